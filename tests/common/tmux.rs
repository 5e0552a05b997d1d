//! A program on a real terminal: a detached tmux session, its screen read
//! with `capture-pane`, keys sent with `send-keys`.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use super::run_ok;

/// A detached tmux session running a command; killed on drop.
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
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", name])
            .output();
        run_ok(Command::new("tmux").args([
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
        Tmux {
            name: name.to_owned(),
        }
    }

    /// Sends keys by tmux's names (`q`, `Enter`, `Escape`, `C-c`).
    pub fn keys(&self, keys: &[&str]) {
        run_ok(
            Command::new("tmux")
                .args(["send-keys", "-t", &self.name])
                .args(keys),
        );
    }

    /// Types `text` as it is.
    pub fn type_text(&self, text: &str) {
        run_ok(Command::new("tmux").args(["send-keys", "-l", "-t", &self.name, text]));
    }

    pub fn screen(&self) -> String {
        let output = run_ok(Command::new("tmux").args(["capture-pane", "-p", "-t", &self.name]));
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
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.name])
            .output();
    }
}
