//! Loads unwind tables into the kernel's maps as processes need them, and
//! drops them when no process maps their file any more.
//!
//! Tables are shared: one copy per file identity (the SHA-256 of the file's
//! bytes, [`crate::files::content_id`]; never a build id, which whoever
//! builds a file chooses) however many processes map it. Rows live in chunks of
//! [`ROW_CHUNK`] in one big array map; a free list of chunk ranges bounds the
//! memory, and a table that does not fit is counted and left to frame
//! pointers.
//!
//! No capacity cliffs: a process beyond the kernel's process map, or one
//! whose load the kernel refuses, is left to frame pointers (counted), and
//! its next attempts wait out a doubling backoff, so samples that keep
//! asking for it never rebuild anything in a loop. A process with more
//! executable mappings than the kernel keeps per process loads the ones
//! that fit (file-backed first) and waits out the same backoff.
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use crate::model::{CodeRange, CodeUse, Mapping};
mod pieces;
mod source;
mod space;
mod sparse;
mod stats;
use hostprof_common::{
    MAX_UNWIND_PROCESSES, RowChunk,
    unwind::{
        COPY_UNMAPPED, ExecMapping, FRAME_POINTER_TABLE, MARKED, MAX_PROCESS_MAPPINGS,
        ProcessMappings, ROW_CHUNK, RUNTIME_TABLE,
    },
};
use pieces::{fitting, runtime_pieces};
pub use source::{FileKey, FileSource};
pub use sparse::{MAX_PCS_PER_REQUEST, MAX_STACKS_PER_REQUEST};
use stats::{CACHED_UNREAD, FILES_READ, PROCESS_LOADS, PROCESSES_DEGRADED, READ_FOR_CACHED};
pub use stats::{
    LoaderStats, capacity_totals, defer_functions, file_totals, functions_deferred, sparse_growths,
};

use hostprof_unwind::table::{self, LoadSegment, TableError, TableKind, UnwindTable};

use super::{FileData, UnwindError, cache::TableCache};

/// Writes to the kernel's unwind maps; tests swap in a fake.
pub trait TableMaps {
    fn write_chunk(&mut self, index: u32, chunk: &RowChunk) -> Result<(), UnwindError>;
    fn set_process(&mut self, tgid: u32, mappings: &ProcessMappings) -> Result<(), UnwindError>;
    fn remove_process(&mut self, tgid: u32) -> Result<(), UnwindError>;
    /// What the kernel holds for `tgid` (to point it at a grown table).
    fn process(&self, tgid: u32) -> Option<ProcessMappings>;
    /// Chunk `index` of the rows the kernel holds (to walk a stack copy as
    /// the kernel would).
    fn read_chunk(&self, index: u32) -> Option<RowChunk>;
    /// Processes the kernel's map holds at most (sized at load by
    /// `crate::sampler`).
    fn process_capacity(&self) -> usize {
        MAX_UNWIND_PROCESSES as usize
    }
}

/// How long after a process's first load its samples that reach an
/// unmapped address are copied for the host ([`COPY_UNMAPPED`]): its
/// libraries are mapped in its first milliseconds, and loaded a few tens
/// of milliseconds later, seconds on a saturated host.
const YOUNG: Duration = Duration::from_secs(10);

/// A process left to frame pointers for now.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    /// No load before this.
    until: Instant,
    /// Backoffs in a row: each doubles the wait.
    rounds: u32,
}

/// The first wait of a process that did not fit, doubled each time it
/// still does not, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(64);
/// Bound of the backoff set: entries of exited processes go with the
/// sweep; past this many, the oldest half is forgotten (those processes
/// may then be tried once more, nothing worse).
const MAX_BACKOFF_ENTRIES: usize = 16_384;

struct Loaded {
    /// First chunk, or FRAME_POINTER_TABLE.
    first_chunk: u32,
    chunks: u32,
    rows: u32,
    text_bytes: u64,
    refs: u32,
    /// With no process using it: its place in [`TableLoader::idle`].
    idle_seq: Option<u64>,
    /// The file's loadable segments: a process mapping the file, at any
    /// offset, needs no read of it.
    segments: Vec<LoadSegment>,
    /// Built for the code that runs (see `sparse`).
    sparse: Option<sparse::Sparse>,
}

