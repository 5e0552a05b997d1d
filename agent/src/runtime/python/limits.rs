//! What the agent accepts from a Python process, and what it refused.
//!
//! Everything the host reads of CPython (the `_Py_DebugOffsets` a process
//! publishes, the code objects its frames point to) is the tenant's to
//! write. A value that sizes a read or an allocation is checked against the
//! caps below first; past one, the process (offsets) or the code object is
//! refused, with one log line and a count, never a panic or a big read.
use std::sync::atomic::{AtomicU64, Ordering};

/// Largest `PyThreadState`, `_PyInterpreterFrame` or `PyCodeObject` taken
/// from `_Py_DebugOffsets` (3.13 and 3.14: a few hundred bytes each). Their
/// fields are read per frame per sample, so their offsets stay below this.
pub const MAX_OBJECT_BYTES: u64 = 4 << 10;
/// Largest `_PyRuntimeState` or `PyInterpreterState`: they hold whole arrays
/// (static strings, pending calls: hundreds of KiB), but only one pointer of
/// each is read, at an offset below this.
pub const MAX_STATE_BYTES: u64 = 16 << 20;
/// Longest name, qualified name or file name, in characters (`PATH_MAX`);
/// up to four bytes each.
pub const MAX_STRING_CHARS: u64 = 4 << 10;
/// Longest location table (`co_linetable`) read: about 20,000 lines of
/// straight-line code in one code object.
pub const MAX_LINETABLE_BYTES: u64 = 64 << 10;

/// Why a value read from a Python process was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "its _Py_DebugOffsets gives {what} = {value:#x}, past {limit:#x}: \
         not a CPython hostprof can walk (its native frames only)"
    )]
    Offset {
        what: &'static str,
        value: u64,
        limit: u64,
    },
    #[error(
        "the code object at {address:#x} has a {what} of {len} bytes, over the \
         {cap}-byte cap: that frame is left out"
    )]
    TooLong {
        address: u64,
        what: &'static str,
        len: u64,
        cap: u64,
    },
    #[error(
        "the code object at {address:#x} has a {what} past the end of the \
         address space: that frame is left out"
    )]
    Overflow { address: u64, what: &'static str },
    #[error(
        "{path}: the search for its evaluation loop's parts stopped at a cap \
         ({parts} parts, {decoded} bytes decoded): frames in a part not found \
         are not placed where the loop ran"
    )]
    LoopCapped {
        path: String,
        parts: usize,
        decoded: usize,
    },
}

/// Values refused since the agent started, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusals {
    /// Processes whose `_Py_DebugOffsets` held an offset or size past a cap.
    pub offsets: u64,
    /// Code objects with a string or location table over its cap.
    pub too_long: u64,
    /// Code objects whose pointers plus an offset overflowed.
    pub overflow: u64,
    /// Interpreter binaries whose loop's parts were searched up to a cap
    /// (`eval::MAX_PARTS`, or the bytes decoded).
    pub loop_capped: u64,
}

static REFUSED_OFFSETS: AtomicU64 = AtomicU64::new(0);
static REFUSED_TOO_LONG: AtomicU64 = AtomicU64::new(0);
static REFUSED_OVERFLOW: AtomicU64 = AtomicU64::new(0);
static REFUSED_LOOP_CAPPED: AtomicU64 = AtomicU64::new(0);

/// Values refused since the agent started.
pub fn refusals() -> Refusals {
    Refusals {
        offsets: REFUSED_OFFSETS.load(Ordering::Relaxed),
        too_long: REFUSED_TOO_LONG.load(Ordering::Relaxed),
        overflow: REFUSED_OVERFLOW.load(Ordering::Relaxed),
        loop_capped: REFUSED_LOOP_CAPPED.load(Ordering::Relaxed),
    }
}

/// Counts and logs a refusal in process `pid`: a warning for a process
/// (once: it is not looked at again) or an interpreter binary (once: it is
/// read once), a debug line for a code object (the refusal is cached with
/// the object, so once per object).
pub fn refused(pid: u32, refusal: &Refusal) {
    let counter = match refusal {
        Refusal::Offset { .. } => &REFUSED_OFFSETS,
        Refusal::TooLong { .. } => &REFUSED_TOO_LONG,
        Refusal::Overflow { .. } => &REFUSED_OVERFLOW,
        Refusal::LoopCapped { .. } => &REFUSED_LOOP_CAPPED,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    match refusal {
        Refusal::Offset { .. } | Refusal::LoopCapped { .. } => {
            tracing::warn!("pid {pid}: {refusal}")
        }
        _ => tracing::debug!("pid {pid}: {refusal}"),
    }
}

/// `address + offset`, refused when it overflows (`what` names the field).
pub fn offset(address: u64, offset: u64, what: &'static str) -> Result<u64, Refusal> {
    address
        .checked_add(offset)
        .ok_or(Refusal::Overflow { address, what })
}

#[cfg(test)]
mod tests {
    use super::{Refusal, refusals, refused};

    #[test]
    fn refusals_are_counted_by_reason() {
        let before = refusals();
        refused(
            1,
            &Refusal::TooLong {
                address: 0x1000,
                what: "qualname",
                len: u64::MAX,
                cap: 4096,
            },
        );
        let after = refusals();
        assert!(after.too_long > before.too_long);
    }
}
