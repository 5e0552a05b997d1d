//! A least-recently-used map bounded by the estimated size of its values,
//! whose entries unused for a while can also be let go.
use std::{
    collections::{BTreeMap, HashMap},
    hash::Hash,
};

/// LRU map whose entries each weigh some bytes; inserting past the budget
/// evicts the least recently used entries.
pub struct SizedLru<K, V> {
    entries: HashMap<K, Entry<V>>,
    /// Use tick → key, oldest first.
    order: BTreeMap<u64, K>,
    tick: u64,
    used: usize,
    budget: usize,
}

struct Entry<V> {
    value: V,
    weight: usize,
    tick: u64,
    /// Used since the last [`SizedLru::release_unused`].
    used: bool,
}

impl<K: Hash + Eq + Clone, V: Clone> SizedLru<K, V> {
    pub fn new(budget: usize) -> Self {
        SizedLru {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            used: 0,
            budget,
        }
    }

    /// The value for `key`, marking it as recently used unless it is among
    /// the newer half already: eviction takes from the older end and
    /// reaches such an entry only after half the entries went. The hot
    /// entries (the same return addresses, sample after sample) then cost
    /// no B-tree removal and insertion per lookup, which had been about a
    /// quarter of the symbolizer's time per frame.
    pub fn get(&mut self, key: &K) -> Option<V> {
        let half = (self.entries.len() as u64).div_ceil(2);
        let entry = self.entries.get_mut(key)?;
        entry.used = true;
        // Entries used or inserted after this one, at most.
        let newer = self.tick - entry.tick;
        if newer >= half {
            self.tick += 1;
            if let Some(key) = self.order.remove(&entry.tick) {
                self.order.insert(self.tick, key);
            }
            entry.tick = self.tick;
        }
        Some(entry.value.clone())
    }

    /// Inserts or replaces `key`, then evicts old entries until the budget
    /// holds. An entry heavier than the whole budget is not kept.
    pub fn insert(&mut self, key: K, value: V, weight: usize) {
        self.remove(&key);
        if weight > self.budget {
            return;
        }
        self.tick += 1;
        self.order.insert(self.tick, key.clone());
        self.entries.insert(
            key,
            Entry {
                value,
                weight,
                tick: self.tick,
                used: true,
            },
        );
        self.used += weight;
        while self.used > self.budget {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(entry) = self.entries.remove(&oldest) {
                self.used -= entry.weight;
            }
        }
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        let entry = self.entries.remove(key)?;
        self.order.remove(&entry.tick);
        self.used -= entry.weight;
        Some(entry.value)
    }

    /// Removes the entries not used since the last call (a second chance,
    /// as a clock: an entry goes one to two calls after its last use, and
    /// a hot entry costs a flag's write, not a clock read); returns how
    /// many went.
    pub fn release_unused(&mut self) -> usize {
        let unused: Vec<u64> = self
            .entries
            .values_mut()
            .filter_map(|entry| {
                let unused = !entry.used;
                entry.used = false;
                unused.then_some(entry.tick)
            })
            .collect();
        for tick in &unused {
            if let Some(key) = self.order.remove(tick) {
                self.remove(&key);
            }
        }
        unused.len()
    }

    /// Estimated bytes held.
    pub fn used(&self) -> usize {
        self.used
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_by_weight() {
        let mut lru = SizedLru::new(100);
        lru.insert("a", 1, 40);
        lru.insert("b", 2, 40);
        assert_eq!(lru.get(&"a"), Some(1));
        // c needs 40: b is the least recently used, so b goes.
        lru.insert("c", 3, 40);
        assert_eq!(lru.get(&"b"), None);
        assert_eq!(lru.get(&"a"), Some(1));
        assert_eq!(lru.get(&"c"), Some(3));
        assert_eq!(lru.used(), 80);
        // Too heavy to ever fit: refused, nothing else evicted.
        lru.insert("huge", 4, 1000);
        assert_eq!(lru.len(), 2);
        // Replacing re-weighs.
        lru.insert("a", 5, 10);
        assert_eq!(lru.used(), 50);
        assert_eq!(lru.remove(&"c"), Some(3));
        assert_eq!(lru.used(), 10);
    }

    #[test]
    fn entries_unused_for_a_whole_period_are_released() {
        let mut lru = SizedLru::new(100);
        lru.insert("kept", 1, 10);
        lru.insert("idle", 2, 20);
        // Both were used (inserted) in this period.
        assert_eq!(lru.release_unused(), 0);
        assert_eq!(lru.get(&"kept"), Some(1));
        assert_eq!(lru.release_unused(), 1);
        assert_eq!(lru.get(&"idle"), None);
        assert_eq!(lru.used(), 10);
        // Used in every period: stays; then idle for one: goes.
        assert_eq!(lru.get(&"kept"), Some(1));
        assert_eq!(lru.release_unused(), 0);
        assert_eq!(lru.release_unused(), 1);
        assert_eq!((lru.len(), lru.used()), (0, 0));
        // What went leaves room as the budget counts it.
        lru.insert("new", 3, 100);
        assert_eq!(lru.get(&"new"), Some(3));
    }
}