/// The tables and processes currently in the kernel.
pub struct TableLoader<M: TableMaps> {
    maps: M,
    capacity_chunks: u32,
    /// Free chunk ranges (start, len), sorted by start, never adjacent.
    free: Vec<(u32, u32)>,
    loaded: HashMap<FileKey, Loaded>,
    /// Files that failed, so they are not parsed again and again; at most
    /// [`MAX_FAILED`], the oldest forgotten first.
    failed: HashMap<FileKey, u64>,
    /// Order of insertion into `failed`.
    failed_seq: u64,
    /// Tables no process uses, by when they became idle. A short-lived
    /// process (a shell loop's `awk`) maps the same files again a moment
    /// later: freeing its tables at exit meant reading, hashing and
    /// building them again for each one.
    idle: BTreeMap<u64, FileKey>,
    idle_seq: u64,
    /// Idle tables kept at most ([`MAX_IDLE`]).
    max_idle: usize,
    /// Per process: the files it uses, a digest of its mappings, when
    /// loaded last and first.
    processes: HashMap<u32, (Vec<FileKey>, u64, Instant, Instant)>,
    /// Processes the kernel's map holds at most ([`TableMaps::process_capacity`]).
    process_capacity: usize,
    /// Processes waiting before their next load (see [`Backoff`]).
    backoff: HashMap<u32, Backoff>,
    /// Per process: the address ranges of a language runtime's code (a
    /// JVM's code heaps, V8's code space and builtins), which the kernel
    /// hands to that runtime's walker.
    runtime_code: HashMap<u32, Vec<CodeRange>>,
    /// Tables built before, on disk (none: every table is built).
    cache: Option<Arc<TableCache>>,
    /// The file whose cached table was just found unusable (and counted).
    unusable: Option<FileKey>,
    /// Files with this many bytes of CFI or more get tables for the code
    /// that runs (none: whole tables only).
    sparse_from: Option<u64>,
    /// Per process: its mappings whose tables are built for the code that runs.
    sparse_slots: HashMap<u32, Vec<sparse::Slot>>,
    /// The files of the tables grown last, oldest first (see `sparse`).
    growing: Vec<sparse::Kept>,
    stats: LoaderStats,
}

/// Files remembered as having no usable table.
const MAX_FAILED: usize = 4096;

/// Idle tables kept at most, however much room the rows map has left.
const MAX_IDLE: usize = 1024;

/// Don't reload a process more often than this.
const MIN_RELOAD_INTERVAL: Duration = Duration::from_millis(200);

impl<M: TableMaps> TableLoader<M> {
    pub fn new(maps: M, capacity_chunks: u32) -> Self {
        let process_capacity = maps.process_capacity();
        TableLoader {
            maps,
            capacity_chunks,
            free: vec![(0, capacity_chunks)],
            loaded: HashMap::new(),
            failed: HashMap::new(),
            failed_seq: 0,
            idle: BTreeMap::new(),
            idle_seq: 0,
            max_idle: MAX_IDLE,
            processes: HashMap::new(),
            process_capacity,
            backoff: HashMap::new(),
            runtime_code: HashMap::new(),
            cache: None,
            unusable: None,
            sparse_from: None,
            sparse_slots: HashMap::new(),
            growing: Vec::new(),
            stats: LoaderStats {
                bytes_capacity: capacity_chunks as u64 * size_of::<RowChunk>() as u64,
                ..Default::default()
            },
        }
    }

    pub fn stats(&self) -> LoaderStats {
        self.stats
    }

    /// Takes tables from `cache` before building them, and stores the ones
    /// it builds there.
    pub fn with_cache(mut self, cache: Option<Arc<TableCache>>) -> Self {
        self.cache = cache;
        self
    }

    /// A smaller process capacity than the kernel's (tests).
    #[cfg(test)]
    fn with_process_capacity(mut self, capacity: usize) -> Self {
        self.process_capacity = capacity;
        self
    }

