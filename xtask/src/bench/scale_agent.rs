//! Issue 31's agent row: `hostprof agent` started host-wide beside the N
//! copies (all spinning already), with an empty unwind table cache and its
//! default rate, exporting to a local sink as on a node just after a
//! restart. After [`WARM_UP`] its own counters over the next [`WINDOW`]
//! say what share of the user stacks the kernel walked reached their end
//! (for these static binaries, `_start`), and its RSS and BPF map memory
//! what it holds by then.
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::soak::{Group, Received, rss_mib, start_sink};

/// How long the agent runs before the window: the "after 60 s".
const WARM_UP: Duration = Duration::from_secs(60);
/// The window the shares are counted over.
const WINDOW: Duration = Duration::from_secs(20);

/// What the agent did in the window, and held at its end.
pub(super) struct AgentRun {
    /// User stacks the kernel walked to their end, of all it walked.
    pub complete: u64,
    pub walked: u64,
    /// The others, by why they stopped (kernel event name, count).
    pub stopped: Vec<(&'static str, u64)>,
    pub rss_mib: f64,
    pub map_mib: f64,
    /// Process loads (mappings and tables into the kernel) by the
    /// window's end.
    pub loads: u64,
}

pub(super) fn agent_after(hostprof: &Path, copies: &[PathBuf], cache: &Path) -> Result<AgentRun> {
    let _ = std::fs::remove_dir_all(cache);
    let sink_binary = crate::build_example("otlp_sink", None)?;
    let seconds = (WARM_UP + WINDOW).as_secs() + 30;
    // Each in a process group of its own, which `Group` kills.
    let mut children = Group(Vec::new());
    for copy in copies {
        children.0.push(
            Command::new(copy)
                .arg(seconds.to_string())
                .stdout(Stdio::null())
                .process_group(0)
                .spawn()
                .context("cannot start the copies")?,
        );
    }
    let (sink, addr) = start_sink(&sink_binary, Arc::new(Received::default()))?;
    children.0.push(sink);
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let agent = Command::new(hostprof)
        .args(["agent", "--otlp-endpoint", &format!("http://{addr}")])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--status-interval", "0"])
        .arg("--unwind-cache-dir")
        .arg(cache)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .context("cannot start hostprof agent")?;
    let agent_pid = agent.id();
    children.0.push(agent);
    std::thread::sleep(WARM_UP);
    let before = scrape(port)?;
    std::thread::sleep(WINDOW);
    let after = scrape(port)?;
    let rss = rss_mib(agent_pid)?;
    let kernel = |text: &str, event: &str| {
        metric(
            text,
            &format!("hostprof_kernel_events_total{{event=\"{event}\"}}"),
        )
    };
    let delta = |event: &str| kernel(&after, event) - kernel(&before, event);
    Ok(AgentRun {
        complete: delta("unwind_complete"),
        walked: delta("unwind_tables") + delta("unwind_unknown_process"),
        stopped: STOPS
            .iter()
            .map(|&event| (event, delta(event)))
            .filter(|&(_, count)| count > 0)
            .collect(),
        rss_mib: rss,
        map_mib: metric(&after, "hostprof_bpf_map_bytes") as f64 / (1 << 20) as f64,
        loads: metric(&after, "hostprof_unwind_process_loads_total"),
    })
}

/// Why the kernel's walks that did not reach their end stopped.
const STOPS: [&str; 8] = [
    "unwind_unknown_process",
    "unwind_not_loaded",
    "unwind_no_mapping",
    "unwind_pc_not_covered",
    "unwind_read_fault",
    "unwind_bad_frame",
    "unwind_no_table",
    "unwind_depth_limit",
];

/// The agent's `/metrics` text.
fn scrape(port: u16) -> Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .context("the agent's metrics endpoint does not answer")?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_owned()),
        _ => bail!("the agent's metrics endpoint answered {response:.80}"),
    }
}

/// The value of the series `name` (with its labels), 0 when absent.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}
