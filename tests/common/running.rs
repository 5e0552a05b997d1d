//! A `hostprof agent` process under test, observed through its metrics
//! endpoint or status lines, and a CPU spinner to give it samples.
use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::hostprof;

/// A running agent whose stderr is collected in the background.
pub struct Agent {
    child: Child,
    stderr: Arc<Mutex<String>>,
    metrics_port: Option<u16>,
}

impl Agent {
    /// Starts `hostprof agent` with `args`, by default against a collector
    /// that is down (port 1), so nothing depends on one.
    pub fn start(metrics: bool, args: &[&str]) -> Agent {
        let metrics_port = metrics.then(free_port);
        let mut command = hostprof();
        command
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
        let mut child = command.spawn().expect("start hostprof agent");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
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
        self.stderr.lock().unwrap().clone()
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

    /// SIGTERM, then the exit status, within a bound.
    pub fn terminate(mut self) -> (std::process::ExitStatus, String) {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        let status = wait_for(Duration::from_secs(60), || {
            self.child.try_wait().expect("wait for the agent")
        });
        let Some(status) = status else {
            let _ = self.child.kill();
            panic!("the agent did not exit after SIGTERM:\n{}", self.stderr());
        };
        // Let the stderr thread see the last lines.
        std::thread::sleep(Duration::from_millis(200));
        (status, self.stderr())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CPU-bound shell loop, so there is something to sample.
pub struct Spinner(Child);

impl Spinner {
    pub fn start() -> Spinner {
        Spinner(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .expect("start a spinner"),
        )
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

pub fn wait_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(value) = check() {
            return Some(value);
        }
        std::thread::sleep(Duration::from_millis(200));
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
