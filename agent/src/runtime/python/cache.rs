//! The code objects read from Python processes, kept by (pid, address)
//! within a budget of bytes.
use std::{collections::HashMap, sync::Arc};

use super::code::Code;

/// Bytes of code objects kept (names, files, decoded lines). A busy
/// service touches a few thousand code objects of a few hundred bytes.
pub const MAX_CODE_CACHE_BYTES: usize = 32 << 20;

/// What one entry costs besides its code object: key, fingerprint and the
/// map's own slot, about.
const ENTRY_BYTES: usize = 64;

/// A code object (`None`: not one, or refused) and the fingerprint it was
/// read under.
type Entry = (Option<Arc<Code>>, [u8; 8]);

/// (pid, address) -> the code object there, within [`MAX_CODE_CACHE_BYTES`].
///
/// Full, it starts over rather than evicting the least recently used: the
/// objects still in use come back at one read each in the next samples,
/// and a hit (every frame of every sample) stays a plain map lookup with
/// no recency to update. A process making code objects without end makes
/// the cache start over often, which costs reads, never memory.
#[derive(Debug)]
pub struct CodeCache {
    entries: HashMap<(u32, u64), Entry>,
    bytes: usize,
    budget: usize,
}

impl Default for CodeCache {
    fn default() -> Self {
        CodeCache::with_budget(MAX_CODE_CACHE_BYTES)
    }
}

impl CodeCache {
    pub fn with_budget(budget: usize) -> Self {
        CodeCache {
            entries: HashMap::new(),
            bytes: 0,
            budget,
        }
    }

    /// What is cached at `address` of `pid` under `fingerprint`; `None`
    /// when nothing is, or another object was there when it was read.
    pub fn get(&self, pid: u32, address: u64, fingerprint: [u8; 8]) -> Option<Option<Arc<Code>>> {
        match self.entries.get(&(pid, address)) {
            Some((code, seen)) if *seen == fingerprint => Some(code.clone()),
            _ => None,
        }
    }

    /// Keeps `code` for `address` of `pid`, starting over when it would not
    /// fit the budget.
    pub fn insert(
        &mut self,
        pid: u32,
        address: u64,
        fingerprint: [u8; 8],
        code: Option<Arc<Code>>,
    ) {
        let added = cost(&code);
        if let Some(old) = self.entries.remove(&(pid, address)) {
            self.bytes -= cost(&old.0);
        }
        if self.bytes + added > self.budget {
            self.entries.clear();
            self.bytes = 0;
        }
        self.bytes += added;
        self.entries.insert((pid, address), (code, fingerprint));
    }

    /// Forgets the code objects of `pid`.
    pub fn forget(&mut self, pid: u32) {
        let bytes = &mut self.bytes;
        self.entries.retain(|&(owner, _), (code, _)| {
            let keep = owner != pid;
            if !keep {
                *bytes -= cost(code);
            }
            keep
        });
    }
}

fn cost(code: &Option<Arc<Code>>) -> usize {
    ENTRY_BYTES + code.as_ref().map_or(0, |code| code.bytes())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{CodeCache, ENTRY_BYTES};
    use crate::runtime::python::{code::Code, lines::Lines};

    fn code(name_bytes: usize) -> Option<Arc<Code>> {
        Some(Arc::new(Code {
            qualname: "q".repeat(name_bytes).into(),
            filename: "f.py".into(),
            first_line: 1,
            lines: Lines::decode(&[0x80, 0], 1),
        }))
    }

    #[test]
    fn byte_budget_evicts_and_counts() {
        let one = code(1000);
        let cost = ENTRY_BYTES + one.as_ref().unwrap().bytes();
        // Room for three entries of this size.
        let mut cache = CodeCache::with_budget(cost * 3 + cost / 2);
        for address in 0..3 {
            cache.insert(1, address, [0; 8], one.clone());
        }
        assert_eq!((cache.entries.len(), cache.bytes), (3, cost * 3));
        assert!(cache.get(1, 0, [0; 8]).is_some());
        assert!(cache.get(1, 0, [1; 8]).is_none(), "another fingerprint");
        // Replacing an entry does not count it twice.
        cache.insert(1, 2, [2; 8], one.clone());
        assert_eq!(cache.bytes, cost * 3);
        // The fourth does not fit: the cache starts over with it.
        cache.insert(2, 0, [0; 8], one.clone());
        assert_eq!((cache.entries.len(), cache.bytes), (1, cost));
        assert!(cache.get(1, 0, [0; 8]).is_none());
        cache.insert(1, 5, [0; 8], None);
        cache.forget(2);
        assert_eq!((cache.entries.len(), cache.bytes), (1, ENTRY_BYTES));
    }
}
