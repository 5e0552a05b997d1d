//! hostprof's chores, so a newcomer needs two commands:
//! `cargo xtask run -- record -d 10 -o profile.folded` and `cargo xtask test`.
mod bench;
mod fuzz;
mod package;
mod peers;
mod setup;
mod soak;
mod vmtest;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "hostprof's chores")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need (idempotent): nightly rust-src,
    /// bpf-linker, the Debian tools the tests and benchmarks use, cargo-fuzz.
    Setup {
        /// Only what building needs (for container builds), no test tools.
        #[arg(long)]
        build_only: bool,
    },
    /// Build hostprof (release), eBPF object included.
    Build {
        /// Build for another target, e.g. aarch64-unknown-linux-gnu.
        #[arg(long)]
        target: Option<String>,
    },
    /// Set up, build, and run hostprof (as root) with the given arguments.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Check formatting, set up, check lints, run unit tests, then the slow
    /// stages: cross build, packages, real-eBPF integration tests, the
    /// kernel matrix (vmtest), a short fuzz smoke run. Each stage prints a
    /// header with the time so far.
    Test,
    /// Build a release tarball (binary, systemd unit, examples, README) in
    /// target/package/.
    Package {
        /// Package for another target, e.g. aarch64-unknown-linux-gnu.
        #[arg(long)]
        target: Option<String>,
    },
    /// Run the fuzz targets in fuzz/ (libFuzzer, nightly) and print
    /// executions and crashes per target; fails when one crashed.
    Fuzz {
        /// Only this target (repeatable); all of fuzz/fuzz_targets/ by default.
        #[arg(long = "target", value_name = "TARGET")]
        targets: Vec<String>,
        /// Seconds each target runs.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// Run `hostprof agent` host-wide (19 Hz, exporting to a local sink)
    /// with fork/exec churn; print its RSS, CPU and log every ~10 s, then
    /// max RSS and mean CPU against the targets (as root).
    Soak {
        /// How long the agent runs.
        #[arg(long, default_value_t = 5.0)]
        minutes: f64,
        /// What runs beside the agent: `idle` (one CPU-bound program) or
        /// `churn` (that and about 600 forks and execs a second).
        #[arg(long, value_enum, default_value = "churn")]
        load: soak::Load,
        /// More `hostprof agent` options, after `--` (e.g. `--off-cpu`).
        #[arg(last = true, value_name = "AGENT_ARGS")]
        agent_args: Vec<String>,
    },
    /// Boot Debian kernels (5.10, 6.1, 6.12 x86_64; 6.1 arm64) under qemu
    /// and run a smoke suite of the release build in each; one summary line
    /// per kernel, failing when any kernel fails.
    Vmtest {
        /// Only this kernel (repeatable): 5.10, 6.1, 6.12, 6.1-arm64.
        #[arg(long = "kernel", value_name = "KERNEL")]
        kernels: Vec<String>,
        /// Keep each arch's initramfs tree in target/vmtest/ (the console
        /// logs are always kept there).
        #[arg(long)]
        keep: bool,
        /// Boot x86_64 guests with KVM (nested KVM can hang at boot; TCG
        /// by default).
        #[arg(long)]
        kvm: bool,
        /// Instead of the matrix: boot Debian bookworm with systemd as PID
        /// 1, install the .deb and check hostprof.service as shipped.
        #[arg(long)]
        systemd: bool,
    },
    /// Measure hostprof next to its peers (perf, ...) and print the figures.
    Bench {
        /// Seconds each profiling run lasts.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Only this part (e.g. `java`), not the whole bench; sets up only
        /// the build tools (the part's own tools, e.g. the JDK, must be there).
        #[arg(long, value_enum)]
        only: Option<bench::Only>,
        /// Distinct binaries the scale row spins at once (issue 31's goals
        /// are for 40 and 80).
        #[arg(long, default_value_t = bench::SCALE_COPIES)]
        copies: usize,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Setup { build_only } => {
            setup::run(build_only)?;
            if build_only {
                return Ok(());
            }
            setup::bench_tools()
        }
        Task::Build { target } => build(target.as_deref()).map(drop),
        Task::Run { args } => {
            setup::run(false)?;
            let binary = build(None)?;
            run_as_root(&binary, &args)
        }
        Task::Test => test(),
        Task::Package { target } => package::run(target.as_deref()).map(drop),
        Task::Fuzz { targets, seconds } => {
            setup::run(false)?;
            fuzz::run(&targets, seconds)
        }
        Task::Soak {
            minutes,
            load,
            agent_args,
        } => {
            setup::run(false)?;
            soak::run(minutes, load, &agent_args)
        }
        Task::Vmtest {
            kernels,
            keep,
            kvm,
            systemd,
        } => {
            setup::run(false)?;
            vmtest::run(&vmtest::Options {
                kernels,
                keep,
                kvm,
                systemd,
            })
        }
        Task::Bench {
            seconds,
            only,
            copies,
        } => {
            // One part needs none of the peers, nor the test tools' roots
            // (minutes of debootstrap on a fresh checkout).
            if only.is_some() {
                setup::build_tools()?;
            } else {
                setup::run(false)?;
                setup::bench_tools()?;
            }
            bench::run(seconds, only, copies)
        }
    }
}

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set (relative to the
/// workspace, as cargo takes it here), else target/; where the binaries
/// xtask builds are.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root().join("target"), |dir| root().join(dir))
}

