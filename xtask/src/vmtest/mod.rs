//! `cargo xtask vmtest`: the release build on real Debian kernels (5.10,
//! 6.1, 6.12 on x86_64; 6.1 on arm64) under qemu, each running a smoke suite
//! (init.sh) from an initramfs: DWARF unwinding of one process, host-wide
//! frame pointers with kernel frames, off-CPU stacks, the agent exporting
//! OTLP, the one-line error of an unprivileged run, Python, JavaScript and
//! (arm64) Java frames, OpenTelemetry thread-context links, and memory. The guest prints
//! figures, judged here; one summary line per kernel, failing when any
//! kernel fails. The host kernel alone says nothing about older kernels'
//! verifiers and BTF, nor about arm64.
mod image;
mod judge;
mod kernel;
mod memory;
mod qemu;
mod systemd;

use std::{
    collections::{HashMap, hash_map::Entry},
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{CROSS_TARGET, build, build_example, root};

/// A guest architecture (the host is x86_64).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        }
    }

    fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// Debian's name.
    fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }

    fn triplet(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-linux-gnu",
            Arch::Aarch64 => "aarch64-linux-gnu",
        }
    }

    /// The Rust target to build for, `None` for the host's.
    fn rust_target(self) -> Option<&'static str> {
        match self {
            Arch::X86_64 => None,
            Arch::Aarch64 => Some(CROSS_TARGET),
        }
    }

    fn cc(self) -> &'static str {
        match self {
            Arch::X86_64 => "gcc",
            Arch::Aarch64 => "aarch64-linux-gnu-gcc",
        }
    }

    /// Where the libraries the Rust build links against live.
    fn lib_dirs(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"],
            Arch::Aarch64 => &["/usr/aarch64-linux-gnu/lib"],
        }
    }

    fn qemu(self) -> &'static str {
        match self {
            Arch::X86_64 => "qemu-system-x86_64",
            Arch::Aarch64 => "qemu-system-aarch64",
        }
    }

    fn console(self) -> &'static str {
        match self {
            Arch::X86_64 => "ttyS0",
            Arch::Aarch64 => "ttyAMA0",
        }
    }

    /// The guest's RAM: the arm64 image carries three JREs (~155 to 175
    /// MB each) and five Node.js builds (~95 to 150 MB each), ~1.1 GB in
    /// all, twice while the kernel unpacks it (the cpio and the files),
    /// and then runs a JVM or node beside hostprof. 2 GiB left ~200 MB at
    /// the unpacking's peak with three builds; uncompressed, the image
    /// costs TCG no decompression, and RAM is cheaper than that time.
    fn memory(self) -> &'static str {
        match self {
            Arch::X86_64 => "1G",
            Arch::Aarch64 => "4G",
        }
    }

    /// The hard limit on one boot and suite under TCG (they take ~25 s on
    /// x86_64 plus the Node.js check, whose `record -p` loads the unwind
    /// tables of node's ~90 MB binary: minutes under TCG; ~150 to 180 s on
    /// arm64 with its three JVMs and four or five Node.js builds (tables loaded for
    /// the code that runs only) on a quiet host, ~105 s when it had one
    /// of each, and then 300 s were once not enough beside two other
    /// guests and three builds). Only what ends a hung guest: no figure
    /// is judged by time.
    fn timeout(self) -> Duration {
        match self {
            Arch::X86_64 => Duration::from_secs(480),
            Arch::Aarch64 => Duration::from_secs(900),
        }
    }
}

/// One kernel of the matrix.
struct Target {
    /// What `--kernel` selects.
    name: &'static str,
    /// The Debian release whose current kernel it is.
    suite: &'static str,
    arch: Arch,
}

