//! Sampler errors, sorted by what the user can do about them.
use std::{error::Error as StdError, io};

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error(
        "permission denied while {what}: run as root, or grant CAP_BPF and CAP_PERFMON \
         (plus CAP_SYS_RESOURCE on kernels before 5.11)"
    )]
    PermissionDenied {
        what: String,
        source: Box<dyn StdError + Send + Sync>,
    },
    #[error(
        "this kernel does not support {what}: hostprof needs Linux 5.15 or later with BPF and perf events enabled"
    )]
    Unsupported {
        what: String,
        source: Box<dyn StdError + Send + Sync>,
    },
    #[error("{what} failed: {source}")]
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
    #[error("cannot list online CPUs: {0}")]
    OnlineCpus(#[source] io::Error),
}

const ATTACH: &str = "opening cpu-clock perf events";

impl SamplerError {
    fn classify(what: impl Into<String>, source: impl StdError + Send + Sync + 'static) -> Self {
        let what = what.into();
        let errno = io_errno(&source);
        let source = Box::new(source);
        match errno {
            Some(libc::EPERM | libc::EACCES) => SamplerError::PermissionDenied { what, source },
            Some(libc::ENOSYS | libc::EOPNOTSUPP) => SamplerError::Unsupported { what, source },
            // perf_event_open: no such event on this kernel or CPU.
            Some(libc::ENOENT | libc::ENODEV) if what.starts_with(ATTACH) => {
                SamplerError::Unsupported { what, source }
            }
            _ => SamplerError::Other { what, source },
        }
    }

    pub(crate) fn load(err: aya::EbpfError) -> Self {
        Self::classify("loading the eBPF object", err)
    }

    pub(crate) fn load_program(err: aya::programs::ProgramError) -> Self {
        Self::classify("loading the eBPF program", err)
    }

    /// Loading the named program failed.
    pub(crate) fn load_named(
        program: &'static str,
    ) -> impl FnOnce(aya::programs::ProgramError) -> Self {
        move |err| Self::classify(format!("loading the eBPF program {program}"), err)
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