    /// Fewer idle tables kept than [`MAX_IDLE`] (tests).
    #[cfg(test)]
    fn with_max_idle(mut self, max_idle: usize) -> Self {
        self.max_idle = max_idle;
        self
    }

    /// True while `pid` waits out a backoff: asking for it now does nothing
    /// (callers check before reading anything of the process).
    pub fn backing_off(&self, pid: u32) -> bool {
        self.backoff
            .get(&pid)
            .is_some_and(|backoff| Instant::now() < backoff.until)
    }

    /// Starts (or doubles) `pid`'s backoff.
    fn back_off(&mut self, pid: u32) {
        if self.backoff.len() >= MAX_BACKOFF_ENTRIES && !self.backoff.contains_key(&pid) {
            let mut oldest: Vec<(Instant, u32)> = self
                .backoff
                .iter()
                .map(|(pid, backoff)| (backoff.until, *pid))
                .collect();
            oldest.sort_unstable();
            for (_, pid) in &oldest[..oldest.len() / 2] {
                self.backoff.remove(pid);
            }
        }
        let rounds = self
            .backoff
            .get(&pid)
            .map_or(0, |backoff| backoff.rounds + 1);
        let wait = FIRST_BACKOFF
            .saturating_mul(1 << rounds.min(6))
            .min(MAX_BACKOFF);
        self.backoff.insert(
            pid,
            Backoff {
                until: Instant::now() + wait,
                rounds,
            },
        );
    }

    /// Counts `pid` as left to frame pointers for lack of room, and backs off.
    fn degrade(&mut self, pid: u32) {
        tracing::debug!("pid {pid}: left to frame pointers: the kernel's unwind maps are full");
        self.stats.process_full += 1;
        PROCESSES_DEGRADED.fetch_add(1, Ordering::Relaxed);
        self.back_off(pid);
    }

    /// True when `pid` was loaded with these very mappings (and runtime
    /// code) less than the reload interval ago (an exec or dlopen changes
    /// them, a runtime found since too: reload at once).
    pub fn recently_loaded(&self, pid: u32, mappings: &[Mapping]) -> bool {
        self.processes.get(&pid).is_some_and(|(_, digest, at, _)| {
            *digest == self.digest(pid, mappings) && at.elapsed() < MIN_RELOAD_INTERVAL
        })
    }

    /// Says where `pid`'s runtime code is (none: `ranges` empty), for its
    /// next load.
    pub fn set_runtime_code(&mut self, pid: u32, ranges: Vec<CodeRange>) {
        if ranges.is_empty() {
            self.runtime_code.remove(&pid);
        } else {
            self.runtime_code.insert(pid, ranges);
        }
    }

    fn digest(&self, pid: u32, mappings: &[Mapping]) -> u64 {
        digest_of(
            mappings,
            self.runtime_code.get(&pid).map_or(&[], Vec::as_slice),
        )
    }

