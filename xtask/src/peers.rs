//! `cargo xtask bench`'s peer table (issue 14): hostprof next to perf and
//! profile-bee (`probee`), host-wide on the same workload in one run, every
//! hostprof figure also printed as a ratio to each peer's. Figures, not
//! assertions.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::bench::Usage;

/// The workload's command name: its samples are the ones that count.
const WORKLOAD: &str = "unwind_c";

/// One profiler's run over the workload.
struct Peer {
    name: &'static str,
    usage: Usage,
    /// Samples of the workload.
    workload: u64,
    /// Of those, stacks that reach `main`.
    reaching_main: u64,
    /// Samples of the whole host, and of the profiler itself (where its
    /// output says which process a stack belongs to).
    host: u64,
    own: Option<u64>,
    /// Processes sampled, where the profiler says (hostprof): memory grows
    /// with the binaries the host ran during the window, so a run whose
    /// peak stands out says here whether the host was busier.
    processes: Option<u64>,
    /// The eBPF program's run time per run (BPF stats).
    kernel_ns: Option<f64>,
    /// Kernel memory of its BPF maps (their fdinfo's `memlock`), MiB: not
    /// in its RSS, but charged to its cgroup all the same.
    bpf_map_mib: Option<f64>,
}

impl Peer {
    fn cpu_ms_per_1k(&self) -> f64 {
        self.usage.cpu.as_secs_f64() * 1e6 / self.workload.max(1) as f64
    }
    fn rss_mib(&self) -> f64 {
        self.usage.max_rss_kib as f64 / 1024.0
    }
    fn main_share(&self) -> f64 {
        self.reaching_main as f64 / self.workload.max(1) as f64
    }
}

/// Two copies of `unwind_c split` (-O2, no frame pointers) keep both CPUs
/// busy while each profiler samples the whole host at 999 Hz.
pub fn run(hostprof: &Path, dir: &Path, seconds: u64) -> Result<()> {
    let workload = compile(dir, seconds)?;
    let probee = has_probee();
    let mut peers = vec![
        dwarf_run(Dwarf::Hostprof, hostprof, dir, &workload, seconds)?,
        dwarf_run(Dwarf::HostprofLegacy, hostprof, dir, &workload, seconds)?,
        busy(&workload, seconds, || {
            hostprof_run(
                hostprof,
                dir,
                seconds,
                "hostprof record --unwind fp",
                &["--unwind", "fp"],
                &[],
            )
        })?,
        dwarf_run(Dwarf::Perf, hostprof, dir, &workload, seconds)?,
        busy(&workload, seconds, || {
            perf_run(dir, seconds, "perf -g + script", &["-g"])
        })?,
    ];
    if probee {
        peers.push(dwarf_run(Dwarf::Probee, hostprof, dir, &workload, seconds)?);
        peers.push(busy(&workload, seconds, || {
            probee_run(dir, seconds, "probee", &[])
        })?);
    } else {
        println!("(probee not installed: `cargo xtask setup` installs profile-bee)");
    }
    print_table(&peers);
    split(hostprof, dir, &workload, &peers, seconds, probee)
}

