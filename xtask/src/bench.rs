//! `cargo xtask bench`: hostprof's overhead next to perf's, measured in the
//! same run on the same workload. Figures, not assertions: timing belongs here,
//! never in tests.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::{build, root, run_cmd};

mod java;
mod node;
mod program;
mod python;
mod scale;
mod scale_agent;
mod thread_ctx;

pub use scale::COPIES as SCALE_COPIES;

/// One part of the bench to run alone (`--only`).
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Only {
    /// hostprof on the Java program, next to JFR's slowdown of it.
    Java,
    /// hostprof on the Node.js program, next to `node --cpu-prof`'s
    /// slowdown of it.
    Node,
    /// Many distinct binaries without frame pointers at once: how fast
    /// their tables arrive, with a cold and a warm table cache.
    Scale,
    /// The peer table's DWARF rows only: hostprof, `perf --call-graph
    /// dwarf` and `probee --dwarf` host-wide, long and short runs, their
    /// CPU per sample and eBPF ns per run (issue 31's per-sample goal).
    Dwarf,
    /// The eBPF sampler's cost per run on a process that publishes an
    /// OpenTelemetry thread context, next to the same process without one.
    ThreadContext,
}

/// CPU time and peak memory of a finished child.
#[derive(Clone, Copy, Default)]
pub(crate) struct Usage {
    pub(crate) cpu: Duration,
    pub(crate) max_rss_kib: u64,
}

impl Usage {
    pub(crate) fn plus(self, other: Usage) -> Usage {
        Usage {
            cpu: self.cpu + other.cpu,
            max_rss_kib: self.max_rss_kib.max(other.max_rss_kib),
        }
    }
}

/// Waits for `child` and returns its resource usage (wait4).
pub(crate) fn wait_usage(child: Child) -> Result<Usage> {
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: all-zero is a valid rusage; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our unwaited child; pointers are valid for the call.
    if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } != pid {
        bail!("wait4 failed: {}", std::io::Error::last_os_error());
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!("benchmarked command failed (status {status})");
    }
    let time = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
    Ok(Usage {
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss as u64,
    })
}

/// Waits for `child`, whose stderr is piped: its usage and stderr.
pub(crate) fn wait_usage_stderr(mut child: Child) -> Result<(Usage, String)> {
    let mut pipe = child.stderr.take().context("no stderr")?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
        text
    });
    let usage = wait_usage(child)?;
    Ok((usage, reader.join().unwrap_or_default()))
}

struct Row {
    name: &'static str,
    samples: u64,
    usage: Usage,
    kernel_ns_per_sample: Option<f64>,
}

/// The profilers' rows under their header, names `width` wide.
fn print_rows(width: usize, rows: &[&Row]) {
    println!(
        "{:<width$} {:>9} {:>8} {:>16} {:>16}",
        "profiler", "samples", "CPU s", "CPU s/1k samples", "kernel ns/sample"
    );
    for row in rows {
        println!(
            "{:<width$} {:>9} {:>8.3} {:>16.4} {:>16}",
            row.name,
            row.samples,
            row.usage.cpu.as_secs_f64(),
            row.cpu_per_1k(),
            row.kernel_text()
        );
    }
}

impl Row {
    /// The profiler's CPU seconds per 1000 samples.
    fn cpu_per_1k(&self) -> f64 {
        self.usage.cpu.as_secs_f64() * 1000.0 / self.samples.max(1) as f64
    }

    /// The eBPF program's time per sample, or `n/a` for perf.
    fn kernel_text(&self) -> String {
        self.kernel_ns_per_sample
            .map_or("n/a".to_string(), |ns| format!("{ns:.0}"))
    }
}

