//! `cargo xtask vmtest --systemd`: the shipped systemd unit under a real
//! systemd. A Debian bookworm root filesystem (`debootstrap
//! --variant=minbase` with systemd-sysv and bpftool, cached in
//! target/vmtest/systemd/) boots as the initramfs of bookworm's kernel under
//! qemu, systemd as PID 1 (the kernel's tmpfs root: no disk image, no
//! modules to load). An overlay adds the `.deb` of `cargo xtask package`,
//! the otlp_sink example as a second unit on the port the shipped
//! hostprof.env names, a CPU-bound program and the suite (systemd.sh), run
//! by vmtest.service once multi-user.target is reached. Units a test VM does
//! not need (gettys, timers) are masked to keep the TCG boot short.
use std::{
    fs,
    os::unix::fs::{PermissionsExt, symlink},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Arch, image, kernel, qemu};
use crate::{build_example, package, root, run_cmd};

const SUITE: &str = include_str!("systemd.sh");

/// Boot, install, start, stop and power-off under TCG take ~3 minutes
/// (more on a loaded host).
const TIMEOUT: Duration = Duration::from_secs(600);

/// The units masked in the guest: logins on the consoles (one would write
/// over the suite's lines) and periodic maintenance.
const MASKED: &[&str] = &[
    "getty@tty1.service",
    "serial-getty@ttyS0.service",
    "console-getty.service",
    "systemd-firstboot.service",
    "systemd-logind.service",
    "e2scrub_reap.service",
    "systemd-pstore.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "systemd-tmpfiles-clean.timer",
];

