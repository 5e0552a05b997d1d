//! Threads that exit while sampled: `hostprof record` on the writer's
//! `--churn` mode (tests/programs/otel_thread_ctx.c), short-lived threads
//! two at a time, each exiting with a span attached. A sample of a thread
//! past `exit_mm` in `do_exit` finds its user memory gone: the kernel
//! must count that read as `trace_exited`, apart from the reads that
//! should have worked (`trace_read_fault`), which must stay at 0 here,
//! and the threads' samples before their exit must carry their link.
mod common;

use std::{process::Stdio, time::Duration};

/// CPU seconds of the writer before it is stopped: about 6,000 samples at
/// 999 Hz, of which a few percent land in the threads' exits.
const CPU_SECONDS: f64 = 3.0;
const MIN_LINKED: u64 = 100;

/// The figures of record's line "trace context: L samples linked to a
/// span, D with none attached, F reads failed, E unread in exiting
/// threads": (L, F, E).
fn trace_counts(log: &str) -> Option<(u64, u64, u64)> {
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
    Some((
        number_before(" samples linked")?,
        number_before(" reads failed")?,
        number_before(" unread in exiting threads")?,
    ))
}

#[test]
fn reads_of_exiting_threads_are_counted_apart() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let writer = common::build_otel_writer();
    let stop = common::work_dir().join("churn.stop");
    let _ = std::fs::remove_file(&stop);
    let out = common::work_dir().join("churn.folded");
    let recording = common::hostprof()
        .args(["record", "-F", "999", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&writer)
        .arg("--churn")
        .arg(&stop)
        .arg("600")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hostprof record");
    // The writer, once record's child has executed it (before, the child
    // is still a copy of hostprof).
    let started = std::time::Instant::now();
    let pid = loop {
        let child = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", recording.id()))
            .ok()
            .and_then(|children| children.split_whitespace().next()?.parse::<u32>().ok());
        let exe = child.and_then(|child| std::fs::read_link(format!("/proc/{child}/exe")).ok());
        if let (Some(child), Some(exe)) = (child, exe)
            && exe
                .file_name()
                .is_some_and(|name| name == "otel_thread_ctx")
        {
            break child;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "record never started the writer"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Then its CPU time, not a time: a loaded machine only makes this
    // slower.
    while common::try_cpu_seconds(pid).is_some_and(|seconds| seconds < CPU_SECONDS) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&stop, b"").unwrap();
    let output = recording.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "record failed:\n{log}");
    let (linked, failed, exited) =
        trace_counts(&log).unwrap_or_else(|| panic!("no trace context line in:\n{log}"));
    println!("{linked} linked, {failed} reads failed, {exited} unread in exiting threads");
    assert!(linked >= MIN_LINKED, "{linked} linked samples:\n{log}");
    assert_eq!(failed, 0, "reads failed in live threads:\n{log}");
    assert!(
        exited > 0,
        "no sample of an exiting thread was told apart:\n{log}"
    );
}

#[test]
fn the_trace_line_is_read_back() {
    let line = "hostprof: trace context: 412 samples linked to a span, 30 with none attached, \
                2 reads failed, 17 unread in exiting threads";
    assert_eq!(trace_counts(line), Some((412, 2, 17)));
}
