//! Frames named lately, by what the kernel recorded of them. A hot
//! function's frame comes back in sample after sample with the same
//! recorded code and pc, and naming it again reads the process's memory
//! and builds its lines anew each time; reused for [`REUSE`], a frame
//! costs a lookup and a clone of its shared lines. A name stays a guess
//! for at most that long after the code it names was freed and reused.
use std::{
    collections::HashMap,
    hash::Hash,
    time::{Duration, Instant},
};

/// How long a named frame is reused for the same recorded frame.
pub const REUSE: Duration = Duration::from_millis(500);
/// Named frames kept per process; past it the memo starts over.
pub const MAX_FRAMES: usize = 16384;

/// A runtime's frames of one process named lately, with what else its
/// naming said (`V`), by recorded frame (`K`).
#[derive(Debug)]
pub struct Recent<K, V> {
    named: HashMap<K, (V, Instant)>,
}

impl<K, V> Default for Recent<K, V> {
    fn default() -> Self {
        Recent {
            named: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq, V: Clone> Recent<K, V> {
    /// What `key` was named, if that was less than [`REUSE`] ago.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.named
            .get(key)
            .filter(|(_, at)| at.elapsed() < REUSE)
            .map(|(value, _)| value)
    }

    /// What `key` is named now (starting over past [`MAX_FRAMES`]).
    pub fn insert(&mut self, key: K, value: V) {
        if self.named.len() >= MAX_FRAMES && !self.named.contains_key(&key) {
            self.named.clear();
        }
        self.named.insert(key, (value, Instant::now()));
    }

    /// The named frame of `key`, named by `name` unless it was lately.
    pub fn get_or_name(&mut self, key: K, name: impl FnOnce() -> V) -> V {
        if let Some(value) = self.get(&key) {
            return value.clone();
        }
        let value = name();
        self.insert(key, value.clone());
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_named_once_then_reused_and_the_memo_is_bounded() {
        let mut recent: Recent<u64, String> = Recent::default();
        let mut named = 0;
        for _ in 0..3 {
            let name = recent.get_or_name(7, || {
                named += 1;
                "hot".to_string()
            });
            assert_eq!(name, "hot");
        }
        assert_eq!(named, 1);
        // Stale entries are named again.
        recent.named.get_mut(&7).unwrap().1 -= REUSE;
        recent.get_or_name(7, || {
            named += 1;
            "hot".to_string()
        });
        assert_eq!(named, 2);
        for key in 0..MAX_FRAMES as u64 + 10 {
            recent.insert(key, String::new());
        }
        let held = recent.named.len();
        assert!((1..=MAX_FRAMES).contains(&held), "{held}");
    }
}
