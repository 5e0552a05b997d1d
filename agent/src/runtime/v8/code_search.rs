//! The code a compiled frame runs when it is not its function's current
//! code: V8 entered it by on-stack replacement (a loop that got hot in one
//! long call runs optimized code the function itself does not point at),
//! or replaced the function's code since. Nothing a reader can follow from
//! the frame leads to that code, so it is found from the pc: looking back
//! from it, at each address instructions can start at, for the object
//! that holds them — V8 10's `Code` (its instructions inline), or V8 11's
//! and later's `InstructionStream`, whose word after its map points back
//! at its `Code` — which counts only if that `Code` says its instructions
//! start there and hold the pc. What is found is kept by its instructions'
//! range, so one search serves every sample in that code.
use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    Node,
    compiled::Compiled,
    layout::CodeStart,
    names::{Heap, heap_object},
};
use crate::procs::memory::Memory;

/// How far back from a pc its code's start is looked for: V8's regular
/// pages are 256 KiB, and code is not larger than a page (larger objects
/// get pages of their own, and are not searched).
const SEARCH_BYTES: u64 = 256 << 10;
/// Read at once while looking back: a page, mapped or not as a whole.
const PAGE_BYTES: u64 = 4096;
/// Instructions start at multiples of this (V8's code alignment is 32 or
/// 64 bytes on 64-bit machines).
const CODE_ALIGNMENT: u64 = 32;
/// Code ranges kept per process; past it the record starts over.
const MAX_FOUND: usize = 4096;
/// Searches per process per [`SEARCH_WINDOW`] at most: each may read 256
/// KiB of the process's memory, and a process that fakes frames could ask
/// for one per frame of every sample. V8 makes a few such code objects a
/// second at most, and one search serves all of a code object's pcs.
const MAX_SEARCHES: u32 = 64;
const SEARCH_WINDOW: Duration = Duration::from_secs(1);

/// Code found from pcs in it, by where its instructions start: where they
/// end and the `Code` object's address.
#[derive(Debug, Default)]
pub struct FoundCode {
    ranges: BTreeMap<u64, (u64, u64)>,
    /// The map of the objects found so far (all alike): candidates with
    /// another are passed over unread.
    header_map: Option<u64>,
    /// Searches in the window that started at `window`.
    searches: u32,
    window: Option<Instant>,
}

impl FoundCode {
    /// Whether a search may run at `now` (counted if so).
    fn take_search(&mut self, now: Instant) -> bool {
        let fresh = self
            .window
            .is_none_or(|start| now.saturating_duration_since(start) >= SEARCH_WINDOW);
        if fresh {
            self.window = Some(now);
            self.searches = 0;
        }
        self.searches < MAX_SEARCHES && {
            self.searches += 1;
            true
        }
    }
}

impl Node {
    /// The code whose instructions hold `at` (the pc, or the call before a
    /// return address), found from it; `None` when no object checks out.
    pub(super) fn code_holding(&mut self, memory: &impl Memory, at: u64) -> Option<Arc<Compiled>> {
        let known = self.found.ranges.range(..=at).next_back();
        if let Some((start, code)) = known
            .filter(|(_, (end, _))| at < *end)
            .map(|(&start, &(_, code))| (start, code))
        {
            // Checked again as any code is (the collector frees and moves
            // code): looked for anew when it no longer holds `at`.
            match self.code(memory, code) {
                Ok(compiled) if compiled.holds(at) => return Some(compiled),
                _ => {
                    self.found.ranges.remove(&start);
                }
            }
        }
        if !self.found.take_search(Instant::now()) {
            return None;
        }
        let code = self.search_code(memory, at)?;
        let compiled = self.code(memory, code).ok().filter(|c| c.holds(at))?;
        if self.found.ranges.len() >= MAX_FOUND {
            self.found.ranges.clear();
        }
        let (start, end) = compiled.range();
        self.found.ranges.insert(start, (end, code));
        Some(compiled)
    }

    /// The `Code` whose instructions hold `at`, by looking back from it.
    fn search_code(&mut self, memory: &impl Memory, at: u64) -> Option<u64> {
        let layout = self.layout.code.as_ref()?;
        let type_code = self.layout.type_code?;
        // How far into the object holding them instructions start, and
        // where a `Code` says they start (`None`: in itself, V8 10).
        let (header, start_field) = match layout.start {
            CodeStart::Inline(header) => (header, None),
            CodeStart::Field(field) => (layout.stream?, Some(field)),
        };
        let heap = Heap {
            memory,
            layout: &self.layout,
        };
        let checks_out = |object: u64, start: u64| -> Option<u64> {
            let code = match start_field {
                None => object,
                Some(field) => {
                    let code = heap_object(heap.word(object.checked_add(8)?)?)?;
                    (heap.word(code.checked_add(field)?)? == start).then_some(code)?
                }
            };
            if heap.instance_type(code)? != type_code {
                return None;
            }
            let size = memory.read_u32(code.checked_add(layout.size)?)?;
            (at - start < u64::from(size)).then_some(code)
        };
        // Candidate starts, highest first, a page of their objects' headers
        // read at a time (an object is 8-aligned: its map is in the page);
        // an unmapped page ends the search.
        let mut start = at & !(CODE_ALIGNMENT - 1);
        let lowest = at.saturating_sub(SEARCH_BYTES);
        let mut page = None;
        while start >= lowest.max(header) {
            let object = start - header;
            let base = object & !(PAGE_BYTES - 1);
            if page.as_ref().is_none_or(|(at, _)| *at != base) {
                page = Some((base, memory.read_vec(base, PAGE_BYTES as usize)?));
            }
            let bytes = &page.as_ref()?.1;
            let offset = (object - base) as usize;
            let map = u64::from_le_bytes(bytes.get(offset..offset + 8)?.try_into().ok()?);
            let plausible = heap_object(map).is_some()
                && self.found.header_map.is_none_or(|known| known == map);
            if plausible && let Some(code) = checks_out(object, start) {
                self.found.header_map = Some(map);
                return Some(code);
            }
            start = start.checked_sub(CODE_ALIGNMENT)?;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn searches_are_capped_per_process_and_window() {
        let mut found = FoundCode::default();
        let start = Instant::now();
        for _ in 0..MAX_SEARCHES {
            assert!(found.take_search(start));
        }
        assert!(!found.take_search(start));
        assert!(!found.take_search(start + SEARCH_WINDOW / 2));
        // A new window, a new allowance.
        assert!(found.take_search(start + SEARCH_WINDOW));
    }
}