    /// Loads the tables of every mapping of `pid` and tells the kernel where
    /// they are.
    pub fn load_process(
        &mut self,
        pid: u32,
        mappings: &[Mapping],
        files: &mut dyn FileSource,
    ) -> Result<(), UnwindError> {
        if self.backing_off(pid) {
            self.stats.backoff_skips += 1;
            return Ok(());
        }
        if mappings.is_empty() {
            // Read in the middle of an exec: the old image gone, the new
            // one not mapped yet. Written, the empty list would stop every
            // sample of the new image at its first frame ("no mapping")
            // until the next load; without it the kernel copies their
            // stacks for the host to unwind, and the exec's event asks
            // again.
            return Ok(());
        }
        if !self.processes.contains_key(&pid) && self.processes.len() >= self.process_capacity {
            // The kernel's map is full: frame pointers for this one.
            self.degrade(pid);
            return Ok(());
        }
        self.stats.loads += 1;
        PROCESS_LOADS.fetch_add(1, Ordering::Relaxed);
        let mut entries = ProcessMappings::default();
        let mut keys = Vec::new();
        let mut sparse_slots = Vec::new();
        let runtime_code = self.runtime_code.get(&pid).cloned().unwrap_or_default();
        let pieces = runtime_pieces(mappings, &runtime_code);
        let (sorted, dropped) = fitting(&pieces, MAX_PROCESS_MAPPINGS);
        let truncated = dropped > 0;
        self.stats.mappings_dropped += dropped as u64;
        for (slot, piece) in sorted.into_iter().enumerate() {
            // Where the piece is, and the whole mapping its file is read by.
            let (mapping, whole) = (&piece.mapping, &mappings[piece.whole]);
            let (runtime, mark) = match piece.by {
                Some(CodeUse::Walked(runtime)) => (Some(runtime), 0),
                Some(CodeUse::Marked(mark)) => (None, mark),
                None => (None, 0),
            };
            let mut entry = ExecMapping {
                start: mapping.start,
                end: mapping.end,
                ..Default::default()
            };
            let known = if runtime.is_some() {
                None
            } else {
                files.identify(pid, whole)
            };
            if let Some(runtime) = runtime {
                entry.table_start = RUNTIME_TABLE;
                // A runtime mapping has no table to bias: the field says
                // whose walker steps it (see `unwinder::Lookup::Runtime`).
                entry.bias = u64::from(runtime);
            } else if let Some(key) = &known
                && self.failed.contains_key(key)
            {
                // Known to have no usable table: frame pointers.
            } else if let Some(key) = &known
                && let Some((vaddr, loaded)) = self
                    .reuse(key, mapping.file_offset)
                    .or_else(|| self.acquire_cached(key, mapping.file_offset))
            {
                entry.bias = mapping.start.wrapping_sub(vaddr);
                entry.table_start = loaded.0;
                entry.table_len = loaded.1;
                keys.push(key.clone());
            } else if runtime.is_none()
                && let Some((key, data)) = self.read_file(files, pid, whole)
                && let Some(segments) = table::load_segments((*data).as_ref())
                && let Some(vaddr) = table::vaddr_in(&segments, mapping.file_offset)
                && let built = files.take_built(&key)
                && let Some(loaded) = self.acquire(&key, (*data).as_ref(), segments, built)
            {
                entry.bias = mapping.start.wrapping_sub(vaddr);
                entry.table_start = loaded.0;
                entry.table_len = loaded.1;
                keys.push(key);
            }
            if entry.table_len != 0 && mark != 0 {
                // A runtime's native code (an interpreter's loop): unwound
                // by its rows, its frames marked for the host.
                entry.set_mark(mark);
                entries.flags |= MARKED;
            }
            if entry.table_len != 0
                && let Some(key) = keys.last()
                && self.is_sparse(key)
            {
                sparse_slots.push(sparse::Slot {
                    start: entry.start,
                    end: entry.end,
                    bias: entry.bias,
                    key: key.clone(),
                    mapping: whole.clone(),
                });
            }
            entries.mappings[slot] = entry;
            entries.len = slot as u32 + 1;
        }
        // A young process's libraries may still be mapping. Not for a
        // process past that (a sample whose walk found a bad return
        // address would be held for nothing), our own (whose samples
        // always miss our executable, left out on purpose) or a truncated
        // one (whose left-out code stays unmapped).
        let first = self
            .processes
            .get(&pid)
            .map_or_else(Instant::now, |(_, _, _, first)| *first);
        if first.elapsed() < YOUNG && !truncated && pid != std::process::id() {
            entries.flags |= COPY_UNMAPPED;
        }
        if !files.still_mapped(pid, mappings) {
            // It exec'd while its tables were built: the old image's
            // mappings, written now, would stop the new image's samples at
            // their first frame until the next load (the caller's).
            for key in keys {
                self.release(&key);
            }
            return Ok(());
        }
        let digest = self.digest(pid, mappings);
        self.note_sparse(pid, sparse_slots);
        let previous = self
            .processes
            .insert(pid, (keys, digest, Instant::now(), first));
        if let Some((old_keys, _, _, _)) = previous {
            for key in old_keys {
                self.release(&key);
            }
        }
        self.stats.processes = self.processes.len() as u64;
        match self.maps.set_process(pid, &entries) {
            Ok(()) => {
                if truncated {
                    self.back_off(pid);
                } else {
                    self.backoff.remove(&pid);
                }
                Ok(())
            }
            Err(err) => {
                self.unload(pid);
                self.degrade(pid);
                Err(err)
            }
        }
    }

