//! hostprof's chores, so a newcomer needs two commands:
//! `cargo xtask run -- record -d 10 -o profile.folded` and `cargo xtask test`.
mod bench;
mod fuzz;
mod package;
mod setup;
mod soak;
mod vmtest;

use std::{
    path::{Path, PathBuf},
    process::Command,
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
    /// Set up, check formatting and lints, run unit and real-eBPF integration
    /// tests, the kernel matrix (vmtest), then a short fuzz smoke run.
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
    },
    /// Measure hostprof next to its peers (perf, ...) and print the figures.
    Bench {
        /// Seconds each profiling run lasts.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Setup { build_only } => setup::run(build_only),
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
            agent_args,
        } => {
            setup::run(false)?;
            soak::run(minutes, &agent_args)
        }
        Task::Vmtest { kernels, keep, kvm } => {
            setup::run(false)?;
            vmtest::run(&vmtest::Options { kernels, keep, kvm })
        }
        Task::Bench { seconds } => {
            setup::run(false)?;
            bench::run(seconds)
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
    let mut binary = root().join("target");
    if let Some(target) = target {
        cmd.args(["--target", target]);
        binary.push(target);
    }
    run_cmd(&mut cmd)?;
    Ok(binary.join("release/hostprof"))
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

fn test() -> Result<()> {
    setup::run(false)?;
    run_cmd(cargo().args(["fmt", "--all", "--check"]))?;
    run_cmd(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    if std::env::var("CI").is_ok_and(|ci| ci == "true") && !is_root() {
        bail!("CI=true: the real eBPF tests must run, and they need root");
    }
    // One test binary at a time keeps the 2-CPU machines' timing sane for
    // the share assertions; tests inside a binary still run in parallel.
    // The aarch64 build is tested under qemu by tests/packaging.rs.
    let cross = build(Some(CROSS_TARGET))?;
    // The release packages, checked: what users install must work too.
    package::check(&package::run(None)?)?;
    run_cmd(
        cargo()
            .args(["test", "--workspace", "--no-fail-fast"])
            .env("HOSTPROF_AARCH64_BIN", cross),
    )?;
    // The release build on other kernels and on arm64, under qemu.
    vmtest::run(&vmtest::Options::default())?;
    // A smoke run: every target replays its corpus (seeds and past finds)
    // and explores a little; `cargo xtask fuzz` runs them for longer.
    fuzz::run(&[], FUZZ_SMOKE_SECONDS)
}

/// Seconds per fuzz target in `cargo xtask test`.
const FUZZ_SMOKE_SECONDS: u64 = 10;