/// `cargo xtask bench --only dwarf`: the table's DWARF rows alone, long
/// and short, in [`DWARF_ROUNDS`] rounds that take turns between the
/// profilers, so a busy spell of the host falls on all of them; each figure
/// is the median of the rounds, with its range. (One round's CPU per sample
/// swung by half between runs minutes apart: no goal can be read from one.)
pub fn run_dwarf(hostprof: &Path, dir: &Path, seconds: u64) -> Result<()> {
    let workload = compile(dir, seconds)?;
    let probee = has_probee();
    if !probee {
        println!("(probee not installed: `cargo xtask setup` installs profile-bee)");
    }
    let kinds: Vec<Dwarf> = Dwarf::ALL
        .into_iter()
        .filter(|&peer| peer != Dwarf::Probee || probee)
        .collect();
    // Per profiler: its long runs and the per-sample split of each round.
    let mut long: Vec<Vec<Peer>> = kinds.iter().map(|_| Vec::new()).collect();
    let mut per_1k: Vec<Vec<f64>> = kinds.iter().map(|_| Vec::new()).collect();
    for round in 1..=DWARF_ROUNDS {
        println!("round {round} of {DWARF_ROUNDS}");
        for (at, &peer) in kinds.iter().enumerate() {
            let run = dwarf_run(peer, hostprof, dir, &workload, seconds)?;
            let short = dwarf_run(peer, hostprof, dir, &workload, SHORT_SECONDS)?;
            if let Some((_, cost)) = split_cost(&run, &short) {
                per_1k[at].push(cost);
            }
            long[at].push(run);
        }
    }
    let medians: Vec<Peer> = long
        .into_iter()
        .map(|mut runs| {
            runs.sort_by(|a, b| a.cpu_ms_per_1k().total_cmp(&b.cpu_ms_per_1k()));
            runs.swap_remove(runs.len() / 2)
        })
        .collect();
    println!("\nthe round with the median CPU of each profiler:");
    print_table(&medians);
    println!(
        "\nCPU per 1000 workload samples beyond the fixed part (long run minus short run), by round"
    );
    println!(
        "{:<34} {:>8} {:>16} {:>22}",
        "profiler", "median", "range", "hostprof median ratio"
    );
    let median = |costs: &mut Vec<f64>| {
        costs.sort_by(f64::total_cmp);
        costs.get(costs.len() / 2).copied()
    };
    let ours = per_1k.first_mut().and_then(median);
    for (peer, costs) in medians.iter().zip(per_1k.iter_mut()) {
        let Some(mid) = median(costs) else {
            println!("{:<34} {:>8}", peer.name, "n/a");
            continue;
        };
        let range = format!("{:.1}-{:.1}", costs[0], costs[costs.len() - 1]);
        let ratio = match ours {
            Some(ours) if mid > 0.0 && !peer.name.starts_with("hostprof") => {
                format!("{:.2}", ours / mid)
            }
            _ => String::new(),
        };
        println!("{:<34} {mid:>8.1} {range:>16} {ratio:>22}", peer.name);
    }
    Ok(())
}

/// Rounds of `--only dwarf`.
const DWARF_ROUNDS: usize = 3;

/// Builds the workload and says what the runs are.
fn compile(dir: &Path, seconds: u64) -> Result<PathBuf> {
    let workload = dir.join(WORKLOAD);
    crate::bench::compile_unwind_c(&workload)?;
    println!(
        "peers: 2 x {WORKLOAD} split (-O2 -fomit-frame-pointer), host-wide, {seconds} s at 999 Hz; \
         CPU includes post-processing (perf script)"
    );
    Ok(workload)
}

/// The profilers in DWARF mode, the ones run long and short.
#[derive(Clone, Copy, PartialEq)]
enum Dwarf {
    Hostprof,
    /// The eBPF variant for Linux 5.10 to 5.16 (no `bpf_loop`), forced
    /// on this kernel: what the many fleets on those kernels pay.
    HostprofLegacy,
    Perf,
    Probee,
}

impl Dwarf {
    const ALL: [Dwarf; 4] = [
        Dwarf::Hostprof,
        Dwarf::HostprofLegacy,
        Dwarf::Perf,
        Dwarf::Probee,
    ];
}

/// One DWARF-mode run of `peer`, `seconds` long, beside the workload.
fn dwarf_run(
    peer: Dwarf,
    hostprof: &Path,
    dir: &Path,
    workload: &Path,
    seconds: u64,
) -> Result<Peer> {
    busy(workload, seconds, || match peer {
        Dwarf::Hostprof => {
            hostprof_run(hostprof, dir, seconds, "hostprof record (dwarf)", &[], &[])
        }
        Dwarf::HostprofLegacy => hostprof_run(
            hostprof,
            dir,
            seconds,
            "hostprof (dwarf, legacy eBPF)",
            &[],
            &[("HOSTPROF_BPF_VARIANT", "legacy")],
        ),
        Dwarf::Perf => perf_run(
            dir,
            seconds,
            "perf --call-graph dwarf + script",
            &["--call-graph", "dwarf"],
        ),
        Dwarf::Probee => probee_run(dir, seconds, "probee --dwarf", &["--dwarf"]),
    })
}

