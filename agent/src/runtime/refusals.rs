//! What the runtimes' name readers refused of a process's memory.
//!
//! The JVM's method data and V8's heap are the tenant's to write: each
//! reader caps what it reads (a string's length and nesting, a line or
//! debug-info table's size). A frame whose data is past a cap is named
//! `[unknown …]` or `(anonymous)` rather than read whole; each such
//! refusal is counted here, by runtime and reason, for the
//! `hostprof_runtime_refused_total` metric. A refused object is cached
//! with the frame's name, so it is counted once per object, not per
//! sample.
use std::sync::atomic::{AtomicU64, Ordering};

pub use hostprof_common::runtime::Runtime;

/// The runtimes whose name readers count here (CPython's count their own
/// caps: `python::limits`), each by its OTLP `profile.frame.type`.
const RUNTIMES: [Runtime; 2] = [Runtime::Hotspot, Runtime::V8];

/// Why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A length or size over its cap (a string, a script's source or line
    /// table, a method's line table or debug information).
    TooLong,
    /// Strings nested deeper than the cap (V8's cons, sliced, thin).
    TooDeep,
}

const REASONS: [(Reason, &str); 2] = [(Reason::TooLong, "too_long"), (Reason::TooDeep, "too_deep")];

static COUNTS: [[AtomicU64; REASONS.len()]; RUNTIMES.len()] =
    [const { [const { AtomicU64::new(0) }; REASONS.len()] }; RUNTIMES.len()];

/// Counts one refusal (of a runtime that counts here; another's is not).
pub fn refuse(runtime: Runtime, reason: Reason) {
    let Some(at) = RUNTIMES.iter().position(|&counted| counted == runtime) else {
        return;
    };
    COUNTS[at][reason as usize].fetch_add(1, Ordering::Relaxed);
    tracing::debug!("{runtime:?}: a frame's data refused: {reason:?}");
}

/// Refusals since the agent started: (runtime, reason, count) for every
/// pair, zeros included (so the metric's series always exist).
pub fn refusals() -> Vec<(&'static str, &'static str, u64)> {
    let mut all = Vec::with_capacity(RUNTIMES.len() * REASONS.len());
    for (at, runtime) in RUNTIMES.into_iter().enumerate() {
        for (reason, reason_name) in REASONS {
            let count = COUNTS[at][reason as usize].load(Ordering::Relaxed);
            all.push((runtime.name(), reason_name, count));
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_counts_under_its_runtime_and_reason() {
        let count = |runtime: &str, reason: &str| {
            refusals()
                .into_iter()
                .find(|&(r, why, _)| r == runtime && why == reason)
                .map(|(_, _, count)| count)
                .unwrap()
        };
        let before = (count("v8js", "too_deep"), count("jvm", "too_long"));
        refuse(Runtime::V8, Reason::TooDeep);
        refuse(Runtime::Hotspot, Reason::TooLong);
        assert!(count("v8js", "too_deep") > before.0);
        assert!(count("jvm", "too_long") > before.1);
        assert_eq!(refusals().len(), 4);
        // CPython's readers count their caps elsewhere: not a series here.
        refuse(Runtime::Cpython, Reason::TooLong);
        assert!(refusals().iter().all(|&(runtime, ..)| runtime != "cpython"));
    }
}
