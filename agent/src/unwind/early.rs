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
//! here, in a bounded queue ([`MAX_HELD`] samples), until the sample is
//! unwound, sent on with its frame-pointer stack after [`MAX_WAIT`], or
//! dropped because the queue is full (each counted); the bytes are then
//! freed. Nothing of them reaches a sample, an output file or an export:
//! only the return addresses the unwinder finds do.
use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use hostprof_common::{
    RowChunk, SAMPLE_FLAG_USER_TABLES, SAMPLE_FLAG_USER_TRUNCATED, SAMPLE_UNWIND_SHIFT, Sample,
};
use hostprof_unwind::{self as unwind, Lookup, ProcessMappings, ROW_CHUNK, Regs, Step, UnwindRow};

use super::{TableMaps, UnwindError, replay::HOST_ARCH};
use crate::sampler::StackCopy;

/// Samples held at most (and copies queued on their way here): with
/// [`crate::sampler::EARLY_COPY_BYTES`] each, at most 4 MiB in all.
pub const MAX_HELD: usize = 256;

/// How long a sample waits for its process's tables before it goes on with
/// its frame-pointer stack.
pub const MAX_WAIT: Duration = Duration::from_secs(2);

/// What the kernel's unwind maps hold, as the host sees it.
#[derive(Default)]
pub struct Mirror {
    rows: Vec<UnwindRow>,
    processes: HashMap<u32, ProcessMappings>,
}

/// The mirror, shared by the unwind service (writer) and attribution.
pub type SharedMirror = Arc<RwLock<Mirror>>;

/// Kernel maps that also keep the host's [`Mirror`] up to date.
pub struct Mirrored<M> {
    pub inner: M,
    pub mirror: SharedMirror,
}

impl<M: TableMaps> TableMaps for Mirrored<M> {
    fn write_chunk(&mut self, index: u32, chunk: &RowChunk) -> Result<(), UnwindError> {
        self.inner.write_chunk(index, chunk)?;
        let mut mirror = self.mirror.write().unwrap_or_else(|e| e.into_inner());
        let start = index as usize * ROW_CHUNK;
        if mirror.rows.len() < start + ROW_CHUNK {
            mirror.rows.resize(start + ROW_CHUNK, UnwindRow::default());
        }
        mirror.rows[start..start + ROW_CHUNK].copy_from_slice(&chunk.0);
        Ok(())
    }

    fn set_process(&mut self, tgid: u32, mappings: &ProcessMappings) -> Result<(), UnwindError> {
        self.inner.set_process(tgid, mappings)?;
        let mut mirror = self.mirror.write().unwrap_or_else(|e| e.into_inner());
        mirror.processes.insert(tgid, *mappings);
        Ok(())
    }

    fn remove_process(&mut self, tgid: u32) -> Result<(), UnwindError> {
        let mut mirror = self.mirror.write().unwrap_or_else(|e| e.into_inner());
        mirror.processes.remove(&tgid);
        drop(mirror);
        self.inner.remove_process(tgid)
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
    /// Samples sent on with their frame-pointer stack: tables not loaded
    /// within [`MAX_WAIT`] (or the run ended first).
    pub timed_out: u64,
    /// Copies dropped because [`MAX_HELD`] samples were waiting already.
    pub dropped: u64,
}

struct Held {
    sample: Sample,
    regs: [u64; 4],
    stack: Vec<u8>,
    since: Instant,
}

/// Samples waiting for their process's tables, with their stack copies.
pub struct EarlyStacks {
    mirror: SharedMirror,
    /// Copies that arrived before their sample was attributed, by (tid,
    /// kernel time); at most [`MAX_HELD`].
    copies: HashMap<(u32, u64), StackCopy>,
    held: VecDeque<Held>,
    stats: EarlyStats,
}

impl EarlyStacks {
    pub fn new(mirror: SharedMirror) -> Self {
        EarlyStacks {
            mirror,
            copies: HashMap::new(),
            held: VecDeque::new(),
            stats: EarlyStats::default(),
        }
    }

    pub fn stats(&self) -> EarlyStats {
        self.stats
    }

    /// Takes in the copy of a sample that is still to come.
    pub fn add_copy(&mut self, copy: StackCopy) {
        if copy.regs.is_none() || copy.stack.is_empty() {
            return;
        }
        if self.copies.len() + self.held.len() >= MAX_HELD {
            self.stats.dropped += 1;
            return;
        }
        self.copies
            .insert((copy.sample.tid, copy.sample.ktime_ns), copy);
    }

