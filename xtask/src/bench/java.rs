//! The cost of Java frames: hostprof on tests/programs/java/Hot.java (its
//! row: samples, CPU, kernel ns per sample), and what hostprof and JDK Flight
//! Recorder each cost the program, as its own throughput (its workers' rounds
//! once warm, per second and per CPU second of theirs) against a run without
//! a profiler.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result};

use super::{
    bench_hostprof_with, print_rows,
    program::{Program, Throughput, load_average, print_throughput, samples_with},
};
use crate::{root, run_cmd};

/// Debian bookworm's JDK 17, by its path as tests/java.rs names it (`java`
/// on PATH may be another JDK); `JAVA_HOME`, when set, instead.
const HOST_JDK: &str = "/usr/lib/jvm/java-17-openjdk-amd64";

fn jdk() -> PathBuf {
    std::env::var_os("JAVA_HOME").map_or_else(|| HOST_JDK.into(), PathBuf::from)
}

pub(super) fn bench_java(hostprof: &Path, dir: &Path, seconds: u64) -> Result<()> {
    let jdk = jdk();
    let program = build_program(&jdk, dir)?;
    // Throughput alone needs no long window, and the JVMs' starts (several
    // seconds each under JFR on a busy 2-CPU host) add up: half the bench's
    // seconds for the runs that only measure it keeps the row near 40 s.
    let window = (seconds / 2).max(3);
    println!(
        "java: tests/programs/java/Hot.java under {} (2 workers), warmed up first; \
         hostprof -p for {seconds} s at 999 Hz; throughput alone over {window} s; \
         load average before: {}",
        jdk.display(),
        load_average()
    );

    let baseline = throughput(start(&jdk, &program, &[], window)?)?;

    let jvm = start(&jdk, &program, &[], seconds)?;
    let pid = jvm.child.id().to_string();
    // hostprof starts as the program's window does, so its start (loading
    // the eBPF programs, attaching to the JVM) is part of what it costs.
    let recorded = bench_hostprof_with(
        hostprof,
        dir,
        seconds,
        "hostprof record -p (Java)",
        &["-p", &pid],
    );
    let with_hostprof = throughput(jvm)?;
    let (ours, text) = recorded?;
    let folded = std::fs::read_to_string(dir.join("hostprof.folded"))?;
    // Java frames are labelled `Class.method (File.java:LINE)`.
    let java_stacks = samples_with(&folded, |label| {
        label.contains(".java:") || label.contains(".java)")
    });

    let mut jfr = Vec::new();
    for (name, settings) in jfr_settings(&jdk, dir) {
        let recording = dir.join("java-bench.jfr");
        let _ = std::fs::remove_file(&recording);
        let flag = format!(
            "-XX:StartFlightRecording=settings={settings},dumponexit=true,filename={}",
            recording.display()
        );
        let rate = throughput(start(&jdk, &program, &[&flag], window)?)?;
        jfr.push((name, rate, execution_samples(&jdk, &recording)));
    }

    print_rows(28, &[&ours]);
    println!("hostprof samples with Java frames: {java_stacks}");
    if let Some(line) = text.lines().find(|line| line.contains("Java frames:")) {
        println!("{}", line.trim_start_matches("hostprof: "));
    }
    println!();
    let mut runs = vec![(
        "hostprof record -p, 999 Hz",
        with_hostprof,
        Some(ours.samples),
    )];
    runs.extend(jfr);
    print_throughput("Hot.java throughput", baseline, &runs);
    println!(
        "hostprof's own CPU (outside the JVM): {:.4} s per 1k samples; JFR's runs in \
         the JVM, so only its slowdown shows it. Per CPU s: per CPU second of the \
         workers (the eBPF program's time is charged to them; other load on the host \
         mostly cancels out). JFR samples: jdk.ExecutionSample events (Java code only; \
         the native period is 20 ms in both settings).",
        ours.cpu_per_1k()
    );
    Ok(())
}

/// The program's classes and JNI library in `dir/java`, built as
/// tests/java.rs builds them: javac `--release 11`, so any JDK 11+ runs it.
fn build_program(jdk: &Path, dir: &Path) -> Result<PathBuf> {
    let out = dir.join("java");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let source = root().join("tests/programs/java");
    run_cmd(
        Command::new(jdk.join("bin/javac"))
            .args(["--release", "11", "-h"])
            .arg(&out)
            .arg("-d")
            .arg(&out)
            .arg(source.join("Hot.java")),
    )
    .context("cannot build Hot.java (cargo xtask setup installs JDK 17)")?;
    let include = jdk.join("include");
    run_cmd(
        Command::new("cc")
            // No sibling call, as in tests/java.rs: the C frame stays on
            // the stack under the Java callback.
            .args([
                "-shared",
                "-fPIC",
                "-O2",
                "-g",
                "-fno-optimize-sibling-calls",
            ])
            .arg(format!("-I{}", include.display()))
            .arg(format!("-I{}", include.join("linux").display()))
            .arg("-I")
            .arg(&out)
            .arg("-o")
            .arg(out.join("libhot.so"))
            .arg(source.join("hot_jni.c")),
    )?;
    Ok(out)
}

/// JFR's settings to compare: the shipped `profile` and, when `jfr
/// configure` exists (JDK 17+), the same with a 1 ms Java sampling period.
fn jfr_settings(jdk: &Path, dir: &Path) -> Vec<(&'static str, String)> {
    let mut settings = vec![(
        "JFR settings=profile (Java 10 ms, native 20 ms)",
        "profile".to_string(),
    )];
    let max = dir.join("java-max.jfc");
    let configured = Command::new(jdk.join("bin/jfr"))
        .args(["configure", "--input", "profile", "--output"])
        .arg(&max)
        .arg("method-profiling=max")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if configured {
        settings.push((
            "JFR profile, method-profiling=max (Java 1 ms)",
            max.display().to_string(),
        ));
    } else {
        println!("(no `jfr configure` in this JDK: no JFR run at 1 ms)");
    }
    settings
}

/// The `jdk.ExecutionSample` events in `recording` (`jfr summary`), if any.
fn execution_samples(jdk: &Path, recording: &Path) -> Option<u64> {
    let output = Command::new(jdk.join("bin/jfr"))
        .arg("summary")
        .arg(recording)
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            (fields.next()? == "jdk.ExecutionSample").then(|| fields.next()?.parse().ok())?
        })
}

/// Starts Hot with `flags` for `seconds` once warm, and waits for `warm`.
fn start(jdk: &Path, program: &Path, flags: &[&str], seconds: u64) -> Result<Program> {
    Program::start(
        Command::new(jdk.join("bin/java"))
            .args(flags)
            .arg("-cp")
            .arg(program)
            .arg("Hot")
            .arg(program.join("libhot.so"))
            .arg(seconds.to_string()),
        |line| line == "warm",
    )
    .context("the Java program did not start")
}

/// Waits for the program's end: its throughput once warm.
fn throughput(jvm: Program) -> Result<Throughput> {
    let line = jvm.finish(|line| line.starts_with("rounds/s: "))?;
    // `rounds/s: R; per CPU s: C`
    let parsed = line["rounds/s: ".len()..]
        .split_once("; per CPU s: ")
        .and_then(|(rate, cpu)| Some((rate.parse().ok()?, cpu.trim().parse().ok()?)));
    let (per_second, per_cpu_second) =
        parsed.with_context(|| format!("bad throughput line {line:?}"))?;
    Ok(Throughput {
        per_second,
        per_cpu_second,
    })
}
