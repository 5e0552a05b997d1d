//! `hostprof record -- COMMAND`: the child started held at a gate until its
//! pid is in the sampler's filter.
use std::{
    fs::File,
    io::{self, Write},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

use anyhow::{Context, bail};

use crate::sampler::Sampler;

/// Starts `command` held at a gate until its pid is in the sampler's filter,
/// so its very first instructions are profiled.
///
/// `spawn` returns only once the child has exec'd, so the gate cannot sit
/// between fork and exec; a shell waits on it instead and then `exec`s the
/// command, which keeps the pid we put in the filter.
pub(super) fn spawn_profiled(
    command: &[String],
    sampler: &mut Sampler,
) -> anyhow::Result<tokio::process::Child> {
    if !is_runnable(&command[0]) {
        bail!(
            "cannot start `{}`: no such command (check the name or PATH)",
            command[0]
        );
    }
    let (gate_read, gate_write) = pipe().context("cannot create a pipe")?;
    let read_fd = gate_read.as_raw_fd();
    // The command runs at the user's priority, not at record's.
    let user_nice = crate::cli::priority::user_nice();
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(r#"read -r _ <&3; exec 3<&-; exec "$0" "$@""#)
        .args(command);
    // SAFETY: dup2 and setpriority are async-signal-safe system calls;
    // they run between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(read_fd, GATE_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(nice) = user_nice {
                // Lowering one's own priority needs no privilege.
                libc::setpriority(libc::PRIO_PROCESS, 0, nice);
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .context("cannot start /bin/sh to run the command")?;
    drop(gate_read);
    if let Some(pid) = child.id() {
        sampler.add_pid(pid)?;
    }
    let mut gate = File::from(gate_write);
    gate.write_all(b"go\n")
        .context("cannot release the profiled command")?;
    Ok(child)
}

/// The descriptor the gate shell reads.
const GATE_FD: i32 = 3;

/// A path, or a name found in PATH, naming an executable file.
fn is_runnable(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        path.metadata()
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        return executable(Path::new(name));
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| executable(&dir.join(name))))
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
