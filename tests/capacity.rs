//! No capacity cliffs (issue 15): more processes than the kernel's unwind
//! maps hold, each with many executable mappings, next to a known workload.
//! The real eBPF sampler, host-wide.
mod common;

use std::{
    io::{BufRead, BufReader, Write},
    process::Stdio,
    time::Duration,
};

use common::{running::start_recording, *};

/// Processes of the flood, and executable mappings each (the kernel keeps
/// `hostprof_common::MAX_UNWIND_PROCESSES` = 1024 processes).
const PROCESSES: &str = "2000";
const MAPPINGS: &str = "100";
/// CPU each flood process burns: about two samples each at 999 Hz, enough
/// for well over 1024 of them to ask for their tables.
const SPIN_MS: &str = "2";

/// What the loader logs (debug) when a process does not fit.
const DEGRADED_LINE: &str = "left to frame pointers: the kernel's unwind maps are full";

/// The number right before `marker` in `text`.
fn number_before(text: &str, marker: &str) -> Option<u64> {
    let end = text.find(marker)?;
    let digits: String = text[..end]
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.chars().rev().collect::<String>().parse().ok()
}

/// Peak resident memory of a running process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .expect("VmHWM")
}

#[test]
fn thousands_of_processes_degrade_to_frame_pointers_without_a_reload_loop() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let workload = build_c(
        "unwind_c.c",
        "cap_workload",
        &["-O2", "-fomit-frame-pointer", "-g"],
    );
    let flood = build_c("many_maps.c", "capacity_many_maps", &["-O2"]);

    // record runs the workload and the flood as its command (following
    // children as they fork). The flood's parent maps its code, says
    // "ready" and waits for a line before it forks: by then the
    // workload's tables are in the kernel.
    let script = format!(
        "{} split 60 & echo $!; exec {} {PROCESSES} {MAPPINGS} {SPIN_MS}",
        workload.display(),
        flood.display()
    );
    let (mut record, stderr) = start_recording(
        hostprof()
            .args(["record", "-F", "999", "--log-level", "debug", "-o"])
            .arg(work_dir().join("capacity.folded"))
            .args(["--", "sh", "-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    let mut flood_out = BufReader::new(record.stdout.take().expect("stdout piped"));
    let mut line = String::new();
    flood_out
        .read_line(&mut line)
        .expect("read the workload's pid");
    let busy: i32 = line.trim().parse().expect("the workload's pid");
    line.clear();
    flood_out
        .read_line(&mut line)
        .expect("read the flood's stdout");
    assert_eq!(line.trim(), "ready");
    let loaded = format!("pid {busy}: unwind tables loaded");
    let waited = common::running::wait_for(Duration::from_secs(30), || {
        stderr.text().contains(&loaded).then_some(())
    });
    assert!(waited.is_some(), "the workload's tables never loaded");
    let mut go = record.stdin.take().expect("stdin piped");
    go.write_all(b"go\n").expect("start the flood");
    line.clear();
    flood_out
        .read_line(&mut line)
        .expect("read the flood's stdout");
    assert_eq!(line.trim(), "spun", "every flood process burnt its CPU");
    // The loader has met the kernel maps' limit.
    let seen = common::running::wait_for(Duration::from_secs(30), || {
        stderr.text().contains(DEGRADED_LINE).then_some(())
    });
    let peak_kib = peak_rss_kib(record.id());

    // The flood ends its children and itself once its stdin closes; the
    // recording ends with the workload.
    drop(go);
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(busy, libc::SIGKILL) };
    let status = record.wait().expect("wait for record");
    let mut stderr = stderr;
    let text = stderr.finish();
    assert!(status.success(), "record failed:\n{text}");
    let summary: String = text
        .lines()
        .filter(|line| line.starts_with("hostprof: "))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("{summary}\nrecord's peak RSS: {} MiB", peak_kib / 1024);
    assert!(seen.is_some(), "the loader never met the limit:\n{summary}");

    // The workload kept its tables: its stacks reach main.
    let folded = std::fs::read_to_string(work_dir().join("capacity.folded")).expect("output");
    let stacks = parse_folded(&folded);
    let of_workload = stacks
        .iter()
        .filter(|(frames, _)| frames[0] == "cap_workload");
    let total: u64 = of_workload.clone().map(|(_, count)| count).sum();
    let complete: u64 = of_workload
        .filter(|(frames, _)| frames.iter().any(|frame| frame == "main"))
        .map(|(_, count)| count)
        .sum();
    assert!(
        total >= 100,
        "only {total} samples of the workload\n{summary}"
    );
    assert!(
        complete as f64 >= 0.95 * total as f64,
        "{complete} of {total} workload samples reach main\n{summary}"
    );

    // The processes that did not fit were counted, and nothing was
    // reloaded in a loop: at most a few loads per process (each backoff
    // doubles), however many samples asked.
    let degraded = number_before(&summary, " processes left to frame pointers")
        .unwrap_or_else(|| panic!("no capacity line:\n{summary}"));
    let loads = number_before(&summary, " process loads").expect("loads");
    assert!(
        degraded >= 1,
        "no process was left to frame pointers:\n{summary}"
    );
    assert!(
        loads <= 3 * 2000,
        "{loads} process loads for ~2000 processes: a reload loop\n{summary}"
    );
    // Bounded memory: the kernel maps are fixed, the agent's own share
    // stays that of a small process.
    assert!(
        peak_kib < 400 * 1024,
        "record peaked at {} MiB with 2000 processes",
        peak_kib / 1024
    );
}
