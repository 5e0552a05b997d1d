//! The line of a JavaScript frame: `hostprof record -p` on
//! tests/programs/node/lines.js, whose `hot` function runs two loops, each
//! on a line of its own, under Node.js 18, 20 and 22 (node's own builds,
//! `cargo xtask setup`) run with `--jitless` (every frame interpreted) and
//! without (V8 compiles `hot`: its frames run Sparkplug, Maglev or
//! TurboFan code), each with `--cpu-prof`, whose `positionTicks` (ticks
//! by line, per node of its call tree) are the ground truth.
//!
//! What counts, in hostprof's pprof profile: samples whose innermost
//! JavaScript frame is `hot`, by that frame's line. The share of them on
//! the first loop's line must be within 0.05 of `--cpu-prof`'s share of
//! `hot`'s ticks on that line (or, where `--cpu-prof`'s is itself more
//! than 0.05 off the program's three quarters, of those: see
//! [`DESIGNED_SHARE`]), each over at least 100 samples; 0.95 of
//! them must be on the lines of `hot`'s body (not its definition's); and
//! every `hot` frame keeps its definition's line as its function's start
//! line.
mod common;

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use common::*;
use hostprof_proto::{Message, pprof::Profile};

const RATE_HZ: &str = "499";
/// CPU seconds of the (single-threaded) program under both profilers:
/// about 1,000 hostprof samples of `hot` and 2,000 of `--cpu-prof`'s, so
/// the shares' difference has a standard deviation near 0.017.
const CPU_SECONDS: f64 = 2.0;
const SHARE_TOLERANCE: f64 = 0.05;
/// The first loop's share of `hot`'s time by construction: three times the
/// second's iterations of the same code (tests/programs/node/lines.js).
/// `--cpu-prof` does not see a Sparkplug or optimized frame's line while
/// the CPU is in a builtin it calls (it takes the caller's frame then), so
/// its share can drift from this on some machines (a fresh CI machine:
/// 0.636 to 0.695 in Sparkplug code, 0.688 once in node 22's compiled code,
/// where hostprof saw 0.740 to 0.767); where it is further than
/// [`SHARE_TOLERANCE`] from this, hostprof is judged against this instead,
/// and the test says so.
const DESIGNED_SHARE: f64 = 0.75;
/// The builds `cargo xtask setup` unpacks in target/node-roots.
const VERSIONS: &[&str] = &["18.20.4", "20.18.0", "22.11.0", "24.22.3", "26.12.1"];
const FUNCTION: &str = "hot";

fn target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// The program's lines that matter, from its source: where `hot` is
/// defined, its first loop's, and its last (`return`).
struct Lines {
    definition: u32,
    first_loop: u32,
    last: u32,
}

fn program_lines(source: &str) -> Lines {
    let line_of = |from: u32, test: &dyn Fn(&str) -> bool| -> u32 {
        source
            .lines()
            .enumerate()
            .skip(from as usize)
            .find(|(_, text)| test(text))
            .map(|(index, _)| index as u32 + 1)
            .expect("the program's line")
    };
    let definition = line_of(0, &|text| text.starts_with("function hot("));
    let first_loop = line_of(definition, &|text| text.trim_start().starts_with("for ("));
    let last = line_of(first_loop, &|text| text.trim_start().starts_with("return "));
    Lines {
        definition,
        first_loop,
        last,
    }
}

/// `--cpu-prof`'s ticks of `hot` by line, over its whole profile (the
/// program does the same work from its start; the share of each line
/// does not depend on the tier running it).
fn cpu_prof_lines(profiles: &Path) -> HashMap<u32, u64> {
    let profile = read_cpu_prof(profiles);
    let mut lines = HashMap::new();
    for node in profile["nodes"].as_array().expect("nodes") {
        let call = &node["callFrame"];
        if call["functionName"] != FUNCTION
            || !call["url"].as_str().unwrap_or("").ends_with("/lines.js")
        {
            continue;
        }
        for tick in node["positionTicks"].as_array().into_iter().flatten() {
            let line = tick["line"].as_u64().unwrap() as u32;
            *lines.entry(line).or_insert(0) += tick["ticks"].as_u64().unwrap();
        }
    }
    lines
}

/// The `.cpuprofile` `--cpu-prof` wrote in `profiles`.
fn read_cpu_prof(profiles: &Path) -> serde_json::Value {
    let path = std::fs::read_dir(profiles)
        .expect("read the profiles")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.to_string_lossy().ends_with(".cpuprofile"))
        .unwrap_or_else(|| panic!("no profile in {}", profiles.display()));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// A frame of a pprof sample: function, file, line, start line.
