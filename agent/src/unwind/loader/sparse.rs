//! Tables for the code that runs (issue 31): a large file's table starts
//! with no function's rows ([`table::build_sparse`]); a walk that reaches
//! one of its functions stops there (`reason::NOT_LOADED`) with the
//! address as its last frame, the reader asks for it, and the table is
//! built again with that function's rows, placed anew, and every process
//! mapping the file pointed at it.
//!
//! A busy process runs in a few dozen of its binary's tens of thousands of
//! functions: its table costs microseconds instead of a build of every FDE
//! (150 ms of CPU for a 3 MiB interpreter on a saturated host), and a few
//! KiB of the rows map instead of hundreds. A stack is complete after one
//! round trip per function it reaches for the first time, or, when the
//! sample's stack copy comes with the request, after one: the service walks
//! the copy on, past each function the kernel lacks with that function's
//! rows built from the file alone, and adds every function the walk needed
//! in one growth.
use super::*;
use crate::unwind::early::{self, StackCopy};
use hostprof_common::{MAX_USER_STACK_DEPTH, unwind::cfa};
use hostprof_unwind::Lookup;

/// Files with at least this many bytes of CFI get a table for the code
/// that runs (when the loader makes them: [`TableLoader::with_sparse`]).
/// libc's is 150 KiB: it and the smaller libraries every process shares
/// keep whole tables, built once, complete from a process's first sample.
pub const SPARSE_FROM: u64 = 256 << 10;

/// Functions asked for per file at most: past it, the table stays as it is
/// (a process that runs so much of a binary is better served by frame
/// pointers than by ever larger rebuilds).
const MAX_PCS: usize = 4096;

/// Files kept between growths, the most recently grown: reading one again
/// (an image of its size, its CFI copied in) was most of a growth's cost on
/// a saturated host, and a new process's functions come one round trip
/// after another. Their other pages are never touched: about their CFI's
/// size each, and an index of their FDEs (12 bytes each) when they have no
/// `.eh_frame_hdr`.
const KEPT_FILES: usize = 8;

/// Bytes of kept files at most (their CFI, read in, and FDE index), the
/// newest always kept: with 40 distinct busy binaries, eight kept files
/// of a few hundred KiB each were a visible part of a record's peak, while
/// growths mostly come from different files in turn (a hit is a process of a file grown just before, or a
/// second process of it, which the newest few serve).
const KEPT_BYTES: usize = 2 << 20;

/// Addresses asked for per request at most (the reader asks once per
/// sample that stopped).
pub const MAX_PCS_PER_REQUEST: usize = 64;

/// Stack copies walked per request at most (a process's threads stopped in
/// different places).
pub const MAX_STACKS_PER_REQUEST: usize = 4;

/// A loaded table built for the code that runs: the addresses it was
/// built for.
#[derive(Debug, Default)]
pub(super) struct Sparse {
    /// ELF virtual addresses, sorted.
    pcs: Vec<u32>,
}

/// A mapping of a process whose table is sparse: where it is, to find the
/// file of an address the walk stopped at.
#[derive(Clone, Debug)]
pub(super) struct Slot {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) bias: u64,
    pub(super) key: FileKey,
    pub(super) mapping: Mapping,
}

impl<M: TableMaps> TableLoader<M> {
    /// Makes tables for the code that runs for files of [`SPARSE_FROM`]
    /// bytes of CFI or more.
    pub fn with_sparse(mut self, sparse: bool) -> Self {
        self.sparse_from = sparse.then_some(SPARSE_FROM);
        self
    }

    /// Whether `data`'s table is to be built for the code that runs.
    pub(super) fn wants_sparse(&self, data: &[u8]) -> bool {
        self.sparse_from
            .is_some_and(|from| table::cfi_bytes(data).is_some_and(|bytes| bytes >= from))
    }

    /// Whether a cached table of `rows` rows is passed over for one built
    /// for the code that runs (the same file, as the cache keys it: its
    /// CFI is about as large as its rows).
    pub(super) fn skips_cached(&self, rows: usize) -> bool {
        self.sparse_from.is_some_and(|from| rows as u64 * 8 >= from)
    }

