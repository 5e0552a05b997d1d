//! Threads whose memory a sample cannot read, told apart from the reads
//! that should have worked (`trace_read_fault`, which must stay at 0
//! here):
//! - threads that exit while sampled: `hostprof record` on the writer's
//!   `--churn` mode (tests/programs/otel_thread_ctx.c), short-lived
//!   threads two at a time, each exiting with a span attached. A sample
//!   of a thread past `exit_mm` in `do_exit` finds its user memory gone:
//!   the kernel must count that read as `trace_exited`, and the threads'
//!   samples before their exit must carry their link;
//! - a thread with no thread pointer yet, as every thread of a process
//!   just executed runs before its loader sets the TLS up (`--no-tls`):
//!   no context attached, not a failed read.
mod common;

use std::{process::Stdio, time::Duration};

/// CPU seconds of the writer before it is stopped: about 6,000 samples at
/// 999 Hz, of which a few percent land in the threads' exits.
const CPU_SECONDS: f64 = 3.0;
const MIN_LINKED: u64 = 100;

/// The figures of record's line "trace context: L samples linked to a
/// span, D with none attached, F reads failed, E unread in exiting
/// threads".
#[derive(Debug, PartialEq)]
struct Counts {
    linked: u64,
    none: u64,
    failed: u64,
    exited: u64,
}

fn trace_counts(log: &str) -> Option<Counts> {
    let line = log
        .lines()
        .find_map(|line| line.strip_prefix("hostprof: trace context: "))?;
    let number_before = |marker: &str| -> Option<u64> {
        line.split_once(marker)?
            .0
            .rsplit([' ', ','])
            .find(|word| !word.is_empty())?
            .parse()
            .ok()
    };
    Some(Counts {
        linked: number_before(" samples linked")?,
        none: number_before(" with none attached")?,
        failed: number_before(" reads failed")?,
        exited: number_before(" unread in exiting threads")?,
    })
}

/// Records the writer in `mode` (with its STOP file, then `args`) until
/// it has used `cpu_seconds`, then stops it; returns the trace context
/// figures and record's log.
fn record_writer(mode: &str, args: &[&str], cpu_seconds: f64) -> (Counts, String) {
    let writer = common::build_otel_writer();
    let name = mode.trim_start_matches('-');
    let stop = common::work_dir().join(format!("{name}.stop"));
    let _ = std::fs::remove_file(&stop);
    let out = common::work_dir().join(format!("{name}.folded"));
    let recording = common::hostprof()
        .args(["record", "-F", "999", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&writer)
        .arg(mode)
        .arg(&stop)
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hostprof record");
    // The writer, once record's child has executed it (before, the child
    // is still a copy of hostprof).
    let started = std::time::Instant::now();
    let pid = loop {
        if let Some(pid) = common::try_descendant_running(recording.id(), "otel_thread_ctx") {
            break pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "record never started the writer"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Then its CPU time, not a time: a loaded machine only makes this
    // slower.
    while common::try_cpu_seconds(pid).is_some_and(|seconds| seconds < cpu_seconds) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&stop, b"").unwrap();
    let output = recording.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "record failed:\n{log}");
    let counts = trace_counts(&log).unwrap_or_else(|| panic!("no trace context line in:\n{log}"));
    println!("{counts:?}");
    (counts, log)
}

#[test]
fn reads_of_exiting_threads_are_counted_apart() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let (counts, log) = record_writer("--churn", &["600"], CPU_SECONDS);
    assert!(counts.linked >= MIN_LINKED, "{counts:?}:\n{log}");
    assert_eq!(counts.failed, 0, "reads failed in live threads:\n{log}");
    assert!(
        counts.exited > 0,
        "no sample of an exiting thread was told apart:\n{log}"
    );
}

#[test]
fn threads_without_a_thread_pointer_have_no_context() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    // About 1,000 samples of the thread at 999 Hz.
    let (counts, log) = record_writer("--no-tls", &[], 1.0);
    assert!(
        counts.none >= MIN_LINKED,
        "the thread's samples were not counted as having no context: {counts:?}:\n{log}"
    );
    assert_eq!(counts.failed, 0, "reads failed in a live thread:\n{log}");
}

#[test]
fn the_trace_line_is_read_back() {
    let line = "hostprof: trace context: 412 samples linked to a span, 30 with none attached, \
                2 reads failed, 17 unread in exiting threads";
    assert_eq!(
        trace_counts(line),
        Some(Counts {
            linked: 412,
            none: 30,
            failed: 2,
            exited: 17
        })
    );
}
