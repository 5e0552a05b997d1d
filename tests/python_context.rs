//! A Python thread deep in its own frames, with an OpenTelemetry span
//! attached (OTEP 4947, written by `tests/programs/otel_span_lib.c`, which
//! `tests/programs/deep_span.py` loads with ctypes): its samples carry
//! 127 runtime frames, so the record's used part ends where its link and
//! attributes sit, and the sampler moves a long attribute through its
//! scratch rather than over itself. `record` writes OTLP; the file is
//! decoded here with the generated protobuf types alone.
mod common;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use common::{
    collector::{sample_functions, text_attribute},
    running::{interrupt, record_pid, wait_for_cpu},
    *,
};
use hostprof_proto::{
    Message,
    profiles::{ProfilesData, ProfilesDictionary, Sample},
};

/// The span `otel_span_attach` writes.
const TRACE: &str = "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf";
const SPAN: &str = "b0b1b2b3b4b5b6b7";
/// An `http.route` longer than the attribute bytes read with the record.
const ROUTE: &str = "/catalog/departments/garden-and-outdoor/categories/watering-equipment/\
                     products/oscillating-sprinkler-with-sixteen-nozzles/reviews/most-helpful";
/// `descend` frames that make a sample deep: its runtime frames then
/// reach past where a long attribute's copy would overlap itself.
const DEEP: usize = 100;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// One sample: how many `descend` frames, its link, its `http.route`.
struct Seen {
    depth: usize,
    link: Option<(String, String)>,
    route: Option<String>,
}

fn depth_of(dictionary: &ProfilesDictionary, sample: &Sample) -> usize {
    sample_functions(dictionary, sample)
        .iter()
        .filter(|name| *name == "descend")
        .count()
}

fn decode(path: &Path) -> Vec<Seen> {
    let data = ProfilesData::decode(&*std::fs::read(path).expect("read the OTLP file"))
        .expect("an OTLP file");
    let dictionary = data.dictionary.as_ref().expect("a dictionary");
    let mut seen = Vec::new();
    for resource in &data.resource_profiles {
        for scope in &resource.scope_profiles {
            for profile in &scope.profiles {
                for sample in &profile.samples {
                    let link = (sample.link_index != 0).then(|| {
                        let link = &dictionary.link_table[sample.link_index as usize];
                        (hex(&link.trace_id), hex(&link.span_id))
                    });
                    for _ in 0..sample.timestamps_unix_nano.len().max(1) {
                        seen.push(Seen {
                            depth: depth_of(dictionary, sample),
                            link: link.clone(),
                            route: text_attribute(dictionary, sample, "http.route"),
                        });
                    }
                }
            }
        }
    }
    seen
}

/// What `deep_span.py` prints, line by line.
type Said = std::io::Lines<std::io::BufReader<std::process::ChildStdout>>;

/// Its next line.
fn next_line(said: &mut Said) -> String {
    said.next().and_then(Result::ok).unwrap_or_default()
}

/// Builds the span library (with `cflags`) in `name`'s directory and
/// starts `deep_span.py` with it (and `extra`), once it printed `first`.
fn start_python(
    name: &str,
    cflags: &[&str],
    extra: &[&str],
    first: &str,
) -> (running::KillOnDrop, Said, PathBuf) {
    let dir = work_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let library = dir.join("libotel_span.so");
    run_ok(
        std::process::Command::new("cc")
            .args(["-O1", "-Wall", "-shared", "-fPIC"])
            .args(cflags)
            .arg("-o")
            .arg(&library)
            .arg(program_source("otel_span_lib.c")),
    );
    let mut python = std::process::Command::new("python3")
        .arg(program_source("deep_span.py"))
        .arg(&library)
        .args(["60", ROUTE])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start python3");
    let stdout = python.stdout.take().expect("its stdout");
    let python = running::KillOnDrop(python);
    let mut said = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    assert_eq!(next_line(&mut said), first, "deep_span.py's first line");
    (python, said, dir)
}

/// The deep samples of `recording` and how many of them are linked.
fn deep_samples(recording: &Path) -> (Vec<Seen>, usize) {
    let samples = decode(recording);
    let all = samples.len();
    let deep: Vec<Seen> = samples
        .into_iter()
        .filter(|seen| seen.depth >= DEEP)
        .collect();
    let linked = deep.iter().filter(|seen| seen.link.is_some()).count();
    println!(
        "{all} samples, {} with at least {DEEP} descend frames, {linked} of them linked",
        deep.len()
    );
    (deep, linked)
}

/// Checks the deep samples of `recording`: each linked one carries the
/// span and `route`, and at least 100 are linked.
fn check_deep_links(recording: &Path, route: Option<&str>) {
    let (deep, linked) = deep_samples(recording);
    // Before the agent has found the variable, samples are unlinked; once
    // linked, always right.
    for seen in &deep {
        if let Some((trace, span)) = &seen.link {
            assert_eq!((trace.as_str(), span.as_str()), (TRACE, SPAN));
            assert_eq!(seen.route.as_deref(), route, "a deep sample's route");
        }
    }
    assert!(linked >= 100, "{linked} linked deep samples");
}

