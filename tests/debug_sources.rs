//! Debug info from where distributions and build systems put it: dwz
//! supplementary files, split DWARF (`.dwo`, `.dwp`), debuginfod servers.
//! Each fixture is made by the real tool (dwz, `-gsplit-dwarf`, dwp,
//! elfutils' debuginfod), and hostprof's answers are compared with
//! llvm-symbolizer's on the untouched binary.
mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::{
    has_section,
    llvm::{Comparison, Symbols, compare_module, pick_addresses},
    program_source, require_tool, run_ok, split_debug_by_build_id, work_dir,
};
use hostprof::symbolize::{DebuginfodOptions, Symbolizer, SymbolizerOptions};

/// A fresh directory in the work dir.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = work_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create dir");
    dir
}

/// Compiles the C++ `sources` with g++ and `flags` into `output`.
fn build_cpp(sources: &[PathBuf], output: &Path, flags: &[&str], cwd: &Path) {
    run_ok(
        Command::new("g++")
            .args(flags)
            .arg("-o")
            .arg(output)
            .args(sources)
            .current_dir(cwd),
    );
}

/// Addresses to compare in `binary`: a sample of all its functions.
fn addresses(binary: &Path) -> Vec<u64> {
    pick_addresses(binary, 1500)
}

/// Asserts that every frame hostprof gives for `addresses` through
/// `symbolizer` (which loads `binary`) is llvm-symbolizer's on `reference`:
/// function, start line, file and line of each inlined call (but for the
/// differences the symbolize tests explain: GCC clone suffixes, aliases).
fn assert_same_frames(
    reference: &Path,
    binary: &Path,
    symbolizer: &Symbolizer,
    addresses: &[u64],
) -> Vec<Comparison> {
    let module = symbolizer
        .module_for_path(binary)
        .unwrap_or_else(|err| panic!("load {}: {err}", binary.display()));
    let comparisons = compare_module(reference, &module, addresses);
    // GCC clones (`f.cold`) and aliases are named as in the symbolize tests.
    let symbols = Symbols::of(reference);
    let different: Vec<&Comparison> = comparisons
        .iter()
        .filter(|c| c.frame_explained(&symbols).is_none())
        .collect();
    eprintln!(
        "{}: {} of {} addresses with identical frames",
        binary.display(),
        comparisons.len() - different.len(),
        comparisons.len()
    );
    assert!(
        different.is_empty(),
        "{} differs from llvm-symbolizer on {}:\n{:#?}",
        binary.display(),
        reference.display(),
        &different[..different.len().min(5)]
    );
    comparisons
}

/// Two C++ programs sharing a header, built with -g -O2 (once per test
/// run) and copied into `dir` (`a`, `b`), with untouched copies (`a.orig`,
/// `b.orig`) for llvm-symbolizer.
fn build_dwz_pair(dir: &Path) -> (PathBuf, PathBuf) {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let built = fresh_dir("dwz-built");
        let sources = program_source("dwz");
        for name in ["a", "b"] {
            build_cpp(
                &[sources.join(format!("dwz_{name}.cpp"))],
                &built.join(name),
                &["-g", "-O2", "-Wl,--build-id"],
                &built,
            );
        }
        built
    });
    for name in ["a", "b"] {
        for copy in [name.to_string(), format!("{name}.orig")] {
            std::fs::copy(built.join(name), dir.join(copy)).expect("copy binary");
        }
    }
    (dir.join("a"), dir.join("b"))
}

/// `dwz -m common -M link a b`: shared DWARF moved to `common`, each binary
/// linking to it by the name `link`.
fn dwz(dir: &Path, common: &Path, link: &str) {
    run_ok(
        Command::new("dwz")
            .arg("-m")
            .arg(common)
            .args(["-M", link, "a", "b"])
            .current_dir(dir),
    );
    for name in ["a", "b"] {
        assert!(
            has_section(&dir.join(name), ".gnu_debugaltlink"),
            "dwz left {name} without a supplementary file"
        );
    }
}

