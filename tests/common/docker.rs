//! A real Docker daemon for the container tests: Debian's `docker.io`
//! (installed by `cargo xtask setup`), started here when it is not running
//! yet, with its own socket, data root under target/ and no bridge network
//! (no iptables changes on the host; the tests' containers need no network,
//! and the agent's container uses the host's, as shown where it is run).
use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use super::{require_tool, run_ok, running::wait_for};

/// The daemon's directory for its socket, pid file and runtime state;
/// shared by every worktree's test runs on the machine (one daemon).
const RUN_DIR: &str = "/run/hostprof-tests";

/// A Docker daemon that answers.
pub struct Docker {
    socket: String,
}

impl Docker {
    /// The daemon, started if needed; `None` (after saying why) when docker
    /// is not installed, a panic under `CI=true` or when it will not start.
    pub fn get() -> Option<&'static Docker> {
        static DOCKER: OnceLock<Option<Docker>> = OnceLock::new();
        DOCKER
            .get_or_init(|| {
                if !(require_tool("dockerd") && require_tool("docker")) {
                    return None;
                }
                let docker = Docker {
                    socket: format!("unix://{RUN_DIR}/docker.sock"),
                };
                if !docker.answers() {
                    docker.start();
                }
                Some(docker)
            })
            .as_ref()
    }

    /// `docker` talking to this daemon.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new("docker");
        cmd.env("DOCKER_HOST", &self.socket);
        cmd
    }

    /// `docker ARGS`, which must succeed; its stdout, trimmed.
    pub fn run(&self, args: &[&str]) -> String {
        let out = run_ok(self.command().args(args));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    fn answers(&self) -> bool {
        self.command()
            .args(["version", "--format", "{{.Server.Version}}"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// Starts dockerd in its own session (it outlives this test process, so
    /// the next test binary reuses it) and waits until its API answers.
    fn start(&self) {
        let state = Path::new(env!("CARGO_TARGET_TMPDIR")).join("docker");
        std::fs::create_dir_all(&state).expect("create the docker data root");
        std::fs::create_dir_all(RUN_DIR).expect("create the docker run dir");
        let log_path = state.join("dockerd.log");
        let log = std::fs::File::create(&log_path).expect("create dockerd.log");
        let mut daemon = Command::new("dockerd");
        daemon
            .arg("--host")
            .arg(&self.socket)
            .arg("--data-root")
            .arg(state.join("data"))
            .args(["--exec-root", &format!("{RUN_DIR}/exec")])
            .args(["--pidfile", &format!("{RUN_DIR}/dockerd.pid")])
            .args(["--bridge", "none", "--iptables=false", "--ip-masq=false"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0);
        let mut child = daemon.spawn().expect("start dockerd");
        let up = wait_for(Duration::from_secs(60), || {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(Err(status));
            }
            self.answers().then_some(Ok(()))
        });
        match up {
            Some(Ok(())) => {}
            Some(Err(status)) => panic!(
                "dockerd exited with {status}:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            ),
            None => panic!(
                "dockerd did not answer within 60 s:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            ),
        }
    }

    /// Imports the directory `root` as image `tag` (`docker import` of its
    /// tar: no registry needed).
    pub fn import(&self, root: &Path, tag: &str) {
        let mut tar = Command::new("tar")
            .arg("-C")
            .arg(root)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()
            .expect("run tar");
        let import = self
            .command()
            .args(["import", "-", tag])
            .stdin(tar.stdout.take().unwrap())
            .output()
            .expect("run docker import");
        assert!(tar.wait().unwrap().success(), "tar of {}", root.display());
        assert!(
            import.status.success(),
            "docker import {tag}: {}",
            String::from_utf8_lossy(&import.stderr)
        );
    }

    /// Whether image `tag` exists.
    pub fn has_image(&self, tag: &str) -> bool {
        self.command()
            .args(["image", "inspect", tag])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// `docker run -d ARGS`: the started container.
    pub fn start_container(&'static self, args: &[&str]) -> Container {
        let id = self.run(&[&["run", "-d"], args].concat());
        Container { docker: self, id }
    }
}

/// A container, removed (killed) on drop.
pub struct Container {
    docker: &'static Docker,
    /// What `docker run -d` printed: the full 64-hex id.
    pub id: String,
}

impl Container {
    /// `docker inspect --format FORMAT` of this container.
    pub fn inspect(&self, format: &str) -> String {
        self.docker.run(&["inspect", "--format", format, &self.id])
    }

    /// The host pid of the container's first process.
    pub fn pid(&self) -> u32 {
        self.inspect("{{.State.Pid}}")
            .parse()
            .expect("a pid from docker inspect")
    }

    /// Waits (up to `limit`) for the container to exit; its exit code.
    pub fn wait(&self, limit: Duration) -> Option<i64> {
        wait_for(limit, || {
            (self.inspect("{{.State.Running}}") == "false")
                .then(|| self.inspect("{{.State.ExitCode}}").parse().unwrap())
        })
    }

    /// stdout and stderr so far.
    pub fn logs(&self) -> String {
        let out = self
            .docker
            .command()
            .args(["logs", &self.id])
            .output()
            .expect("run docker logs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.docker.command().args(["rm", "-f", &self.id]).output();
    }
}

/// A Debian bookworm root filesystem (`debootstrap --variant=minbase`, with
/// CA certificates), made once and kept in target/: the offline stand-in
/// for the image's default runtime base (distroless cc-debian12, which holds
/// the same glibc and certificates), imported as `tag`.
pub fn bookworm_base(docker: &Docker, tag: &str) {
    if docker.has_image(tag) {
        return;
    }
    assert!(
        require_tool("debootstrap"),
        "debootstrap makes the image's base"
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bookworm-minbase");
    if !dir.join("etc/debian_version").exists() {
        let partial = dir.with_extension("partial");
        let _ = std::fs::remove_dir_all(&partial);
        run_ok(
            Command::new("debootstrap")
                .args(["--variant=minbase", "--include=ca-certificates", "bookworm"])
                .arg(&partial)
                .arg("http://deb.debian.org/debian"),
        );
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&partial, &dir).expect("keep the root filesystem");
    }
    docker.import(&dir, tag);
}
