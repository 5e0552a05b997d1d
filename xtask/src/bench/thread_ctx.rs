//! Issue 30, item 7: what reading the OpenTelemetry thread context costs
//! the eBPF sampler. The same writer (`tests/programs/otel_thread_ctx.c`:
//! threads switching spans, each with attributes) is profiled twice, with
//! `otel_thread_ctx_v1` exported (the agent finds it, the kernel reads the
//! record and its attributes at each sample of the process) and without
//! (the agent cannot find it: no read), one after the other.
use std::{
    path::Path,
    process::{Child, Command},
};

use anyhow::Result;

use super::{Row, bench_hostprof_with, print_rows};
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
         every 12 ms), profiled with -p; {seconds} s at 999 Hz each"
    );
    let present = measure(hostprof, dir, seconds, &with, "hostprof, context read")?;
    let absent = measure(hostprof, dir, seconds, &without, "hostprof, no context")?;
    print_rows(28, &[&present, &absent]);
    if let (Some(present), Some(absent)) =
        (present.kernel_ns_per_sample, absent.kernel_ns_per_sample)
    {
        println!(
            "eBPF ns per run, context present minus absent: {:.0}",
            present - absent
        );
    }
    Ok(())
}

/// hostprof's row on `writer`, run for longer than the recording.
fn measure(
    hostprof: &Path,
    dir: &Path,
    seconds: u64,
    writer: &Path,
    name: &'static str,
) -> Result<Row> {
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
    Ok(measured?.0)
}