#[test]
fn dwz_supplementary_file_beside_the_binary() {
    if !require_tool("dwz") || !require_tool(common::llvm::LLVM_SYMBOLIZER) {
        return;
    }
    let dir = fresh_dir("dwz-beside");
    let (a, b) = build_dwz_pair(&dir);
    dwz(&dir, &dir.join("common.debug"), "common.debug");
    let symbolizer = Symbolizer::new();
    let sample = addresses(&dir.join("a.orig"));
    let comparisons = assert_same_frames(&dir.join("a.orig"), &a, &symbolizer, &sample);
    // The shared header's inline functions are named in both programs.
    let inlined =
        |comparisons: &[Comparison]| comparisons.iter().filter(|c| c.hostprof.len() > 1).count();
    assert!(inlined(&comparisons) > 50, "few inlined frames");
    let sample_b = addresses(&dir.join("b.orig"));
    assert_same_frames(&dir.join("b.orig"), &b, &symbolizer, &sample_b);

    // Without the supplementary file, the names dwz moved are gone: the
    // file above was really used.
    std::fs::rename(dir.join("common.debug"), dir.join("moved.debug")).expect("move");
    let module = Symbolizer::new().module_for_path(&a).expect("load a");
    let comparisons = compare_module(&dir.join("a.orig"), &module, &sample);
    assert!(
        comparisons.iter().filter(|c| c.frames_agree()).count() < sample.len() * 9 / 10,
        "names without the supplementary file: dwz moved nothing?"
    );
}

#[test]
fn dwz_supplementary_file_in_a_dwz_directory_and_by_build_id() {
    if !require_tool("dwz") || !require_tool(common::llvm::LLVM_SYMBOLIZER) {
        return;
    }
    for layout in ["dwz-dir", "build-id"] {
        let dir = fresh_dir(&format!("dwz-{layout}"));
        let (a, _) = build_dwz_pair(&dir);
        // As Debian links: an absolute path under /usr/lib/debug/.dwz, which
        // on this host exists only under the debug directory passed.
        let link = "/usr/lib/debug/.dwz/x86_64-linux-gnu/hostprof-test.debug";
        dwz(&dir, &dir.join("common.debug"), link);
        let debug = dir.join("debug");
        split_debug_by_build_id(&a, &debug);
        let common = match layout {
            "dwz-dir" => debug.join(".dwz/x86_64-linux-gnu/hostprof-test.debug"),
            _ => {
                let id = common::gnu_build_id(&dir.join("common.debug"));
                debug.join(format!(".build-id/{}/{}.debug", &id[..2], &id[2..]))
            }
        };
        std::fs::create_dir_all(common.parent().unwrap()).expect("create dir");
        std::fs::rename(dir.join("common.debug"), &common).expect("move common file");
        let symbolizer = Symbolizer::with_options(SymbolizerOptions {
            debug_dirs: vec![debug],
            ..SymbolizerOptions::default()
        });
        let sample = addresses(&dir.join("a.orig"));
        assert_same_frames(&dir.join("a.orig"), &a, &symbolizer, &sample);
    }
}

/// Compiles `tests/programs/dwz/dwz_a.cpp` with `-gsplit-dwarf` in `dir`:
/// `dir/prog` keeps a skeleton unit naming `a.dwo` (relative to `dir`, its
/// compilation directory).
fn build_split(dir: &Path, version: &str) -> PathBuf {
    let source = program_source("dwz").join("dwz_a.cpp");
    build_cpp(
        &[source],
        &dir.join("a.o"),
        &["-g", "-O2", "-gsplit-dwarf", version, "-c"],
        dir,
    );
    build_cpp(&[dir.join("a.o")], &dir.join("prog"), &[], dir);
    assert!(dir.join("a.dwo").exists(), "g++ wrote no a.dwo");
    dir.join("prog")
}