struct PprofFrame {
    name: String,
    file: String,
    line: i64,
    start: i64,
}

/// The samples of the pprof profile at `pprof`: their frames (leaf first;
/// in a location, the innermost line first) and counts.
fn pprof_samples(pprof: &Path) -> Vec<(Vec<PprofFrame>, u64)> {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(pprof).expect("open the profile"))
        .read_to_end(&mut bytes)
        .expect("gunzip");
    let profile = Profile::decode(&bytes[..]).expect("decode pprof");
    let string = |at: i64| profile.string_table[at as usize].clone();
    let functions: HashMap<u64, _> = profile.function.iter().map(|f| (f.id, f)).collect();
    let locations: HashMap<u64, _> = profile.location.iter().map(|l| (l.id, l)).collect();
    let samples_at = profile
        .sample_type
        .iter()
        .position(|t| string(t.r#type) == "samples")
        .expect("a samples value");
    let frame = |line: &hostprof_proto::pprof::Line| {
        let function = functions[&line.function_id];
        PprofFrame {
            name: string(function.name),
            file: string(function.filename),
            line: line.line,
            start: function.start_line,
        }
    };
    profile
        .sample
        .iter()
        .map(|sample| {
            let lines = sample.location_id.iter().flat_map(|id| &locations[id].line);
            (lines.map(frame).collect(), sample.value[samples_at] as u64)
        })
        .collect()
}

/// Functions of node's own modules (files `node:…`), by name and file.
type Internal = HashMap<(String, String), InternalFunction>;

/// One such function: its definition line, and (hostprof's) the samples
/// with a frame of it, and those whose frame has a line.
#[derive(Debug, Default)]
struct InternalFunction {
    start: i64,
    samples: u64,
    with_line: u64,
}

/// `--cpu-prof`'s functions of node's own modules, with their definition
/// lines (its `lineNumber` counts from 0).
fn cpu_prof_internal(profiles: &Path) -> Internal {
    let profile = read_cpu_prof(profiles);
    let mut functions = Internal::new();
    for node in profile["nodes"].as_array().expect("nodes") {
        let call = &node["callFrame"];
        let url = call["url"].as_str().unwrap_or("");
        let name = call["functionName"].as_str().unwrap_or("");
        if url.starts_with("node:") && !name.is_empty() {
            let start = call["lineNumber"].as_i64().unwrap_or(-1) + 1;
            let key = (name.to_string(), url.to_string());
            functions.entry(key).or_default().start = start;
        }
    }
    functions
}

/// hostprof's frames of functions of node's own modules.
fn hostprof_internal(pprof: &Path) -> Internal {
    let mut internal = Internal::new();
    for (frames, count) in pprof_samples(pprof) {
        for frame in frames
            .into_iter()
            .filter(|frame| frame.file.starts_with("node:"))
        {
            let seen = internal.entry((frame.name, frame.file)).or_default();
            seen.start = frame.start;
            seen.samples += count;
            if frame.line > 0 {
                seen.with_line += count;
            }
        }
    }
    internal
}

/// What is wrong with the frames of node's own modules: ≥ 0.99 of them
/// must carry a line, and a function `--cpu-prof` saw too the same
/// definition line; at least one function in both.
fn internal_failures(seen: &Internal, truth: &Internal) -> Vec<String> {
    let samples: u64 = seen.values().map(|function| function.samples).sum();
    let with_line: u64 = seen.values().map(|function| function.with_line).sum();
    let mut failures = Vec::new();
    if (with_line as f64) < 0.99 * samples as f64 {
        failures.push(format!(
            "{with_line} of {samples} frames of node's own modules have a line: {seen:?}"
        ));
    }
    let both: Vec<_> = seen
        .iter()
        .filter_map(|(key, function)| Some((key, function.start, truth.get(key)?.start)))
        .collect();
    eprintln!(
        "node's own modules: {with_line} of {samples} frames with a line; {} functions in both \
         profiles",
        both.len()
    );
    if both.is_empty() {
        failures.push(format!(
            "no function of node's own modules in both profiles: hostprof {:?}, --cpu-prof {:?}",
            seen.keys(),
            truth.keys()
        ));
    }
    for ((name, file), ours, theirs) in both {
        if ours != theirs {
            failures.push(format!(
                "{name} ({file}): defined on line {ours}, --cpu-prof says {theirs}"
            ));
        }
    }
    failures
}

/// hostprof's samples whose innermost JavaScript frame (a line of a
/// function with a file) is `hot`, by the frame's line; and the start
/// lines `hot`'s functions carry.
fn hostprof_lines(pprof: &Path) -> (HashMap<u32, u64>, Vec<i64>) {
    let mut lines = HashMap::new();
    let mut starts = Vec::new();
    for (frames, count) in pprof_samples(pprof) {
        let javascript = frames.iter().find(|frame| frame.file.ends_with(".js"));
        let Some(frame) = javascript.filter(|frame| frame.name == FUNCTION) else {
            continue;
        };
        *lines.entry(frame.line as u32).or_insert(0) += count;
        starts.push(frame.start);
    }
    (lines, starts)
}

/// The share of `lines`' count on `line`, and the count.
fn share(lines: &HashMap<u32, u64>, line: u32) -> (f64, u64) {
    let all: u64 = lines.values().sum();
    let on = lines.get(&line).copied().unwrap_or(0);
    (on as f64 / all.max(1) as f64, all)
}

#[test]
fn interpreted_frames_name_the_line_cpu_prof_names() {
    lines_match_cpu_prof("jitless", |_| vec!["--jitless"], &[]);
}

/// With V8's compilers at work (`hot` runs in Sparkplug, Maglev or
/// TurboFan code most of the time), but no inlining: an inlined `hot`
/// keeps its definition line until inlined frames are expanded, and
/// whether TurboFan inlines it varies from run to run (CI once had 92 of
/// node 22's samples of `hot` outside its caller's code, 929 inlined).
#[test]
fn compiled_frames_name_the_line_cpu_prof_names() {
    lines_match_cpu_prof("jit", |_| vec!["--no-turbo-inlining"], &[]);
}

/// With `hot` called once and looping for seconds (the program's `osr`):
/// V8 optimizes it while it runs and enters the optimized code by
/// on-stack replacement, code its function never points at, which the
/// agent finds from the frame's pc. Half of hostprof's samples of `hot`
/// at least must be named from code found that way (the report's count),
/// or the test did not test it.
#[test]
fn on_stack_replaced_frames_name_the_line_cpu_prof_names() {
    lines_match_cpu_prof(OSR, |_| vec![], &["osr"]);
}

/// The run whose frames must be in on-stack-replacement code.
const OSR: &str = "osr";

/// With `hot` kept in Sparkplug's (baseline) code: most of its samples
/// are in the frameless builtins that code calls for its arithmetic and
/// comparisons (`ModulusSmi_Baseline`, …), where the frame's pc is the
/// return address the call left at the stack pointer. Node 20 and 22
/// would tier it up to Maglev without `--no-maglev` (node 18 has no
/// Maglev, nor the flag). `--cpu-prof` puts those samples on the caller
/// (`loop`), so it keeps about a fifth of `hot`'s: it samples four times
/// as often here to keep its share's noise near the other runs'.
#[test]
fn sparkplug_frames_name_the_line_cpu_prof_names() {
    lines_match_cpu_prof(
        "sparkplug",
        |version| {
            let mut flags = vec!["--always-sparkplug", "--no-opt", "--cpu-prof-interval=250"];
            if !version.starts_with("18.") {
                flags.push("--no-maglev");
            }
            flags
        },
        &[],
    );
}

/// Profiles the program (given `args`) under each node with its `flags`;
/// fails on any version that went wrong.
fn lines_match_cpu_prof(name: &str, flags: fn(&str) -> Vec<&'static str>, args: &[&str]) {
    let Some(_guard) = require_ebpf() else { return };
    let source_path = program_source("node").join("lines.js");
    let source = std::fs::read_to_string(&source_path).unwrap();
    let lines = program_lines(&source);
    let mut failures = Vec::new();
    for version in VERSIONS {
        let node = target()
            .join("node-roots")
            .join(version)
            .join("package/bin/node");
        if !require_tool(&node.display().to_string()) {
            continue;
        }
        let run = || {
            profile(
                version,
                name,
                (&flags(version), args),
                &node,
                &source_path,
                &lines,
            )
        };
        // A second run where the first missed: each share is over about
        // 1000 samples, and both must miss to fail; the first miss is
        // printed. Node 18's interpreted frames once missed in every run
        // on a CI machine (0.81 to 0.86 on the first loop) and were not
        // judged. The likely cause was the program's fixed-length call
        // locking to the sampling period (lines.js; shown for compiled
        // frames): since each call's length is drawn at random, five runs
        // here gave 0.753 to 0.783 against --cpu-prof's 0.731 to 0.756.
        if let Some(first) = run() {
            eprintln!("{first}: measured again");
            if let Some(failure) = run() {
                failures.push(format!("{first}; again: {failure}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Profiles the program under one node, with node's flags and the
/// program's arguments; what went wrong.
fn profile(
    version: &str,
    name: &str,
    (flags, args): (&[&str], &[&str]),
    node: &Path,
    source: &Path,
    lines: &Lines,
) -> Option<String> {
    let dir = work_dir().join(format!("node-lines-{name}-{version}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("profiles")).unwrap();
    let mut child = Command::new(node)
        .args(flags)
        .arg("--cpu-prof")
        .arg(format!("--cpu-prof-dir={}", dir.join("profiles").display()))
        .arg(source)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start node");
    let (sender, output) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    let warm = output.recv_timeout(Duration::from_secs(60));
    assert!(
        warm.as_deref().is_ok_and(|line| line.starts_with("warm ")),
        "node {version}: the program never printed `warm`: {warm:?}"
    );
    let pid = child.id();
    let pprof = dir.join("hostprof.pb.gz");
    let (mut recording, mut log) = running::start_recording(
        hostprof()
            .args(["record", "-F", RATE_HZ, "--pid"])
            .arg(pid.to_string())
            .arg("--output")
            .arg(&pprof),
    );
    let enough = running::wait_for_cpu(pid, CPU_SECONDS, Duration::from_secs(120));
    let status = running::interrupt(&mut recording);
    // SAFETY: kill(2) on the process the test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let exited = running::wait_for(Duration::from_secs(60), || {
        child.try_wait().expect("wait for node")
    });
    if exited.is_none() {
        let _ = child.kill();
    }
    let report = log.finish();
    assert_eq!(
        enough,
        Some(true),
        "node {version}: node exited or did not run"
    );
    assert!(
        status.success(),
        "node {version}: hostprof failed:\n{report}"
    );

    let truth = cpu_prof_lines(&dir.join("profiles"));
    let (seen, starts) = hostprof_lines(&pprof);
    let (truth_share, truth_samples) = share(&truth, lines.first_loop);
    let (seen_share, seen_samples) = share(&seen, lines.first_loop);
    let body: u64 = seen
        .iter()
        .filter(|(line, _)| (lines.definition + 1..=lines.last).contains(*line))
        .map(|(_, count)| count)
        .sum();
    let in_body = body as f64 / seen_samples.max(1) as f64;
    eprintln!(
        "node {version} ({name}): line {} share: hostprof {seen_share:.3} of {seen_samples} ({seen:?}), \
         --cpu-prof {truth_share:.3} of {truth_samples} ({truth:?}); {}",
        lines.first_loop,
        report
            .lines()
            .find(|line| line.contains("JavaScript frames"))
            .unwrap_or("")
    );
    let mut failures = internal_failures(
        &hostprof_internal(&pprof),
        &cpu_prof_internal(&dir.join("profiles")),
    );
    if name == OSR {
        let by_pc = report
            .split("(and ")
            .nth(1)
            .and_then(|rest| rest.split(" more in code found from their pc").next())
            .and_then(|count| count.parse::<u64>().ok())
            .unwrap_or(0);
        if by_pc < seen_samples / 2 {
            failures.push(format!(
                "{by_pc} frames in code found from their pc, for {seen_samples} samples of \
                 `{FUNCTION}`: its on-stack-replacement code was not tested"
            ));
        }
    }
    if seen_samples < MIN_SHARE_SAMPLES || truth_samples < MIN_SHARE_SAMPLES {
        failures.push(format!(
            "too few samples of `{FUNCTION}`: hostprof {seen_samples}, --cpu-prof {truth_samples}"
        ));
    }
    let reference = if (truth_share - DESIGNED_SHARE).abs() > SHARE_TOLERANCE {
        eprintln!(
            "node {version} ({name}): --cpu-prof's {truth_share:.3} is off the program's \
             {DESIGNED_SHARE}: hostprof judged against the program's"
        );
        DESIGNED_SHARE
    } else {
        truth_share
    };
    if (seen_share - reference).abs() > SHARE_TOLERANCE {
        failures.push(format!(
            "line {}: hostprof {seen_share:.3} of {seen_samples} samples ({seen:?}), \
             --cpu-prof {truth_share:.3} of {truth_samples} ({truth:?}), the program's \
             {DESIGNED_SHARE}",
            lines.first_loop
        ));
    }
    if in_body < 0.95 {
        failures.push(format!(
            "{in_body:.3} of hostprof's `{FUNCTION}` samples on its body's lines {} to {} \
             ({seen:?})",
            lines.definition + 1,
            lines.last
        ));
    }
    if let Some(start) = starts
        .iter()
        .find(|&&start| start != i64::from(lines.definition))
    {
        failures.push(format!(
            "`{FUNCTION}`'s start line {start}, not its definition's {}",
            lines.definition
        ));
    }
    (!failures.is_empty()).then(|| format!("node {version} ({name}): {}", failures.join("; ")))
}
