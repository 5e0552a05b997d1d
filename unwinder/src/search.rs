//! Bounded searches over sorted tables (rows by pc, mappings by start),
//! advanced a probe at a time so that the eBPF program can drive them from
//! `bpf_loop`, and the per-CPU hint cache that skips most of them.

/// Most probes a binary search over `u32` indices takes.
pub const MAX_SEARCH_STEPS: u32 = 32;

/// A binary search for the last element whose key is `<= target`, advanced
/// one probe at a time: the host loops over [`Search::probe`], the eBPF
/// program calls it from `bpf_loop` (a loop inside the unwinder's own loop
/// callback would make the verifier walk every iteration).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Search {
    pub target: u64,
    /// Elements below `low` are `<= target`.
    pub low: u32,
    /// Elements from `high` on are `> target`.
    pub high: u32,
    /// Non-zero when a key could not be read.
    pub failed: u32,
    pub _pad: u32,
}

impl Search {
    pub fn new(len: u32, target: u64) -> Self {
        Search {
            target,
            low: 0,
            high: len,
            failed: 0,
            _pad: 0,
        }
    }

    /// One probe; false once the search is over. `key` reads element `index`.
    #[inline(always)]
    pub fn probe(&mut self, key: impl FnOnce(u32) -> Option<u64>) -> bool {
        if self.low >= self.high || self.failed != 0 {
            return false;
        }
        let mid = self.low + (self.high - self.low) / 2;
        match key(mid) {
            Some(value) if value <= self.target => self.low = mid + 1,
            Some(_) => self.high = mid,
            None => {
                self.failed = 1;
                return false;
            }
        }
        true
    }

    /// One probe that branches on nothing it reads, for kernels without
    /// `bpf_loop`: their verifier walks every path through a loop, and a
    /// search whose probes branch doubles its paths with each probe. Here
    /// the comparison becomes arithmetic (the sign of a difference), so
    /// each probe is one path. Once the search is over, probes change
    /// nothing, so callers run a fixed number of them. Keys and the target
    /// compare as 63-bit values (user addresses and table offsets are far
    /// below that); `key` returning `None` counts as "greater than the
    /// target".
    #[inline(always)]
    pub fn probe_branchless(&mut self, key: impl FnOnce(u32) -> Option<u64>) {
        const KEY_MASK: u64 = (1 << 63) - 1;
        let (low, high) = (self.low as u64, self.high as u64);
        // 1 while low < high: the sign bit of low - high.
        let active = opaque(opaque(low).wrapping_sub(high) >> 63);
        let mid = low.wrapping_add((high.wrapping_sub(low) >> 1).wrapping_mul(active));
        let value = key(mid as u32).map_or(KEY_MASK, |value| value & KEY_MASK);
        // 1 when value > target: the sign bit of target - value.
        let greater = opaque((self.target & KEY_MASK).wrapping_sub(opaque(value)) >> 63);
        let right = (greater ^ 1) & active;
        let left = greater & active;
        self.low =
            low.wrapping_add(right.wrapping_mul(mid.wrapping_add(1).wrapping_sub(low))) as u32;
        self.high = high.wrapping_sub(left.wrapping_mul(high.wrapping_sub(mid))) as u32;
    }

    /// The index found, if the search is over and found one.
    #[inline(always)]
    pub fn result(&self) -> Option<u32> {
        if self.failed != 0 || self.low < self.high {
            return None;
        }
        self.low.checked_sub(1)
    }
}

/// `value`, hidden from the optimizer: what it computes from it, it must
/// compute. In [`Search::probe_branchless`]: knowing its operands' ranges,
/// LLVM sees that the sign of a difference
/// is a comparison, and a multiply by it a select; BPF has no instruction
/// that sets a register from a comparison, so both became conditional
/// jumps. The verifier split its state at each, and the paths multiplied
/// probe after probe: 74,000 of the sampler's 82,000 verified
/// instructions, 80 ms of every start. In BPF, one register move the
/// optimizer cannot see through (`black_box` would go through the stack;
/// an empty `asm!` leaves two line-info records on one instruction, which
/// the kernel rejects); elsewhere the value is used as is. Also for an
/// index's mask that older verifiers must see: LLVM drops a mask that a
/// comparison with another register already implies, and verifiers before
/// 6.x do not learn bounds from such a comparison.
#[inline(always)]
pub fn opaque(value: u64) -> u64 {
    #[cfg(target_arch = "bpf")]
    {
        let mut value = value;
        // SAFETY: a register moved to itself: no memory, no side effect.
        unsafe { core::arch::asm!("{0} = {0}", inout(reg) value, options(pure, nomem, nostack)) };
        value
    }
    #[cfg(not(target_arch = "bpf"))]
    value
}

/// Slots of the kernel's per-CPU cache of row searches: the row each
/// recent (table, address) search found, keyed by [`hint_slot`].
pub const ROW_HINT_SLOTS: u32 = 1 << ROW_HINT_BITS;
const ROW_HINT_BITS: u32 = 10;

