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

/// Functions of the filler a large binary is built with: 12,000 of them,
/// about 400 KiB of CFI, past the size from which host-wide sessions build
/// tables for the code that runs (256 KiB).
const FILLER_FUNCTIONS: usize = 12_000;

/// Assembly of [`FILLER_FUNCTIONS`] small functions with CFI, none called.
fn filler_asm() -> std::path::PathBuf {
    use std::fmt::Write as _;
    let mut asm = String::from(".text\n");
    for i in 0..FILLER_FUNCTIONS {
        let size = 16 + (i % 8) * 8;
        let _ = writeln!(
            asm,
            ".globl filler{i}\n.type filler{i},@function\nfiller{i}:\n.cfi_startproc\n\
             sub ${size}, %rsp\n.cfi_adjust_cfa_offset {size}\nadd ${size}, %rsp\n\
             .cfi_adjust_cfa_offset -{size}\nret\n.cfi_endproc\n.size filler{i},.-filler{i}"
        );
    }
    asm.push_str(".section .note.GNU-stack,\"\",@progbits\n");
    let path = work_dir().join("capacity_filler.s");
    std::fs::write(&path, asm).expect("write the filler");
    path
}

/// Issue 31: a host-wide recording builds a large binary's table for the
/// code that runs, and its stacks still reach `main`: two FP-less programs
/// with 12,000 functions each, one dynamic (its functions found through
/// `.eh_frame_hdr`) and one static (no such header: a scan of the FDEs).
#[test]
#[cfg(target_arch = "x86_64")]
fn a_large_binarys_table_holds_the_code_that_runs_and_its_stacks_are_whole() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let filler = filler_asm();
    let filler = filler.to_str().expect("a UTF-8 path");
    let flags = ["-O2", "-fomit-frame-pointer", filler];
    let dynamic = build_c("unwind_c.c", "cap_big_dynamic", &flags);
    let mut static_flags = flags.to_vec();
    static_flags.push("-static");
    let fixed = build_c("unwind_c.c", "cap_big_static", &static_flags);
    let programs: Vec<common::running::KillOnDrop> = [&dynamic, &fixed]
        .iter()
        .map(|program| {
            common::running::KillOnDrop(
                std::process::Command::new(program)
                    .args(["split", "600"])
                    .spawn()
                    .expect("start the program"),
            )
        })
        .collect();
    let output = work_dir().join("capacity_large.folded");
    let (mut record, stderr) =
        start_recording(hostprof().args(["record", "-F", "999", "-o"]).arg(&output));
    // Four seconds of each program's CPU under the recording, however long
    // a loaded machine takes to give it.
    for program in &programs {
        let ran = common::running::wait_for_cpu(program.0.id(), 4.0, Duration::from_secs(120));
        assert_eq!(ran, Some(true), "the program ran under the recording");
    }
    let status = common::running::interrupt(&mut record);
    let mut stderr = stderr;
    let text = stderr.finish();
    assert!(status.success(), "record failed:\n{text}");
    drop(programs);
    let summary: String = text
        .lines()
        .filter(|line| line.starts_with("hostprof: "))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("{summary}");
    let sparse = number_before(&summary, " for the code that runs")
        .unwrap_or_else(|| panic!("no tables line:\n{summary}"));
    assert!(
        sparse >= 2,
        "both programs' tables are for the code that runs:\n{summary}"
    );
    let folded = std::fs::read_to_string(&output).expect("output");
    let stacks = parse_folded(&folded);
    for name in ["cap_big_dynamic", "cap_big_static"] {
        let of_program = stacks.iter().filter(|(frames, _)| frames[0] == name);
        let total: u64 = of_program.clone().map(|(_, count)| count).sum();
        let reaching_main: u64 = of_program
            .filter(|(frames, _)| {
                frames.iter().any(|frame| frame == "main")
                    && frames.iter().any(|frame| frame == "run_split")
            })
            .map(|(_, count)| count)
            .sum();
        eprintln!("{name}: {reaching_main} of {total} samples reach main");
        assert!(total >= 100, "only {total} samples of {name}\n{summary}");
        // The first walks stop where a function is not loaded yet (a round
        // trip to hostprof per new function on the stack); their stack
        // copies are walked again on the host once it is.
        assert!(
            reaching_main as f64 >= 0.95 * total as f64,
            "{reaching_main} of {total} samples of {name} reach main\n{summary}"
        );
    }
}
