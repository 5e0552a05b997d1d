//! A program on a real terminal: a detached tmux session, its screen read
//! with `capture-pane`, keys sent with `send-keys`.
//!
//! Each session has a tmux server of its own, on a socket of its own
//! (`-S`, removed with the session). With one shared
//! server, a test whose last session ends takes the server down while a
//! test running beside it asks that server for a new session, and tmux
//! answers "server exited unexpectedly" (seen in CI).
use std::{
    process::Command,
    time::{Duration, Instant},
};

use super::run_ok;

/// A detached tmux session running a command; killed, with its server, on
/// drop.
pub struct Tmux {
    pub name: String,
}

impl Tmux {
    /// A 200×50 terminal.
    pub fn start(name: &str, command: &str) -> Tmux {
        Self::start_sized(name, (200, 50), command)
    }

    /// A terminal of (columns, rows).
    pub fn start_sized(name: &str, (columns, rows): (u16, u16), command: &str) -> Tmux {
        let tmux = Tmux {
            name: name.to_owned(),
        };
        // A server left by an earlier run under the same name.
        let _ = tmux.command().arg("kill-server").output();
        let _ = std::fs::remove_file(tmux.socket());
        run_ok(tmux.command().args([
            "new-session",
            "-d",
            "-x",
            &columns.to_string(),
            "-y",
            &rows.to_string(),
            "-s",
            name,
            command,
        ]));
        tmux
    }

    /// `tmux` talking to this session's own server.
    fn command(&self) -> Command {
        let mut command = Command::new("tmux");
        command.arg("-S").arg(self.socket());
        command
    }

    /// The server's socket (short: a socket's path has at most 107 bytes).
    fn socket(&self) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("hostprof-tmux-{}", self.name))
    }

    /// Sends keys by tmux's names (`q`, `Enter`, `Escape`, `C-c`).
    pub fn keys(&self, keys: &[&str]) {
        run_ok(
            self.command()
                .args(["send-keys", "-t", &self.name])
                .args(keys),
        );
    }

    /// Types `text` as it is.
    pub fn type_text(&self, text: &str) {
        run_ok(
            self.command()
                .args(["send-keys", "-l", "-t", &self.name, text]),
        );
    }

    pub fn screen(&self) -> String {
        let output = run_ok(
            self.command()
                .args(["capture-pane", "-p", "-t", &self.name]),
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Polls the screen until `done` accepts it; panics with it at the deadline.
    pub fn wait_for<T>(&self, what: &str, seconds: u64, done: impl Fn(&str) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        loop {
            let screen = self.screen();
            if let Some(found) = done(&screen) {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} after {seconds} s; the terminal shows:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command().arg("kill-server").output();
        let _ = std::fs::remove_file(self.socket());
    }
}
