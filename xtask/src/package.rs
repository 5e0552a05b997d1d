//! `cargo xtask package`: the release tarball. The container image
//! (packaging/Dockerfile) copies its binary from here too.
use std::{fs, path::Path, process::Command};

use anyhow::{Context, Result};

use crate::{build, root, run_cmd};

/// Files shipped next to the binary: (source in the repo, name in the tarball).
const FILES: &[(&str, &str)] = &[
    ("packaging/systemd/hostprof.service", "hostprof.service"),
    ("packaging/systemd/hostprof.env", "hostprof.env"),
    ("README.md", "README.md"),
];

pub fn run(target: Option<&str>) -> Result<()> {
    let binary = build(target)?;
    let arch = target
        .and_then(|t| t.split('-').next())
        .unwrap_or(std::env::consts::ARCH);
    let version = env!("CARGO_PKG_VERSION");
    let name = format!("hostprof-{version}-{arch}-linux");
    let out = root().join("target/package");
    let stage = out.join(&name);
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    fs::create_dir_all(&stage)?;
    copy(&binary, &stage.join("hostprof"))?;
    for (source, dest) in FILES {
        copy(&root().join(source), &stage.join(dest))?;
    }
    // The image build copies this path: the same bytes as the tarball's.
    if target.is_none() {
        copy(&binary, &out.join("hostprof"))?;
    }
    let tarball = out.join(format!("{name}.tar.gz"));
    run_cmd(
        Command::new("tar")
            .arg("-czf")
            .arg(&tarball)
            .arg("-C")
            .arg(&out)
            .arg(&name),
    )?;
    println!("{}", tarball.display());
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    Ok(())
}
