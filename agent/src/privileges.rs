//! Capabilities after setup: once the eBPF programs are loaded and attached,
//! the agent keeps only what reading processes and files needs, so a bug in
//! the parsers of untrusted data cannot load kernel code or open perf events.
//!
//! Only `hostprof agent` drops them: `hostprof record -- CMD` starts a command
//! that should run with the privileges its user gave it.
use caps::{CapSet, Capability, CapsHashSet};

/// What the agent keeps, and why.
pub const KEPT: &[(Capability, &str)] = &[
    (
        Capability::CAP_SYS_PTRACE,
        "read /proc/PID/maps and open /proc/PID/root of other users' processes",
    ),
    (
        Capability::CAP_DAC_READ_SEARCH,
        "read binaries and debug files whatever their mode",
    ),
    (
        Capability::CAP_CHECKPOINT_RESTORE,
        "open /proc/PID/map_files (binaries deleted or replaced on disk)",
    ),
    (
        Capability::CAP_SYSLOG,
        "read kernel symbol addresses from /proc/kallsyms",
    ),
];

/// Kept as well where the kernel asks for it on every `bpf()` call: the
/// agent keeps writing unwind tables and reading counters after setup.
pub const KEPT_FOR_MAPS: (Capability, &str) = (
    Capability::CAP_BPF,
    "write unwind tables and read counters: this kernel checks it on every \
     bpf() call while kernel.unprivileged_bpf_disabled is set (Linux 5.10 \
     does; later kernels check only loading and map creation). Without \
     CAP_PERFMON it loads no tracing program",
);

/// Kept after setup only until the table thread has raised its priority
/// (see [`drop_nice`]).
pub const KEPT_FOR_PRIORITY: (Capability, &str) = (
    Capability::CAP_SYS_NICE,
    "raise the unwind table thread's priority (then dropped)",
);

/// True when this kernel refuses a `bpf()` map operation to a thread
/// without `CAP_BPF` and `CAP_SYS_ADMIN`. Linux 5.10 checks
/// `kernel.unprivileged_bpf_disabled` on entry to every command; newer
/// kernels only when loading programs or creating maps. Probed on a thread
/// of its own (capabilities are per thread) that lowers its effective set
/// and looks up an element of no map (fd -1): `EPERM` means the entry check
/// refused it, `EBADF` that it got as far as the fd.
pub fn map_access_needs_cap_bpf() -> bool {
    std::thread::spawn(|| {
        for cap in [Capability::CAP_BPF, Capability::CAP_SYS_ADMIN] {
            if caps::drop(None, CapSet::Effective, cap).is_err() {
                return true;
            }
        }
        // union bpf_attr for BPF_MAP_LOOKUP_ELEM: map_fd, then key, value
        // and flags as u64s.
        let mut attr = [0u64; 4];
        attr[0] = u64::from(u32::MAX);
        const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
        // SAFETY: bpf() reads `attr`'s 32 bytes; the fd names no map.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_ELEM,
                attr.as_mut_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        ret != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    })
    .join()
    .unwrap_or(true)
}

/// Drops every capability but [`KEPT`] (and [`KEPT_FOR_MAPS`] when
/// `keep_bpf`) from the effective, permitted, inheritable and ambient sets
/// (and the bounding set, when allowed to): nothing dropped can come back.
/// [`KEPT_FOR_PRIORITY`] stays in the effective and permitted sets for
/// the table thread, which is started next, raises itself and drops it
/// (as the caller does once it is started: [`drop_nice`]). Returns the
/// capabilities still effective.
pub fn drop_after_setup(keep_bpf: bool) -> Result<CapsHashSet, caps::errors::CapsError> {
    let mut kept: CapsHashSet = KEPT.iter().map(|(cap, _)| *cap).collect();
    if keep_bpf {
        kept.insert(KEPT_FOR_MAPS.0);
    }
    let bounded = kept.clone();
    kept.insert(KEPT_FOR_PRIORITY.0);
    // The bounding set first: changing it needs CAP_SETPCAP, dropped below.
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP)? {
        for cap in caps::read(None, CapSet::Bounding)? {
            if !bounded.contains(&cap) {
                caps::drop(None, CapSet::Bounding, cap)?;
            }
        }
    }
    caps::clear(None, CapSet::Ambient)?;
    for (set, keep) in [
        (CapSet::Inheritable, &bounded),
        (CapSet::Effective, &kept),
        (CapSet::Permitted, &kept),
    ] {
        let now = caps::read(None, set)?;
        caps::set(None, set, &now.intersection(keep).copied().collect())?;
    }
    caps::read(None, CapSet::Effective)
}

/// Drops [`KEPT_FOR_PRIORITY`] from the calling thread for good (threads
/// it starts from now on do not have it either).
pub fn drop_nice() {
    for set in [CapSet::Effective, CapSet::Permitted] {
        if let Err(err) = caps::drop(None, set, KEPT_FOR_PRIORITY.0) {
            tracing::warn!("cannot drop CAP_SYS_NICE: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe lowers capabilities on a thread of its own only: the
    /// caller keeps every one it had (the agent still has to drop them, and
    /// attach, after probing).
    #[test]
    fn probing_leaves_the_callers_capabilities_alone() {
        let before = caps::read(None, CapSet::Effective).unwrap();
        let _ = map_access_needs_cap_bpf();
        assert_eq!(caps::read(None, CapSet::Effective).unwrap(), before);
    }
}
