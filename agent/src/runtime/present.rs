//! The kernel's record of which kinds of process are registered, per tgid
//! slot (`hostprof_common::MAP_PRESENT`): a sample of a process that
//! publishes no trace context, runs no Python and is no Go program skips
//! those maps' hash lookups, however many others on the host do. A bit
//! is set before its process's record goes in and cleared after it left,
//! so no sample of a registered process misses its lookup.
use std::{collections::HashMap, sync::Mutex};

use aya::maps::{Array, MapData};
use hostprof_common::present::{self, slot};

/// The map, and what was written to it.
static PRESENT: Mutex<Option<Present>> = Mutex::new(None);

struct Present {
    map: Array<MapData, u64>,
    /// Each registered pid's kinds: a slot's byte is the union of its pids'.
    kinds: Kinds,
}

/// Registered pids' kinds, grouped by the map entry their slot is in, so
/// that an entry's value is worked out from its own few pids, not from
/// every pid registered.
#[derive(Default)]
struct Kinds(HashMap<u32, HashMap<u32, u8>>);

impl Kinds {
    /// Adds (`on`) or removes `bit` for `pid`; the entry to write and its
    /// new value when it changed.
    fn set(&mut self, pid: u32, bit: u8, on: bool) -> Option<(u32, u64)> {
        let (entry, _) = slot(pid);
        let before = self.entry(entry);
        let pids = self.0.entry(entry).or_default();
        let kinds = pids.entry(pid).or_default();
        if on {
            *kinds |= bit;
        } else {
            *kinds &= !bit;
        }
        if *kinds == 0 {
            pids.remove(&pid);
        }
        if pids.is_empty() {
            self.0.remove(&entry);
        }
        let after = self.entry(entry);
        (after != before).then_some((entry, after))
    }

    /// Entry `entry`'s value: each of its slots' byte, the union of the
    /// kinds of the pids in it.
    fn entry(&self, entry: u32) -> u64 {
        self.0.get(&entry).map_or(0, |pids| {
            pids.iter().fold(0, |value, (&pid, &kinds)| {
                value | (u64::from(kinds) << slot(pid).1)
            })
        })
    }
}

/// Hands over the session's map, nothing registered yet.
pub fn use_map(map: Array<MapData, u64>) {
    *lock() = Some(Present {
        map,
        kinds: Kinds::default(),
    });
}

/// Says `pid` is about to be registered as a process of kind `bit`
/// (`hostprof_common::present`): set before its record, so its first
/// samples look it up.
pub fn mark(bit: u8, pid: u32) {
    write(pid, bit, true);
}

/// Says `pid`'s record of kind `bit` left the kernel's map (or never got
/// in): its samples skip the lookup from now on.
pub fn unmark(bit: u8, pid: u32) {
    write(pid, bit, false);
}

fn write(pid: u32, bit: u8, on: bool) {
    debug_assert!(present::ALL.contains(&bit));
    let mut present = lock();
    let Some(Present { map, kinds }) = present.as_mut() else {
        return;
    };
    let Some((entry, value)) = kinds.set(pid, bit, on) else {
        return;
    };
    if let Err(err) = map.set(entry, value, 0) {
        // Not expected (an entry within the array): a kind's lookups stay
        // skipped for this slot, which its runtime's frames missing would
        // show.
        tracing::warn!("cannot tell the kernel which processes to look up: {err}");
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<Present>> {
    PRESENT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostprof_common::present::{GO, PYTHON, TRACE};

    #[test]
    fn a_slot_holds_the_union_of_its_pids_kinds() {
        let mut kinds = Kinds::default();
        // 9 and 65,545 share a slot (65,536 slots); 10 is the next one.
        let (entry, shift) = slot(9);
        assert_eq!(slot(65_545), (entry, shift));
        assert_eq!(slot(10), (entry, shift + 8));
        assert_eq!(
            kinds.set(9, TRACE, true),
            Some((entry, u64::from(TRACE) << shift))
        );
        // Already set for the slot: nothing to write.
        assert_eq!(kinds.set(65_545, TRACE, true), None);
        assert_eq!(
            kinds.set(10, PYTHON | GO, true),
            Some((
                entry,
                (u64::from(TRACE) << shift) | (u64::from(PYTHON | GO) << (shift + 8))
            ))
        );
        // One of the slot's two leaves: the other keeps the bit.
        assert_eq!(kinds.set(9, TRACE, false), None);
        assert_eq!(
            kinds.set(65_545, TRACE, false),
            Some((entry, u64::from(PYTHON | GO) << (shift + 8)))
        );
        assert_eq!(
            kinds.set(10, GO, false),
            Some((entry, u64::from(PYTHON) << (shift + 8)))
        );
        assert_eq!(kinds.set(10, PYTHON, false), Some((entry, 0)));
        assert!(kinds.0.is_empty());
        // A kind cleared that was never set changes nothing.
        assert_eq!(kinds.set(11, GO, false), None);
        assert!(kinds.0.is_empty());
    }
}