    /// Holds `sample` when it has a copy (returns true): it comes back from
    /// [`EarlyStacks::ready`].
    pub fn hold(&mut self, sample: &Sample) -> bool {
        let Some(copy) = self.copies.remove(&(sample.tid, sample.ktime_ns)) else {
            return false;
        };
        let Some(regs) = copy.regs else {
            return false;
        };
        self.held.push_back(Held {
            sample: *sample,
            regs,
            stack: copy.stack,
            since: Instant::now(),
        });
        true
    }

    /// Samples whose tables are loaded now, with their user stacks walked
    /// on the host, and those that waited too long (all of them when
    /// `flush`), as they were; their copies are freed.
    pub fn ready(&mut self, flush: bool) -> Vec<Sample> {
        // Copies whose sample never came (lost on the way) go too.
        if self.copies.len() > MAX_HELD / 2 {
            self.copies.clear();
        }
        let mut out = Vec::new();
        let mirror = self.mirror.read().unwrap_or_else(|e| e.into_inner());
        let mut waiting = VecDeque::with_capacity(self.held.len());
        for held in self.held.drain(..) {
            // Mappings loaded for an earlier image of the pid (the kernel
            // forgot them at the exec, the mirror may not have yet) do not
            // hold the sample's pc: wait for the new ones.
            let current = mirror
                .processes
                .get(&held.sample.tgid)
                .filter(|mappings| maps_pc(mappings, held.regs[0]));
            match current {
                Some(mappings) => {
                    self.stats.unwound += 1;
                    out.push(unwound(&mirror, mappings, &held));
                }
                None if flush || held.since.elapsed() >= MAX_WAIT => {
                    self.stats.timed_out += 1;
                    out.push(held.sample);
                }
                None => waiting.push_back(held),
            }
        }
        self.held = waiting;
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

/// True when one of `mappings` holds `pc`.
fn maps_pc(mappings: &ProcessMappings, pc: u64) -> bool {
    let len = (mappings.len as usize).min(mappings.mappings.len());
    mappings.mappings[..len]
        .iter()
        .any(|mapping| (mapping.start..mapping.end).contains(&pc))
}

/// `held`'s sample with the user stack the kernel's unwinder would have
/// found with the tables now loaded.
fn unwound(mirror: &Mirror, mappings: &ProcessMappings, held: &Held) -> Sample {
    let [pc, sp, fp, lr] = held.regs;
    let mut regs = Regs::interrupted(pc, sp, fp, lr);
    let mut process = CopyProcess {
        rows: &mirror.rows,
        mappings,
        sp,
        stack: &held.stack,
    };
    let mut sample = held.sample;
    let max = sample.user_stack.len();
    let mut frames = 1;
    sample.user_stack[0] = regs.pc;
    let reason = loop {
        match unwind::step(HOST_ARCH, &mut regs, &mut process) {
            Step::Caller if frames >= max => break unwind::reason::DEPTH_LIMIT,
            Step::Caller => {
                sample.user_stack[frames] = regs.pc;
                frames += 1;
            }
            Step::Stop(reason) => break reason,
            // Runtime frames are walked in the kernel only.
            Step::Runtime(_) => break unwind::reason::NO_TABLE,
        }
    };
    sample.user_stack_len = frames as u32;
    let truncated = if reason == unwind::reason::DEPTH_LIMIT {
        SAMPLE_FLAG_USER_TRUNCATED
    } else {
        0
    };
    let kept = sample.flags & !(0xff << SAMPLE_UNWIND_SHIFT) & !SAMPLE_FLAG_USER_TRUNCATED;
    sample.flags = kept | SAMPLE_FLAG_USER_TABLES | truncated | (reason << SAMPLE_UNWIND_SHIFT);
    sample
}

/// A stack copy and the mirrored tables, as `hostprof_unwind` sees a
/// process.
struct CopyProcess<'a> {
    rows: &'a [UnwindRow],
    mappings: &'a ProcessMappings,
    sp: u64,
    stack: &'a [u8],
}

impl unwind::Process for CopyProcess<'_> {
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        let at = usize::try_from(address.checked_sub(self.sp)?).ok()?;
        let word = self.stack.get(at..at.checked_add(8)?)?;
        Some(u64::from_le_bytes(word.try_into().ok()?))
    }

    fn lookup(&mut self, pc: u64) -> Lookup {
        unwind::lookup_in_memory(self.mappings, self.rows, pc)
    }
}
