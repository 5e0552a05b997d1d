//! A `hostprof agent` process under test, observed through its metrics
//! endpoint or status lines, and a CPU spinner to give it samples.
use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Child, Command, Stdio},
    sync::{Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::hostprof;

/// A child's stderr, read line by line on a thread of its own, so a test can
/// wait for a line while the child runs.
pub struct StderrLog {
    /// The text so far, and whether the child closed its stderr.
    shared: Arc<(Mutex<(String, bool)>, Condvar)>,
    reader: Option<JoinHandle<()>>,
}

impl StderrLog {
    /// Reads `child`'s stderr, which must be piped.
    pub fn take(child: &mut Child) -> StderrLog {
        let pipe = child.stderr.take().expect("stderr piped");
        let shared = Arc::new((Mutex::new((String::new(), false)), Condvar::new()));
        let sink = shared.clone();
        let reader = std::thread::spawn(move || {
            let (text, changed) = &*sink;
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = text.lock().unwrap();
                text.0.push_str(&line);
                text.0.push('\n');
                changed.notify_all();
            }
            text.lock().unwrap().1 = true;
            changed.notify_all();
        });
        StderrLog {
            shared,
            reader: Some(reader),
        }
    }

    /// What was printed so far.
    pub fn text(&self) -> String {
        self.shared.0.lock().unwrap().0.clone()
    }

    /// Waits until a line starting with `prefix` was printed: false when
    /// the child closed its stderr first, or after `limit`.
    pub fn wait_for_line(&self, prefix: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let (text, changed) = &*self.shared;
        let mut text = text.lock().unwrap();
        loop {
            if text.0.lines().any(|line| line.starts_with(prefix)) {
                return true;
            }
            let now = Instant::now();
            if text.1 || now >= deadline {
                return false;
            }
            text = changed.wait_timeout(text, deadline - now).unwrap().0;
        }
    }

    /// Everything the child printed, once it closed its stderr (it exited).
    pub fn finish(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            reader.join().expect("the stderr reader panicked");
        }
        self.text()
    }
}

/// The count after `prefix` on a report line of record's that starts with
/// it ("hostprof: Java frames: 1234 walked in the kernel; …").
pub fn report_count(report: &str, prefix: &str) -> Option<u64> {
    let line = report.lines().find_map(|line| line.strip_prefix(prefix))?;
    line.split(' ').next()?.parse().ok()
}

/// Starts `hostprof record` (`command`, its stderr piped here) and waits
/// until it says it is recording: samples are being taken, and SIGINT ends
/// the recording.
pub fn start_recording(command: &mut Command) -> (Child, StderrLog) {
    let mut child = command
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hostprof record");
    let mut stderr = StderrLog::take(&mut child);
    if !stderr.wait_for_line(::hostprof::cli::RECORDING_LINE, Duration::from_secs(60)) {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "hostprof record never started recording:\n{}",
            stderr.finish()
        );
    }
    (child, stderr)
}

/// Starts `hostprof record -F rate_hz --pid pid --output output` with
/// [`start_recording`].
pub fn record_pid(pid: u32, rate_hz: &str, output: &std::path::Path) -> (Child, StderrLog) {
    record_pid_on(pid, rate_hz, output, None)
}

/// [`record_pid`] with the eBPF variant `variant` forced
/// (`HOSTPROF_BPF_VARIANT`: "legacy" runs Linux 5.10's programs here), or
/// the one hostprof picks when `None`.
pub fn record_pid_on(
    pid: u32,
    rate_hz: &str,
    output: &std::path::Path,
    variant: Option<&str>,
) -> (Child, StderrLog) {
    let mut record = super::hostprof();
    record
        .args(["record", "-F", rate_hz, "--pid"])
        .arg(pid.to_string())
        .arg("--output")
        .arg(output);
    if let Some(variant) = variant {
        record.env(::hostprof::sampler::VARIANT_ENV, variant);
    }
    start_recording(&mut record)
}

/// Waits until process `pid` has used `seconds` more CPU time than when
/// called, however long the machine takes to give it that time (at most
/// `limit`): `Some(true)` when it did, `Some(false)` when it exited first,
/// `None` at the limit.
pub fn wait_for_cpu(pid: u32, seconds: f64, limit: Duration) -> Option<bool> {
    let ran = super::cpu_seconds(pid);
    wait_for(limit, || match super::try_cpu_seconds(pid) {
        Some(now) => (now >= ran + seconds).then_some(true),
        None => Some(false),
    })
}

