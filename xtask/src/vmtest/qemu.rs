//! Boots a kernel with the initramfs under qemu (TCG unless KVM is asked
//! for: nested KVM can hang at boot) and collects the console, killing qemu
//! at a hard deadline so nothing hangs.
use std::{
    fs,
    io::{BufRead, BufReader, Read, Write},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::Arch;

/// What a boot left behind.
pub struct Boot {
    /// The console's `VMTEST ...` lines, without the prefix.
    pub results: Vec<String>,
    /// The console's last lines, to show when the suite did not finish.
    pub tail: Vec<String>,
    /// qemu's own stderr.
    pub stderr: String,
    /// Killed at the deadline.
    pub timed_out: bool,
}

const TAIL_LINES: usize = 15;

/// What differs between guests: memory, vCPUs, and kernel arguments added
/// to the console's.
pub struct Guest {
    pub memory: &'static str,
    pub cpus: u32,
    pub append: &'static str,
    /// TCG on one host thread for all vCPUs. Multi-threaded TCG, the
    /// default, once crashed a 32-vCPU guest at boot (6.12: `Oops: int3`
    /// in `sched_clock_cpu`, a vCPU running code another was patching with
    /// the kernel's int3 text poking); one thread sees every write first.
    pub single_thread: bool,
}

impl Default for Guest {
    fn default() -> Self {
        Guest {
            memory: "1G",
            cpus: 2,
            append: "",
            single_thread: false,
        }
    }
}

/// Runs qemu until it exits (the guest powers off or panics) or `timeout`
/// passes; the whole console goes to `log`, VMTEST lines are echoed.
pub fn boot(
    arch: Arch,
    kernel: &Path,
    initramfs: &Path,
    log: &Path,
    timeout: Duration,
    kvm: bool,
    guest: &Guest,
) -> Result<Boot> {
    let mut cmd = Command::new(arch.qemu());
    match arch {
        Arch::X86_64 => cmd.args(["-M", "pc"]),
        // An implementation-defined pointer authentication is much faster
        // under TCG than the architected one, and as good for the guest.
        Arch::Aarch64 => cmd.args(["-M", "virt", "-cpu", "max,pauth-impdef=on"]),
    };
    if kvm {
        cmd.args(["-enable-kvm", "-cpu", "host"]);
    } else {
        if guest.single_thread {
            cmd.args(["-accel", "tcg,thread=single"]);
        }
        if arch == Arch::X86_64 {
            cmd.args(["-cpu", "max"]);
        }
    }
    cmd.args([
        "-m",
        guest.memory,
        "-smp",
        &guest.cpus.to_string(),
        "-kernel",
    ])
    .arg(kernel)
    .arg("-initrd")
    .arg(initramfs)
    .args([
        "-append",
        &format!("console={} panic=-1 quiet {}", arch.console(), guest.append),
        "-no-reboot",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio",
        "-nic",
        "none",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    eprintln!("xtask: running {cmd:?}");
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", arch.qemu()))?;

    let (lines, receive) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line).trim_end().to_owned();
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut stderr_pipe = child.stderr.take().expect("piped");
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr_pipe.read_to_string(&mut text);
        text
    });

    let mut console = fs::File::create(log)?;
    let deadline = Instant::now() + timeout;
    let mut boot = Boot {
        results: Vec::new(),
        tail: Vec::new(),
        stderr: String::new(),
        timed_out: false,
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match receive.recv_timeout(left) {
            Ok(line) => {
                writeln!(console, "{line}")?;
                if let Some(result) = line.strip_prefix("VMTEST ") {
                    eprintln!("  {line}");
                    boot.results.push(result.to_owned());
                }
                boot.tail.push(line);
                if boot.tail.len() > TAIL_LINES {
                    boot.tail.remove(0);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                boot.timed_out = true;
                let _ = child.kill();
                break;
            }
        }
    }
    child.wait()?;
    let _ = reader.join();
    if boot.tail.is_empty() {
        boot.tail.push("(nothing)".into());
    }
    boot.stderr = stderr_reader.join().unwrap_or_default();
    Ok(boot)
}