const MATRIX: &[Target] = &[
    Target {
        name: "5.10",
        suite: "bullseye",
        arch: Arch::X86_64,
    },
    Target {
        name: "6.1",
        suite: "bookworm",
        arch: Arch::X86_64,
    },
    Target {
        name: "6.12",
        suite: "trixie",
        arch: Arch::X86_64,
    },
    Target {
        name: "6.1-arm64",
        suite: "bookworm",
        arch: Arch::Aarch64,
    },
];

#[derive(Default)]
pub struct Options {
    /// Only these kernels (`MATRIX` names); all when empty.
    pub kernels: Vec<String>,
    /// Keep each arch's initramfs tree.
    pub keep: bool,
    /// Boot x86_64 guests with KVM.
    pub kvm: bool,
    /// Instead of the kernel matrix: the .deb's systemd unit under systemd.
    pub systemd: bool,
}

pub fn run(options: &Options) -> Result<()> {
    if options.systemd {
        let dir = root().join("target/vmtest");
        return systemd::run(&dir, options.kvm);
    }
    for name in &options.kernels {
        if !MATRIX.iter().any(|target| target.name == name) {
            let names: Vec<_> = MATRIX.iter().map(|target| target.name).collect();
            bail!("unknown kernel {name}; the matrix has {}", names.join(", "));
        }
    }
    let targets: Vec<&Target> = MATRIX
        .iter()
        .filter(|target| {
            options.kernels.is_empty() || options.kernels.iter().any(|k| k == target.name)
        })
        .collect();
    let dir = root().join("target/vmtest");
    fs::create_dir_all(&dir)?;

    let mut images = HashMap::new();
    for target in &targets {
        if let Entry::Vacant(entry) = images.entry(target.arch) {
            entry.insert(build_image(&dir, target.suite, target.arch, options.keep)?);
        }
    }
    let mut summaries = Vec::new();
    let mut failed = 0;
    for target in &targets {
        let (passed, summary, memory) =
            run_target(&dir, target, &images[&target.arch], options.kvm)?;
        eprintln!("{summary}");
        failed += usize::from(!passed);
        summaries.push(summary);
        if target.name == MANY_CPUS_KERNEL {
            let (passed, summary) =
                run_many_cpus(&dir, target, &images[&target.arch], options.kvm, memory)?;
            eprintln!("{summary}");
            failed += usize::from(!passed);
            summaries.push(summary);
        }
    }
    eprintln!();
    for summary in &summaries {
        eprintln!("{summary}");
    }
    if failed > 0 {
        bail!("vmtest: {failed} of {} kernels failed", targets.len());
    }
    Ok(())
}

/// Builds hostprof, otlp_sink and the test programs for `arch` and packs
/// them into an initramfs.
fn build_image(dir: &Path, suite: &str, arch: Arch, keep: bool) -> Result<PathBuf> {
    let hostprof = build(arch.rust_target())?;
    let otlp_sink = build_example("otlp_sink", arch.rust_target())?;
    // JVMs for arm64 only: the host's tests run HotSpot on x86_64; the
    // arm64 guest is where its aarch64 frames are walked.
    let jres = match arch {
        Arch::Aarch64 => kernel::JDKS
            .iter()
            .map(|jdk| Ok((jdk.major, kernel::jre(dir, jdk, arch)?)))
            .collect::<Result<_>>()?,
        Arch::X86_64 => Vec::new(),
    };
    let inputs = image::Inputs {
        busybox: kernel::busybox(dir, suite, arch)?,
        hostprof,
        otlp_sink,
        jres,
    };
    let arch_dir = dir.join(arch.name());
    fs::create_dir_all(&arch_dir)?;
    let cpio = image::build(&arch_dir, arch, &inputs)?;
    if !keep {
        fs::remove_dir_all(arch_dir.join("root"))?;
    }
    Ok(cpio)
}

/// The kernel also booted with [`memory::MANY_CPUS`] vCPUs, for what each
/// CPU costs.
const MANY_CPUS_KERNEL: &str = "6.12";

