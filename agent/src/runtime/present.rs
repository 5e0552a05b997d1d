//! The kernel's record of which kinds of process were registered so far
//! (`hostprof_common::MAP_PRESENT`): every sample of a host with no
//! process publishing a trace context and no Python interpreter skips
//! those maps' lookups. Sticky: a bit stays set once a process of its kind
//! was seen, so no sample of one ever misses its lookup.
use std::sync::Mutex;

use aya::maps::{Array, MapData};

/// The map and the bits written to it.
static PRESENT: Mutex<Option<(Array<MapData, u32>, u32)>> = Mutex::new(None);

/// Hands over the session's map, no kind seen yet.
pub fn use_map(map: Array<MapData, u32>) {
    *lock() = Some((map, 0));
}

/// Says a process of kind `bit` (`hostprof_common::present`) is about to be
/// registered: set before its record, so its first samples look it up.
pub fn mark(bit: u32) {
    let mut present = lock();
    let Some((map, bits)) = present.as_mut() else {
        return;
    };
    if *bits & bit == bit {
        return;
    }
    *bits |= bit;
    if let Err(err) = map.set(0, *bits, 0) {
        // Not expected (an array's only entry): the kind's lookups stay
        // skipped, which the runtime's frames missing would show.
        tracing::warn!("cannot tell the kernel which processes to look up: {err}");
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<(Array<MapData, u32>, u32)>> {
    PRESENT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