/// `cargo` with the workspace as working directory.
fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Runs a command; fails naming it when it fails.
fn run_cmd(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn build(target: Option<&str>) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args(["build", "--release", "-p", "hostprof"]);
    if let Some(target) = target {
        cmd.args(["--target", target]);
    }
    run_cmd(&mut cmd)?;
    Ok(binary_path(target))
}

/// Builds hostprof's example `name` (release, for `target` or the host)
/// and returns its path.
fn build_example(name: &str, target: Option<&str>) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args(["build", "--release", "-p", "hostprof", "--example", name]);
    let mut dir = target_dir();
    if let Some(target) = target {
        cmd.args(["--target", target]);
        dir.push(target);
    }
    run_cmd(&mut cmd)?;
    Ok(dir.join("release/examples").join(name))
}

/// Where `build(target)` puts the binary.
fn binary_path(target: Option<&str>) -> PathBuf {
    let mut dir = target_dir();
    if let Some(target) = target {
        dir.push(target);
    }
    dir.join("release/hostprof")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.starts_with(b"0\n"))
}

fn run_as_root(binary: &Path, args: &[String]) -> Result<()> {
    let mut cmd = if is_root() {
        Command::new(binary)
    } else {
        eprintln!("xtask: hostprof needs root for eBPF; using sudo");
        let mut sudo = Command::new("sudo");
        sudo.arg(binary);
        sudo
    };
    run_cmd(cmd.args(args))
}

/// The cross target whose build the test suite runs under qemu.
const CROSS_TARGET: &str = "aarch64-unknown-linux-gnu";

/// One stage of `cargo xtask test`: the name its header shows, and its work.
type Stage = (&'static str, fn() -> Result<()>);

/// `cargo xtask test`, in order: what fails fastest and needs least first, so
/// a formatting slip or a failing unit test is reported within minutes; the
/// tools only the later stages use are installed after those.
const TEST_STAGES: &[Stage] = &[
    ("format", check_format),
    ("setup: build tools", setup::build_tools),
    ("lints", lints),
    ("unit tests", unit_tests),
    ("setup: test tools", setup::test_tools),
    ("aarch64 build", cross_build),
    ("packages", packages),
    ("integration tests", integration_tests),
    ("kernel matrix", kernel_matrix),
    ("systemd VM", systemd_vm),
    ("fuzz smoke", fuzz_smoke),
];

fn test() -> Result<()> {
    if std::env::var("CI").is_ok_and(|ci| ci == "true") && !is_root() {
        bail!("CI=true: the real eBPF tests must run, and they need root");
    }
    warn_if_disk_short();
    let start = Instant::now();
    for (at, (name, run)) in TEST_STAGES.iter().enumerate() {
        eprintln!(
            "xtask: [{}/{}] {name} ({} s so far)",
            at + 1,
            TEST_STAGES.len(),
            start.elapsed().as_secs()
        );
        run().with_context(|| format!("stage `{name}` failed"))?;
    }
    eprintln!(
        "xtask: all {} stages passed in {} s",
        TEST_STAGES.len(),
        start.elapsed().as_secs()
    );
    Ok(())
}

/// What a full `cargo xtask test` from a clean checkout leaves on disk:
/// measured at 20 GB with incremental builds (debug 9.5, of which 3.0 is
/// incremental state; release 2.0; aarch64 1.0; fuzz 2.3; the runtimes'
/// Debian roots 2.6; VM images 1.0; test scratch 0.9), about 17 GB
/// without (`.ci/run` turns them off).
const TEST_DISK_NEED: u64 = 20 << 30;

/// Says at the start, not 45 minutes in, when the disk holding target/ is
/// too full for the run: a build that runs out of space fails in whatever
/// stage it has reached, with a compiler's I/O error. Only a warning: a warm
/// target/ needs far less than a clean one.
fn warn_if_disk_short() {
    let target = root().join("target");
    let at = if target.exists() { target } else { root() };
    let Some(free) = free_bytes(&at) else {
        return;
    };
    if free < TEST_DISK_NEED {
        eprintln!(
            "xtask: warning: {:.1} GB free at {}; a run from a clean checkout \
             needs about {} GB, and fails in whichever stage fills the disk",
            free as f64 / f64::from(1u32 << 30),
            at.display(),
            TEST_DISK_NEED >> 30
        );
    }
}

/// Bytes an unprivileged writer may still use on the filesystem of `path`.
fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs(3) fills the zeroed struct from a NUL-terminated path.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some(stat.f_bavail * stat.f_frsize)
}

fn check_format() -> Result<()> {
    run_cmd(cargo().args(["fmt", "--all", "--check"]))
}