/// The slot of a search for `target` in the table at row `start`.
#[inline(always)]
pub fn hint_slot(start: u32, target: u64) -> u32 {
    // splitmix64's finaliser: return addresses are regular (aligned, a
    // few bytes apart), which a single multiply maps to regular slots.
    let mut key = target ^ (u64::from(start) << 32);
    key = (key ^ (key >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    key = (key ^ (key >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (key >> (64 - ROW_HINT_BITS)) as u32
}

/// True when `hint` is what a search of `len` sorted keys for `target`
/// finds: its key is `<= target` and the next one, if any, is not. Two
/// reads instead of a search's dozen probes, and right whatever put
/// `hint` there (another table, another address, a table since
/// replaced): the cache needs no invalidation.
#[inline(always)]
pub fn hint_holds(
    len: u32,
    target: u64,
    hint: u32,
    mut key: impl FnMut(u32) -> Option<u64>,
) -> bool {
    if hint >= len {
        return false;
    }
    let next = hint + 1;
    key(hint).is_some_and(|at| at <= target)
        && (next == len || key(next).is_some_and(|after| after > target))
}

/// [`Search`] run to the end in a plain loop (the host's way).
pub fn search_last_le(
    len: u32,
    target: u64,
    mut key: impl FnMut(u32) -> Option<u64>,
) -> Option<u32> {
    let mut search = Search::new(len, target);
    for _ in 0..MAX_SEARCH_STEPS {
        if !search.probe(&mut key) {
            break;
        }
    }
    search.result()
}

/// [`search_last_le`] with [`Search::probe_branchless`] and at most
/// `probes` probes (the legacy eBPF programs' way).
#[inline(always)]
pub fn search_last_le_branchless(
    len: u32,
    target: u64,
    probes: u32,
    mut key: impl FnMut(u32) -> Option<u64>,
) -> Option<u32> {
    let mut search = Search::new(len, target);
    for _ in 0..probes {
        search.probe_branchless(&mut key);
    }
    search.result()
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::vec::Vec;

    use super::*;

    #[test]
    fn search_of_nothing_finds_nothing() {
        assert_eq!(search_last_le(0, 5, |_| panic!("no element to read")), None);
        let search = Search::new(0, 5);
        assert_eq!(search.result(), None);
    }

    #[test]
    fn search_of_one_element() {
        let keys = [10u64];
        let find = |target| search_last_le(1, target, |i| keys.get(i as usize).copied());
        assert_eq!(find(9), None);
        assert_eq!(find(10), Some(0));
        assert_eq!(find(u64::MAX), Some(0));
    }

    #[test]
    fn search_finds_the_last_of_equal_keys() {
        let keys = [10u64, 20, 20, 20, 30];
        let find =
            |target| search_last_le(keys.len() as u32, target, |i| keys.get(i as usize).copied());
        assert_eq!(find(0), None);
        assert_eq!(find(9), None);
        assert_eq!(find(10), Some(0));
        assert_eq!(find(19), Some(0));
        assert_eq!(find(20), Some(3));
        assert_eq!(find(25), Some(3));
        assert_eq!(find(30), Some(4));
        assert_eq!(find(31), Some(4));
    }

    #[test]
    fn search_matches_a_linear_scan() {
        // Sorted keys with runs of duplicates, every target around them.
        let keys: Vec<u64> = (0..100u64).map(|i| (i / 3) * 7).collect();
        for target in 0..=keys[keys.len() - 1] + 2 {
            let expected = keys.iter().rposition(|&key| key <= target);
            let found =
                search_last_le(keys.len() as u32, target, |i| keys.get(i as usize).copied());
            assert_eq!(found, expected.map(|i| i as u32), "target {target}");
        }
    }

    #[test]
    fn a_hint_holds_exactly_when_it_is_what_the_search_finds() {
        // Sorted keys with runs of duplicates; every hint, every target.
        let keys: Vec<u64> = (0..40u64).map(|i| (i / 3) * 7).collect();
        for len in [0u32, 1, 2, 3, 40] {
            let key = |i: u32| keys[..len as usize].get(i as usize).copied();
            for target in 0..=keys[keys.len() - 1] + 2 {
                let found = search_last_le(len, target, key);
                for hint in 0..len + 2 {
                    assert_eq!(
                        hint_holds(len, target, hint, key),
                        found == Some(hint),
                        "len {len} target {target} hint {hint}"
                    );
                }
            }
        }
        // A key that cannot be read proves nothing.
        assert!(!hint_holds(4, 10, 1, |i| (i != 2).then_some(u64::from(i))));
    }

    #[test]
    fn hint_slots_stay_in_range_and_spread() {
        let mut used = std::collections::HashSet::new();
        for start in [0u32, 4096, 1 << 20] {
            for target in (0x1000u64..0x1000 + 300 * 16).step_by(16) {
                let slot = hint_slot(start, target);
                assert!(slot < ROW_HINT_SLOTS);
                used.insert(slot);
            }
        }
        // 900 searches over 1,024 slots: most get one of their own.
        assert!(used.len() > 500, "{} slots used", used.len());
    }

    #[test]
    fn search_stops_on_an_unreadable_key() {
        let mut search = Search::new(8, 5);
        assert!(!search.probe(|_| None));
        assert_eq!(search.failed, 1);
        assert_eq!(search.result(), None);
        // No further probes once failed.
        assert!(!search.probe(|_| panic!("probed after a failure")));
    }

    #[test]
    fn search_of_u32_max_elements_ends_within_its_step_bound() {
        let mut search = Search::new(u32::MAX, 3_000_000_000);
        let mut probes = 0;
        while search.probe(|i| Some(u64::from(i))) {
            probes += 1;
        }
        assert!(probes <= MAX_SEARCH_STEPS, "{probes} probes");
        assert_eq!(search.result(), Some(3_000_000_000));
        // An unfinished search has no result yet.
        let mut search = Search::new(1000, 10);
        assert!(search.probe(|i| Some(u64::from(i))));
        assert_eq!(search.result(), None);
    }
}