/// Records `deep_span.py` (its library built with `cflags`) from when its
/// span is attached, for `seconds` of its CPU however long a loaded
/// machine takes to give them: the recording and `record`'s stderr, or
/// `None` when skipped (no eBPF or no python3, outside CI).
fn record_attached(name: &str, cflags: &[&str], seconds: f64) -> Option<(PathBuf, String)> {
    let _serial = require_ebpf()?;
    if !require_tool("python3") {
        return None;
    }
    let (python, _said, dir) = start_python(name, cflags, &[], "attached");
    let pid = python.0.id();
    let recording = dir.join("attached.otlp.pb");
    let (mut record, mut stderr) = record_pid(pid, "499", &recording);
    let enough = wait_for_cpu(pid, seconds, Duration::from_secs(120));
    assert!(interrupt(&mut record).success(), "hostprof record failed");
    assert_eq!(enough, Some(true), "python3 ran");
    drop(python);
    Some((recording, stderr.finish()))
}

#[test]
fn a_deep_python_thread_keeps_its_span_and_long_attribute() {
    // The late load is the next test's.
    if let Some((recording, _)) = record_attached("python_context", &[], 5.0) {
        check_deep_links(&recording, Some(ROUTE));
    }
}

/// A service that loads its SDK's library after the agent first read its
/// maps, and whose samples never land in that library (they are all in
/// the interpreter): the agent finds the thread context's variable once
/// a later look at the process (the search for its process context, with
/// backoff) reads maps that hold the library. `flags`: deep_span.py's
/// besides `--late`. The recording, or `None` when skipped (no eBPF or
/// no python3, outside CI).
fn loaded_late(name: &str, flags: &[&str]) -> Option<PathBuf> {
    let _serial = require_ebpf()?;
    if !require_tool("python3") {
        return None;
    }
    let flags: Vec<&str> = ["--late"].iter().chain(flags).copied().collect();
    let (python, mut said, dir) = start_python(name, &[], &flags, "waiting");
    let pid = python.0.id();
    let recording = dir.join("late.otlp.pb");
    let (mut record, _stderr) = record_pid(pid, "499", &recording);
    // Its samples have come, and the agent has read its maps, without the
    // library.
    let limit = Duration::from_secs(120);
    assert_eq!(wait_for_cpu(pid, 1.0, limit), Some(true), "python3 ran");
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGUSR1) }, 0);
    assert_eq!(next_line(&mut said), "attached", "deep_span.py woke");
    // The maps are searched 2 s after the first read, then 4 s later:
    // time enough to find the library twice over.
    assert_eq!(wait_for_cpu(pid, 7.0, limit), Some(true), "python3 ran");
    assert!(interrupt(&mut record).success(), "hostprof record failed");
    Some(recording)
}

#[test]
fn a_span_library_loaded_after_the_first_look_is_found() {
    if let Some(recording) = loaded_late("python_context_late", &[]) {
        check_deep_links(&recording, Some(ROUTE));
    }
}

/// The same without a process context: nothing names the route (the key
/// map is the context's), but the samples are linked.
#[test]
fn a_span_library_without_a_process_context_loaded_late_is_found() {
    if let Some(recording) = loaded_late("python_context_late_bare", &["--no-context"]) {
        check_deep_links(&recording, None);
    }
}

/// A service whose SDK published its process context at start and loads
/// the library with the thread context's variable later: the agent keeps
/// searching the maps of a process with a context (with backoff) and
/// finds the library; the route is named by the context's key map.
#[test]
fn a_span_library_loaded_after_the_process_context_is_found() {
    let dir = work_dir().join("python_context_late_after_context");
    std::fs::create_dir_all(&dir).unwrap();
    let context_only = dir.join("libotel_context_only.so");
    run_ok(
        std::process::Command::new("cc")
            .args(["-O1", "-Wall", "-shared", "-fPIC", "-DCONTEXT_ONLY", "-o"])
            .arg(&context_only)
            .arg(program_source("otel_span_lib.c")),
    );
    let flags = ["--context-from", context_only.to_str().unwrap()];
    if let Some(recording) = loaded_late("python_context_late_after_context_run", &flags) {
        check_deep_links(&recording, Some(ROUTE));
    }
}

/// A process context naming another `threadlocal.schema_version` than the
/// OTEP's (here a later `tls_v2`): its threads' records are not the
/// format hostprof reads, so no sample is linked or given attributes,
/// the kernel stops reading them once the context is known, and `record`
/// says why.
#[test]
fn records_of_a_schema_hostprof_does_not_read_are_not_used() {
    let cflags = ["-DSCHEMA=\"tls_v2\""];
    let Some((recording, said)) = record_attached("python_context_schema", &cflags, 2.0) else {
        return;
    };
    let (deep, linked) = deep_samples(&recording);
    assert!(deep.len() >= 100, "{} deep samples", deep.len());
    assert_eq!(linked, 0, "records of schema tls_v2 were used");
    assert!(deep.iter().all(|seen| seen.route.is_none()));
    // The kernel read records only until the context was known (its own
    // count: "trace context: N samples linked to a span, …"), and each it
    // read is counted as refused.
    let read = said
        .lines()
        .find_map(|line| line.strip_prefix("hostprof: trace context: "))
        .and_then(|line| line.split_once(' '))
        .and_then(|(count, _)| count.parse::<usize>().ok())
        .unwrap_or(0);
    let refused = said
        .lines()
        .find_map(|line| line.strip_prefix("hostprof: trace context refused: "))
        .and_then(|reasons| reasons.split(", ").find_map(|r| r.strip_prefix("schema ")))
        .and_then(|count| count.parse::<usize>().ok())
        .unwrap_or(0);
    eprintln!(
        "{} deep samples; the kernel read {read} records, {refused} refused",
        deep.len()
    );
    assert!(
        read * 4 <= deep.len(),
        "the kernel kept reading records of schema tls_v2: {read} of {} samples\n{said}",
        deep.len()
    );
    assert!(
        refused >= read,
        "record does not count the {read} records refused:\n{said}"
    );
}