    /// Adds the functions at `pcs` (addresses in `pid`, where its walks
    /// stopped for want of them) to the tables of the files they are in,
    /// and those the walks of `stacks` (copies of its samples' stacks) need
    /// on from there.
    pub fn add_functions(
        &mut self,
        pid: u32,
        pcs: &[u64],
        stacks: &[StackCopy],
        files: &mut dyn FileSource,
    ) {
        if !self.sparse_slots.contains_key(&pid) {
            return;
        }
        let mut pcs: Vec<u64> = pcs.iter().take(MAX_PCS_PER_REQUEST).copied().collect();
        for stack in stacks.iter().take(MAX_STACKS_PER_REQUEST) {
            for pc in self.functions_needed(pid, stack, files) {
                if !pcs.contains(&pc) {
                    pcs.push(pc);
                }
            }
        }
        let Some(slots) = self.sparse_slots.get(&pid) else {
            return;
        };
        let mut wanted: HashMap<FileKey, (Mapping, Vec<u32>)> = HashMap::new();
        for &pc in &pcs {
            let Some(slot) = slots
                .iter()
                .find(|slot| (slot.start..slot.end).contains(&pc))
            else {
                continue;
            };
            let Ok(vaddr) = u32::try_from(pc.wrapping_sub(slot.bias)) else {
                continue;
            };
            wanted
                .entry(slot.key.clone())
                .or_insert_with(|| (slot.mapping.clone(), Vec::new()))
                .1
                .push(vaddr);
        }
        for (key, (mapping, vaddrs)) in wanted {
            self.grow(pid, &key, &mapping, &vaddrs, files);
        }
    }

    /// Builds `key`'s table again with `vaddrs` too, and points every
    /// process mapping it at the new one.
    fn grow(
        &mut self,
        pid: u32,
        key: &FileKey,
        mapping: &Mapping,
        vaddrs: &[u32],
        files: &mut dyn FileSource,
    ) {
        let Some(sparse) = self
            .loaded
            .get(key)
            .and_then(|loaded| loaded.sparse.as_ref())
        else {
            return;
        };
        let mut pcs = sparse.pcs.clone();
        let before = pcs.len();
        for &vaddr in vaddrs {
            if let Err(at) = pcs.binary_search(&vaddr) {
                pcs.insert(at, vaddr);
            }
        }
        if pcs.len() == before {
            // Asked for by samples taken before the last growth landed.
            return;
        }
        if pcs.len() > MAX_PCS {
            self.stats.sparse_full += 1;
            return;
        }
        let Some(kept) = kept_file(&mut self.growing, pid, key, mapping, files) else {
            return;
        };
        let Ok(table) = kept.build(&pcs) else {
            return;
        };
        let Some(mut grown) = self.store(&table) else {
            return;
        };
        // Room for it may have evicted the old one (idle: no process uses it).
        let Some(old) = self.loaded.remove(key) else {
            self.free_range(grown.first_chunk, grown.chunks);
            return;
        };
        grown.refs = old.refs;
        grown.idle_seq = old.idle_seq;
        grown.segments = old.segments.clone();
        grown.sparse = Some(Sparse { pcs });
        let (from, to) = (placement(&old), placement(&grown));
        self.stats.rows = self.stats.rows - u64::from(old.rows) + u64::from(grown.rows);
        self.stats.bytes_used = self.stats.bytes_used
            - old.chunks as u64 * size_of::<RowChunk>() as u64
            + grown.chunks as u64 * size_of::<RowChunk>() as u64;
        self.stats.sparse_growths += 1;
        super::stats::SPARSE_GROWTHS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.loaded.insert(key.clone(), grown);
        self.repoint(key, from, to);
        self.free_range(old.first_chunk, old.chunks);
    }

    /// The addresses in `pid`'s sparse tables of the functions the walk of
    /// `stack` needs and the kernel lacks, the walk going on past each with
    /// rows built for that function alone (its FDE found through the
    /// header: microseconds).
    fn functions_needed(
        &mut self,
        pid: u32,
        stack: &StackCopy,
        files: &mut dyn FileSource,
    ) -> Vec<u64> {
        let (Some(slots), Some(mappings)) = (self.sparse_slots.get(&pid), self.maps.process(pid))
        else {
            return Vec::new();
        };
        let maps = &self.maps;
        let growing = &mut self.growing;
        let mut needed = Vec::new();
        // A recursive function's frames ask once.
        let mut found: HashMap<u64, Option<Lookup>> = HashMap::new();
        let mut fill = |pc: u64| {
            *found.entry(pc).or_insert_with(|| {
                let slot = slots
                    .iter()
                    .find(|slot| (slot.start..slot.end).contains(&pc))?;
                let vaddr = u32::try_from(pc.wrapping_sub(slot.bias)).ok()?;
                let kept = kept_file(growing, pid, &slot.key, &slot.mapping, files)?;
                let table = kept.build(&[vaddr]).ok()?;
                let rows = table.rows()?;
                let row = rows[..rows.partition_point(|row| row.pc <= vaddr)]
                    .last()
                    .copied()?;
                match row.cfa_rule {
                    cfa::NOT_LOADED => None,
                    cfa::NOT_COVERED => Some(Lookup::NotCovered),
                    _ => {
                        needed.push(pc);
                        Some(Lookup::Row(row))
                    }
                }
            })
        };
        let read = |index| maps.read_chunk(index);
        let mut frames = [0u64; MAX_USER_STACK_DEPTH];
        early::walk_copy(&mappings, Some(&read), stack, &mut frames, &mut fill);
        needed.truncate(MAX_PCS_PER_REQUEST);
        needed
    }