#[test]
fn split_dwarf_from_dwo_files_and_a_dwp_package() {
    if !require_tool(common::llvm::LLVM_SYMBOLIZER) || !require_tool("llvm-dwp") {
        return;
    }
    // GNU's DWARF 4 extension (DW_AT_GNU_dwo_id) and DWARF 5 skeletons.
    let old = build_split(&fresh_dir("split-build-4"), "-gdwarf-4");
    let comparisons = assert_same_frames(&old, &old, &Symbolizer::new(), &addresses(&old));
    assert!(
        comparisons.iter().filter(|c| c.hostprof.len() > 1).count() > 50,
        "few inlined frames: the DWARF 4 .dwo was not read?"
    );
    // The reference: llvm-symbolizer reads a.dwo where the compiler left it.
    let reference = build_split(&fresh_dir("split-build"), "-gdwarf-5");
    let sample = addresses(&reference);
    let comparisons = assert_same_frames(&reference, &reference, &Symbolizer::new(), &sample);
    assert!(
        comparisons.iter().filter(|c| c.hostprof.len() > 1).count() > 50,
        "few inlined frames: the .dwo was not read?"
    );

    // Built elsewhere, then moved: the compilation directory is gone, and
    // a.dwo is found beside the binary.
    let built = fresh_dir("split-moved-from");
    build_split(&built, "-gdwarf-5");
    let moved = work_dir().join("split-moved");
    let _ = std::fs::remove_dir_all(&moved);
    std::fs::rename(&built, &moved).expect("move the build");
    let prog = moved.join("prog");
    assert_same_frames(&reference, &prog, &Symbolizer::new(), &sample);

    // Packed with llvm-dwp into prog.dwp, the .dwo files deleted.
    run_ok(
        Command::new("llvm-dwp")
            .args(["a.dwo", "-o", "prog.dwp"])
            .current_dir(&moved),
    );
    std::fs::remove_file(moved.join("a.dwo")).expect("remove a.dwo");
    assert_same_frames(&reference, &prog, &Symbolizer::new(), &sample);

    // Neither: the skeleton alone has no inlined calls.
    std::fs::remove_file(moved.join("prog.dwp")).expect("remove prog.dwp");
    let module = Symbolizer::new().module_for_path(&prog).expect("load");
    let bare = compare_module(&reference, &module, &sample);
    assert!(
        bare.iter().all(|c| c.hostprof.len() <= 1),
        "inlined frames without any split DWARF"
    );
}

/// elfutils' debuginfod serving `dir`, in a network namespace of its own
/// (this version cannot be told to listen on loopback only, so it gets a
/// namespace whose only interface is loopback). Threads that call
/// [`DebuginfodServer::enter`] reach it at `127.0.0.1:port`.
struct DebuginfodServer {
    child: std::process::Child,
    port: u16,
}

impl DebuginfodServer {
    fn start(dir: &Path) -> DebuginfodServer {
        let port = 8002;
        let script = format!(
            "ip link set lo up && exec debuginfod -F -d :memory: -p {port} {}",
            dir.display()
        );
        let child = Command::new("unshare")
            .args(["-n", "sh", "-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start debuginfod");
        DebuginfodServer { child, port }
    }

    /// Moves the calling thread (and threads it starts later) into the
    /// server's network namespace.
    fn enter(&self) {
        // `unshare` makes the namespace, then runs the server: wait until
        // it has.
        let theirs = format!("/proc/{}/ns/net", self.child.id());
        let ours = std::fs::read_link("/proc/self/ns/net").expect("our network namespace");
        let made = common::running::wait_for(std::time::Duration::from_secs(10), || {
            std::fs::read_link(&theirs)
                .ok()
                .filter(|link| *link != ours)
        });
        assert!(made.is_some(), "unshare -n made no namespace");
        let ns = std::fs::File::open(&theirs).expect("open the server's network namespace");
        use std::os::fd::AsRawFd;
        // SAFETY: setns on an open namespace file; affects this thread only.
        let done = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(done, 0, "setns: {}", std::io::Error::last_os_error());
    }

    /// The HTTP status of `GET path`, if the server answers.
    fn status(&self, path: &str) -> Option<u16> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    }
}

