//! Tests against a live JVM: a small program is compiled and run until it
//! says it is warm (its hot method compiled), then attached to, its code
//! heaps walked on the host and its nmethods named.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use hostprof_common::{
    hotspot::kind,
    runtime::{Frame, tag},
};

use super::{
    JavaFrameKind, Jvm, LibjvmCache,
    jvm::Layout,
    names::{Method, Nmethod, Stream, decode_lines},
    vmstructs::{Memory, Process},
};

const SOURCE: &str = r#"public class Hot {
    static volatile int never = -1;

    static int square(int x) {
        if (x == never) {
            throw new IllegalStateException("never");
        }
        return x * x + 1;
    }

    static long hotLoop(int n) {
        long sum = 0;
        for (int i = 0; i < n; i++) {
            sum += square(i);
        }
        return sum;
    }

    public static void main(String[] args) {
        long total = 0;
        for (int round = 0; ; round++) {
            total += hotLoop(1000);
            if (round == 30000) {
                System.out.println("warm " + total);
                System.out.flush();
            }
        }
    }
}
"#;

/// 1-based line of the first source line containing `text`.
fn line_of(text: &str) -> u32 {
    let index = SOURCE
        .lines()
        .position(|line| line.contains(text))
        .expect("marker in source");
    index as u32 + 1
}

/// The JVM under test; killed and reaped however the test ends.
struct Java {
    child: Child,
    dir: PathBuf,
}

impl Drop for Java {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `bin` directories of the JDKs at hand: the one on `PATH` and any
/// under /usr/lib/jvm, each once.
fn jdks() -> Vec<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    let installed = std::fs::read_dir("/usr/lib/jvm")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"));
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for dir in on_path.into_iter().chain(installed) {
        if dir.join("javac").is_file()
            && let Ok(java) = dir.join("java").canonicalize()
            && seen.insert(java)
        {
            out.push(dir);
        }
    }
    out
}