const SINK_UNIT: &str = "\
[Unit]
Description=OTLP receiver (hostprof's otlp_sink example) for the vmtest

[Service]
ExecStart=/usr/local/bin/otlp_sink 127.0.0.1:4317
StandardOutput=file:/run/otlp-sink.log
";

const SUITE_UNIT: &str = "\
[Unit]
Description=hostprof systemd vmtest suite
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/usr/local/bin/vmtest.sh
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0

[Install]
WantedBy=multi-user.target
";

pub fn run(dir: &Path, kvm: bool) -> Result<()> {
    let dir = dir.join("systemd");
    fs::create_dir_all(&dir)?;
    let kernel = kernel::fetch(dir.parent().expect("vmtest dir"), "bookworm", Arch::X86_64)?;
    let base = base_cpio(&dir)?;
    let packages = package::run(None)?;
    let otlp_sink = build_example("otlp_sink", None)?;

    let overlay = dir.join("overlay");
    let _ = fs::remove_dir_all(&overlay);
    let bin = overlay.join("usr/local/bin");
    fs::create_dir_all(&bin)?;
    fs::create_dir_all(overlay.join("root"))?;
    fs::copy(&packages.deb, overlay.join("root/hostprof.deb"))?;
    fs::copy(&otlp_sink, bin.join("otlp_sink"))?;
    run_cmd(
        Command::new("cc")
            .args(["-O0", "-g", "-fno-omit-frame-pointer", "-static", "-o"])
            .arg(bin.join("otlp_spin"))
            .arg(root().join("tests/programs/otlp_spin.c")),
    )?;
    fs::write(bin.join("vmtest.sh"), SUITE)?;
    fs::set_permissions(bin.join("vmtest.sh"), fs::Permissions::from_mode(0o755))?;
    let etc = overlay.join("etc");
    let units = etc.join("systemd/system");
    fs::create_dir_all(units.join("multi-user.target.wants"))?;
    fs::write(units.join("otlp-sink.service"), SINK_UNIT)?;
    fs::write(units.join("vmtest.service"), SUITE_UNIT)?;
    symlink(
        "../vmtest.service",
        units.join("multi-user.target.wants/vmtest.service"),
    )?;
    for unit in MASKED {
        symlink("/dev/null", units.join(unit))?;
    }
    // Not a first boot (no prompts), and names for the loopback address.
    fs::write(etc.join("machine-id"), "4f1c0e5d0c3a8e2f9d7c6b5a49382716\n")?;
    fs::write(etc.join("hostname"), "vmtest\n")?;
    fs::write(etc.join("hosts"), "127.0.0.1 localhost\n::1 localhost\n")?;
    let overlay_cpio = dir.join("overlay.cpio");
    image::pack(&overlay, &overlay_cpio)?;

    // The kernel unpacks concatenated archives in turn, later files
    // replacing earlier ones: the cached base, then this run's overlay.
    let initramfs = dir.join("initramfs.cpio");
    let mut bytes = fs::read(&base)?;
    bytes.extend(fs::read(&overlay_cpio)?);
    fs::write(&initramfs, bytes)?;

    let log = dir.join("console.log");
    let started = Instant::now();
    let boot = qemu::boot(
        Arch::X86_64,
        &kernel.image,
        &initramfs,
        &log,
        TIMEOUT,
        kvm,
        &qemu::Guest {
            memory: "2G",
            cpus: 2,
            single_thread: false,
            // Debian's kernels default to perf_event_paranoid=3, at which a
            // Debian patch asks CAP_SYS_ADMIN for any perf event: the unit's
            // CAP_PERFMON is enough only at 2 (upstream's default), which
            // hosts running the unit must set (README, "systemd").
            append: "rdinit=/sbin/init systemd.show_status=0 sysctl.kernel.perf_event_paranoid=2",
        },
    )?;
    let verdict = judge(&boot.results);
    let passed = boot
        .results
        .iter()
        .any(|line| line.starts_with("check=stop"))
        && verdict.iter().all(|(passed, _)| *passed);
    let label = format!("vmtest: systemd on linux-{}", kernel.release);
    eprintln!(
        "{label}: {} in {} s{}",
        if passed { "pass" } else { "fail" },
        started.elapsed().as_secs(),
        if boot.timed_out { " (timed out)" } else { "" }
    );
    for (ok, text) in &verdict {
        eprintln!("vmtest:   {} {text}", if *ok { "ok  " } else { "FAIL" });
    }
    if !passed {
        eprintln!("vmtest:   console: {}", log.display());
        for line in &boot.tail {
            eprintln!("vmtest:     {line}");
        }
        bail!("{label} failed");
    }
    Ok(())
}

/// The bookworm root filesystem as an uncompressed cpio, made once.
fn base_cpio(dir: &Path) -> Result<std::path::PathBuf> {
    let cpio = dir.join("rootfs.cpio");
    if cpio.exists() {
        return Ok(cpio);
    }
    let rootfs = dir.join("rootfs");
    if !rootfs.join("etc/debian_version").exists() {
        let partial = dir.join("rootfs.partial");
        let _ = fs::remove_dir_all(&partial);
        run_cmd(
            Command::new("debootstrap")
                .args([
                    "--variant=minbase",
                    "--include=systemd-sysv,bpftool",
                    "bookworm",
                ])
                .arg(&partial)
                .arg("http://deb.debian.org/debian"),
        )
        .context("debootstrap (cargo xtask setup installs it) could not make the rootfs")?;
        fs::rename(&partial, &rootfs)?;
    }
    let partial = dir.join("rootfs.cpio.partial");
    image::pack(&rootfs, &partial)?;
    fs::rename(&partial, &cpio)?;
    Ok(cpio)
}

/// The guest's capability sets, as /proc/PID/status prints them: bounding
/// = the unit's CapabilityBoundingSet (CAP_DAC_READ_SEARCH 2, SYS_PTRACE 19,
/// SYS_NICE 23, SYS_RESOURCE 24, SYSLOG 34, PERFMON 38, BPF 39,
/// CHECKPOINT_RESTORE 40); effective = the four the agent keeps once its
/// programs are attached (and its table thread raised).
const CAP_BOUNDING: &str = "000001c401880004";
const CAP_KEPT: &str = "0000010400080004";
/// The unit's MemoryMax=1G in the cgroup.
const MEMORY_MAX: &str = "1073741824";

/// A check line's field by key (empty when absent).
type Get<'a> = &'a dyn Fn(&str) -> String;

/// (passed, what was seen) per expectation on the suite's lines.
fn judge(results: &[String]) -> Vec<(bool, String)> {
    let fields = |check: &str| -> Option<Vec<(String, String)>> {
        let line = results
            .iter()
            .find(|line| line.starts_with(&format!("check={check} ")))?;
        let figures = line
            .split_once(" detail=")
            .map_or(line.as_str(), |(f, _)| f);
        Some(
            figures
                .split_whitespace()
                .filter_map(|field| field.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    };
    let detail = |check: &str| -> String {
        results
            .iter()
            .find(|line| line.starts_with(&format!("check={check} ")))
            .and_then(|line| line.split_once(" detail="))
            .map(|(_, detail)| detail.to_owned())
            .unwrap_or_default()
    };
    let mut verdict = Vec::new();
    let mut expect = |check: &str, what: &str, test: &dyn Fn(Get) -> bool| {
        let Some(fields) = fields(check) else {
            verdict.push((false, format!("{check}: never reported")));
            return;
        };
        let get = |key: &str| -> String {
            fields
                .iter()
                .find(|(k, _)| k == key)
                .map_or(String::new(), |(_, v)| v.clone())
        };
        let shown: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let passed = test(&get);
        let mut text = format!("{check}: {what} ({})", shown[1..].join(" "));
        if !passed || check == "journal" {
            text.push_str(&format!(" {}", detail(check)));
        }
        verdict.push((passed, text));
    };
    let number = |get: Get, key: &str| get(key).parse::<u64>().unwrap_or(0);
    expect("install", "dpkg -i of the .deb", &|get| get("exit") == "0");
    expect(
        "start",
        "hostprof.service active, profiles at the receiver",
        &|get| get("exit") == "0" && get("active") == "active" && number(get, "requests") >= 2,
    );
    expect(
        "hardening",
        "the shipped hardening in force on the agent",
        &|get| {
            get("capbnd") == CAP_BOUNDING
                && get("capeff") == CAP_KEPT
                && get("root_ro") == "1"
                && get("tmp_private") == "1"
                && get("dev_private") == "1"
                && get("memory_max") == MEMORY_MAX
                && get("mdwe") == "yes"
                && get("protect_system") == "strict"
        },
    );
    expect("journal", "status lines in the journal", &|get| {
        number(get, "status_lines") >= 1
    });
    expect(
        "stop",
        "systemctl stop flushes the last window and detaches every program",
        &|get| {
            get("exit") == "0"
                && get("result") == "success"
                && number(get, "after_stop") > number(get, "before_stop")
                && number(get, "exported") == number(get, "received")
                && get("dropped") == "0"
                && number(get, "programs") >= 1
                && get("left") == "0"
        },
    );
    verdict
}
