//! Issue 30, item 7: what reading the OpenTelemetry thread context costs
//! the eBPF sampler. The same writer (`tests/programs/otel_thread_ctx.c`:
//! threads switching spans, each with attributes) is profiled twice, with
//! `otel_thread_ctx_v1` exported (the agent finds it, the kernel reads the
//! record and its attributes at each sample of the process) and without
//! (the agent cannot find it: no read), one after the other. The goal is
//! judged on the context code's own clock (`record --bpf-stats` times it
//! in the program): the whole program's run time varies by more than the
//! context costs from one run to the next.
use std::{
    path::Path,
    process::{Child, Command},
};

use anyhow::Result;

use super::{Row, bench_hostprof_with, number_before_f64, print_rows};
use crate::{root, run_cmd};

pub(super) fn bench_thread_ctx(hostprof: &Path, dir: &Path, seconds: u64) -> Result<()> {
    let source = root().join("tests/programs/otel_thread_ctx.c");
    let build = |name: &str, export: bool| -> Result<std::path::PathBuf> {
        let out = dir.join(name);
        let mut cc = Command::new("cc");
        cc.args(["-O1", "-pthread", "-o"]).arg(&out).arg(&source);
        if export {
            cc.arg("-Wl,--export-dynamic-symbol=otel_thread_ctx_v1");
        }
        run_cmd(&mut cc)?;
        Ok(out)
    };
    let with = build("otel_thread_ctx", true)?;
    let without = build("otel_thread_ctx_hidden", false)?;
    println!(
        "thread context: tests/programs/otel_thread_ctx.c (3 threads, a span with 1-2 attributes \
         every 12 ms), profiled with -p; {seconds} s at 999 Hz each, {ROUNDS} rounds in \
         alternating order"
    );
    let mut rows = Vec::new();
    let mut whole = Vec::new();
    let mut per_sample = Vec::new();
    let mut per_linked = Vec::new();
    for round in 0..ROUNDS {
        let run = |present: bool| {
            let (writer, name) = if present {
                (&with, PRESENT[round])
            } else {
                (&without, ABSENT[round])
            };
            measure(hostprof, dir, seconds, writer, name)
        };
        // Alternating which goes first: drift in the machine's load or
        // clock falls on both sides, not on one (a single pair differed
        // by 0.5 to 3.8 µs from one run to the next).
        let (present, absent) = if round % 2 == 0 {
            let present = run(true)?;
            (present, run(false)?)
        } else {
            let absent = run(false)?;
            (run(true)?, absent)
        };
        if let (Some(present), Some(absent)) = (
            present.0.kernel_ns_per_sample,
            absent.0.kernel_ns_per_sample,
        ) {
            whole.push(present - absent);
        }
        if let (Some(present), Some(absent)) = (present.1, absent.1) {
            per_sample.push(present.per_sample - absent.per_sample);
            per_linked.push(present.per_linked - absent.per_sample);
        }
        rows.push(present.0);
        rows.push(absent.0);
    }
    print_rows(32, &rows.iter().collect::<Vec<_>>());
    for (what, mut differences) in [
        ("eBPF ns per run (the whole program's)", whole),
        (
            "thread-context code's ns per sample (its own clock)",
            per_sample,
        ),
        ("thread-context code's ns per linked sample", per_linked),
    ] {
        differences.sort_by(f64::total_cmp);
        if let Some(median) = differences.get(differences.len() / 2) {
            let each: Vec<String> = differences.iter().map(|ns| format!("{ns:.0}")).collect();
            println!(
                "{what}, context present minus absent: median {median:.0} (rounds: {})",
                each.join(", ")
            );
        }
    }
    Ok(())
}

/// Pairs measured: each with and without the context.
const ROUNDS: usize = 3;
const PRESENT: [&str; ROUNDS] = [
    "hostprof, context read (1)",
    "hostprof, context read (2)",
    "hostprof, context read (3)",
];
const ABSENT: [&str; ROUNDS] = [
    "hostprof, no context (1)",
    "hostprof, no context (2)",
    "hostprof, no context (3)",
];

/// What `record --bpf-stats` printed of the thread-context code's own
/// clock (`thread-context code: N samples, X ns per sample; M linked, Y ns
/// per linked sample`).
#[derive(Clone, Copy)]
struct ContextCost {
    per_sample: f64,
    per_linked: f64,
}

impl ContextCost {
    fn parse(text: &str) -> Option<Self> {
        let line = text
            .lines()
            .find(|line| line.contains("thread-context code:"))?;
        Some(Self {
            per_sample: number_before_f64(line, " ns per sample")?,
            per_linked: number_before_f64(line, " ns per linked sample").unwrap_or(0.0),
        })
    }
}

/// hostprof's row on `writer`, run for longer than the recording, with
/// the context code's cost.
fn measure(
    hostprof: &Path,
    dir: &Path,
    seconds: u64,
    writer: &Path,
    name: &'static str,
) -> Result<(Row, Option<ContextCost>)> {
    let log = dir.join("otel_thread_ctx.log");
    let stop = dir.join("otel_thread_ctx.stop");
    let _ = std::fs::remove_file(&stop);
    let child: Child = Command::new(writer)
        .arg(&log)
        .arg(&stop)
        .arg((seconds + 30).to_string())
        .spawn()?;
    let pid = child.id().to_string();
    let measured = bench_hostprof_with(hostprof, dir, seconds, name, &["-p", &pid]);
    std::fs::write(&stop, b"")?;
    super::wait_usage(child)?;
    let _ = std::fs::remove_file(&log);
    let (row, text) = measured?;
    Ok((row, ContextCost::parse(&text)))
}