/// Compiles `Hot` with the JDK in `bin` and starts it, returning once it
/// printed that it is warm.
fn start_java(bin: &Path, index: usize) -> Java {
    let dir = std::env::temp_dir().join(format!("hostprof-hotspot-{}-{index}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("Hot.java"), SOURCE).expect("write source");
    let status = Command::new(bin.join("javac"))
        .arg("Hot.java")
        .current_dir(&dir)
        .status()
        .expect("javac runs");
    assert!(status.success(), "javac failed");
    let child = Command::new(bin.join("java"))
        // Compiles in the thread that asked: once the loop ran long enough,
        // its code is compiled, not queued.
        .args(["-XX:-BackgroundCompilation", "-Xss1m", "-cp"])
        .arg(&dir)
        .arg("Hot")
        .stdout(Stdio::piped())
        .spawn()
        .expect("java starts");
    let mut java = Java { child, dir };
    let stdout = java.child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("reads java's output");
    assert!(line.starts_with("warm"), "java said {line:?}");
    java
}

/// Every JDK at hand (the test skips without one, unless `CI` is set).
#[test]
fn names_frames_of_live_jvms() {
    let jdks = jdks();
    if jdks.is_empty() {
        assert!(
            std::env::var_os("CI").is_none(),
            "javac and java are needed in CI"
        );
        eprintln!("skipped: no javac/java");
        return;
    }
    for (index, bin) in jdks.iter().enumerate() {
        eprintln!("JDK in {}", bin.display());
        names_frames_of_a_live_jvm(&start_java(bin, index));
    }
}

fn names_frames_of_a_live_jvm(java: &Java) {
    let pid = java.child.id();
    let maps = std::fs::read(format!("/proc/{pid}/maps")).expect("maps");
    let maps = crate::procs::parse_maps(&maps).expect("parses maps");
    let libjvm = maps
        .iter()
        .find(|mapping| mapping.path.ends_with("/libjvm.so"))
        .expect("libjvm mapped");
    let started = std::time::Instant::now();
    let mut jvm = Jvm::attach(pid, libjvm).expect("attaches");
    eprintln!("attached in {:?}", started.elapsed());
    // Through the cache of libjvm files: the same JVM, read once.
    let mut cache = LibjvmCache::default();
    for _ in 0..2 {
        let started = std::time::Instant::now();
        let again = Jvm::attach_cached(pid, libjvm, &mut cache).expect("attaches again");
        eprintln!("attached (cache) in {:?}", started.elapsed());
        assert_eq!(again.kernel_process(), jvm.kernel_process());
        assert_eq!(again.version(), jvm.version());
    }

    let version = jvm.version().expect("a version");
    assert!(
        version.split('.').count() == 3 && version.split('.').all(|n| n.parse::<u32>().is_ok()),
        "version {version}"
    );
    let process = jvm.kernel_process();
    assert!(process.heap_count >= 1);
    for heap in &process.heaps[..process.heap_count as usize] {
        assert!((5..=10).contains(&heap.log2_segment), "{heap:?}");
        assert!(
            maps.find(heap.low).is_some(),
            "heap {heap:?} not in an executable mapping"
        );
    }
    assert_eq!(jvm.code_ranges().len(), process.heap_count as usize);
    for (name, offset) in [
        ("heap_block_size", process.heap_block_size),
        ("blob_name", process.blob_name),
        ("blob_frame_size", process.blob_frame_size),
        ("blob_frame_complete", process.blob_frame_complete),
        ("blob_code_begin", process.blob_code_begin),
        ("nmethod_compile_id", process.nmethod_compile_id),
        ("method_const_method", process.method_const_method),
        ("const_method_size", process.const_method_size),
    ] {
        assert!((1..1024).contains(&offset), "{name} = {offset}");
    }
    assert_eq!(
        process.interp_bcp_slot,
        if cfg!(target_arch = "aarch64") { 9 } else { 8 }
    );

    let hot_lines = line_of("static long hotLoop")..line_of("return sum;") + 1;
    let first_line = line_of("long sum = 0;");
    let square_lines = line_of("static int square")..line_of("return x * x + 1;") + 1;
    let memory = Process(pid);
    let blobs = jvm.blobs();
    let (mut hot_nmethods, mut inlined_seen, mut stub_named) = (0, false, false);
    let mut lines_seen = 0;
    for (blob, name) in &blobs {
        if name != "nmethod" {
            if !stub_named {
                let frame = Frame {
                    code: tag::apply(tag::HOTSPOT | kind::STUB, *blob),
                    instr: 0,
                };
                let frames = jvm.name_frame(frame);
                assert_eq!(frames.len(), 1);
                assert_eq!(&frames[0].method, name);
                assert_eq!(frames[0].kind, JavaFrameKind::Stub);
                stub_named = true;
            }
            continue;
        }
        let compile_id = memory
            .read_u32(blob + u64::from(process.nmethod_compile_id))
            .expect("compile id");
        let frame = |pc: u32, id: u32| Frame {
            code: tag::apply(tag::HOTSPOT | kind::COMPILED, *blob),
            instr: (u64::from(id) << 32) | u64::from(pc),
        };
        let frames = jvm.name_frame(frame(0, compile_id));
        let Some(outer) = frames.last() else { continue };
        assert!(!outer.inlined);
        if (outer.class.as_str(), outer.method.as_str()) != ("Hot", "hotLoop") {
            continue;
        }
        hot_nmethods += 1;
        assert_eq!(outer.file.as_deref(), Some("Hot.java"));
        assert_eq!(outer.kind, JavaFrameKind::Compiled);
        // A stale compile id names nothing.
        assert!(
            jvm.name_frame(frame(0, compile_id ^ 0x8000_0000))
                .is_empty()
        );

        for pc in jvm.pc_offsets(*blob) {
            let Ok(pc) = u32::try_from(pc) else { continue };
            let frames = jvm.name_frame(frame(pc, compile_id));
            let Some((outer, inner)) = frames.split_last() else {
                continue;
            };
            assert_eq!(
                (outer.class.as_str(), outer.method.as_str()),
                ("Hot", "hotLoop")
            );
            // A PcDesc without scope (entry, exception handler) leaves
            // the method without a line; any other has one in hotLoop.
            if let Some(line) = outer.line {
                assert!(hot_lines.contains(&line), "line {line} of hotLoop");
                lines_seen += 1;
            } else {
                assert!(inner.is_empty(), "no line at pc {pc}: {frames:?}");
            }
            for callee in inner {
                assert!(callee.inlined);
                if callee.method == "square" {
                    let line = callee.line.expect("square's line");
                    assert!(square_lines.contains(&line), "line {line} of square");
                    inlined_seen = true;
                }
            }
        }

        // The nmethod's Method* as an interpreted frame at bci 0.
        let layout = &jvm.layout;
        let method = memory
            .read_u64(blob + layout.nmethod_method)
            .expect("Method*");
        let const_method = memory
            .read_u64(method + layout.method_const_method)
            .expect("ConstMethod*");
        let interpreted = |check: u64| Frame {
            code: tag::apply(tag::HOTSPOT | kind::INTERPRETED, method),
            instr: check << 32,
        };
        let check = u64::from((const_method >> 3) as u32);
        let frames = jvm.name_frame(interpreted(check));
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(frames[0].method, "hotLoop");
        assert_eq!(frames[0].line, Some(first_line));
        assert_eq!(frames[0].kind, JavaFrameKind::Interpreted);
        assert!(jvm.name_frame(interpreted(check ^ 1)).is_empty());
    }
    assert!(
        hot_nmethods >= 1,
        "no nmethod of hotLoop among {} blobs",
        blobs.len()
    );
    assert!(lines_seen > 0, "no pc of hotLoop had a line");
    assert!(inlined_seen, "square never inlined into hotLoop");
    assert!(stub_named);
}

#[test]
fn decodes_compressed_streams() {
    // One byte below 192; two bytes: 192 + 64 * 1.
    let mut stream = Stream::new(&[5, 192, 1, 3], 0);
    assert_eq!(stream.uint(), Some(5));
    assert_eq!(stream.uint(), Some(256));
    assert_eq!(stream.int(), Some(-2));
    assert_eq!(stream.uint(), None);
    // JDK 20+: every byte one higher.
    assert_eq!(Stream::new(&[6], 1).uint(), Some(5));
    assert_eq!(Stream::new(&[0], 1).uint(), None);
    // A continuation that never ends stops after five bytes.
    assert!(Stream::new(&[255; 8], 0).uint().is_some());

    // Short pairs (bci << 3 | line delta), an escaped pair, the end.
    let lines = decode_lines(&[(2 << 3) | 3, 0xff, 20, 4, 0], 0).expect("complete");
    assert_eq!(lines, vec![(2, 3), (12, 5)]);
    assert_eq!(decode_lines(&[(2 << 3) | 3], 0), Err(true));
    assert_eq!(decode_lines(&[0xff, 192], 0), Err(true));
}

/// The scope chain of a made-up nmethod: the PcDesc at or after the pc,
/// inlined methods innermost first, and hostile chains cut short.
#[test]
fn expands_scope_chains() {
    let mut jvm = Jvm::for_tests(std::process::id(), Layout::default());
    let method = |name: &str, lines: Vec<(u32, u32)>| Method {
        const_method: 0,
        class: "Hot".into(),
        name: name.into(),
        file: Some("Hot.java".into()),
        lines,
    };
    jvm.cache_method(0x1000, method("hotLoop", vec![(0, 10), (4, 11)]));
    jvm.cache_method(0x2000, method("square", vec![(0, 3)]));
    // Offset 0 is "no scope". At 1: hotLoop at bci 4 (stored + 1), no
    // sender. At 4: square at bci 0, called from 1. At 7: its own sender.
    // At 10: a method index past the metadata. At 13: cut short.
    let scopes = vec![0, 0, 1, 5, 1, 2, 1, 7, 1, 1, 1, 100, 1, 4, 2];
    let nmethod = Nmethod {
        compile_id: 1,
        method: 0x1000,
        metadata: vec![0x1000, 0x2000],
        scopes,
        pcs: vec![
            (-1, 0),
            (10, 4),
            (20, 1),
            (30, 7),
            (40, 10),
            (50, 13),
            (60, 99),
        ],
    };
    let names = |frames: Vec<super::JavaFrame>| {
        frames
            .into_iter()
            .map(|frame| (frame.method, frame.line, frame.inlined))
            .collect::<Vec<_>>()
    };
    let inlined = vec![
        ("square".to_string(), Some(3), true),
        ("hotLoop".to_string(), Some(11), false),
    ];
    assert_eq!(names(jvm.scopes_at(&nmethod, 0)), inlined);
    assert_eq!(names(jvm.scopes_at(&nmethod, 10)), inlined);
    assert_eq!(
        names(jvm.scopes_at(&nmethod, 11)),
        vec![("hotLoop".to_string(), Some(11), false)]
    );
    // A scope naming itself its sender is read once.
    assert_eq!(
        names(jvm.scopes_at(&nmethod, 30)),
        vec![("hotLoop".to_string(), Some(10), false)]
    );
    // An unknown method is skipped, its sender still named.
    assert_eq!(
        names(jvm.scopes_at(&nmethod, 40)),
        vec![("hotLoop".to_string(), Some(11), false)]
    );
    // A scope cut short, one past the data, none after the last PcDesc.
    assert!(jvm.scopes_at(&nmethod, 50).is_empty());
    assert!(jvm.scopes_at(&nmethod, 60).is_empty());
    assert!(jvm.scopes_at(&nmethod, 61).is_empty());
}
