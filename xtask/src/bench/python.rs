//! Issue 16: the cost of Python frames — hostprof on a Python program next
//! to py-spy on the same program, one after the other.
use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::{Row, bench_hostprof_with, print_rows, wait_usage};
use crate::root;

pub(super) fn bench_python(hostprof: &Path, dir: &Path, seconds: u64) -> Result<()> {
    let program = root().join("tests/programs/python_callgraph.py");
    let mut child = Command::new("python3")
        .arg(&program)
        .arg((2 * seconds + 10).to_string())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start python3")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("no stdout")?).read_line(&mut line)?;
    if line.trim() != "ready" {
        bail!("the Python program did not start");
    }
    let pid = child.id().to_string();
    let measured = measure(hostprof, dir, seconds, &pid);
    let _ = child.kill();
    let _ = child.wait();
    let (ours, python_stacks, theirs) = measured?;
    println!(
        "python: tests/programs/python_callgraph.py under python3 (3 threads), {seconds} s at 999 Hz each"
    );
    print_rows(28, &[&ours, &theirs]);
    println!(
        "hostprof samples with Python frames: {python_stacks}; CPU per 1k samples, hostprof / py-spy: {:.2}",
        ours.cpu_per_1k() / theirs.cpu_per_1k().max(f64::MIN_POSITIVE)
    );
    Ok(())
}

/// hostprof's row and its samples with Python frames, then py-spy's row.
fn measure(hostprof: &Path, dir: &Path, seconds: u64, pid: &str) -> Result<(Row, u64, Row)> {
    let (ours, _) = bench_hostprof_with(
        hostprof,
        dir,
        seconds,
        "hostprof record -p (Python)",
        &["-p", pid],
    )?;
    let folded = std::fs::read_to_string(dir.join("hostprof.folded"))?;
    let python_stacks = folded
        .lines()
        .filter(|line| line.contains(".py:"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    let raw = dir.join("py-spy.txt");
    let child = Command::new("py-spy")
        .args([
            "record",
            "--nonblocking",
            "--gil",
            "--format",
            "raw",
            "--rate",
            "999",
        ])
        .args(["--duration", &seconds.to_string(), "--pid", pid, "--output"])
        .arg(&raw)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start py-spy (cargo xtask setup installs it)")?;
    let usage = wait_usage(child)?;
    let samples = std::fs::read_to_string(&raw)?
        .lines()
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    Ok((
        ours,
        python_stacks,
        Row {
            name: "py-spy record --nonblocking",
            samples,
            usage,
            kernel_ns_per_sample: None,
        },
    ))
}
