//! The cost of JavaScript frames: hostprof on tests/programs/node/hot.js
//! under node's own build (its row: samples, CPU, kernel ns per sample, and
//! the share of samples with frames of hot.js), and what hostprof and
//! `node --cpu-prof` each cost the program, as its own throughput (both
//! threads' rounds once warm, per second and per CPU second of the process)
//! against a run without a profiler.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::{
    bench_hostprof_with, print_rows,
    program::{Program, Throughput, load_average, print_throughput, samples_with},
};
use crate::root;

/// The build `cargo xtask setup` unpacks in target/node-roots (tests/node.rs
/// also profiles 18.20.4 and 22.11.0).
const VERSION: &str = "20.18.0";

pub(super) fn bench_node(hostprof: &Path, dir: &Path, seconds: u64) -> Result<()> {
    let node = root()
        .join("target/node-roots")
        .join(VERSION)
        .join("package/bin/node");
    if !node.exists() {
        bail!("no {}: `cargo xtask setup` unpacks it", node.display());
    }
    let program = root().join("tests/programs/node/hot.js");
    // As the Java row: throughput alone needs no long window.
    let window = (seconds / 2).max(3);
    println!(
        "node: tests/programs/node/hot.js under node {VERSION} (main thread and a worker), \
         warmed up first; hostprof -p for {seconds} s at 999 Hz; throughput alone over \
         {window} s; load average before: {}",
        load_average()
    );

    let baseline = throughput(start(&node, &program, &[], window)?)?;

    let running = start(&node, &program, &[], seconds)?;
    let pid = running.child.id().to_string();
    // hostprof starts as the program's window does, so its start (loading
    // the eBPF programs, attaching to node) is part of what it costs.
    let recorded = bench_hostprof_with(
        hostprof,
        dir,
        seconds,
        "hostprof record -p (Node)",
        &["-p", &pid],
    );
    let with_hostprof = throughput(running)?;
    let (ours, text) = recorded?;
    let folded = std::fs::read_to_string(dir.join("hostprof.folded"))?;
    let total = samples_with(&folded, |_| true);
    // JavaScript frames are labelled `name (file:LINE)`.
    let program_stacks = samples_with(&folded, |label| label.contains("/hot.js:"));

    let profiles = dir.join("node-cpu-prof");
    let _ = std::fs::remove_dir_all(&profiles);
    std::fs::create_dir_all(&profiles)?;
    let flag = format!("--cpu-prof-dir={}", profiles.display());
    let cpu_prof = throughput(start(&node, &program, &["--cpu-prof", &flag], window)?)?;
    let cpu_prof_samples = cpu_profile_samples(&profiles);

    print_rows(28, &[&ours]);
    println!(
        "hostprof samples with frames of hot.js: {program_stacks} of {total} ({:.1} %)",
        100.0 * program_stacks as f64 / total.max(1) as f64
    );
    if let Some(line) = text
        .lines()
        .find(|line| line.contains("JavaScript frames:"))
    {
        println!("{}", line.trim_start_matches("hostprof: "));
    }
    println!();
    print_throughput(
        "hot.js throughput",
        baseline,
        &[
            (
                "hostprof record -p, 999 Hz",
                with_hostprof,
                Some(ours.samples),
            ),
            ("node --cpu-prof (every 1 ms)", cpu_prof, cpu_prof_samples),
        ],
    );
    println!(
        "hostprof's own CPU (outside node): {:.4} s per 1k samples; --cpu-prof's \
         sampler runs in node, so only its slowdown shows it (and its profiles are \
         written after the window). Per CPU s: per CPU second of the process (the eBPF \
         program's time is charged to it). --cpu-prof samples: all threads' profiles.",
        ours.cpu_per_1k()
    );
    Ok(())
}

/// Starts hot.js with node's `flags` for `seconds` once warm, and waits
/// for `warm`.
fn start(node: &Path, program: &Path, flags: &[&str], seconds: u64) -> Result<Program> {
    Program::start(
        Command::new(node)
            .args(flags)
            .arg(program)
            .arg(seconds.to_string()),
        |line| line.starts_with("warm "),
    )
    .context("the Node.js program did not start")
}

/// Waits for the program's end: its throughput once warm.
fn throughput(running: Program) -> Result<Throughput> {
    let line = running.finish(|line| line.starts_with("done "))?;
    // `done ROUNDS MICROS CPU_MICROS`
    let numbers: Vec<f64> = line["done ".len()..]
        .split_whitespace()
        .filter_map(|field| field.parse().ok())
        .collect();
    let [rounds, micros, cpu_micros] = numbers[..] else {
        bail!("bad throughput line {line:?}");
    };
    Ok(Throughput {
        per_second: rounds * 1e6 / micros.max(1.0),
        per_cpu_second: rounds * 1e6 / cpu_micros.max(1.0),
    })
}

/// The samples in the `.cpuprofile` files in `profiles` (the length of
/// their `samples` arrays), if any.
fn cpu_profile_samples(profiles: &Path) -> Option<u64> {
    let files: Vec<PathBuf> = std::fs::read_dir(profiles)
        .ok()?
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "cpuprofile"))
        .collect();
    let mut total = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).ok()?;
        let start = text.find("\"samples\":[")? + "\"samples\":[".len();
        let array = &text[start..start + text[start..].find(']')?];
        total += if array.trim().is_empty() {
            0
        } else {
            array.matches(',').count() as u64 + 1
        };
    }
    (!files.is_empty()).then_some(total)
}
