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

/// Drops every capability but [`KEPT`] from the effective, permitted,
/// inheritable and ambient sets (and the bounding set, when allowed to):
/// nothing dropped can come back. Returns the capabilities still effective.
pub fn drop_after_setup() -> Result<CapsHashSet, caps::errors::CapsError> {
    let kept: CapsHashSet = KEPT.iter().map(|(cap, _)| *cap).collect();
    // The bounding set first: changing it needs CAP_SETPCAP, dropped below.
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP)? {
        for cap in caps::read(None, CapSet::Bounding)? {
            if !kept.contains(&cap) {
                caps::drop(None, CapSet::Bounding, cap)?;
            }
        }
    }
    caps::clear(None, CapSet::Ambient)?;
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        let now = caps::read(None, set)?;
        caps::set(None, set, &now.intersection(&kept).copied().collect())?;
    }
    caps::read(None, CapSet::Effective)
}
