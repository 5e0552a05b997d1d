//! What the runtime rows (Java, Node) share: a program that reports on its
//! stdout (`warm`, then its throughput), and the table of its throughput
//! with and without profilers.
use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// A benchmarked program, its stdout read to the end on a thread (so it
/// never blocks on the pipe); killed if dropped while running.
pub(super) struct Program {
    pub(super) child: Child,
    lines: mpsc::Receiver<String>,
}

impl Program {
    /// Starts `command` with its stdout piped, and waits for the line
    /// `warm` picks.
    pub(super) fn start(command: &mut Command, warm: impl Fn(&str) -> bool) -> Result<Program> {
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {:?}", command.get_program()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let program = Program { child, lines };
        program
            .wait_for(warm, Duration::from_secs(120))
            .context("the program never printed that it is warm")?;
        Ok(program)
    }

    /// The line `matches` picks, within `limit`.
    pub(super) fn wait_for(
        &self,
        matches: impl Fn(&str) -> bool,
        limit: Duration,
    ) -> Result<String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left)?;
            if matches(&line) {
                return Ok(line);
            }
        }
    }

    /// Waits for the line `matches` picks, then for a successful exit.
    pub(super) fn finish(mut self, matches: impl Fn(&str) -> bool) -> Result<String> {
        let line = self.wait_for(matches, Duration::from_secs(300));
        let status = self.child.wait()?;
        let line = line.context("the program printed no throughput")?;
        if !status.success() {
            bail!("the program failed ({status})");
        }
        Ok(line)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // Only a program abandoned on an error is still running here.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The program's rounds once warm, per second and per CPU second of its.
#[derive(Clone, Copy)]
pub(super) struct Throughput {
    pub(super) per_second: f64,
    pub(super) per_cpu_second: f64,
}

/// The throughput table: each run's rate and slowdown against `baseline`
/// (the first line, `no profiler`), with its profiler's samples.
pub(super) fn print_throughput(
    title: &str,
    baseline: Throughput,
    runs: &[(&str, Throughput, Option<u64>)],
) {
    println!(
        "{:<48} {:>9} {:>9} {:>13} {:>9} {:>8}",
        title, "rounds/s", "slowdown", "rounds/CPU s", "slowdown", "samples"
    );
    let slowdown = |base: f64, with: f64| base / with.max(f64::MIN_POSITIVE);
    for (name, rate, samples) in [("no profiler", baseline, None)].iter().chain(runs) {
        let samples = samples.map_or("-".to_string(), |n| n.to_string());
        println!(
            "{name:<48} {:>9.1} {:>8.3}x {:>13.1} {:>8.3}x {samples:>8}",
            rate.per_second,
            slowdown(baseline.per_second, rate.per_second),
            rate.per_cpu_second,
            slowdown(baseline.per_cpu_second, rate.per_cpu_second),
        );
    }
}

/// The samples of folded `stacks` (`frames COUNT` lines) with a frame
/// `is_runtime` picks (a `;`-separated label).
pub(super) fn samples_with(folded: &str, is_runtime: impl Fn(&str) -> bool) -> u64 {
    folded
        .lines()
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(stack, _)| stack.split(';').any(&is_runtime))
        .filter_map(|(_, count)| count.parse::<u64>().ok())
        .sum()
}

/// The host's load averages (1, 5, 15 min), for the row's heading.
pub(super) fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
