//! Process tracking from the kernel's fork, exec and exit events, on real
//! programs and the real eBPF sampler.
mod common;

use common::*;

/// Two builds of one program that differ only in the name of their hot
/// function (same length, so same layout and addresses: non-PIE, both at
/// the same place), named `old` and `new` for their comm.
fn twin_programs() -> (std::path::PathBuf, std::path::PathBuf) {
    let build = |hot: &str, name: &str| {
        build_c(
            "replaced.c",
            name,
            &["-O1", "-g", "-no-pie", "-fno-pie", &format!("-DHOT={hot}")],
        )
    };
    (
        build("old_image_work", "reuse_old"),
        build("new_image_work", "reuse_new"),
    )
}

#[test]
fn a_reused_pid_gets_the_new_programs_names() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let (old, new) = twin_programs();
    let reuse = build_c("pid_reuse.c", "pid_reuse", &["-O1"]);
    let output = run_ok(hostprof().args([
        "record",
        "-F",
        "499",
        "-o",
        "-",
        "--",
        reuse.to_str().unwrap(),
        old.to_str().unwrap(),
        new.to_str().unwrap(),
        "0.8",
    ]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(" reused"),
        "the pid was not reused:\n{stderr}"
    );
    let stacks = parse_folded(&String::from_utf8_lossy(&output.stdout));
    for (comm, hot, other) in [
        ("reuse_old", "old_image_work", "new_image_work"),
        ("reuse_new", "new_image_work", "old_image_work"),
    ] {
        let share = leaf_share(&stacks, comm, hot);
        assert!(share > 0.9, "{comm}: {share} of its samples in {hot}");
        let wrong: u64 = stacks
            .iter()
            .filter(|(frames, _)| frames[0] == comm && frames.iter().any(|f| f == other))
            .map(|(_, count)| count)
            .sum();
        assert_eq!(wrong, 0, "{comm} has samples named after {other}");
    }
}

/// The bytes of `data`, gunzipped when gzip.
fn plain(data: Vec<u8>) -> Vec<u8> {
    if data.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&*data), &mut out)
            .expect("gunzip");
        out
    } else {
        data
    }
}

#[test]
fn early_stack_copies_never_reach_an_output() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = build_c("stack_marker.c", "stack_marker", &["-O2", "-g"]);
    // The secret is the seed shifted by one byte value: in no argument.
    let seed = format!("GNRSOQNE@RDBQDS{}", std::process::id());
    let secret: Vec<u8> = seed.bytes().map(|b| b + 1).collect();
    let mut early = 0u64;
    for format in ["folded", "svg", "pprof", "otlp", "otlp-json"] {
        let out = work_dir().join(format!("marker.{format}"));
        let output = run_ok(hostprof().args([
            "record",
            "-F",
            "999",
            "--format",
            format,
            "-o",
            out.to_str().unwrap(),
            "--",
            program.to_str().unwrap(),
            &seed,
            "0.5",
        ]));
        let stderr = String::from_utf8_lossy(&output.stderr);
        early += stderr
            .split("were loaded): ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let bytes = plain(std::fs::read(&out).expect("the output file"));
        assert!(!bytes.is_empty(), "{format}: empty output");
        assert!(
            !bytes.windows(secret.len()).any(|window| window == secret),
            "{format}: the stack's secret is in the output"
        );
        assert!(
            !stderr.as_bytes().windows(secret.len()).any(|w| w == secret),
            "{format}: the stack's secret is on stderr"
        );
    }
    // The copies existed (and were unwound): the check above saw their path.
    assert!(early > 0, "no early sample was unwound from a stack copy");
    // Control: the copies do hold the secret. Only --stack-copy-dir, asked
    // for explicitly, writes them (raw snapshots for replay tests).
    let dir = work_dir().join("marker-snapshots");
    let _ = std::fs::remove_dir_all(&dir);
    run_ok(hostprof().args([
        "record",
        "-F",
        "999",
        "--stack-copy",
        "16384",
        "--stack-copy-dir",
        dir.to_str().unwrap(),
        "-o",
        work_dir().join("marker-control.folded").to_str().unwrap(),
        "--",
        program.to_str().unwrap(),
        &seed,
        "0.3",
    ]));
    let found = std::fs::read_dir(&dir).unwrap().any(|entry| {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        bytes.windows(secret.len()).any(|window| window == secret)
    });
    assert!(
        found,
        "the stack copies do not hold the secret: the test proves nothing"
    );
}

/// Share of `stacks` ending in one of `leaves` that pass through `main`,
/// and their count.
fn main_share(stacks: &[(Vec<String>, u64)], leaves: &[&str]) -> (f64, u64) {
    let (mut total, mut with_main) = (0, 0);
    for (frames, count) in stacks {
        if frames
            .last()
            .is_some_and(|leaf| leaves.contains(&leaf.as_str()))
        {
            total += count;
            if frames.iter().any(|frame| frame == "main") {
                with_main += count;
            }
        }
    }
    (with_main as f64 / total.max(1) as f64, total)
}

#[test]
fn stacks_reach_main_from_a_new_processs_first_samples() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    // No frame pointers: only tables (in the kernel or, before they are
    // loaded, on the host from stack copies) find main.
    let program = build_c(
        "unwind_c.c",
        "early_unwind_c",
        &["-O2", "-fomit-frame-pointer", "-g"],
    );
    let mut stacks = Vec::new();
    let mut early = 0u64;
    // Whole lives of 200 ms: every sample is from a process's first 200 ms.
    for _ in 0..4 {
        let output = run_ok(hostprof().args([
            "record",
            "-F",
            "999",
            "-o",
            "-",
            "--",
            program.to_str().unwrap(),
            "split",
            "0.2",
        ]));
        let stderr = String::from_utf8_lossy(&output.stderr);
        early += stderr
            .split("were loaded): ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        stacks.extend(parse_folded(&String::from_utf8_lossy(&output.stdout)));
    }
    let (share, samples) = main_share(&stacks, &["hot_work", "cold_work"]);
    eprintln!(
        "{share:.3} of {samples} stacks reach main; {early} early samples unwound on the host"
    );
    assert!(
        samples >= MIN_SHARE_SAMPLES,
        "only {samples} samples in the workers"
    );
    assert!(
        share >= 0.99,
        "{share:.3} of {samples} stacks reach main ({early} early samples unwound on the host)"
    );
}