impl Drop for DebuginfodServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        let why = "the debuginfod test needs root (a network namespace)";
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{why}, and CI=true forbids skipping it");
        }
        eprintln!("skipping: {why}");
    }
    root
}

/// A stripped build of `sym_target.c` named `name` in `dir`, its debug file
/// kept apart: (binary, debug file, build id, address of `outer_function`).
fn stripped_with_debug_file(dir: &Path, name: &str) -> (PathBuf, PathBuf, String, u64) {
    let binary = common::build_c("sym_target.c", name, &["-g", "-O2", "-Wl,--build-id"]);
    let debug = dir.join(format!("{name}.debug"));
    run_ok(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&binary)
            .arg(&debug),
    );
    run_ok(Command::new("strip").arg("--strip-all").arg(&binary));
    let id = common::gnu_build_id(&binary);
    let outer = {
        use object::{Object, ObjectSymbol};
        let data = std::fs::read(&debug).expect("read debug file");
        let file = object::File::parse(&*data).expect("parse debug file");
        file.symbols()
            .find(|symbol| symbol.name() == Ok("outer_function"))
            .expect("outer_function in the debug file")
            .address()
    };
    (binary, debug, id, outer)
}

/// The functions at `address` of `binary` once a symbolizer with
/// `options` has asked its debuginfod servers: nothing is named at the
/// first look (the lookup does not wait for the fetch), then the fetch
/// settles and the binary is loaded again.
fn names_after_fetch(
    options: DebuginfodOptions,
    binary: &Path,
    address: u64,
) -> Vec<hostprof::model::Line> {
    let symbolizer = Symbolizer::with_options(SymbolizerOptions {
        debuginfod: Some(options),
        ..SymbolizerOptions::default()
    });
    let module = symbolizer.module_for_path(binary).expect("load");
    assert!(
        module.lookup_address(address).is_empty(),
        "named before the fetch"
    );
    assert!(
        symbolizer.wait_for_debuginfod(std::time::Duration::from_secs(60)),
        "fetch never finished"
    );
    let module = symbolizer.module_for_path(binary).expect("load again");
    module.lookup_address(address)
}

#[test]
fn debuginfod_delivers_a_debug_file_the_host_lacks() {
    if !require_tool("debuginfod") || !is_root() {
        return;
    }
    let dir = fresh_dir("debuginfod");
    let served = dir.join("served");
    std::fs::create_dir_all(&served).expect("create dir");
    let (binary, _, id, outer) = stripped_with_debug_file(&served, "debuginfod_target");

    let server = DebuginfodServer::start(&served);
    server.enter();
    // Ready once it has indexed the file: it answers 200 for the build id.
    let path = format!("/buildid/{id}/debuginfo");
    let ready = common::running::wait_for(std::time::Duration::from_secs(60), || {
        (server.status(&path) == Some(200)).then_some(())
    });
    assert!(ready.is_some(), "debuginfod never served {path}");

    let cache = dir.join("cache");
    let lines = names_after_fetch(
        DebuginfodOptions {
            cache_dir: cache.clone(),
            ..DebuginfodOptions::with_urls(vec![format!("http://127.0.0.1:{}", server.port)])
                .expect("options")
        },
        &binary,
        outer,
    );
    assert!(
        cache
            .join(format!(".build-id/{}/{}.debug", &id[..2], &id[2..]))
            .exists(),
        "not cached on disk"
    );
    let line = lines.last().expect("named once the debug file arrived");
    assert_eq!(&*line.function, "outer_function");
    assert!(
        line.file
            .as_deref()
            .is_some_and(|f| f.ends_with("sym_target.c"))
            && line.line > 0,
        "{line:?}"
    );

    // Another symbolizer with the same cache needs no server.
    drop(server);
    let offline = Symbolizer::with_options(SymbolizerOptions {
        debuginfod: Some(DebuginfodOptions {
            cache_dir: cache.clone(),
            ..DebuginfodOptions::with_urls(vec!["http://127.0.0.1:9".into()]).expect("options")
        }),
        ..SymbolizerOptions::default()
    });
    let module = offline.module_for_path(&binary).expect("load from cache");
    assert_eq!(
        module
            .lookup_address(outer)
            .last()
            .map(|l| l.function.to_string()),
        Some("outer_function".into())
    );
}

