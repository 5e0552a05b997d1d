//! `cargo xtask package`: the release tarball and a `.deb` (built with
//! Debian's own dpkg-deb, no extra tool). The container image
//! (packaging/Dockerfile) is built from the tarball's directory.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::{build, root, run_cmd};

/// Files shipped next to the binary: (source in the repo, name in the tarball).
const FILES: &[(&str, &str)] = &[
    ("packaging/systemd/hostprof.service", "hostprof.service"),
    ("packaging/systemd/hostprof.env", "hostprof.env"),
    ("packaging/config/hostprof.toml", "hostprof.toml"),
    ("README.md", "README.md"),
];

/// The `.deb`'s files: (source in the repo, installed path).
const DEB_FILES: &[(&str, &str)] = &[
    (
        "packaging/systemd/hostprof.service",
        "lib/systemd/system/hostprof.service",
    ),
    (
        "packaging/systemd/hostprof.env",
        "etc/hostprof/hostprof.env",
    ),
    (
        "packaging/config/hostprof.toml",
        "etc/hostprof/hostprof.toml",
    ),
    ("README.md", "usr/share/doc/hostprof/README.md"),
];

/// What `package` made.
pub struct Packages {
    pub binary: PathBuf,
    pub tarball: PathBuf,
    pub deb: PathBuf,
}

pub fn run(target: Option<&str>) -> Result<Packages> {
    let binary = build(target)?;
    let arch = arch(target);
    let version = env!("CARGO_PKG_VERSION");
    let stage = dir(target);
    let name = stage
        .file_name()
        .expect("a name")
        .to_string_lossy()
        .into_owned();
    let out = root().join("target/package");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    fs::create_dir_all(&stage)?;
    copy(&binary, &stage.join("hostprof"))?;
    for (source, dest) in FILES {
        copy(&root().join(source), &stage.join(dest))?;
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
    let deb = deb(&binary, arch, version, &out)?;
    println!("{}\n{}", tarball.display(), deb.display());
    Ok(Packages {
        binary,
        tarball,
        deb,
    })
}

fn arch(target: Option<&str>) -> &str {
    target
        .and_then(|t| t.split('-').next())
        .unwrap_or(std::env::consts::ARCH)
}

/// The tarball's content, unpacked: the context packaging/Dockerfile builds
/// the image from.
pub fn dir(target: Option<&str>) -> PathBuf {
    let version = env!("CARGO_PKG_VERSION");
    root()
        .join("target/package")
        .join(format!("hostprof-{version}-{}-linux", arch(target)))
}

fn deb(binary: &Path, arch: &str, version: &str, out: &Path) -> Result<PathBuf> {
    let deb_arch = match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let stage = out.join(format!("deb-{deb_arch}"));
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    for (source, dest) in DEB_FILES {
        let dest = stage.join(dest);
        fs::create_dir_all(dest.parent().expect("a directory"))?;
        copy(&root().join(source), &dest)?;
    }
    fs::create_dir_all(stage.join("usr/bin"))?;
    copy(binary, &stage.join("usr/bin/hostprof"))?;
    fs::create_dir_all(stage.join("DEBIAN"))?;
    fs::write(
        stage.join("DEBIAN/control"),
        format!(
            "Package: hostprof\nVersion: {version}\nArchitecture: {deb_arch}\n\
             Maintainer: hostprof developers <hostprof@example.invalid>\n\
             Depends: libc6\nSection: devel\nPriority: optional\n\
             Description: eBPF host-level sampling profiler agent\n \
             Profiles every process on the host with eBPF and exports\n \
             OpenTelemetry profiles over OTLP/gRPC (hostprof agent), or writes\n \
             flame graphs and pprof files (hostprof record).\n"
        ),
    )?;
    // Local edits to these survive upgrades.
    fs::write(
        stage.join("DEBIAN/conffiles"),
        "/etc/hostprof/hostprof.env\n/etc/hostprof/hostprof.toml\n",
    )?;
    let deb = out.join(format!("hostprof_{version}_{deb_arch}.deb"));
    run_cmd(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    Ok(deb)
}

/// Checks what `run` made: both packages hold every file, and the packaged
/// binary runs and accepts the packaged configuration.
pub fn check(packages: &Packages) -> Result<()> {
    let listing = |cmd: &mut Command| -> Result<String> {
        let output = cmd
            .output()
            .with_context(|| format!("cannot run {cmd:?}"))?;
        anyhow::ensure!(output.status.success(), "{cmd:?} failed");
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let tar = listing(Command::new("tar").arg("-tzf").arg(&packages.tarball))?;
    for (_, name) in FILES.iter().chain(&[("", "hostprof")]) {
        anyhow::ensure!(
            tar.lines().any(|line| line.ends_with(&format!("/{name}"))),
            "{} lacks {name}",
            packages.tarball.display()
        );
    }
    let deb = listing(
        Command::new("dpkg-deb")
            .arg("--contents")
            .arg(&packages.deb),
    )?;
    for (_, path) in DEB_FILES.iter().chain(&[("", "usr/bin/hostprof")]) {
        anyhow::ensure!(
            deb.contains(&format!("./{path}")),
            "{} lacks {path}",
            packages.deb.display()
        );
    }
    let printed = listing(
        Command::new(&packages.binary)
            .args(["agent", "--print-config", "--config"])
            .arg(root().join("packaging/config/hostprof.toml")),
    )?;
    anyhow::ensure!(
        printed.contains("frequency = 19"),
        "the packaged binary printed an unexpected configuration:\n{printed}"
    );
    eprintln!(
        "xtask: packages check out: {} and {}",
        packages.tarball.display(),
        packages.deb.display()
    );
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    Ok(())
}
