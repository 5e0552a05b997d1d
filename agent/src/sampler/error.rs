//! Sampler errors, sorted by what the user can do about them.
use std::{error::Error as StdError, io};

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    // These two say the root cause once, not the whole chain of wrappers
    // around it (aya's say "failed to create map X" twice).
    #[error(
        "permission denied while {what} ({cause}): run as root, or grant CAP_BPF and CAP_PERFMON \
         (plus CAP_SYS_RESOURCE on kernels before 5.11)"
    )]
    PermissionDenied { what: String, cause: String },
    #[error(
        "this kernel (Linux {release}) does not support {what} ({cause}): hostprof needs Linux 5.10 \
         or later with BPF, BTF and perf events enabled"
    )]
    Unsupported {
        what: String,
        release: String,
        cause: String,
    },
    #[error(
        "the kernel (Linux {release}) rejected the eBPF program {program}: {errno}; \
         run with --log-level debug to see the verifier's log, and report it with the kernel version"
    )]
    Rejected {
        program: String,
        release: String,
        // Not a `source`: the message already says it, once.
        errno: io::Error,
    },
    #[error(
        "this kernel (Linux {release}) has no BTF (/sys/kernel/btf/vmlinux: {error}): hostprof \
         needs a kernel built with CONFIG_DEBUG_INFO_BTF=y, as Debian, Ubuntu, RHEL and Amazon \
         Linux build theirs from 5.10 on"
    )]
    NoBtf { release: String, error: io::Error },
    #[error(
        "this kernel (Linux {release}) is older than Linux 5.10, the oldest hostprof supports: \
         upgrade the kernel"
    )]
    TooOld { release: String },
    #[error("{0:?} is not a program variant: set {var} to modern, legacy or auto", var = super::VARIANT_ENV)]
    BadVariant(String),
    #[error("{what} failed")]
    Other {
        what: String,
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    #[error("the embedded eBPF object has no {0}: the build is broken, rebuild hostprof")]
    MissingObject(&'static str),
    #[error(
        "the kernel's BTF does not describe {0}: this kernel is not supported for following child processes"
    )]
    MissingKernelType(&'static str),
    #[error("cannot list online CPUs")]
    OnlineCpus(#[source] io::Error),
}

const ATTACH: &str = "opening cpu-clock perf events";

impl SamplerError {
    fn classify(what: impl Into<String>, source: impl StdError + Send + Sync + 'static) -> Self {
        let what = what.into();
        let errno = io_errno(&source);
        let cause = || io::Error::from_raw_os_error(errno.unwrap_or(0)).to_string();
        let release = super::kernel_release();
        match errno {
            Some(libc::EPERM | libc::EACCES) => SamplerError::PermissionDenied {
                what,
                cause: cause(),
            },
            Some(libc::ENOSYS | libc::EOPNOTSUPP) => SamplerError::Unsupported {
                what,
                release,
                cause: cause(),
            },
            // perf_event_open: no such event on this kernel or CPU.
            Some(libc::ENOENT | libc::ENODEV) if what.starts_with(ATTACH) => {
                SamplerError::Unsupported {
                    what,
                    release,
                    cause: cause(),
                }
            }
            _ => SamplerError::Other {
                what,
                source: Box::new(source),
            },
        }
    }

    pub(crate) fn load(err: aya::EbpfError) -> Self {
        match err {
            aya::EbpfError::ProgramError(err) => Self::program("the eBPF object", err),
            err => Self::classify("loading the eBPF object", err),
        }
    }

    pub(crate) fn load_program(err: aya::programs::ProgramError) -> Self {
        Self::program("hostprof", err)
    }

    /// Loading the named program failed.
    pub(crate) fn load_named(
        program: &'static str,
    ) -> impl FnOnce(aya::programs::ProgramError) -> Self {
        move |err| Self::program(program, err)
    }

    /// Duplicating a program's descriptor failed.
    pub(crate) fn load_program_io(err: io::Error) -> Self {
        Self::classify("loading the eBPF program", err)
    }

    /// Probing the kernel's helpers failed.
    pub(crate) fn probe(err: aya::programs::ProgramError) -> Self {
        Self::classify("probing the kernel's BPF helpers", err)
    }

    /// `/sys/kernel/btf/vmlinux` cannot be read.
    pub(crate) fn no_btf(source: io::Error) -> Self {
        SamplerError::NoBtf {
            release: super::kernel_release(),
            error: source,
        }
    }

    /// A program failed to load: the verifier's log goes to the debug log,
    /// never into the one-line error.
    fn program(program: &str, err: aya::programs::ProgramError) -> Self {
        match err {
            aya::programs::ProgramError::LoadError {
                io_error,
                verifier_log,
            } => {
                tracing::debug!("the verifier's log for {program}:\n{verifier_log}");
                // EACCES is the verifier's own "unsafe program".
                match io_error.raw_os_error() {
                    Some(libc::EPERM) => SamplerError::PermissionDenied {
                        what: format!("loading the eBPF program {program}"),
                        cause: io_error.to_string(),
                    },
                    _ => SamplerError::Rejected {
                        program: program.to_string(),
                        release: super::kernel_release(),
                        errno: io_error,
                    },
                }
            }
            err => Self::classify(format!("loading the eBPF program {program}"), err),
        }
    }

    /// Attaching the named program failed.
    pub(crate) fn attach_named(
        program: &'static str,
    ) -> impl FnOnce(aya::programs::ProgramError) -> Self {
        move |err| Self::classify(format!("attaching the eBPF program {program}"), err)
    }

    pub(crate) fn attach(err: aya::programs::ProgramError) -> Self {
        Self::classify(ATTACH, err)
    }

    pub(crate) fn map(err: aya::maps::MapError) -> Self {
        Self::classify("accessing a BPF map", err)
    }

    /// A map's descriptor could not be duplicated (out of descriptors).
    pub(crate) fn dup(err: io::Error) -> Self {
        Self::classify("duplicating a BPF map's descriptor", err)
    }

    pub(crate) fn stats(err: aya::sys::SyscallError) -> Self {
        Self::classify("BPF run-time statistics", err)
    }
}

/// The OS error code at the bottom of an error chain, if there is one.
fn io_errno(err: &(dyn StdError + 'static)) -> Option<i32> {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(err) = current {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return io.raw_os_error();
        }
        current = err.source();
    }
    None
}