/// An https debuginfod server (`openssl s_server -WWW` serving the
/// `/buildid/ID/debuginfo` layout over TLS on loopback): fetched when its
/// certificate is trusted, refused when it is not.
#[test]
fn debuginfod_over_https_verifies_the_server() {
    if !require_tool("openssl") {
        return;
    }
    let dir = fresh_dir("debuginfod-https");
    let (binary, debug, id, outer) = stripped_with_debug_file(&dir, "debuginfod_https_target");
    let served = dir.join("served");
    let at = served.join(format!("buildid/{id}"));
    std::fs::create_dir_all(&at).expect("create dir");
    std::fs::copy(&debug, at.join("debuginfo")).expect("serve the debug file");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    run_ok(
        Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec"])
            .args([
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
            ])
            .args([
                "-subj",
                "/CN=localhost",
                "-addext",
                "subjectAltName=DNS:localhost",
                // A server certificate, its own trust anchor (not a CA's).
                "-addext",
                "basicConstraints=critical,CA:FALSE",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert),
    );
    let port = common::running::free_port();
    let server = Command::new("openssl")
        .args(["s_server", "-WWW", "-quiet", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .current_dir(&served)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start openssl s_server");
    // Stopped however the test ends.
    let _server = common::running::KillOnDrop(server);
    // The probe's connection is closed at once: s_server serves one
    // connection at a time.
    let listening = common::running::wait_for(std::time::Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(drop)
    });
    assert!(listening.is_some(), "openssl s_server never listened");
    let fetch = |ca_file: Option<PathBuf>, cache: &str| {
        let options = DebuginfodOptions {
            cache_dir: dir.join(cache),
            ca_file,
            ..DebuginfodOptions::with_urls(vec![format!("https://localhost:{port}")])
                .expect("options")
        };
        names_after_fetch(options, &binary, outer)
            .last()
            .map(|line| line.function.to_string())
    };
    // A certificate no root vouches for: nothing is fetched.
    assert_eq!(
        fetch(None, "untrusted"),
        None,
        "an unverified server was used"
    );
    // Trusted: the debug file arrives and names the function.
    assert_eq!(
        fetch(Some(cert.clone()), "trusted"),
        Some("outer_function".to_string())
    );
}

#[test]
fn debuginfod_server_down_gives_one_warning_and_the_profile() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let dir = fresh_dir("server-down");
    let program = common::build_c(
        "cpu_split.c",
        "split_no_debug",
        &["-O0", "-fno-omit-frame-pointer", "-g", "-Wl,--build-id"],
    );
    run_ok(Command::new("strip").arg("--strip-all").arg(&program));
    let out = dir.join("profile.folded");
    // Nothing listens on the discard port of loopback.
    let output = run_ok(
        common::hostprof()
            .args(["record", "-F", "199", "-o"])
            .arg(&out)
            .args(["--", program.to_str().unwrap(), "1"])
            .env("DEBUGINFOD_URLS", "http://127.0.0.1:9")
            .env("XDG_CACHE_HOME", dir.join("cache")),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("debuginfod"))
        .collect();
    assert_eq!(warnings.len(), 1, "stderr:\n{stderr}");
    assert!(warnings[0].contains("127.0.0.1:9"), "{}", warnings[0]);
    let profile = std::fs::read_to_string(&out).expect("profile written");
    assert!(
        profile
            .lines()
            .any(|line| line.starts_with("split_no_debug")),
        "no samples of the program:\n{profile}"
    );
}

/// `go tool addr2line`'s (function, file, line) for each of `addresses`.
fn go_addr2line(go: &str, binary: &Path, addresses: &[u64]) -> Vec<(String, String, u32)> {
    use std::io::Write;
    let mut child = Command::new(go)
        .args(["tool", "addr2line"])
        .arg(binary)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run go tool addr2line");
    let input: String = addresses.iter().map(|a| format!("{a:#x}\n")).collect();
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().expect("addr2line output");
    writer.join().expect("writer").expect("write addresses");
    let text = String::from_utf8(output.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * addresses.len(), "two lines per address");
    lines
        .chunks(2)
        .map(|pair| {
            let (file, line) = pair[1].rsplit_once(':').expect("file:line");
            (
                pair[0].to_string(),
                file.to_string(),
                line.parse().unwrap_or(0),
            )
        })
        .collect()
}

/// This machine's Go (1.19: the 1.18 table layout) and Debian's
/// bookworm-backports Go 1.23 (the 1.20+ layout, with start lines).
const GO_TOOLCHAINS: &[&str] = &["go", "/usr/lib/go-1.23/bin/go"];

#[test]
fn stripped_go_binary_has_files_and_lines_as_go_tool_addr2line_says() {
    for go in GO_TOOLCHAINS {
        if require_tool(go) {
            check_go_lines(go);
        }
    }
}

fn check_go_lines(go: &str) {
    let binary = work_dir().join(format!("go_lines_{}", go.len()));
    run_ok(
        Command::new(go)
            .args(["build", "-ldflags=-s -w", "-o"])
            .arg(&binary)
            .arg("main.go")
            .current_dir(program_source("go_target"))
            .env("GOCACHE", work_dir().join("go-cache"))
            .env("GOPATH", work_dir().join("go-path"))
            .env("GO111MODULE", "off")
            // Never download another toolchain.
            .env("GOTOOLCHAIN", "local"),
    );
    assert!(!has_section(&binary, ".debug_info"));
    let text = {
        use object::{Object, ObjectSection};
        let data = std::fs::read(&binary).expect("read binary");
        let file = object::File::parse(&*data).expect("parse");
        let text = file.section_by_name(".text").expect(".text");
        (text.address(), text.size())
    };
    // Every 61st byte of the code: the runtime, the standard library, main.
    let addresses: Vec<u64> = (text.0..text.0 + text.1).step_by(61).collect();
    let module = Symbolizer::new().module_for_path(&binary).expect("load");
    let reference = go_addr2line(go, &binary, &addresses);
    let mut same = 0;
    let mut different = Vec::new();
    for (&address, expected) in addresses.iter().zip(&reference) {
        let ours = module.lookup_address(address).last().map(|line| {
            (
                line.function.to_string(),
                line.file.as_deref().unwrap_or_default().to_string(),
                line.line,
            )
        });
        let ours = ours.unwrap_or_else(|| ("?".into(), "?".into(), 0));
        if &ours == expected {
            same += 1;
        } else {
            different.push((address, ours, expected.clone()));
        }
    }
    eprintln!(
        "{} ({go}): {same} of {} addresses with go tool addr2line's function, file and line",
        binary.display(),
        addresses.len()
    );
    assert!(
        same * 1000 >= addresses.len() * 995,
        "{:#?}",
        &different[..different.len().min(10)]
    );
    // The program's own code is among them.
    assert!(
        reference
            .iter()
            .any(|(name, file, _)| name.starts_with("main.") && file.ends_with("main.go")),
        "no address in main.go sampled"
    );
}