    /// Points every process whose mappings use the table at `from` at `to`
    /// (the kernel's copy, read back: the loader keeps none of 8 KiB each).
    fn repoint(&mut self, key: &FileKey, from: (u32, u32), to: (u32, u32)) {
        let users: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, (keys, _, _, _))| keys.contains(key))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in users {
            let Some(mut entries) = self.maps.process(pid) else {
                continue;
            };
            let len = (entries.len as usize).min(MAX_PROCESS_MAPPINGS);
            for entry in &mut entries.mappings[..len] {
                // A marked piece of the file keeps its mark.
                if (entry.table_start, entry.rows()) == from {
                    let mark = entry.mark();
                    (entry.table_start, entry.table_len) = to;
                    entry.set_mark(mark);
                }
            }
            if let Err(err) = self.maps.set_process(pid, &entries) {
                tracing::debug!("pid {pid}: cannot point at a grown unwind table: {err}");
            }
        }
    }

    /// Notes `pid`'s mappings whose tables are sparse (after its load).
    pub(super) fn note_sparse(&mut self, pid: u32, slots: Vec<Slot>) {
        if slots.is_empty() {
            self.sparse_slots.remove(&pid);
        } else {
            self.sparse_slots.insert(pid, slots);
        }
    }

    /// Whether `key`'s loaded table is sparse.
    pub(super) fn is_sparse(&self, key: &FileKey) -> bool {
        self.loaded
            .get(key)
            .is_some_and(|loaded| loaded.sparse.is_some())
    }
}

/// A file kept between growths of its table.
pub(super) struct Kept {
    pub(super) key: FileKey,
    data: FileData,
    /// Its FDEs by address when it has no `.eh_frame_hdr`: made once, each
    /// growth finds its functions without a scan of them all.
    index: Option<table::FdeIndex>,
    /// What keeping it costs: its CFI and index (its other pages were
    /// never touched).
    bytes: usize,
}

impl Kept {
    /// Its table for the code at `pcs`.
    fn build(&self, pcs: &[u32]) -> Result<table::UnwindTable, table::TableError> {
        table::build_sparse_with((*self.data).as_ref(), pcs, self.index.as_ref())
    }
}

/// `key`'s file: kept from its last growth (a process's functions come
/// one round trip after another, each a growth), else read again (its
/// parts for unwinding; its content id is known): the same bytes, or it
/// changed and is not grown.
fn kept_file<'a>(
    growing: &'a mut Vec<Kept>,
    pid: u32,
    key: &FileKey,
    mapping: &Mapping,
    files: &mut dyn FileSource,
) -> Option<&'a Kept> {
    if let Some(at) = growing.iter().position(|kept| kept.key == *key) {
        let kept = growing.remove(at);
        growing.push(kept);
        return growing.last();
    }
    let (opened, data) = files.open(pid, mapping)?;
    if opened != *key {
        return None;
    }
    let index = table::fde_index((*data).as_ref());
    let bytes = table::cfi_bytes((*data).as_ref()).unwrap_or(0) as usize
        + index.as_ref().map_or(0, table::FdeIndex::bytes);
    make_room(growing, bytes);
    growing.push(Kept {
        key: opened,
        data,
        index,
        bytes,
    });
    growing.last()
}

/// Forgets the files kept longest until one of `bytes` fits
/// ([`KEPT_FILES`], [`KEPT_BYTES`]; with none left, it is kept however
/// large).
fn make_room(growing: &mut Vec<Kept>, bytes: usize) {
    let mut kept_bytes: usize = growing.iter().map(|kept| kept.bytes).sum();
    while !growing.is_empty() && (growing.len() >= KEPT_FILES || kept_bytes + bytes > KEPT_BYTES) {
        kept_bytes -= growing.remove(0).bytes;
    }
}

#[cfg(test)]
#[path = "sparse_tests.rs"]
mod tests;
