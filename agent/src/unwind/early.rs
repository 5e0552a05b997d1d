//! Complete stacks for the first samples of a process: those taken before
//! its unwind tables reached the kernel.
//!
//! Such a sample comes with a copy of the top of its user stack (the
//! registers and up to `early_copy_bytes` from sp up, what `--stack-copy`
//! captures). [`EarlyStacks`] holds it until the unwind service has loaded
//! the process's tables, then walks it with `hostprof_unwind::step` over
//! [`Mirror`], a host copy of exactly what the loader wrote to the kernel:
//! the same unwinder core on the same rows, so the stack is the one the
//! kernel would have found.
//!
//! The copied bytes are user memory of the profiled process. They live only
//! here, in a queue bounded in bytes ([`MAX_HELD_BYTES`]), until the sample
//! is unwound, sent on with its frame-pointer stack after [`MAX_WAIT`], or
//! dropped because the queue is full (each counted); the bytes are then
//! freed. Nothing of them reaches a sample, an output file or an export:
//! only the return addresses the unwinder finds do.
//!
//! On a busy host with many new binaries, tables take seconds to arrive
//! and every CPU sample meanwhile has a copy: thousands. So a held sample
//! keeps only what it needs: its record without its frame-pointer frames
//! (which the walk replaces), and its stack in 512-byte blocks shared with
//! the thread's previous copy where the bytes are the same (the callers'
//! frames of a thread busy in one place do not change between samples):
//! about 1 KiB a sample instead of 11.
use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, RwLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use hostprof_common::{RowChunk, SAMPLE_UNWIND_SHIFT, Sample};
use hostprof_unwind::{self as unwind, ProcessMappings};

use super::{TableMaps, UnwindError};
use crate::sampler::EarlyCopy;

/// Bytes the held samples and their stack copies take at most; a copy
/// past it is dropped (counted). About 16,000 samples of threads busy in
/// one place: eight seconds of a 2-CPU host sampled at 999 Hz.
pub const MAX_HELD_BYTES: usize = 16 << 20;

/// Copies on their way here from the ring's reader (each up to
/// [`crate::sampler::EARLY_COPY_BYTES`] of stack and a few words, 8 KiB,
/// at most 16 MiB): about a second of copies at full rate, taken in at
/// every batch. (At 1,024 copies of 13 KiB, each with its whole sample,
/// a busy host's attribution thread let half of them drop.)
pub const MAX_QUEUED: usize = 2048;

/// How long a sample waits for its process's tables before it goes on with
/// its frame-pointer stack. On a saturated host with dozens of new
/// binaries the last tables come seconds after their first sample (the
/// bench's scale row: 16 distinct binaries, a cold cache, tables in after
/// 4 to 10 s); a wait shorter than that loses those stacks.
pub const MAX_WAIT: Duration = Duration::from_secs(15);

/// Bytes of a stack block, the unit shared between a thread's copies.
const BLOCK: u64 = 512;

/// Threads whose last copy is remembered for sharing, at most.
const MAX_THREADS: usize = 4096;

/// Copies kept for a sample that has not come (yet), at most.
const MAX_PENDING: usize = 4096;

/// How long a copy waits for its sample. The reader sends copies as it
/// drains the ring, their samples after, in a batch that may wait while
/// attribution is behind (up to the reader's 4,096 samples, about two
/// seconds of a busy 2-CPU host): the attribution thread can take in a
/// copy several batches before its sample.
const PENDING_WAIT: Duration = Duration::from_secs(5);

/// Asks for the function at `pc` in a process (`tgid, pc`), where the walk
/// of a held copy stopped; the copy goes along so that the functions its
/// callers need come with it.
pub type WantFunction = dyn Fn(u32, u64, &StackCopy) + Send;

/// Reads chunk `index` of the kernel's rows map (`None`: unreadable).
pub type ChunkReader = Box<dyn Fn(u32) -> Option<RowChunk> + Send + Sync>;

