//! The cost of Java frames: hostprof on tests/programs/java/Hot.java (its
//! row: samples, CPU, kernel ns per sample), and what hostprof and JDK Flight
//! Recorder each cost the program, as its own throughput (its workers' rounds
//! once warm, per second and per CPU second of theirs) against a run without
//! a profiler.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::bench_hostprof_with;
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "java: tests/programs/java/Hot.java under {} (2 workers), warmed up first; \
         hostprof -p for {seconds} s at 999 Hz; throughput alone over {window} s; \
         load average before: {}",
        jdk.display(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );

    let baseline = Jvm::start(&jdk, &program, &[], window)?.throughput()?;

    let jvm = Jvm::start(&jdk, &program, &[], seconds)?;
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
    let with_hostprof = jvm.throughput()?;
    let (ours, text) = recorded?;
    let folded = std::fs::read_to_string(dir.join("hostprof.folded"))?;
    // Java frames are labelled `Class.method (File.java:LINE)`.
    let java_stacks: u64 = folded
        .lines()
        .filter(|line| line.contains(".java:") || line.contains(".java)"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();

    let mut jfr = Vec::new();
    for (name, settings) in jfr_settings(&jdk, dir) {
        let recording = dir.join("java-bench.jfr");
        let _ = std::fs::remove_file(&recording);
        let flag = format!(
            "-XX:StartFlightRecording=settings={settings},dumponexit=true,filename={}",
            recording.display()
        );
        let rate = Jvm::start(&jdk, &program, &[&flag], window)?.throughput()?;
        jfr.push((name, rate, execution_samples(&jdk, &recording)));
    }

    println!(
        "{:<28} {:>9} {:>8} {:>16} {:>16}",
        "profiler", "samples", "CPU s", "CPU s/1k samples", "kernel ns/sample"
    );
    println!(
        "{:<28} {:>9} {:>8.3} {:>16.4} {:>16}",
        ours.name,
        ours.samples,
        ours.usage.cpu.as_secs_f64(),
        ours.cpu_per_1k(),
        ours.kernel_text()
    );
    println!("hostprof samples with Java frames: {java_stacks}");
    if let Some(line) = text.lines().find(|line| line.contains("Java frames:")) {
        println!("{}", line.trim_start_matches("hostprof: "));
    }
    println!();
    println!(
        "{:<48} {:>9} {:>9} {:>13} {:>9} {:>8}",
        "Hot.java throughput", "rounds/s", "slowdown", "rounds/CPU s", "slowdown", "samples"
    );
    let line = |name: &str, rate: Throughput, samples: Option<u64>| {
        let samples = samples.map_or("-".to_string(), |n| n.to_string());
        let slowdown = |base: f64, with: f64| base / with.max(f64::MIN_POSITIVE);
        println!(
            "{name:<48} {:>9.1} {:>8.3}x {:>13.1} {:>8.3}x {samples:>8}",
            rate.per_second,
            slowdown(baseline.per_second, rate.per_second),
            rate.per_cpu_second,
            slowdown(baseline.per_cpu_second, rate.per_cpu_second),
        );
    };
    line("no profiler", baseline, None);
    line(
        "hostprof record -p, 999 Hz",
        with_hostprof,
        Some(ours.samples),
    );
    for (name, rate, samples) in jfr {
        line(name, rate, samples);
    }
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

/// The workers' rounds once warm, per second and per CPU second of theirs.
#[derive(Clone, Copy)]
struct Throughput {
    per_second: f64,
    per_cpu_second: f64,
}

/// The Java program, running with its workers warm.
struct Jvm {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Jvm {
    /// Starts Hot with `flags` for `seconds` once warm, and waits for
    /// `warm`.
    fn start(jdk: &Path, program: &Path, flags: &[&str], seconds: u64) -> Result<Jvm> {
        let mut child = Command::new(jdk.join("bin/java"))
            .args(flags)
            .arg("-cp")
            .arg(program)
            .arg("Hot")
            .arg(program.join("libhot.so"))
            .arg(seconds.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start java")?;
        // Read to the end on a thread, so the JVM never blocks on the pipe
        // (JFR prints its own lines there too).
        let stdout = child.stdout.take().context("no stdout")?;
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        let jvm = Jvm { child, lines };
        jvm.wait_for(|line| line == "warm", Duration::from_secs(120))
            .context("the Java program never printed `warm`")?;
        Ok(jvm)
    }

    /// The line `matches` picks, within `limit`.
    fn wait_for(&self, matches: impl Fn(&str) -> bool, limit: Duration) -> Result<String> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.lines.recv_timeout(left)?;
            if matches(&line) {
                return Ok(line);
            }
        }
    }

    /// Waits for the program's end: its throughput once warm.
    fn throughput(mut self) -> Result<Throughput> {
        let line = self.wait_for(
            |line| line.starts_with("rounds/s: "),
            Duration::from_secs(300),
        );
        let status = self.child.wait()?;
        let line = line.context("the Java program printed no throughput")?;
        if !status.success() {
            bail!("the Java program failed ({status})");
        }
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
}

impl Drop for Jvm {
    fn drop(&mut self) {
        // Only a JVM abandoned on an error is still running here.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
