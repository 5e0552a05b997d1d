//! Issue 31: the cost of many distinct binaries at once, as on a busy node
//! just after the agent (re)starts. N copies of one static binary without
//! frame pointers, made distinct by a few bytes (so N tables, nothing
//! shared), all spinning; a 10 s host-wide `record` with a cold and then a
//! warm unwind table cache, as a user runs it (early stack copies on), and
//! once more cold without the copies: there a stack is complete only once
//! its process's table is in the kernel, which says how fast the tables
//! keep up. For each host-wide run, why the incomplete stacks stopped:
//! walked in the kernel, from early copies on the host, or copies that
//! were dropped or waited too long. Then the agent, beside the copies and
//! without them (the idle host).
use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result};

use crate::run_cmd;

/// Distinct binaries spinning at once, unless `--copies` says otherwise.
pub const COPIES: usize = 16;
/// Functions in each (three CFI rows each): 60,000 rows, about 1 MiB of
/// kernel memory a copy, so that all fit the default 32 MiB rows map next
/// to the host's other binaries.
const FUNCTIONS: usize = 20_000;
/// Seconds each record lasts.
const SECONDS: u64 = 10;

/// The hot path: a few frames without frame pointers, then a spin.
const HOT_C: &str = r#"
#include <stdlib.h>
#include <time.h>
volatile long sink;
long f0(long);
__attribute__((noinline)) long leaf(long x) {
    for (long i = 0; i < 1000; i++) x = x * 6364136223846793005 + 1;
    return x;
}
__attribute__((noinline)) long mid3(long x) { volatile char b[48]; b[0] = x; return leaf(x) + b[0]; }
__attribute__((noinline)) long mid2(long x) { volatile char b[80]; b[0] = x; return mid3(x) + b[0]; }
__attribute__((noinline)) long mid1(long x) { volatile char b[112]; b[0] = x; return mid2(x) + b[0]; }
int main(int argc, char **argv) {
    long seconds = argc > 1 ? atol(argv[1]) : 10;
    if (argc > 2) sink = f0(atol(argv[2]));
    time_t start = time(0);
    long x = 1;
    for (long n = 0;; n++) {
        x = mid1(x);
        sink = x;
        if ((n & 0xfff) == 0 && time(0) - start >= seconds) break;
    }
    return 0;
}
"#;

/// `FUNCTIONS` small functions, each with its own CFI (assembled in a
/// second, where as many C functions take a minute to compile).
fn filler_asm() -> String {
    let mut asm = String::from(".text\n");
    for i in 0..FUNCTIONS {
        let size = 16 + (i % 8) * 8;
        let _ = writeln!(
            asm,
            ".globl f{i}\n.type f{i},@function\nf{i}:\n.cfi_startproc\nsub ${size}, %rsp\n\
             .cfi_adjust_cfa_offset {size}\nmov %rdi, (%rsp)\nadd ${size}, %rsp\n\
             .cfi_adjust_cfa_offset -{size}\nret\n.cfi_endproc\n.size f{i},.-f{i}"
        );
    }
    asm.push_str(".section .note.GNU-stack,\"\",@progbits\n");
    asm
}

/// The base binary, then `copies` copies with their index appended.
fn build_copies(dir: &Path, copies: usize) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let (hot, filler, base) = (dir.join("hot.c"), dir.join("filler.s"), dir.join("base"));
    fs::write(&hot, HOT_C)?;
    fs::write(&filler, filler_asm())?;
    run_cmd(
        Command::new("cc")
            .args(["-O2", "-fomit-frame-pointer", "-static", "-o"])
            .arg(&base)
            .arg(&hot)
            .arg(&filler),
    )?;
    let bytes = fs::read(&base)?;
    // Copies of an earlier, larger run are not spun.
    for entry in fs::read_dir(dir)?.flatten() {
        if entry.file_name().to_string_lossy().starts_with("scale_") {
            fs::remove_file(entry.path())?;
        }
    }
    (0..copies)
        .map(|i| {
            let copy = dir.join(format!("scale_{i:03}"));
            let mut distinct = bytes.clone();
            distinct.extend_from_slice(&(i as u64).to_le_bytes());
            fs::write(&copy, distinct)?;
            fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
            Ok(copy)
        })
        .collect()
}

/// One record's figures.
struct Run {
    /// Samples of the copies, and those whose stack reaches `_start`.
    samples: u64,
    complete: u64,
    /// Seconds from the record's start to each copy's tables in the kernel
    /// (copies loaded within the window only).
    loaded: Vec<f64>,
    /// Seconds the loader spent on the copies (read, hash, build or cache,
    /// write), summed.
    busy: f64,
    /// record's cache line.
    cache: String,
    /// record's unwind files line (tables from the cache without reading
    /// their file, the file id memo).
    files: String,
    /// record's unwind tables line.
    tables: String,
    /// record's user stacks line (counters of the whole host).
    stacks: String,
    /// record's early samples line.
    early: String,
    /// record's memory line (peak RSS, BPF maps).
    memory: String,
}