/// What the kernel's unwind maps hold, as the host sees it: the processes'
/// mappings (8 KiB each) copied, the rows read from the kernel's map when
/// a held sample is unwound. A host copy of the rows was as large as the
/// tables: 30 MiB of the 81 MiB a 40-binary `record -p` peaked at.
#[derive(Default)]
pub struct Mirror {
    chunks: Option<ChunkReader>,
    processes: HashMap<u32, ProcessMappings>,
    /// Raised at every write of a process's mappings: a held sample that
    /// reached an unmapped address is walked again only after one.
    writes: HashMap<u32, u64>,
    next_write: u64,
}

impl Mirror {
    /// Takes in what the loader wrote for `tgid`.
    fn set(&mut self, tgid: u32, mappings: &ProcessMappings) {
        self.processes.insert(tgid, *mappings);
        self.next_write += 1;
        self.writes.insert(tgid, self.next_write);
    }

    fn remove(&mut self, tgid: u32) {
        self.processes.remove(&tgid);
        self.writes.remove(&tgid);
    }

    /// The last write of `tgid`'s mappings.
    fn written(&self, tgid: u32) -> u64 {
        self.writes.get(&tgid).copied().unwrap_or(0)
    }

    /// A mirror whose rows are read with `chunks`.
    pub fn reading(chunks: ChunkReader) -> SharedMirror {
        Arc::new(RwLock::new(Mirror {
            chunks: Some(chunks),
            ..Mirror::default()
        }))
    }
}

/// The mirror, shared by the unwind service (writer) and attribution. The
/// writer holds it while it writes the kernel's maps, so a reader holding
/// it sees rows that do not change under it.
pub type SharedMirror = Arc<RwLock<Mirror>>;

/// Kernel maps that also keep the host's [`Mirror`] up to date.
pub struct Mirrored<M> {
    pub inner: M,
    pub mirror: SharedMirror,
}

impl<M: TableMaps> TableMaps for Mirrored<M> {
    fn write_chunk(&mut self, index: u32, chunk: &RowChunk) -> Result<(), UnwindError> {
        // Not while a held sample is unwound with the rows it reads.
        let _mirror = self.mirror.write().unwrap_or_else(|e| e.into_inner());
        self.inner.write_chunk(index, chunk)
    }

    fn set_process(&mut self, tgid: u32, mappings: &ProcessMappings) -> Result<(), UnwindError> {
        self.inner.set_process(tgid, mappings)?;
        let mut mirror = self.mirror.write().unwrap_or_else(|e| e.into_inner());
        mirror.set(tgid, mappings);
        Ok(())
    }

    fn remove_process(&mut self, tgid: u32) -> Result<(), UnwindError> {
        let mut mirror = self.mirror.write().unwrap_or_else(|e| e.into_inner());
        mirror.remove(tgid);
        drop(mirror);
        self.inner.remove_process(tgid)
    }

    fn process(&self, tgid: u32) -> Option<ProcessMappings> {
        self.inner.process(tgid)
    }

    fn read_chunk(&self, index: u32) -> Option<RowChunk> {
        self.inner.read_chunk(index)
    }

    fn process_capacity(&self) -> usize {
        self.inner.process_capacity()
    }
}

/// Counts, for status lines and the recording's summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EarlyStats {
    /// Samples unwound on the host once their tables were loaded.
    pub unwound: u64,
    /// Of those, the stacks walked to their end (reason `COMPLETE`).
    pub complete: u64,
    /// Samples sent on with their frame-pointer stack: tables not loaded
    /// within [`MAX_WAIT`] (or the run ended first).
    pub timed_out: u64,
    /// Copies dropped because [`MAX_HELD_BYTES`] were held already.
    pub dropped: u64,
    /// Copies whose sample never came within [`PENDING_WAIT`] (lost on
    /// its way, or the run ended first).
    pub orphaned: u64,
}

/// A stack block: bytes of one thread's stack at `start`, shared by the
/// copies that found them unchanged. Counted in its meter while it lives.
struct Block {
    start: u64,
    bytes: Box<[u8]>,
    meter: Arc<AtomicUsize>,
}

impl Drop for Block {
    fn drop(&mut self) {
        self.meter
            .fetch_sub(block_cost(self.bytes.len()), Ordering::Relaxed);
    }
}