pub fn run(seconds: u64, only: Option<Only>, copies: usize) -> Result<()> {
    // Another build's binary, to compare two versions on the same machine
    // in one sitting (a copy of an earlier `target/release/hostprof`).
    let hostprof = match std::env::var_os("HOSTPROF_BENCH_BINARY") {
        Some(binary) => PathBuf::from(binary),
        None => build(None)?,
    };
    let dir = root().join("target/bench");
    fs::create_dir_all(&dir)?;
    match only {
        Some(Only::Java) => return java::bench_java(&hostprof, &dir, seconds),
        Some(Only::Node) => return node::bench_node(&hostprof, &dir, seconds),
        Some(Only::Scale) => return scale::bench_scale(&hostprof, &dir, copies),
        Some(Only::Dwarf) => return crate::peers::run_dwarf(&hostprof, &dir, seconds),
        Some(Only::ThreadContext) => {
            return thread_ctx::bench_thread_ctx(&hostprof, &dir, seconds);
        }
        None => {}
    }
    let workload = compile_workload(&dir)?;
    println!(
        "workload: 2 x cpu_split (CPU-bound, frame pointers); {seconds} s host-wide at 999 Hz\n"
    );

    let mut rows = Vec::new();
    rows.push(with_workload(&workload, seconds, || {
        bench_hostprof(&hostprof, &dir, seconds)
    })?);
    rows.push(with_workload(&workload, seconds, || {
        bench_perf(&dir, seconds)
    })?);

    println!(
        "{:<28} {:>9} {:>8} {:>16} {:>13} {:>16}",
        "profiler", "samples", "CPU s", "CPU s/1k samples", "peak RSS MiB", "kernel ns/sample"
    );
    for row in rows {
        println!(
            "{:<28} {:>9} {:>8.3} {:>16.4} {:>13.1} {:>16}",
            row.name,
            row.samples,
            row.usage.cpu.as_secs_f64(),
            row.cpu_per_1k(),
            row.usage.max_rss_kib as f64 / 1024.0,
            row.kernel_text()
        );
    }
    println!(
        "\nkernel ns/sample: the eBPF program's run_time_ns / run_cnt (BPF stats); perf has no equivalent figure."
    );
    println!();
    crate::peers::run(&hostprof, &dir, seconds)?;
    println!();
    bench_unwinding(&hostprof, &dir, seconds)?;
    println!();
    bench_off_cpu(&hostprof, &dir)?;
    println!();
    python::bench_python(&hostprof, &dir, seconds)?;
    println!();
    java::bench_java(&hostprof, &dir, seconds)?;
    println!();
    node::bench_node(&hostprof, &dir, seconds)?;
    println!();
    thread_ctx::bench_thread_ctx(&hostprof, &dir, seconds)?;
    println!();
    bench_symbolize()?;
    println!();
    // Issue 4: a 10 s host-wide window, with the same workload running.
    let encode = || {
        run_cmd(crate::cargo().args([
            "run",
            "--quiet",
            "--release",
            "-p",
            "hostprof",
            "--example",
            "bench_encode",
            "--",
            "10",
            "99",
        ]))
    };
    with_workload(&workload, 10, encode)?;
    println!();
    scale::bench_scale(&hostprof, &dir, copies)
}

/// Issue 8: what off-CPU tracing costs a context-switch-heavy program.
fn bench_off_cpu(hostprof: &Path, dir: &Path) -> Result<()> {
    const TRIPS: &str = "200000";
    let pingpong = dir.join("pingpong");
    run_cmd(
        Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&pingpong)
            .arg(root().join("tests/programs/pingpong.c")),
    )?;
    let configs: [(&str, &[&str]); 3] = [
        ("alone", &[]),
        ("--off-cpu (threshold 1ms, p=1)", &["--off-cpu"]),
        (
            "--off-cpu --off-cpu-probability 0.1",
            &["--off-cpu", "--off-cpu-probability", "0.1"],
        ),
    ];
    // Alternate configurations over rounds and keep medians: the machine's
    // other load drifts.
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut events: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for _round in 0..5 {
        for (index, (_, flags)) in configs.iter().enumerate() {
            let output = if flags.is_empty() {
                Command::new(&pingpong).arg(TRIPS).output()?
            } else {
                Command::new(hostprof)
                    .arg("record")
                    .args(*flags)
                    .arg("--")
                    .arg(&pingpong)
                    .arg(TRIPS)
                    .output()?
            };
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            let rate = number_before(&stdout, " round trips/s")
                .context("pingpong printed no rate")? as f64;
            let seconds = number_before_f64(&stderr, " s at ");
            let count = number_before(&stderr, " periods over").unwrap_or(0) as f64;
            rates[index].push(rate);
            events[index].push(seconds.map_or(0.0, |s| count / s.max(1e-9)));
        }
    }
    let baseline = median(&rates[0]);
    println!(
        "off-CPU tracing on a pipe ping-pong ({TRIPS} round trips, 2 processes; medians of 5)"
    );
    println!(
        "{:<40} {:>16} {:>10} {:>14}",
        "configuration", "round trips/s", "slowdown", "events/s"
    );
    for (index, (name, _)) in configs.iter().enumerate() {
        let rate = median(&rates[index]);
        println!(
            "{:<40} {:>16.0} {:>9.2}x {:>14.1}",
            name,
            rate,
            baseline / rate,
            median(&events[index])
        );
    }
    Ok(())
}