/// The same DWARF-mode runs again, shorter: with the long ones, each
/// profiler's CPU splits into what it pays once and what it pays per
/// sample.
fn split(
    hostprof: &Path,
    dir: &Path,
    workload: &Path,
    long: &[Peer],
    seconds: u64,
    probee: bool,
) -> Result<()> {
    let mut short = Vec::new();
    for peer in Dwarf::ALL {
        if peer != Dwarf::Probee || probee {
            short.push(dwarf_run(peer, hostprof, dir, workload, SHORT_SECONDS)?);
        }
    }
    print_split(long, &short, seconds);
    Ok(())
}

/// Seconds of the short runs that split CPU into fixed and per-sample
/// parts.
const SHORT_SECONDS: u64 = 2;

/// CPU as (fixed ms, ms per 1000 workload samples): the line through a
/// long and a short run of the same profiler on the same workload.
fn split_cost(long: &Peer, short: &Peer) -> Option<(f64, f64)> {
    let samples = long.workload as f64 - short.workload as f64;
    if samples <= 0.0 {
        return None;
    }
    let per_sample = (long.usage.cpu.as_secs_f64() - short.usage.cpu.as_secs_f64()) / samples;
    let fixed = short.usage.cpu.as_secs_f64() - per_sample * short.workload as f64;
    Some((fixed * 1e3, per_sample * 1e6))
}

fn print_split(long: &[Peer], short: &[Peer], seconds: u64) {
    println!(
        "\nCPU split into a fixed part (start, exit) and a part per sample, from the {seconds} s runs \
         and {SHORT_SECONDS} s ones"
    );
    println!(
        "{:<34} {:>10} {:>13} {:>22}",
        "profiler", "fixed ms", "ms/1k samples", "hostprof ms/1k ratio"
    );
    let costs: Vec<(&str, (f64, f64))> = short
        .iter()
        .filter_map(|short| {
            let long = long.iter().find(|long| long.name == short.name)?;
            Some((short.name, split_cost(long, short)?))
        })
        .collect();
    let ours = costs
        .iter()
        .find(|(name, _)| name.starts_with("hostprof"))
        .map(|(_, (_, per_1k))| *per_1k);
    for (name, (fixed, per_1k)) in &costs {
        let ratio = match ours {
            Some(ours) if *per_1k > 0.0 && !name.starts_with("hostprof") => {
                format!("{:.2}", ours / per_1k)
            }
            _ => "".into(),
        };
        println!("{name:<34} {fixed:>10.0} {per_1k:>13.1} {ratio:>22}");
    }
}

fn print_table(peers: &[Peer]) {
    println!(
        "{:<34} {:>9} {:>17} {:>10} {:>13} {:>11} {:>10} {:>10} {:>10}",
        "profiler",
        "workload",
        "CPU ms/1k samples",
        "peak MiB",
        "BPF maps MiB",
        "reach main",
        "eBPF ns",
        "own share",
        "processes"
    );
    for peer in peers {
        println!(
            "{:<34} {:>9} {:>17.1} {:>10.1} {:>13} {:>11.3} {:>10} {:>10} {:>10}",
            peer.name,
            peer.workload,
            peer.cpu_ms_per_1k(),
            peer.rss_mib(),
            peer.bpf_map_mib
                .map_or("n/a".into(), |mib| format!("{mib:.1}")),
            peer.main_share(),
            peer.kernel_ns.map_or("n/a".into(), |ns| format!("{ns:.0}")),
            peer.own.map_or("n/a".into(), |own| format!(
                "{:.2}%",
                own as f64 * 100.0 / peer.host.max(1) as f64
            )),
            peer.processes
                .map_or("n/a".into(), |count| count.to_string()),
        );
    }
    println!("\nhostprof as a ratio to each peer (< 1: hostprof is cheaper)");
    println!(
        "{:<34} {:<34} {:>8} {:>8} {:>8}",
        "hostprof", "peer", "CPU", "RSS", "eBPF ns"
    );
    let ratio = |ours: f64, theirs: f64| {
        if theirs > 0.0 {
            format!("{:.2}", ours / theirs)
        } else {
            "n/a".into()
        }
    };
    for ours in peers
        .iter()
        .filter(|peer| peer.name.starts_with("hostprof"))
    {
        for theirs in peers
            .iter()
            .filter(|peer| !peer.name.starts_with("hostprof"))
        {
            let kernel = match (ours.kernel_ns, theirs.kernel_ns) {
                (Some(a), Some(b)) => ratio(a, b),
                _ => "n/a".into(),
            };
            println!(
                "{:<34} {:<34} {:>8} {:>8} {:>8}",
                ours.name,
                theirs.name,
                ratio(ours.cpu_ms_per_1k(), theirs.cpu_ms_per_1k()),
                ratio(ours.rss_mib(), theirs.rss_mib()),
                kernel
            );
        }
    }
}