fn lints() -> Result<()> {
    run_cmd(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))
}

/// Unit tests and doc tests: no root, no eBPF, no test tools. `--workspace`
/// includes the unwinder core (hostprof-unwind), whose tests run its `step`
/// on synthetic stacks on the host.
fn unit_tests() -> Result<()> {
    run_cmd(cargo().args(["test", "--workspace", "--lib", "--bins", "--no-fail-fast"]))?;
    run_cmd(cargo().args(["test", "--workspace", "--doc", "--no-fail-fast"]))
}

/// The aarch64 build, tested under qemu by tests/packaging.rs.
fn cross_build() -> Result<()> {
    build(Some(CROSS_TARGET)).map(drop)
}

/// The release packages, checked: what users install must work too.
fn packages() -> Result<()> {
    package::check(&package::run(None)?)
}

/// The tests in tests/, real eBPF included (as root).
fn integration_tests() -> Result<()> {
    // One test binary at a time keeps the 2-CPU machines' timing sane for
    // the share assertions; tests inside a binary still run in parallel.
    let tested = run_cmd(
        cargo()
            .args(["test", "--workspace", "--no-fail-fast", "--test", "*"])
            .env("HOSTPROF_AARCH64_BIN", binary_path(Some(CROSS_TARGET)))
            // tests/containers.rs builds packaging/Dockerfile from it.
            .env("HOSTPROF_PACKAGE_DIR", package::dir(None)),
    );
    stop_test_docker();
    tested
}

/// The tests' Docker daemon's directory (tests/common/docker.rs).
const TEST_DOCKER_RUN: &str = "/run/hostprof-tests";

/// Stops the Docker daemon tests/common/docker.rs started for the tests
/// (it outlives each test binary so the next reuses it): left running, it
/// and containerd are part of every later host-wide measurement. Then
/// unmounts what it left mounted under its directory (its default network
/// namespace's file stayed mounted after it exited).
fn stop_test_docker() {
    let pid = std::fs::read_to_string(format!("{TEST_DOCKER_RUN}/dockerd.pid"))
        .ok()
        .and_then(|pid| pid.trim().parse::<i32>().ok());
    // SAFETY: kill(2) with a pid read from the daemon's own pid file.
    if let Some(pid) = pid
        && unsafe { libc::kill(pid, libc::SIGTERM) } == 0
    {
        println!("xtask: stopped the tests' Docker daemon (pid {pid})");
        // Its own unmounts first: up to 30 s for it to exit.
        let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
        for _ in 0..300 {
            if !proc.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for mount in mounts_under(&mounts, TEST_DOCKER_RUN) {
        let Ok(path) = std::ffi::CString::new(mount.as_str()) else {
            continue;
        };
        // SAFETY: umount2(2) of a path read from /proc/self/mounts; a lazy
        // detach, so a mount still busy goes once unused.
        if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
            println!("xtask: unmounted {mount}, which the tests' Docker daemon left");
        }
    }
}

/// The mount points under `dir` in `mounts` (/proc/self/mounts' text),
/// deepest first.
fn mounts_under(mounts: &str, dir: &str) -> Vec<String> {
    let mut found: Vec<String> = mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(1))
        // /proc/mounts escapes spaces and the like as octal: such a path is
        // not one docker made here.
        .filter(|point| point.starts_with(&format!("{dir}/")) && !point.contains('\\'))
        .map(str::to_owned)
        .collect();
    found.sort_by_key(|point| std::cmp::Reverse(point.len()));
    found
}

/// The release build on other kernels and on arm64, under qemu.
fn kernel_matrix() -> Result<()> {
    vmtest::run(&vmtest::Options::default())
}

/// The .deb's systemd unit, run by systemd in a VM.
fn systemd_vm() -> Result<()> {
    vmtest::run(&vmtest::Options {
        systemd: true,
        ..Default::default()
    })
}

/// A smoke run: every target replays its corpus (seeds and past finds)
/// and explores a little; `cargo xtask fuzz` runs them for longer.
fn fuzz_smoke() -> Result<()> {
    fuzz::run(&[], FUZZ_SMOKE_SECONDS)
}

/// Seconds per fuzz target in `cargo xtask test`.
const FUZZ_SMOKE_SECONDS: u64 = 10;

#[cfg(test)]
mod tests {
    #[test]
    fn mounts_left_under_a_directory_are_found_deepest_first() {
        let mounts = "/dev/vda / ext4 rw 0 0\n\
                      nsfs /run/hostprof-tests/exec/netns/default nsfs rw 0 0\n\
                      tmpfs /run/hostprof-tests/exec tmpfs rw 0 0\n\
                      tmpfs /run/hostprof-tests-other tmpfs rw 0 0\n\
                      tmpfs /run/hostprof-tests/odd\\040name tmpfs rw 0 0\n";
        assert_eq!(
            super::mounts_under(mounts, "/run/hostprof-tests"),
            [
                "/run/hostprof-tests/exec/netns/default",
                "/run/hostprof-tests/exec"
            ]
        );
    }
}
