//! What the running kernel can do, and so which variant of the eBPF programs
//! to load.
//!
//! The sampler exists twice in the eBPF object (see `hostprof_common`
//! `PROGRAM_SAMPLE_LEGACY`): one variant uses `bpf_loop` and
//! `bpf_task_pt_regs` (Linux 5.17+), the other bounded loops and the task's
//! kernel stack (Linux 5.10+). Helpers are probed, not guessed from the
//! version number, because distributions backport them.
use aya::{
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported},
};

use super::SamplerError;

/// Which programs to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `bpf_loop`, `bpf_task_pt_regs` and `bpf_get_current_task_btf`.
    Modern,
    /// Bounded loops; user registers from the top of the task's stack.
    Legacy,
}

/// Environment variable that forces a variant (`modern` or `legacy`), for
/// tests and for working around a kernel whose probes mislead.
pub const VARIANT_ENV: &str = "HOSTPROF_BPF_VARIANT";

impl Variant {
    /// The perf_event sampler of this variant.
    pub fn sample_program(self) -> &'static str {
        match self {
            Variant::Modern => hostprof_common::PROGRAM_SAMPLE,
            Variant::Legacy => hostprof_common::PROGRAM_SAMPLE_LEGACY,
        }
    }

    /// The off-CPU tracepoint of this variant.
    pub fn off_cpu_program(self) -> &'static str {
        match self {
            Variant::Modern => hostprof_common::PROGRAM_OFF_CPU_SWITCH,
            Variant::Legacy => hostprof_common::PROGRAM_OFF_CPU_SWITCH_LEGACY,
        }
    }

    /// How its loops work, for the log.
    pub fn describe(self) -> &'static str {
        match self {
            Variant::Modern => "bpf_loop and bpf_task_pt_regs (Linux 5.17+)",
            Variant::Legacy => "bounded loops, registers from the task's stack (Linux 5.10+)",
        }
    }

    /// The variant this kernel runs: forced by [`VARIANT_ENV`], or the
    /// modern one when every helper it calls is there.
    pub fn detect() -> Result<Variant, SamplerError> {
        match std::env::var(VARIANT_ENV).ok().as_deref() {
            Some("modern") => return Ok(Variant::Modern),
            Some("legacy") => return Ok(Variant::Legacy),
            Some("" | "auto") | None => {}
            Some(other) => {
                return Err(SamplerError::BadVariant(other.to_string()));
            }
        }
        let missing = missing_modern_helpers()?;
        if missing.is_empty() {
            return Ok(Variant::Modern);
        }
        tracing::debug!(
            "linux {}: no {}; using the legacy programs",
            kernel_release(),
            missing.join(", ")
        );
        Ok(Variant::Legacy)
    }
}

/// The helpers of the modern variant this kernel lacks.
fn missing_modern_helpers() -> Result<Vec<&'static str>, SamplerError> {
    let helpers = [
        (BpfHelper::BPF_FUNC_loop, "bpf_loop"),
        (BpfHelper::BPF_FUNC_task_pt_regs, "bpf_task_pt_regs"),
        (
            BpfHelper::BPF_FUNC_get_current_task_btf,
            "bpf_get_current_task_btf",
        ),
    ];
    let mut missing = Vec::new();
    for (helper, name) in helpers {
        let supported =
            is_helper_supported(ProgramType::PerfEvent, helper).map_err(SamplerError::probe)?;
        if !supported {
            missing.push(name);
        }
    }
    Ok(missing)
}

/// The oldest kernel hostprof supports (and tests, in `cargo xtask vmtest`).
pub const MIN_KERNEL: (u32, u32) = (5, 10);

/// `major.minor` of a release string such as `5.10.0-46-amd64`.
pub fn parse_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Fails with one line when the kernel is older than [`MIN_KERNEL`] or has
/// no BTF, before anything is loaded.
pub fn check_supported() -> Result<(), SamplerError> {
    let release = kernel_release();
    if let Some(version) = parse_version(&release)
        && version < MIN_KERNEL
    {
        return Err(SamplerError::TooOld { release });
    }
    match std::fs::metadata("/sys/kernel/btf/vmlinux") {
        Ok(_) => Ok(()),
        Err(err) => Err(SamplerError::no_btf(err)),
    }
}