/// What a block costs: its bytes and its header.
fn block_cost(len: usize) -> usize {
    len + size_of::<Block>() + 2 * size_of::<usize>()
}

/// A copy of a stack from `sp` up, in blocks cut at multiples of
/// [`BLOCK`] (the first one starts at `sp`).
#[derive(Clone, Default)]
struct PackedStack {
    sp: u64,
    len: u64,
    blocks: Vec<Arc<Block>>,
}

impl PackedStack {
    /// `stack` (copied from `sp` up), sharing the blocks of `previous`
    /// that hold the same bytes at the same addresses.
    fn pack(
        sp: u64,
        stack: &[u8],
        previous: Option<&PackedStack>,
        meter: &Arc<AtomicUsize>,
    ) -> Self {
        let mut blocks = Vec::with_capacity(stack.len() / BLOCK as usize + 2);
        let mut at = 0usize;
        while at < stack.len() {
            let start = sp.wrapping_add(at as u64);
            let room = (BLOCK - start % BLOCK) as usize;
            let bytes = &stack[at..stack.len().min(at + room)];
            let shared = previous
                .and_then(|previous| previous.block_at(start))
                .filter(|block| block.start == start && *block.bytes == *bytes);
            blocks.push(match shared {
                Some(block) => block.clone(),
                None => {
                    meter.fetch_add(block_cost(bytes.len()), Ordering::Relaxed);
                    Arc::new(Block {
                        start,
                        bytes: bytes.into(),
                        meter: meter.clone(),
                    })
                }
            });
            at += bytes.len();
        }
        PackedStack {
            sp,
            len: stack.len() as u64,
            blocks,
        }
    }

    /// The block holding `address`.
    fn block_at(&self, address: u64) -> Option<&Arc<Block>> {
        let offset = address.checked_sub(self.sp).filter(|&at| at < self.len)?;
        let index = (self.sp % BLOCK + offset) / BLOCK;
        self.blocks.get(usize::try_from(index).ok()?)
    }

    fn read_u64(&self, address: u64) -> Option<u64> {
        let mut word = [0u8; 8];
        for (i, byte) in word.iter_mut().enumerate() {
            let at = address.checked_add(i as u64)?;
            let block = self.block_at(at)?;
            *byte = *block.bytes.get(usize::try_from(at - block.start).ok()?)?;
        }
        Some(u64::from_le_bytes(word))
    }
}

/// The registers and stack of a sample, as held: what a walk on the host
/// needs (the unwind service walks one to find every function its stack
/// needs at once, see `loader::sparse`). Cheap to clone: the blocks are
/// shared.
#[derive(Clone)]
pub struct StackCopy {
    /// pc, sp, frame pointer, link register.
    regs: [u64; 4],
    stack: PackedStack,
}

impl StackCopy {
    /// `stack`, copied from `regs`' sp up (counted nowhere: for tests and
    /// replays, not held samples).
    pub fn new(regs: [u64; 4], stack: &[u8]) -> Self {
        StackCopy {
            regs,
            stack: PackedStack::pack(regs[1], stack, None, &Arc::default()),
        }
    }

    pub fn pc(&self) -> u64 {
        self.regs[0]
    }
}

impl std::fmt::Debug for StackCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackCopy")
            .field("regs", &self.regs)
            .field("len", &self.stack.len)
            .finish()
    }
}

impl Eq for StackCopy {}

impl PartialEq for StackCopy {
    fn eq(&self, other: &Self) -> bool {
        let bytes = |copy: &StackCopy| -> Vec<u8> {
            copy.stack
                .blocks
                .iter()
                .flat_map(|block| block.bytes.iter().copied())
                .collect()
        };
        self.regs == other.regs && self.stack.sp == other.stack.sp && bytes(self) == bytes(other)
    }
}

/// A copy whose sample has not been attributed yet.
struct Pending {
    copy: StackCopy,
    since: Instant,
}

