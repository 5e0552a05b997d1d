//! `cargo xtask fuzz`: run the libFuzzer targets in `fuzz/` (cargo-fuzz
//! layout) and report executions and crashes per target.
//!
//! A target is a file in `fuzz/fuzz_targets/` (plus its `[[bin]]` in
//! `fuzz/Cargo.toml` and seeds in `fuzz/corpus/<target>/`); every one found
//! there runs, so adding a target needs no change here. Runs grow their corpus
//! in `fuzz/work/<target>/` (not committed), so the committed seeds stay small
//! and later runs continue where earlier ones stopped.
use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{root, run_cmd};

/// Plain Rust panics, overflow checks and debug assertions find the bugs a
/// safe-Rust parser can have; AddressSanitizer would roughly halve the
/// executions for nothing (no C code is fuzzed, and the memory-mapping
/// `unsafe` is not on the fuzzed path).
const SANITIZER: &str = "none";
/// An input taking longer than this is reported as a hang.
const TIMEOUT_SECONDS: u64 = 10;
/// Memory limit per target: input-driven allocations past it are bugs.
const RSS_LIMIT_MB: u64 = 2048;

/// What one target's run did.
struct Outcome {
    target: String,
    executions: Option<u64>,
    seconds: f64,
    corpus: usize,
    /// The failure libFuzzer reported, and the input it saved.
    crash: Option<(String, Option<String>)>,
}

/// Builds the targets and fuzzes each of `targets` (all when empty) for
/// `seconds`; fails when any target crashed.
pub fn run(targets: &[String], seconds: u64) -> Result<()> {
    let fuzz_dir = root().join("fuzz");
    let all = list_targets(&fuzz_dir)?;
    let chosen: Vec<String> = if targets.is_empty() {
        all
    } else {
        for target in targets {
            if !all.contains(target) {
                bail!(
                    "no fuzz target `{target}`; the targets are: {}",
                    all.join(", ")
                );
            }
        }
        targets.to_vec()
    };
    run_cmd(
        Command::new("cargo")
            .args(["+nightly", "fuzz", "build", "--sanitizer", SANITIZER])
            .current_dir(root()),
    )?;
    let binaries = fuzz_dir.join("target").join(host_triple()?).join("release");
    let mut outcomes = Vec::new();
    for target in &chosen {
        eprintln!("xtask: fuzzing {target} for {seconds} s");
        outcomes.push(fuzz_one(
            &fuzz_dir,
            &binaries.join(target),
            target,
            seconds,
        )?);
    }
    report(&outcomes);
    let crashed: Vec<&str> = outcomes
        .iter()
        .filter(|outcome| outcome.crash.is_some())
        .map(|outcome| outcome.target.as_str())
        .collect();
    if !crashed.is_empty() {
        bail!(
            "fuzz targets crashed: {}; reproduce with `fuzz/target/…/release/TARGET INPUT`",
            crashed.join(", ")
        );
    }
    Ok(())
}

/// The targets: the files in `fuzz/fuzz_targets/`, by name.
fn list_targets(fuzz_dir: &Path) -> Result<Vec<String>> {
    let dir = fuzz_dir.join("fuzz_targets");
    let mut targets = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "rs")
            && let Some(stem) = path.file_stem()
        {
            targets.push(stem.to_string_lossy().into_owned());
        }
    }
    targets.sort();
    Ok(targets)
}

fn host_triple() -> Result<String> {
    let out = Command::new("rustc")
        .args(["+nightly", "-vV"])
        .output()
        .context("cannot run rustc +nightly")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(str::to_string)
        .context("rustc -vV names no host")
}

fn fuzz_one(fuzz_dir: &Path, binary: &Path, target: &str, seconds: u64) -> Result<Outcome> {
    let work = fuzz_dir.join("work").join(target);
    let artifacts = fuzz_dir.join("artifacts").join(target);
    let seeds = fuzz_dir.join("corpus").join(target);
    for dir in [&work, &artifacts] {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let log = fuzz_dir.join("work").join(format!("{target}.log"));
    let log_file =
        fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let started = Instant::now();
    // libFuzzer adds what it finds to the first directory only.
    let status = Command::new(binary)
        .arg(&work)
        .arg(&seeds)
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={TIMEOUT_SECONDS}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .stdout(Stdio::null())
        .stderr(log_file)
        .status()
        .with_context(|| {
            format!(
                "cannot run {} (built by `cargo +nightly fuzz build`?)",
                binary.display()
            )
        })?;
    let seconds = started.elapsed().as_secs_f64();
    let text = fs::read_to_string(&log).unwrap_or_default();
    let crash = (!status.success()).then(|| {
        let what = text
            .lines()
            .find(|line| {
                line.contains("panicked at")
                    || line.contains("==ERROR")
                    || line.contains("ERROR: libFuzzer")
            })
            .map(|line| {
                // A panic's message is on the line after its location.
                let next = text
                    .lines()
                    .skip_while(|other| *other != line)
                    .nth(1)
                    .unwrap_or("");
                format!("{} {}", line.trim(), next.trim())
            })
            .unwrap_or_else(|| format!("exited with {status}; see {}", log.display()));
        let input = text
            .lines()
            .find_map(|line| line.split("Test unit written to ").nth(1))
            .map(str::to_string);
        (what, input)
    });
    Ok(Outcome {
        target: target.to_string(),
        executions: stat(&text, "stat::number_of_executed_units:").or_else(|| last_count(&text)),
        seconds,
        corpus: fs::read_dir(&work).map_or(0, |dir| dir.count()),
        crash,
    })
}

/// A `-print_final_stats` figure.
fn stat(log: &str, name: &str) -> Option<u64> {
    log.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|value| value.trim().parse().ok())
}

/// The execution count of libFuzzer's last progress line (`#1234 NEW ...`),
/// for a run that stopped before printing its final stats.
fn last_count(log: &str) -> Option<u64> {
    log.lines().rev().find_map(|line| {
        let count = line.strip_prefix('#')?.split_whitespace().next()?;
        count.parse().ok()
    })
}

fn report(outcomes: &[Outcome]) {
    println!(
        "\n{:<16} {:>8} {:>12} {:>10} {:>8}  result",
        "target", "seconds", "executions", "exec/s", "corpus"
    );
    for outcome in outcomes {
        let executions = outcome
            .executions
            .map_or_else(|| "?".to_string(), |n| n.to_string());
        let rate = outcome
            .executions
            .map_or(0.0, |n| n as f64 / outcome.seconds.max(0.001));
        let result = match &outcome.crash {
            None => "ok".to_string(),
            Some((what, input)) => format!(
                "CRASH: {what}{}",
                input
                    .as_deref()
                    .map(|input| format!("\n    input: {input}"))
                    .unwrap_or_default()
            ),
        };
        println!(
            "{:<16} {:>8.0} {:>12} {:>10.0} {:>8}  {result}",
            outcome.target, outcome.seconds, executions, rate, outcome.corpus
        );
    }
}