    /// Forgets a process (exited): its tables go when no other process uses them.
    pub fn forget_process(&mut self, pid: u32) {
        self.backoff.remove(&pid);
        self.runtime_code.remove(&pid);
        self.unload(pid);
    }

    /// Processes known to the loader: loaded, or backing off (the sweep
    /// forgets the ones that exited).
    pub fn known_processes(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.extend(
            self.backoff
                .keys()
                .filter(|pid| !self.processes.contains_key(pid)),
        );
        pids
    }

    /// Drops a process's mappings from the kernel and its table references.
    fn unload(&mut self, pid: u32) {
        self.sparse_slots.remove(&pid);
        if let Some((keys, _, _, _)) = self.processes.remove(&pid) {
            for key in keys {
                self.release(&key);
            }
            let _ = self.maps.remove_process(pid);
        }
        self.stats.processes = self.processes.len() as u64;
    }

    /// A loaded table: its ELF address at `file_offset` and placement,
    /// taking a reference.
    fn reuse(&mut self, key: &FileKey, file_offset: u64) -> Option<(u64, (u32, u32))> {
        let loaded = self.loaded.get(key)?;
        let vaddr = table::vaddr_in(&loaded.segments, file_offset)?;
        Some((vaddr, self.take_ref(key)?))
    }

    /// `files.open`, counted.
    fn read_file(
        &mut self,
        files: &mut dyn FileSource,
        pid: u32,
        mapping: &Mapping,
    ) -> Option<(FileKey, FileData)> {
        let opened = files.open(pid, mapping)?;
        self.stats.files_read += 1;
        FILES_READ.fetch_add(1, Ordering::Relaxed);
        Some(opened)
    }

    /// A table not loaded yet, from the disk cache without reading its
    /// file: its ELF address at `file_offset` and placement. `None` when
    /// the cache does not have it (the caller reads the file).
    fn acquire_cached(&mut self, key: &FileKey, file_offset: u64) -> Option<(u64, (u32, u32))> {
        let FileKey::Content(id) = key else {
            return None;
        };
        if self.loaded.contains_key(key) {
            // Loaded, but its segments do not place this offset.
            return None;
        }
        let found = match self.cache.as_ref()?.peek(id) {
            Ok(found) => found,
            Err(counted) => {
                // Damaged or stale (counted): the build need not look again.
                if counted {
                    self.unusable = Some(key.clone());
                }
                return None;
            }
        };
        if self.skips_cached(found.table.row_count()) {
            return None;
        }
        let vaddr = table::vaddr_in(&found.segments, file_offset)?;
        let placed = self.place(key, &found.table, found.segments)?;
        self.stats.cached_unread += 1;
        CACHED_UNREAD.fetch_add(1, Ordering::Relaxed);
        Some((vaddr, placed))
    }