/// Issue 3: hostprof's symbolizer next to llvm-symbolizer and addr2line, on
/// a large binary with DWARF (hostprof's own debug build).
fn bench_symbolize() -> Result<()> {
    run_cmd(crate::cargo().args(["build", "-p", "hostprof"]))?;
    let target = crate::target_dir().join("debug/hostprof");
    run_cmd(
        crate::cargo()
            .args([
                "run",
                "--quiet",
                "--release",
                "-p",
                "hostprof",
                "--example",
                "bench_symbolize",
                "--",
            ])
            .arg(&target),
    )
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// The decimal number right before `marker` in `text` (`"2.02 s at"`).
pub(crate) fn number_before_f64(text: &str, marker: &str) -> Option<f64> {
    let end = text.find(marker)?;
    let digits: String = text[..end]
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.chars().rev().collect::<String>().parse().ok()
}

pub(crate) fn compile_workload(dir: &Path) -> Result<PathBuf> {
    let out = dir.join("cpu_split");
    run_cmd(
        Command::new("cc")
            .args(["-O0", "-fno-omit-frame-pointer", "-g", "-o"])
            .arg(&out)
            .arg(root().join("tests/programs/cpu_split.c")),
    )?;
    Ok(out)
}

/// Runs `measure` while two copies of the workload keep both CPUs busy.
fn with_workload<T>(
    workload: &Path,
    seconds: u64,
    measure: impl FnOnce() -> Result<T>,
) -> Result<T> {
    with_workload_args(workload, &[], seconds, measure)
}

/// [`with_workload`], the workload given `args` before its seconds.
pub(crate) fn with_workload_args<T>(
    workload: &Path,
    args: &[&str],
    seconds: u64,
    measure: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let busy: Vec<Child> = (0..2)
        .map(|_| {
            Command::new(workload)
                .args(args)
                .arg((seconds + 3).to_string())
                .stdout(Stdio::null())
                .spawn()
        })
        .collect::<Result<_, _>>()
        .context("cannot start the workload")?;
    std::thread::sleep(Duration::from_millis(300));
    let row = measure();
    for mut child in busy {
        let _ = child.kill();
        let _ = child.wait();
    }
    row
}

fn bench_hostprof(hostprof: &Path, dir: &Path, seconds: u64) -> Result<Row> {
    let (row, _) = bench_hostprof_with(hostprof, dir, seconds, "hostprof record", &[])?;
    Ok(row)
}

/// Runs `hostprof record` host-wide at 999 Hz for `seconds` with `extra`
/// options and BPF stats, writing `out`: its usage and stderr.
pub(crate) fn record_host_wide(
    hostprof: &Path,
    seconds: u64,
    extra: &[&str],
    env: &[(&str, &str)],
    out: &Path,
) -> Result<(Usage, String)> {
    let child = Command::new(hostprof)
        .envs(env.iter().copied())
        .args([
            "record",
            "-F",
            "999",
            "-d",
            &seconds.to_string(),
            "--bpf-stats",
        ])
        .args(extra)
        .arg("-o")
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start hostprof")?;
    wait_usage_stderr(child)
}

/// hostprof record host-wide with `extra` options; the row and its stderr.
fn bench_hostprof_with(
    hostprof: &Path,
    dir: &Path,
    seconds: u64,
    name: &'static str,
    extra: &[&str],
) -> Result<(Row, String)> {
    let (usage, text) =
        record_host_wide(hostprof, seconds, extra, &[], &dir.join("hostprof.folded"))?;
    let samples =
        number_before(&text, " samples from").context("hostprof printed no sample count")?;
    let kernel = number_before(&text, " ns per run").map(|ns| ns as f64);
    Ok((
        Row {
            name,
            samples,
            usage,
            kernel_ns_per_sample: kernel,
        },
        text,
    ))
}

/// One measurement with the workload's pids: the row and hostprof's stderr.
type Measure<'a> = dyn FnMut(&[String]) -> Result<(Row, String)> + 'a;

/// Builds tests/programs/unwind_c.c at `to` without frame pointers, with
/// DWARF: the workload of the unwinding rows and of the peer table.
pub(crate) fn compile_unwind_c(to: &Path) -> Result<()> {
    run_cmd(
        Command::new("cc")
            .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
            .arg(to)
            .arg(root().join("tests/programs/unwind_c.c")),
    )
}

/// Issue 5: in-kernel unwinding of code without frame pointers, next to
/// frame pointers and to perf's stack copies (`--call-graph dwarf`).
fn bench_unwinding(hostprof: &Path, dir: &Path, seconds: u64) -> Result<()> {
    let workload = dir.join("unwind_c");
    compile_unwind_c(&workload)?;
    // Only the workload's processes (-p): host-wide, perf script would also
    // expand inlines of whatever else runs (addr2line on a busy build host
    // can take minutes), which says nothing about unwinding.
    println!(
        "unwinding: 2 x unwind_c split (-O2 -fomit-frame-pointer), both profiled with -p; {seconds} s at 999 Hz"
    );
    let busy = |measure: &mut Measure| {
        let children: Vec<Child> = (0..2)
            .map(|_| {
                Command::new(&workload)
                    .args(["split", &(seconds + 3).to_string()])
                    .spawn()
            })
            .collect::<Result<_, _>>()
            .context("cannot start the workload")?;
        std::thread::sleep(Duration::from_millis(300));
        let pids: Vec<String> = children
            .iter()
            .map(|child| child.id().to_string())
            .collect();
        let row = measure(&pids);
        for mut child in children {
            let _ = child.kill();
            let _ = child.wait();
        }
        row
    };
    let select = |pids: &[String], extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = pids
            .iter()
            .flat_map(|pid| ["-p".to_string(), pid.clone()])
            .collect();
        args.extend(extra.iter().map(|arg| arg.to_string()));
        args
    };
    let (tables, text) = busy(&mut |pids| {
        let args = select(pids, &[]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        bench_hostprof_with(hostprof, dir, seconds, "hostprof --unwind dwarf", &args)
    })?;
    let (frame_pointers, _) = busy(&mut |pids| {
        let args = select(pids, &["--unwind", "fp"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        bench_hostprof_with(hostprof, dir, seconds, "hostprof --unwind fp", &args)
    })?;
    let (perf, _) = busy(&mut |pids| Ok((bench_perf_dwarf(dir, seconds, pids)?, String::new())))?;
    print_rows(36, &[&tables, &frame_pointers, &perf]);
    if let Some(line) = text.lines().find(|line| line.contains("unwind tables:")) {
        let used = number_after(line, " rows, ");
        let code = number_after(line, "(for ");
        if let (Some(used), Some(code)) = (used, code) {
            println!(
                "unwind table memory: {used:.1} MiB for {code:.1} MiB of code = {:.3} MiB per MiB of text",
                used / code.max(0.001)
            );
        }
        println!("{}", line.trim_start_matches("hostprof: "));
    }
    if let Some(line) = text.lines().find(|line| line.contains("user stacks:")) {
        println!("{}", line.trim_start_matches("hostprof: "));
    }
    Ok(())
}

/// The number right after `marker` in `text` (`"(for 2.0 MiB"`).
fn number_after(text: &str, marker: &str) -> Option<f64> {
    let start = text.find(marker)? + marker.len();
    let digits: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.parse().ok()
}

/// perf with DWARF stack copies (8 KiB per sample), then perf script
/// (`--no-inline`: perf would run addr2line for inlines; hostprof's own
/// symbolizer does that in-process).
fn bench_perf_dwarf(dir: &Path, seconds: u64, pids: &[String]) -> Result<Row> {
    let data = dir.join("perf-dwarf.data");
    let record = Command::new("perf")
        .args(["record", "-F", "999", "--call-graph", "dwarf", "-q", "-p"])
        .arg(pids.join(","))
        .arg("-o")
        .arg(&data)
        .args(["--", "sleep", &seconds.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start perf (install linux-perf)")?;
    let recording = wait_usage(record)?;
    let script_path = dir.join("perf-dwarf.script");
    let script = Command::new("perf")
        .args(["script", "--no-inline", "-i"])
        .arg(&data)
        .stdout(fs::File::create(&script_path)?)
        .stderr(Stdio::null())
        .spawn()?;
    let scripting = wait_usage(script)?;
    let text = fs::read_to_string(&script_path)?;
    let samples = text
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with(['\t', ' ']))
        .count() as u64;
    Ok(Row {
        name: "perf --call-graph dwarf + script",
        samples,
        usage: recording.plus(scripting),
        kernel_ns_per_sample: None,
    })
}

fn bench_perf(dir: &Path, seconds: u64) -> Result<Row> {
    let data = dir.join("perf.data");
    let record = Command::new("perf")
        .args(["record", "-F", "999", "-g", "-a", "-q", "-o"])
        .arg(&data)
        .args(["--", "sleep", &seconds.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start perf (install linux-perf)")?;
    let recording = wait_usage(record)?;
    let script_out = fs::File::create(dir.join("perf.script"))?;
    let script = Command::new("perf")
        .arg("script")
        .arg("-i")
        .arg(&data)
        .stdout(script_out)
        .stderr(Stdio::null())
        .spawn()?;
    let scripting = wait_usage(script)?;
    let text = fs::read_to_string(dir.join("perf.script"))?;
    // Each sample starts with an unindented header line.
    let samples = text
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with(['\t', ' ']))
        .count() as u64;
    Ok(Row {
        name: "perf record -g -a + script",
        samples,
        usage: recording.plus(scripting),
        kernel_ns_per_sample: None,
    })
}

/// The integer right before `marker` in `text` (`"1234 samples from"`).
pub(crate) fn number_before(text: &str, marker: &str) -> Option<u64> {
    let end = text.find(marker)?;
    let digits: String = text[..end]
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.chars().rev().collect::<String>().parse().ok()
}