/// Runs `measure` while two copies of the workload run.
fn busy(workload: &Path, seconds: u64, measure: impl FnOnce() -> Result<Peer>) -> Result<Peer> {
    crate::bench::with_workload_args(workload, &["split"], seconds, measure)
}

/// Folded stacks (`root;frame;... count`): (workload samples, reaching
/// main, host samples, samples whose root starts with `own`).
fn count_folded(text: &str, own: &str) -> (u64, u64, u64, u64) {
    let (mut workload, mut main, mut host, mut mine) = (0, 0, 0, 0);
    for line in text.lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = count.parse::<u64>() else {
            continue;
        };
        host += count;
        let root = stack.split(';').next().unwrap_or("");
        if root.starts_with(WORKLOAD) {
            workload += count;
            if stack.split(';').any(|frame| frame == "main") {
                main += count;
            }
        }
        if root.starts_with(own) {
            mine += count;
        }
    }
    (workload, main, host, mine)
}

fn hostprof_run(
    hostprof: &Path,
    dir: &Path,
    seconds: u64,
    name: &'static str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Result<Peer> {
    let folded = dir.join("peer-hostprof.folded");
    let (usage, stderr) = crate::bench::record_host_wide(hostprof, seconds, extra, env, &folded)?;
    let text = fs::read_to_string(&folded)?;
    let (workload, reaching_main, host, own) = count_folded(&text, "hostprof");
    Ok(Peer {
        name,
        usage,
        workload,
        reaching_main,
        host,
        own: Some(own),
        processes: crate::bench::number_before(&stderr, " processes in"),
        kernel_ns: crate::bench::number_before(&stderr, " ns per run").map(|ns| ns as f64),
        bpf_map_mib: crate::bench::number_before_f64(&stderr, " MiB of kernel memory"),
    })
}

