//! Builds the eBPF object (agent-ebpf's binary, for bpfel-unknown-none) and
//! leaves it in OUT_DIR for `include_bytes_aligned!`.
use std::{env, path::Path, process::Command};

fn main() {
    let ebpf_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent-ebpf");
    // aya-build watches only the eBPF package's own directory; the programs
    // also compile the contract and the unwinder core.
    for shared in ["../common", "../unwinder"] {
        println!("cargo:rerun-if-changed={shared}");
    }
    if let Err(missing) = toolchain_ready() {
        // One actionable line instead of a wall of cargo output.
        panic!("cannot build the eBPF program: {missing}; run `cargo xtask setup` first");
    }
    let package = aya_build::Package {
        name: "agent-ebpf",
        root_dir: ebpf_dir.to_str().expect("workspace path is UTF-8"),
        ..Default::default()
    };
    if let Err(err) = aya_build::build_ebpf([package], aya_build::Toolchain::default()) {
        panic!("building the eBPF program failed: {err:#}");
    }
}

fn toolchain_ready() -> Result<(), String> {
    if env::var_os("AYA_BUILD_SKIP").is_some() {
        return Ok(());
    }
    let linker = Command::new("bpf-linker").arg("--version").output();
    if !matches!(linker, Ok(ref out) if out.status.success()) {
        return Err("bpf-linker is not installed".into());
    }
    let sysroot = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
        .map_err(|_| "rustup is not installed".to_string())?;
    if !sysroot.status.success() {
        return Err("the nightly toolchain is not installed".into());
    }
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_string();
    if !Path::new(&sysroot)
        .join("lib/rustlib/src/rust/library/core")
        .exists()
    {
        return Err("nightly's rust-src component is not installed".into());
    }
    Ok(())
}