struct Held {
    /// The sample as a compact ring record (`crate::sampler::decode_sample`
    /// reads it back), its frame-pointer user frames kept for when the
    /// tables never come.
    record: Box<[u8]>,
    copy: StackCopy,
    since: Instant,
    /// For a sample whose kernel walk reached an unmapped address: the
    /// write of its process's mappings it was last walked again with.
    tried: Option<u64>,
}

impl Held {
    fn cost(&self) -> usize {
        size_of::<Held>() + self.record.len() + self.copy.stack.blocks.len() * size_of::<usize>()
    }
}

/// `sample` as a compact ring record, as the kernel writes them: its
/// header, kernel then user frames, runtime frames, and the thread
/// context's attributes and link if it has them. A few hundred bytes where a `Sample` is 3 KiB.
fn pack_sample(sample: &Sample) -> Box<[u8]> {
    crate::sampler::encode_sample(sample).into_boxed_slice()
}

/// Samples waiting for their process's tables, with their stack copies.
pub struct EarlyStacks {
    mirror: SharedMirror,
    /// Copies that arrived before their sample was attributed, by (tid,
    /// kernel time).
    pending: HashMap<(u32, u64), Pending>,
    held: VecDeque<Held>,
    /// Each thread's last copy, whose unchanged blocks the next one shares.
    last: HashMap<u32, PackedStack>,
    /// Bytes of the live stack blocks.
    meter: Arc<AtomicUsize>,
    /// Bytes of the held samples themselves.
    held_bytes: usize,
    /// Asks for the function a walk stopped at (a table built for the code
    /// that runs, `reason::NOT_LOADED`): its sample waits for it.
    want_function: Option<Box<WantFunction>>,
    stats: EarlyStats,
}

impl EarlyStacks {
    pub fn new(mirror: SharedMirror) -> Self {
        EarlyStacks {
            mirror,
            pending: HashMap::new(),
            held: VecDeque::new(),
            last: HashMap::new(),
            meter: Arc::default(),
            held_bytes: 0,
            want_function: None,
            stats: EarlyStats::default(),
        }
    }

    /// Walks that stop for want of a function's rows ask for them with
    /// `want(pid, pc)` and wait, like those that reached an unmapped
    /// address (until [`MAX_WAIT`]).
    pub fn wanting_functions(mut self, want: Box<WantFunction>) -> Self {
        self.want_function = Some(want);
        self
    }

    pub fn stats(&self) -> EarlyStats {
        self.stats
    }

    /// Bytes held now: samples, stack blocks and the copies waiting for
    /// their sample.
    pub fn bytes(&self) -> usize {
        self.meter.load(Ordering::Relaxed) + self.held_bytes
    }

    /// Takes in the copy of a sample that is still to come.
    pub fn add_copy(&mut self, copy: EarlyCopy) {
        let Some(regs) = copy.regs else {
            return;
        };
        if copy.stack.is_empty() {
            return;
        }
        if self.bytes() >= MAX_HELD_BYTES || self.pending.len() >= MAX_PENDING {
            self.stats.dropped += 1;
            return;
        }
        let tid = copy.tid;
        let stack = PackedStack::pack(regs[1], &copy.stack, self.last.get(&tid), &self.meter);
        if self.last.len() >= MAX_THREADS && !self.last.contains_key(&tid) {
            self.last.clear();
        }
        self.last.insert(tid, stack.clone());
        self.pending.insert(
            (tid, copy.ktime_ns),
            Pending {
                copy: StackCopy { regs, stack },
                since: Instant::now(),
            },
        );
    }

    /// Holds `sample` when it has a copy (returns true): it comes back from
    /// [`EarlyStacks::ready`].
    pub fn hold(&mut self, sample: &Sample) -> bool {
        let Some(Pending { copy, .. }) = self.pending.remove(&(sample.tid, sample.ktime_ns)) else {
            return false;
        };
        let held = Held {
            record: pack_sample(sample),
            copy,
            since: Instant::now(),
            tried: None,
        };
        self.held_bytes += held.cost();
        self.held.push_back(held);
        true
    }