/// Ends a recording as Ctrl-C would, and waits for hostprof to exit.
pub fn interrupt(recording: &mut Child) -> std::process::ExitStatus {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(recording.id() as i32, libc::SIGINT) };
    recording.wait().expect("wait for hostprof")
}

/// A running agent whose stderr is collected in the background.
pub struct Agent {
    child: Child,
    stderr: StderrLog,
    metrics_port: Option<u16>,
}

impl Agent {
    /// Starts `hostprof agent` with `args`, by default against a collector
    /// that is down (port 1), so nothing depends on one.
    pub fn start(metrics: bool, args: &[&str]) -> Agent {
        Agent::start_with_env(metrics, args, &[])
    }

    /// [`Agent::start`] with more environment variables.
    pub fn start_with_env(metrics: bool, args: &[&str], env: &[(&str, &str)]) -> Agent {
        let metrics_port = metrics.then(free_port);
        let mut command = hostprof();
        command
            .envs(env.iter().copied())
            .arg("agent")
            .args(["--status-interval", "1", "-F", "99"])
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if !args.contains(&"--otlp-endpoint") {
            command.args(["--otlp-endpoint", "http://127.0.0.1:1"]);
        }
        if let Some(port) = metrics_port {
            command.args(["--metrics-addr", &port.to_string()]);
        }
        // The tests' own table cache, not the machine's (the agent's
        // default is /var/cache/hostprof/tables).
        if !args.contains(&"--unwind-cache-dir") {
            command
                .arg("--unwind-cache-dir")
                .arg(super::work_dir().join("agent-table-cache"));
        }
        let mut child = command.spawn().expect("start hostprof agent");
        let stderr = StderrLog::take(&mut child);
        Agent {
            child,
            stderr,
            metrics_port,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    /// Samples read so far, from the metrics endpoint or else the status lines.
    pub fn samples(&self) -> Option<u64> {
        match self.metrics_port {
            Some(port) => metric(&scrape(port)?, "hostprof_samples_total"),
            None => self
                .stderr()
                .lines()
                .rev()
                .find_map(|line| line.split("status samples=").nth(1))
                .and_then(|rest| rest.split(' ').next()?.parse().ok()),
        }
    }

    /// A metric's current value (the agent must serve metrics).
    pub fn metric(&self, name: &str) -> Option<u64> {
        metric(&scrape(self.metrics_port?)?, name)
    }

    /// Waits until the agent has read more than `floor` samples.
    pub fn wait_for_samples_above(&self, floor: u64) -> u64 {
        wait_for(Duration::from_secs(60), || {
            self.samples().filter(|&n| n > floor)
        })
        .unwrap_or_else(|| {
            panic!(
                "the agent read no more than {floor} samples:\n{}",
                self.stderr()
            )
        })
    }

    /// SIGTERM, then the exit status, within a bound, and all of stderr.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        let status = wait_for(Duration::from_secs(60), || {
            self.child.try_wait().expect("wait for the agent")
        });
        let Some(status) = status else {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!(
                "the agent did not exit after SIGTERM:\n{}",
                self.stderr.finish()
            );
        };
        (status, self.stderr.finish())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CPU-bound shell loop, so there is something to sample.
pub struct Spinner(#[allow(dead_code)] KillOnDrop);

impl Spinner {
    pub fn start() -> Spinner {
        Spinner(KillOnDrop(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .expect("start a spinner"),
        ))
    }
}

/// A child process (a server a test started) killed when the test ends,
/// by a panic too.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port free now, and not handed out before in this test process: the
/// kernel may give the same ephemeral port to two calls in a row (a CI
/// run once gave both agents of one test the same metrics port, before
/// the first had bound it).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

pub fn wait_for<T>(limit: Duration, check: impl FnMut() -> Option<T>) -> Option<T> {
    poll(limit, check, || {
        std::thread::sleep(Duration::from_millis(200))
    })
}

/// As [`wait_for`], but busy between checks, so that this CPU is sampled
/// too (a check on what the sampler does with every CPU).
pub fn spin_for<T>(limit: Duration, check: impl FnMut() -> Option<T>) -> Option<T> {
    let mut sink = 0u64;
    poll(limit, check, || {
        for i in 0..1_000_000u64 {
            sink = std::hint::black_box(sink.wrapping_mul(31).wrapping_add(i));
        }
    })
}

/// `check`'s first value within `limit`, with `pause` between checks.
fn poll<T>(
    limit: Duration,
    mut check: impl FnMut() -> Option<T>,
    mut pause: impl FnMut(),
) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(value) = check() {
            return Some(value);
        }
        pause();
    }
    None
}

/// The body of `GET /metrics`, if the endpoint answers 200.
pub fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

pub fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}