/// Seconds since midnight UTC of a log line's `…T21:33:58.174634Z`.
fn log_time(line: &str) -> Option<f64> {
    let at = line.find('T')?;
    let clock = line.get(at + 1..)?.split('Z').next()?;
    let mut parts = clock.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// `1.5s`, `250.3ms`, `12µs` (Rust's `Debug` of a `Duration`) in seconds.
fn duration_secs(text: &str) -> Option<f64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "µs" | "us" => 1e-6,
        "ns" => 1e-9,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}

/// Which processes a record samples.
#[derive(Clone, Copy)]
enum Scope {
    /// `-p` each copy: their tables load before sampling starts, nothing
    /// else on the host is loaded.
    Copies,
    /// The whole host: tables load as samples ask, busiest process first,
    /// whatever else runs (on a shared machine, other people's builds).
    Host,
}

fn record(
    hostprof: &Path,
    copies: &[PathBuf],
    scope: Scope,
    early: bool,
    cache: &Path,
    out: &Path,
) -> Result<Run> {
    let children: Vec<Child> = copies
        .iter()
        .map(|copy| {
            Command::new(copy)
                // Past any wait for tables: killed when the record ends.
                .arg((SECONDS + 60).to_string())
                .stdout(Stdio::null())
                .spawn()
        })
        .collect::<Result<_, _>>()
        .context("cannot start the copies")?;
    std::thread::sleep(Duration::from_millis(300));
    let pids: Vec<String> = children.iter().map(|c| c.id().to_string()).collect();
    let started = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs_f64()
        % 86_400.0;
    let targets: Vec<&str> = match scope {
        Scope::Copies => pids.iter().flat_map(|pid| ["-p", pid.as_str()]).collect(),
        Scope::Host => Vec::new(),
    };
    // stderr to a file, not a pipe: reading a pipe would wake this
    // process for every log line, and a sample of it would have the
    // host-wide record parse this debug build's DWARF (about 27 MiB of
    // RSS: 84 MiB where the copies alone need 57).
    let log = out.with_extension("stderr");
    let status = Command::new(hostprof)
        .args(["record", "-F", "999", "-d", &SECONDS.to_string()])
        .args(&targets)
        // Room for the host's other binaries too (a rustc's driver library
        // alone is 18 MiB of rows): this measures time, not room.
        .args(["--unwind-table-mib", "128"])
        .args(if early {
            &[][..]
        } else {
            &["--no-early-stack-copy"][..]
        })
        .args(["--log-level", "hostprof::unwind=debug"])
        .arg("--unwind-cache-dir")
        .arg(cache)
        .arg("-o")
        .arg(out)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log)?)
        .status()
        .context("cannot run hostprof")?;
    for mut child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
    anyhow::ensure!(
        status.success(),
        "hostprof record failed: see {}",
        log.display()
    );
    let stderr = fs::read_to_string(&log)?;
    // Only loads logged before the closing lines: a load done after the
    // window helped none of its samples.
    let window: Vec<&str> = stderr
        .lines()
        .take_while(|line| !line.contains(" samples from "))
        .collect();
    let (mut loaded, mut busy) = (Vec::new(), 0.0);
    for pid in &pids {
        let marker = format!("pid {pid}: unwind tables loaded in ");
        if let Some(line) = window.iter().find(|line| line.contains(&marker))
            && let Some(time) = log_time(line)
        {
            loaded.push((time - started).rem_euclid(86_400.0));
            let took = &line[line.find(&marker).unwrap_or(0) + marker.len()..];
            busy += duration_secs(took.trim()).unwrap_or(0.0);
        }
    }
    loaded.sort_by(f64::total_cmp);
    let (mut samples, mut complete) = (0, 0);
    for line in fs::read_to_string(out)?.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        if !stack.starts_with("scale_") {
            continue;
        }
        let count: u64 = count.parse().unwrap_or(0);
        samples += count;
        if stack.split(';').any(|frame| frame == "_start") {
            complete += count;
        }
    }
    let line = |marker: &str| {
        stderr
            .lines()
            .find_map(|line| line.strip_prefix(marker))
            .unwrap_or("none")
            .to_string()
    };
    Ok(Run {
        samples,
        complete,
        loaded,
        busy,
        cache: line("hostprof: unwind table cache: "),
        tables: line("hostprof: unwind tables: "),
        files: line("hostprof: unwind files: "),
        stacks: line("hostprof: user stacks: "),
        early: line(
            "hostprof: early samples (before their tables, or their library's, were loaded): ",
        ),
        memory: line("hostprof: memory: "),
    })
}

/// `name 12, other 0, last 3` without the zeros.
fn nonzero(list: &str) -> String {
    let kept: Vec<&str> = list
        .split(", ")
        .filter(|item| !item.ends_with(" 0"))
        .collect();
    if kept.is_empty() {
        "none".into()
    } else {
        kept.join(", ")
    }
}