    /// Samples whose tables are loaded now, with their user stacks walked
    /// on the host, and those that waited too long (all of them when
    /// `flush`), as they were; their copies are freed.
    pub fn ready(&mut self, flush: bool) -> Vec<Sample> {
        // Copies whose sample never came go too. Not every copy taken in
        // so far: the samples of some may be in batches still to come.
        let before = self.pending.len();
        self.pending
            .retain(|_, pending| !flush && pending.since.elapsed() < PENDING_WAIT);
        self.stats.orphaned += (before - self.pending.len()) as u64;
        let mut out = Vec::new();
        let mirror = self.mirror.read().unwrap_or_else(|e| e.into_inner());
        let mut waiting = VecDeque::with_capacity(self.held.len());
        for mut held in self.held.drain(..) {
            // Mappings loaded for an earlier image of the pid (the kernel
            // forgot them at the exec, the mirror may not have yet) do not
            // hold the sample's pc: wait for the new ones. Only a sample
            // that leaves is decoded (4 KiB): this runs at every batch over
            // every held sample, thousands while a busy host's tables come.
            let tgid = record_tgid(&held.record);
            let current = mirror
                .processes
                .get(&tgid)
                .filter(|mappings| maps_pc(mappings, held.copy.pc()));
            let timed_out = flush || held.since.elapsed() >= MAX_WAIT;
            // A walk that reached an unmapped address, or a function not
            // loaded yet, is tried again after each write of the process's
            // mappings, until one gets past it.
            let unmapped = record_reason(&held.record) == unwind::reason::NO_MAPPING;
            let written = mirror.written(tgid);
            let nothing_new = held.tried == Some(written);
            if (current.is_none() || nothing_new) && !timed_out {
                waiting.push_back(held);
                continue;
            }
            let Some(sample) = crate::sampler::decode_sample(&held.record) else {
                self.held_bytes -= held.cost();
                self.stats.dropped += 1;
                continue;
            };
            let sample = match current {
                Some(mappings) => walk::unwound(&mirror, mappings, sample, &held.copy),
                None => {
                    self.held_bytes -= held.cost();
                    self.stats.timed_out += 1;
                    // Its frame-pointer stack, as the kernel found it.
                    out.push(sample);
                    continue;
                }
            };
            let why = (sample.flags >> SAMPLE_UNWIND_SHIFT) & 0xff;
            let function = crate::sampler::function_wanted(&sample);
            let retry = (unmapped && why == unwind::reason::NO_MAPPING)
                || (function.is_some() && self.want_function.is_some());
            if retry && !timed_out {
                if let (Some(want), Some(pc)) = (&self.want_function, function) {
                    want(tgid, pc, &held.copy);
                }
                held.tried = Some(written);
                waiting.push_back(held);
                continue;
            }
            self.held_bytes -= held.cost();
            self.stats.unwound += 1;
            if why == unwind::reason::COMPLETE {
                self.stats.complete += 1;
            }
            out.push(sample);
        }
        self.held = waiting;
        if self.held.is_empty() {
            // Nothing waits: no copy to share blocks with.
            self.last.clear();
        }
        out
    }

    /// Samples held now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// The process of a record [`pack_sample`] made (its first field).
fn record_tgid(record: &[u8]) -> u32 {
    record_u32(record, std::mem::offset_of!(Sample, tgid))
}

/// Why the kernel's walk of a record [`pack_sample`] made stopped.
fn record_reason(record: &[u8]) -> u32 {
    (record_u32(record, std::mem::offset_of!(Sample, flags)) >> SAMPLE_UNWIND_SHIFT) & 0xff
}

fn record_u32(record: &[u8], at: usize) -> u32 {
    record.get(at..at + 4).map_or(0, |bytes| {
        u32::from_ne_bytes(bytes.try_into().expect("4 bytes"))
    })
}

/// True when one of `mappings` holds `pc`.
fn maps_pc(mappings: &ProcessMappings, pc: u64) -> bool {
    let len = (mappings.len as usize).min(mappings.mappings.len());
    mappings.mappings[..len]
        .iter()
        .any(|mapping| (mapping.start..mapping.end).contains(&pc))
}

mod walk;
pub use walk::{ReadChunk, walk_copy};

#[cfg(test)]
mod tests;