fn perf_run(dir: &Path, seconds: u64, name: &'static str, call_graph: &[&str]) -> Result<Peer> {
    let data = dir.join("peer-perf.data");
    let record = Command::new("perf")
        .args(["record", "-F", "999", "-a", "-q"])
        .args(call_graph)
        .arg("-o")
        .arg(&data)
        .args(["--", "sleep", &seconds.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start perf (install linux-perf)")?;
    let recording = crate::bench::wait_usage(record)?;
    let script_path = dir.join("peer-perf.script");
    // --no-inline: perf would run addr2line for inlines of every binary.
    let script = Command::new("perf")
        .args(["script", "--no-inline", "-F", "comm,ip,sym", "-i"])
        .arg(&data)
        .stdout(fs::File::create(&script_path)?)
        .stderr(Stdio::null())
        .spawn()?;
    let scripting = crate::bench::wait_usage(script)?;
    let text = fs::read_to_string(&script_path)?;
    let (mut workload, mut main, mut host, mut own) = (0, 0, 0, 0);
    let mut current: Option<(bool, bool)> = None;
    let mut finish = |sample: Option<(bool, bool)>| {
        if let Some((ours, reached)) = sample {
            host += 1;
            if ours {
                workload += 1;
                main += u64::from(reached);
            }
        }
    };
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if !line.starts_with([' ', '\t']) {
            finish(current.take());
            let comm = line.split_whitespace().next().unwrap_or("");
            own += u64::from(comm == "perf");
            current = Some((comm == WORKLOAD, false));
        } else if let Some((_, reached)) = current.as_mut() {
            let symbol = line.split_whitespace().nth(1).unwrap_or("");
            *reached |= symbol == "main" || symbol.starts_with("main+");
        }
    }
    finish(current);
    Ok(Peer {
        name,
        usage: recording.plus(scripting),
        workload,
        reaching_main: main,
        host,
        own: Some(own),
        processes: None,
        kernel_ns: None,
        bpf_map_mib: None,
    })
}

fn has_probee() -> bool {
    Command::new("sh")
        .args(["-c", "command -v probee"])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// probee's DWARF mode finds its tracepoints in tracefs.
fn mount_tracefs() {
    if !Path::new("/sys/kernel/tracing/events").exists() {
        let _ = Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status();
    }
}

fn probee_run(dir: &Path, seconds: u64, name: &'static str, extra: &[&str]) -> Result<Peer> {
    let folded: PathBuf = dir.join("peer-probee.folded");
    let _ = fs::remove_file(&folded);
    mount_tracefs();
    // BPF run-time stats on for the run (hostprof's --bpf-stats does the
    // same for itself).
    let stats = fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_default();
    let _ = fs::write("/proc/sys/kernel/bpf_stats_enabled", "1");
    let child = Command::new("probee")
        .args([
            "--frequency",
            "999",
            "--time",
            &(seconds * 1000).to_string(),
        ])
        .args(["--group-by-process", "--skip-idle"])
        .args(extra)
        .arg("-o")
        .arg(&folded)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start probee")?;
    // Its programs' stats, read while it still runs (they go with it).
    let pid = child.id();
    let started = Instant::now();
    let (mut kernel, mut maps) = (None, None);
    while started.elapsed() < Duration::from_millis(seconds * 1000 - 500) {
        std::thread::sleep(Duration::from_millis(200));
        kernel = perf_event_prog_ns(pid).or(kernel);
        maps = map_bytes(pid).or(maps);
    }
    let usage = crate::bench::wait_usage(child)?;
    if stats.trim() == "0" {
        let _ = fs::write("/proc/sys/kernel/bpf_stats_enabled", "0");
    }
    let text = fs::read_to_string(&folded).context("probee wrote no folded output")?;
    let (workload, reaching_main, host, own) = count_folded(&text, "probee");
    Ok(Peer {
        name,
        usage,
        workload,
        reaching_main,
        host,
        own: Some(own),
        processes: None,
        kernel_ns: kernel,
        bpf_map_mib: maps.map(|bytes| bytes as f64 / (1 << 20) as f64),
    })
}

/// run_time_ns / run_cnt over the perf_event programs (type 7) that
/// process `pid` holds, from its fds' fdinfo.
fn perf_event_prog_ns(pid: u32) -> Option<f64> {
    let (mut time, mut count) = (0u64, 0u64);
    for info in fdinfos(pid) {
        if fdinfo_field(&info, "prog_type:") == Some(7) {
            time += fdinfo_field(&info, "run_time_ns:").unwrap_or(0);
            count += fdinfo_field(&info, "run_cnt:").unwrap_or(0);
        }
    }
    (count > 0).then(|| time as f64 / count as f64)
}

/// Kernel memory of the BPF maps process `pid` holds: each map's
/// `memlock` (once per `map_id`) from its fds' fdinfo.
fn map_bytes(pid: u32) -> Option<u64> {
    let maps: std::collections::BTreeMap<u64, u64> = fdinfos(pid)
        .iter()
        .filter_map(|info| {
            Some((
                fdinfo_field(info, "map_id:")?,
                fdinfo_field(info, "memlock:")?,
            ))
        })
        .collect();
    (!maps.is_empty()).then(|| maps.values().sum())
}

/// The fdinfo text of each of process `pid`'s fds.
fn fdinfos(pid: u32) -> Vec<String> {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| fs::read_to_string(entry.path()).ok())
        .collect()
}

/// A number field (`name` with its colon) of an fdinfo text.
fn fdinfo_field(info: &str, name: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|value| value.trim().parse::<u64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cpu_ms: u64, workload: u64) -> Peer {
        Peer {
            name: "p",
            usage: Usage {
                cpu: Duration::from_millis(cpu_ms),
                max_rss_kib: 0,
            },
            workload,
            reaching_main: 0,
            host: 0,
            own: None,
            processes: None,
            kernel_ns: None,
            bpf_map_mib: None,
        }
    }

    #[test]
    fn cost_splits_into_the_line_through_two_runs() {
        // 200 ms once, then 10 ms per 1000 samples.
        let (fixed, per_1k) = split_cost(&run(360, 16_000), &run(240, 4_000)).unwrap();
        assert!((fixed - 200.0).abs() < 1e-6, "{fixed}");
        assert!((per_1k - 10.0).abs() < 1e-6, "{per_1k}");
        // No more samples in the long run: no line.
        assert!(split_cost(&run(300, 4_000), &run(240, 4_000)).is_none());
    }
}