/// The running kernel's release (`uname -r`), or `unknown`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|release| release.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The oldest kernels whose verifiers were seen to accept the JIT
/// runtimes' walks in the modern `sample_cpu` and its early-copy path
/// (`cargo xtask vmtest`). Older kernels go without; the verifier prunes
/// a path whose load-time global is 0. The early-copy path: 6.1 accepts
/// it since `sample_cpu` fills its record once (it gave up, E2BIG, when
/// the unwinder was inlined twice); the legacy programs (before 5.17) have
/// none. CPython's walk is a tail-called program of its own on both
/// variants (checked on 5.10, 6.1 and 6.12 by `cargo xtask vmtest`), so
/// it needs no such bound on x86_64.
pub(super) const RUNTIME_WALK_SINCE: (u32, u32) = (6, 1);
/// arm64's JIT takes a tail call from a program with bpf-to-bpf calls
/// (the modern `sample_cpu`'s `bpf_loop` callbacks) since Linux 6.0; the
/// arm64 guest of `cargo xtask vmtest` (6.1) loads it, but has no CPython
/// to check the walk's frames with.
pub(super) const ARM64_PYTHON_WALK_SINCE: (u32, u32) = (6, 1);
pub(super) const EARLY_COPY_SINCE: (u32, u32) = (6, 1);
/// The modern variant's read of Go's labels (`bpf_loop` over a label
/// map's slots, writes at variable offsets into the attribute room): 6.1,
/// 6.12 and 6.18 accept it (6.1 since each string's length is read once,
/// see `golang::append`); before 6.1 the modern variant has none of the
/// runtime walks either. The legacy variant's read, a loop bounded in the
/// program, is checked on 5.10 by `cargo xtask vmtest`.
pub(super) const GO_LABELS_SINCE: (u32, u32) = (6, 1);

/// The running kernel is `since` or newer.
pub(super) fn verified_since(since: (u32, u32)) -> bool {
    parse_version(&kernel_release()).is_some_and(|version| version >= since)
}

/// The paths the programs take on this kernel (load-time globals, 0 or 1):
/// those its verifier was seen to accept.
pub(super) struct Walks {
    pub python: u32,
    pub runtime: u32,
    pub go_labels: u32,
}

impl Walks {
    /// For `variant` on the running kernel; says once what is left out.
    pub(super) fn verified(variant: Variant) -> Walks {
        // CPython's walk, a program the sampler jumps to: every kernel on
        // x86_64; arm64's modern variant needs its JIT to take the jump
        // from a program with `bpf_loop` callbacks.
        let python = u32::from(
            cfg!(target_arch = "x86_64")
                || variant == Variant::Legacy
                || verified_since(ARM64_PYTHON_WALK_SINCE),
        );
        if python == 0 {
            tracing::info!(
                "no Python frames on this kernel (they need Linux {}.{} or later)",
                ARM64_PYTHON_WALK_SINCE.0,
                ARM64_PYTHON_WALK_SINCE.1
            );
        }
        // The JIT runtimes' walks: modern, `bpf_loop` callbacks in the
        // native unwinder's, on the kernels they were checked on; legacy,
        // V8's and HotSpot's are tail-called programs of their own
        // (checked on 5.10 by cargo xtask vmtest).
        let runtime = u32::from(variant == Variant::Legacy || verified_since(RUNTIME_WALK_SINCE));
        if runtime == 0 {
            tracing::info!(
                "no Java or JavaScript frames on this kernel with the modern eBPF variant \
                 (they need Linux {}.{} or later)",
                RUNTIME_WALK_SINCE.0,
                RUNTIME_WALK_SINCE.1
            );
        }
        // Go's pprof labels: the legacy variant's read everywhere; the
        // modern variant's on the kernels whose verifiers were seen to
        // accept it (x86_64 and arm64).
        let go_labels = u32::from(variant == Variant::Legacy || verified_since(GO_LABELS_SINCE));
        if go_labels == 0 {
            tracing::info!(
                "no Go pprof labels on this kernel with the modern eBPF variant (they need \
                 Linux {}.{} or later)",
                GO_LABELS_SINCE.0,
                GO_LABELS_SINCE.1
            );
        }
        Walks {
            python,
            runtime,
            go_labels,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_variant_names_its_own_programs() {
        assert_ne!(
            Variant::Modern.sample_program(),
            Variant::Legacy.sample_program()
        );
        assert_ne!(
            Variant::Modern.off_cpu_program(),
            Variant::Legacy.off_cpu_program()
        );
        // The kernel keeps 15 bytes of a program's name.
        for variant in [Variant::Modern, Variant::Legacy] {
            assert!(variant.sample_program().len() <= 15);
            assert!(variant.off_cpu_program().len() <= 15);
        }
    }

    #[test]
    fn versions_are_parsed_and_compared() {
        assert_eq!(parse_version("5.10.0-46-amd64"), Some((5, 10)));
        assert_eq!(parse_version("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(parse_version("4.19"), Some((4, 19)));
        assert_eq!(parse_version("unknown"), None);
        assert!(parse_version("4.19.0-27-amd64").unwrap() < MIN_KERNEL);
        assert!(parse_version("5.9.16").unwrap() < MIN_KERNEL);
        assert!(parse_version("5.10.0-46-amd64").unwrap() >= MIN_KERNEL);
        assert!(parse_version("6.1.0-40-arm64").unwrap() >= MIN_KERNEL);
    }

    #[test]
    fn the_release_is_read() {
        assert_ne!(kernel_release(), "unknown");
    }
}
