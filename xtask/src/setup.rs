//! `cargo xtask setup`: install the toolchain parts and tools, idempotently.
use std::process::Command;

use anyhow::{Result, bail};

use crate::run_cmd;

const BPF_LINKER_VERSION: &str = "0.10.0";

/// Debian packages and what shows each is installed (checked before
/// installing): a command, or an absolute path for packages without one.
const DEBIAN_BUILD_TOOLS: &[(&str, &str)] = &[("gcc", "cc")];

/// Tools the tests and benchmarks use, beyond building.
const DEBIAN_TEST_TOOLS: &[(&str, &str)] = &[
    ("linux-perf", "perf"),
    ("util-linux", "setpriv"),
    ("llvm", "llvm-symbolizer"),
    ("binutils", "addr2line"),
    ("golang-go", "go"),
    ("systemd", "systemd-analyze"),
    ("python3-pip", "pip3"),
    ("gcc-aarch64-linux-gnu", "aarch64-linux-gnu-gcc"),
    ("qemu-user-static", "qemu-aarch64-static"),
    ("openssl", "openssl"),
    // `cargo xtask vmtest`: the kernel matrix under qemu, and the aarch64
    // C test programs (static, so they need the cross libc).
    ("qemu-system-x86", "qemu-system-x86_64"),
    ("qemu-system-arm", "qemu-system-aarch64"),
    ("busybox-static", "busybox"),
    ("cpio", "cpio"),
    (
        "libc6-dev-arm64-cross",
        "/usr/aarch64-linux-gnu/include/stdio.h",
    ),
    // tests/report.rs runs `record` in a terminal to see its progress line.
    ("tmux", "tmux"),
];

/// Python tools from PyPI, each with a shell command that succeeds once it
/// is installed.
const PYPI_TEST_TOOLS: &[(&str, &str)] = &[
    ("kubernetes-validate", "command -v kubernetes-validate"),
    // An OTLP decoder independent of ours, for tests/otlp_json.rs. 1.45.2's
    // profiles messages match the OTLP v1.11.0 protos that proto/ vendors
    // field for field (names, numbers, types); keep the two in step.
    (
        "opentelemetry-proto==1.45.2",
        "python3 -c 'import importlib.metadata as m; \
         assert m.version(\"opentelemetry-proto\") == \"1.45.2\"'",
    ),
    (
        "protobuf",
        "python3 -c 'import google.protobuf.json_format'",
    ),
];

pub fn run(build_only: bool) -> Result<()> {
    build_tools()?;
    if build_only {
        return Ok(());
    }
    test_tools()
}

/// What building needs (the agent's build script builds the eBPF object):
/// nightly rust-src, bpf-linker, a C compiler.
pub fn build_tools() -> Result<()> {
    nightly_rust_src()?;
    bpf_linker()?;
    debian_tools(DEBIAN_BUILD_TOOLS)
}

/// What only the tests, benchmarks and fuzzing use.
pub fn test_tools() -> Result<()> {
    debian_tools(DEBIAN_TEST_TOOLS)?;
    pypi_tools()?;
    cross_target()?;
    cargo_fuzz()
}

/// cargo-fuzz, for `cargo xtask fuzz` (it drives the nightly toolchain).
fn cargo_fuzz() -> Result<()> {
    if succeeds(Command::new("cargo").args(["fuzz", "--version"])) {
        return Ok(());
    }
    run_cmd(Command::new("cargo").args(["+stable", "install", "cargo-fuzz", "--locked"]))
}

/// A command on PATH, or (absolute path) a file that exists.
fn is_installed(check: &str) -> bool {
    if check.starts_with('/') {
        std::path::Path::new(check).exists()
    } else {
        has_command(check)
    }
}

fn has_command(command: &str) -> bool {
    succeeds(Command::new("sh").args(["-c", &format!("command -v {command}")]))
}

fn pypi_tools() -> Result<()> {
    for (package, check) in PYPI_TEST_TOOLS {
        if !succeeds(Command::new("sh").args(["-c", check])) {
            run_cmd(Command::new("python3").args(["-m", "pip", "install", "--quiet", package]))?;
        }
    }
    Ok(())
}

fn cross_target() -> Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]));
    if !installed.lines().any(|line| line == crate::CROSS_TARGET) {
        run_cmd(Command::new("rustup").args(["target", "add", crate::CROSS_TARGET]))?;
    }
    Ok(())
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().is_ok_and(|out| out.status.success())
}

fn output(cmd: &mut Command) -> String {
    cmd.output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

fn nightly_rust_src() -> Result<()> {
    if !succeeds(Command::new("rustup").args(["run", "nightly", "rustc", "--version"])) {
        run_cmd(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]));
    if !installed.lines().any(|line| line.starts_with("rust-src")) {
        run_cmd(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    Ok(())
}

fn bpf_linker() -> Result<()> {
    let version = output(Command::new("bpf-linker").arg("--version"));
    if version.contains(BPF_LINKER_VERSION) {
        return Ok(());
    }
    run_cmd(Command::new("cargo").args([
        "+stable",
        "install",
        &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        "--locked",
    ]))
}

fn debian_tools(tools: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(_, check)| !is_installed(check))
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !crate::is_root() {
        bail!(
            "missing tools; install them with: sudo apt-get install -y {}",
            missing.join(" ")
        );
    }
    run_cmd(Command::new("apt-get").arg("update").arg("-q"))?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}