/// Boots `target` again with [`memory::MANY_CPUS`] vCPUs and only the
/// memory check, and compares it with the 2-vCPU boot's (`few`).
fn run_many_cpus(
    dir: &Path,
    target: &Target,
    initramfs: &Path,
    kvm: bool,
    few: Option<memory::Figures>,
) -> Result<(bool, String)> {
    let kernel = kernel::fetch(dir, target.suite, target.arch)?;
    let label = format!(
        "vmtest: linux-{} {}, {} vCPUs",
        kernel.release,
        target.arch.name(),
        memory::MANY_CPUS
    );
    let log = dir.join(format!(
        "console-{}-{}cpus.log",
        target.name,
        memory::MANY_CPUS
    ));
    let guest = qemu::Guest {
        memory: "2G",
        cpus: memory::MANY_CPUS,
        append: "vmtest.suite=memory",
        single_thread: true,
    };
    let (boot, seconds) = boot_guest(target, &kernel, initramfs, &log, kvm, &guest)?;
    let (passed, words) = match (few, memory::figures(&boot)) {
        (Some(few), Some(many)) => memory::per_cpu(few, many),
        (None, _) => (false, "no memory figures from the 2-vCPU boot".to_string()),
        (_, None) => (
            false,
            format!(
                "no memory figures (console: {}); console ends:\n{}",
                log.display(),
                boot.tail.join("\n")
            ),
        ),
    };
    let verdict = if passed { "pass" } else { "fail" };
    Ok((
        passed,
        format!("{label}: {verdict} ({words}) in {seconds} s"),
    ))
}

/// Boots one kernel and judges its suite: (passed, summary lines, the
/// memory check's figures).
fn run_target(
    dir: &Path,
    target: &Target,
    initramfs: &Path,
    kvm: bool,
) -> Result<(bool, String, Option<memory::Figures>)> {
    let kernel = kernel::fetch(dir, target.suite, target.arch)
        .with_context(|| format!("cannot fetch the {} kernel", target.name))?;
    let label = format!("vmtest: linux-{} {}", kernel.release, target.arch.name());
    if !kernel::has_btf(&kernel)? {
        return Ok((
            false,
            format!("{label}: fail (the kernel has no BTF: CONFIG_DEBUG_INFO_BTF is not set)"),
            None,
        ));
    }
    let log = dir.join(format!("console-{}.log", target.name));
    let (boot, seconds) = boot_guest(
        target,
        &kernel,
        initramfs,
        &log,
        kvm,
        &qemu::Guest {
            memory: target.arch.memory(),
            ..qemu::Guest::default()
        },
    )?;
    let verdict = judge::judge(&boot);
    let passed = verdict.iter().all(|item| item.passed);
    let mut summary = format!(
        "{label}: {} ({}) in {seconds} s",
        if passed { "pass" } else { "fail" },
        verdict
            .iter()
            .map(|item| item.short.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for item in verdict.iter().filter(|item| item.show) {
        // Continuation lines (a console's end) indented under their check.
        let long = item.long.replace('\n', "\nvmtest:     ");
        summary.push_str(&format!("\nvmtest:   {long}"));
    }
    if !passed {
        summary.push_str(&format!("\nvmtest:   console: {}", log.display()));
    }
    Ok((passed, summary, memory::figures(&boot)))
}

/// Boots `kernel` as `guest` (KVM only when asked and the arch is the
/// host's): what it left behind, and how many seconds it took.
fn boot_guest(
    target: &Target,
    kernel: &kernel::Kernel,
    initramfs: &Path,
    log: &Path,
    kvm: bool,
    guest: &qemu::Guest,
) -> Result<(qemu::Boot, u64)> {
    let started = Instant::now();
    let boot = qemu::boot(
        target.arch,
        &kernel.image,
        initramfs,
        log,
        target.arch.timeout(),
        kvm && target.arch == Arch::host(),
        guest,
    )?;
    Ok((boot, started.elapsed().as_secs()))
}
