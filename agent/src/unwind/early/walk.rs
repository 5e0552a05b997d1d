//! Walks of stack copies on the host, with the rows the kernel holds (read
//! from its map) and, for the unwind service, the rows of functions it
//! has not loaded yet ([`walk_copy`]'s `fill`).
use std::collections::HashMap;

use hostprof_common::{
    RowChunk, SAMPLE_FLAG_USER_TABLES, SAMPLE_FLAG_USER_TRUNCATED, SAMPLE_UNWIND_SHIFT, Sample,
};
use hostprof_unwind::{
    self as unwind, Lookup, PackedRow, ProcessMappings, ROW_CHUNK, Regs, Step, UnwindRow, cfa,
};

use super::{Mirror, PackedStack, StackCopy};
use crate::unwind::replay::HOST_ARCH;

/// Reads chunk `index` of the kernel's rows map (`None`: unreadable).
pub type ReadChunk<'a> = &'a dyn Fn(u32) -> Option<RowChunk>;

/// `sample` (`copy`'s) with the user stack the kernel's unwinder would have
/// found with the tables now loaded.
pub(super) fn unwound(
    mirror: &Mirror,
    mappings: &ProcessMappings,
    mut sample: Sample,
    copy: &StackCopy,
) -> Sample {
    let read = mirror.chunks.as_deref().map(|read| read as ReadChunk);
    let (frames, reason) = walk_copy(mappings, read, copy, &mut sample.user_stack, &mut |_| None);
    sample.user_stack_len = frames as u32;
    sample.user_stack[frames..].fill(0);
    let truncated = if reason == unwind::reason::DEPTH_LIMIT {
        SAMPLE_FLAG_USER_TRUNCATED
    } else {
        0
    };
    let kept = sample.flags & !(0xff << SAMPLE_UNWIND_SHIFT) & !SAMPLE_FLAG_USER_TRUNCATED;
    sample.flags = kept | SAMPLE_FLAG_USER_TABLES | truncated | (reason << SAMPLE_UNWIND_SHIFT);
    sample
}

/// Walks `copy` over `mappings` and the rows `read` gives, as the kernel
/// would, writing its frames (leaf first) to `frames`; returns how many and
/// why the walk ended. Where the kernel's row for a pc is
/// [`cfa::NOT_LOADED`], `fill(pc)` may give the lookup to go on with
/// (`None`: the walk stops there, as the kernel's does).
pub fn walk_copy(
    mappings: &ProcessMappings,
    read: Option<ReadChunk>,
    copy: &StackCopy,
    frames: &mut [u64],
    fill: &mut dyn FnMut(u64) -> Option<Lookup>,
) -> (usize, u32) {
    let [pc, sp, fp, lr] = copy.regs;
    let mut regs = Regs::interrupted(pc, sp, fp, lr);
    let mut process = CopyProcess {
        rows: std::cell::RefCell::new(RowCache {
            read,
            chunks: HashMap::new(),
        }),
        mappings,
        stack: &copy.stack,
        fill,
        mark: 0,
    };
    let Some(first) = frames.first_mut() else {
        return (0, unwind::reason::DEPTH_LIMIT);
    };
    *first = regs.pc;
    let mut len = 1;
    let reason = loop {
        match unwind::step(HOST_ARCH, &mut regs, &mut process) {
            Step::Caller if len >= frames.len() => break unwind::reason::DEPTH_LIMIT,
            Step::Caller => {
                // The frame left takes its mapping's mark, as in the kernel.
                frames[len - 1] |= u64::from(process.mark & 7) << unwind::STACK_MARK_SHIFT;
                frames[len] = regs.pc;
                len += 1;
            }
            Step::Stop(reason) => break reason,
            // Runtime frames are walked in the kernel only.
            Step::Runtime(_) => break unwind::reason::NO_TABLE,
        }
    };
    (len, reason)
}

/// A stack copy and the kernel's tables, as `hostprof_unwind` sees a
/// process.
struct CopyProcess<'a, 'f> {
    rows: std::cell::RefCell<RowCache<'a>>,
    mappings: &'a ProcessMappings,
    stack: &'a PackedStack,
    fill: &'f mut dyn FnMut(u64) -> Option<Lookup>,
    /// The mark of the mapping the last lookup found.
    mark: u32,
}

/// The rows chunks one unwind read, each read once (a map lookup of 4 KiB;
/// a binary search reads a dozen rows a frame, mostly in a few chunks).
struct RowCache<'a> {
    read: Option<ReadChunk<'a>>,
    chunks: HashMap<u32, Option<Box<RowChunk>>>,
}

impl RowCache<'_> {
    /// Word `index` of the rows map.
    fn word(&mut self, index: u32) -> Option<u64> {
        let chunk = index / ROW_CHUNK as u32;
        let read = self.read;
        let words = self
            .chunks
            .entry(chunk)
            .or_insert_with(|| read.and_then(|read| read(chunk)).map(Box::new));
        words
            .as_ref()
            .map(|words| words.0[index as usize % ROW_CHUNK])
    }

    /// Row `found` of the table of `len` rows at word `start`.
    fn row(&mut self, start: u32, len: u32, found: u32) -> Option<UnwindRow> {
        let word = self.word(start.wrapping_add(found))?;
        let rule = |at: u32| Some([self.word(at)?, self.word(at.wrapping_add(1))?]);
        unwind::packed_row(start, len, found, |_| Some(word), rule)
    }
}

impl unwind::Process for CopyProcess<'_, '_> {
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        self.stack.read_u64(address)
    }

    fn lookup(&mut self, pc: u64) -> Lookup {
        let mappings = self.mappings;
        let rows = &self.rows;
        let search = |what, len, target| {
            unwind::search_last_le(len, target, |i| match what {
                unwind::Sorted::Mappings => mappings.mappings.get(i as usize).map(|m| m.start),
                unwind::Sorted::Rows { start } => rows
                    .borrow_mut()
                    .word(start.wrapping_add(i))
                    .map(|word| u64::from(PackedRow::from_word(word).pc)),
            })
        };
        let mut mark = 0;
        let found = unwind::lookup_marked(
            mappings,
            pc,
            search,
            |start, len, found| rows.borrow_mut().row(start, len, found),
            |found| mark = found,
        );
        self.mark = mark;
        match found {
            Lookup::Row(row) if row.cfa_rule == cfa::NOT_LOADED => (self.fill)(pc).unwrap_or(found),
            found => found,
        }
    }
}