    /// The table's (start, len) in the rows map, loading it if needed.
    fn acquire(
        &mut self,
        key: &FileKey,
        data: &[u8],
        segments: Vec<LoadSegment>,
        built: Option<Result<(UnwindTable, bool), TableError>>,
    ) -> Option<(u32, u32)> {
        if let Some(placed) = self.take_ref(key) {
            return Some(placed);
        }
        if self.failed.contains_key(key) {
            return None;
        }
        if built.is_none() && self.wants_sparse(data) {
            // Microseconds, and never cached: it grows as the process runs.
            let table = match table::build_sparse(data, &[]) {
                Ok(table) => table,
                Err(err) => {
                    tracing::debug!("no unwind table for {key:?}: {err}");
                    self.stats.build_failures += 1;
                    self.remember_failure(key);
                    return None;
                }
            };
            let placed = self.place(key, &table, segments)?;
            if let Some(loaded) = self.loaded.get_mut(key)
                && placed.1 != 0
            {
                loaded.sparse = Some(sparse::Sparse::default());
                self.stats.sparse_tables += 1;
            }
            return Some(placed);
        }
        let lookup = self.unusable.take().as_ref() != Some(key);
        let built = built.unwrap_or_else(|| {
            super::cache::table_of(self.cache.as_deref(), key, data, &segments, lookup)
        });
        let table = match built {
            Ok((table, cached)) => {
                if cached {
                    self.stats.read_for_cached += 1;
                    READ_FOR_CACHED.fetch_add(1, Ordering::Relaxed);
                }
                table
            }
            Err(err) => {
                tracing::debug!("no unwind table for {key:?}: {err}");
                self.stats.build_failures += 1;
                self.remember_failure(key);
                return None;
            }
        };
        self.place(key, &table, segments)
    }

    /// Writes `table` to the rows map as `key`'s.
    fn place(
        &mut self,
        key: &FileKey,
        table: &UnwindTable,
        segments: Vec<LoadSegment>,
    ) -> Option<(u32, u32)> {
        let mut loaded = self.store(table)?;
        loaded.segments = segments;
        let placed = placement(&loaded);
        self.stats.tables += 1;
        self.stats.rows += loaded.rows as u64;
        self.stats.text_bytes += loaded.text_bytes;
        self.stats.bytes_used += loaded.chunks as u64 * size_of::<RowChunk>() as u64;
        self.loaded.insert(key.clone(), loaded);
        Some(placed)
    }

    /// One more process uses `key`'s loaded table (no longer idle).
    fn take_ref(&mut self, key: &FileKey) -> Option<(u32, u32)> {
        let loaded = self.loaded.get_mut(key)?;
        if let Some(seq) = loaded.idle_seq.take() {
            self.idle.remove(&seq);
            self.stats.idle_tables -= 1;
        }
        loaded.refs += 1;
        Some(placement(loaded))
    }

    fn release(&mut self, key: &FileKey) {
        let Some(loaded) = self.loaded.get_mut(key) else {
            return;
        };
        loaded.refs -= 1;
        if loaded.refs > 0 {
            return;
        }
        loaded.idle_seq = Some(self.idle_seq);
        // No process left to grow it for.
        self.growing.retain(|kept| kept.key != *key);
        self.idle.insert(self.idle_seq, key.clone());
        self.idle_seq += 1;
        self.stats.idle_tables += 1;
        if self.idle.len() > self.max_idle {
            self.evict_oldest_idle();
        }
    }

    /// Keeps `key` among the files without a table, forgetting the oldest
    /// half when full (a host with endless distinct files must not grow
    /// the set without bound).
    fn remember_failure(&mut self, key: &FileKey) {
        if self.failed.len() >= MAX_FAILED {
            let cutoff = self.failed_seq - (MAX_FAILED / 2) as u64;
            let before = self.failed.len();
            self.failed.retain(|_, seq| *seq >= cutoff);
            self.stats.failed_forgotten += (before - self.failed.len()) as u64;
        }
        self.failed.insert(key.clone(), self.failed_seq);
        self.failed_seq += 1;
    }
}

/// Identifies a set of mappings (which files, where).
fn digest_of(mappings: &[Mapping], runtime_code: &[CodeRange]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    runtime_code.hash(&mut hasher);
    for mapping in mappings {
        (
            mapping.start,
            mapping.end,
            mapping.file_offset,
            mapping.inode,
        )
            .hash(&mut hasher);
    }
    hasher.finish()
}

/// Where the kernel finds a loaded table: (first row, rows), or the
/// frame-pointer marker.
fn placement(loaded: &Loaded) -> (u32, u32) {
    if loaded.first_chunk == FRAME_POINTER_TABLE {
        (FRAME_POINTER_TABLE, 0)
    } else {
        (loaded.first_chunk * ROW_CHUNK as u32, loaded.rows)
    }
}

#[cfg(test)]
mod tests;