/// Why stacks stopped, from record's closing lines (host-wide counters:
/// other processes' samples too).
fn reasons(run: &Run) -> (String, String) {
    // "A unwound with tables (B complete; stopped: …), C with frame
    // pointers before their tables were loaded"
    let stacks = &run.stacks;
    let kernel = stacks
        .split_once(" (")
        .and_then(|(walked, rest)| {
            let (complete, rest) = rest.split_once(" complete; stopped: ")?;
            let (stopped, rest) = rest.split_once("), ")?;
            let before = rest.split(' ').next()?;
            Some(format!(
                "kernel: {walked}, {complete} complete, stopped: {}; \
                 {before} before their tables",
                nonzero(stopped)
            ))
        })
        .unwrap_or_else(|| format!("kernel: {stacks}"));
    let early = run
        .early
        .split("; the copies")
        .next()
        .unwrap_or("none")
        .replace(" on the host from stack copies", " from copies");
    (kernel, format!("early: {early}"))
}

/// The bench: build, then a cold and a warm record, of the copies alone
/// and of the whole host.
pub(crate) fn bench_scale(hostprof: &Path, dir: &Path, count: usize) -> Result<()> {
    let dir = dir.join("scale");
    let copies = build_copies(&dir, count)?;
    let cache = dir.join("cache");
    println!(
        "scale: {count} distinct static binaries without frame pointers ({FUNCTIONS} functions \
         each), all spinning; {SECONDS} s records at 999 Hz; cold: an empty table cache, warm: \
         the cold run's; early: early stack copies (the default), tables only: without them"
    );
    println!(
        "{:<24} {:>9} {:>13} {:>34} {:>9}  cache",
        "record", "samples", "reach _start", "tables in kernel after (s)", "loader s"
    );
    let mut tables = String::new();
    let runs = [
        (Scope::Copies, "-p copies", "cold", true),
        (Scope::Copies, "-p copies", "warm", true),
        (Scope::Host, "host-wide", "cold", true),
        (Scope::Host, "host-wide", "warm", true),
        (Scope::Host, "host-wide", "cold tables only", false),
    ];
    for (scope, scope_name, name, early) in runs {
        if name.starts_with("cold") {
            let _ = fs::remove_dir_all(&cache);
        }
        let label = format!("{scope_name} {name}");
        let out = dir.join(format!("{label}.folded").replace(' ', "_"));
        let run = record(hostprof, &copies, scope, early, &cache, &out)?;
        let median = run.loaded.get(run.loaded.len() / 2).copied();
        let last = run.loaded.last().copied();
        let seconds = |value: Option<f64>| value.map_or("-".into(), |s| format!("{s:.2}"));
        println!(
            "{:<24} {:>9} {:>12.1}% {:>34} {:>9.2}  {}",
            label,
            run.samples,
            run.complete as f64 * 100.0 / run.samples.max(1) as f64,
            format!(
                "{}/{count}: median {}, last {}",
                run.loaded.len(),
                seconds(median),
                seconds(last)
            ),
            run.busy,
            run.cache
        );
        println!("{:<24} files: {}", "", run.files);
        println!("{:<24} memory: {}", "", run.memory);
        if matches!(scope, Scope::Host) {
            let (kernel, early) = reasons(&run);
            println!("{:<24} {kernel}\n{:<24} {early}", "", "");
        }
        tables = run.tables;
    }
    let agent = super::scale_agent::agent_after(hostprof, &copies, &dir.join("agent-cache"))?;
    println!(
        "agent (host-wide, default rate, cold cache) 60-80 s after its start: {:.1}% of the \
         {} user stacks the kernel walked reached their end; {} process loads; RSS {:.1} MiB + \
         BPF maps {:.1} MiB = {:.1} MiB",
        agent.complete as f64 * 100.0 / agent.walked.max(1) as f64,
        agent.walked,
        agent.loads,
        agent.rss_mib,
        agent.map_mib,
        agent.rss_mib + agent.map_mib
    );
    let stopped: Vec<String> = agent
        .stopped
        .iter()
        .map(|(event, count)| format!("{} {count}", event.trim_start_matches("unwind_")))
        .collect();
    println!("{:<24} stopped short: {}", "", stopped.join(", "));
    // The same agent with none of the copies: what a node pays at idle.
    let idle = super::scale_agent::agent_after(hostprof, &[], &dir.join("agent-cache-idle"))?;
    println!(
        "agent without the copies (the host at idle), 60-80 s after its start: RSS {:.1} MiB + \
         BPF maps {:.1} MiB = {:.1} MiB",
        idle.rss_mib,
        idle.map_mib,
        idle.rss_mib + idle.map_mib
    );
    let bytes: u64 = fs::read_dir(&cache)?
        .flatten()
        .filter_map(|entry| entry.metadata().ok())
        .map(|meta| meta.len())
        .sum();
    println!("unwind tables (last run): {tables}");
    println!(
        "cache directory: {:.1} MiB",
        bytes as f64 / (1 << 20) as f64
    );
    println!(
        "loader s: the unwind thread's time on the copies' loads (read, hash, build or cache, write)"
    );
    Ok(())
}
