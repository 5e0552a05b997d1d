//! Loads unwind tables into the kernel's maps as processes need them, and
//! drops them when no process maps their file any more.
//!
//! Tables are shared: one copy per file identity (the SHA-256 of the file's
//! bytes, [`crate::files::content_id`]; never a build id, which whoever
//! builds a file chooses) however many processes map it. Rows live in chunks of
//! [`ROW_CHUNK`] in one big array map; a free list of chunk ranges bounds the
//! memory, and a table that does not fit is counted and left to frame
//! pointers.
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use agent_ebpf::{
    RowChunk,
    unwind::{
        ExecMapping, FRAME_POINTER_TABLE, MAX_PROCESS_MAPPINGS, ProcessMappings, ROW_CHUNK,
        UnwindRow,
    },
};

use agent_ebpf::unwind::table::{self, TableKind, UnwindTable};

use super::{FileData, UnwindError};

/// Writes to the kernel's unwind maps; tests swap in a fake.
pub trait TableMaps {
    fn write_chunk(&mut self, index: u32, chunk: &RowChunk) -> Result<(), UnwindError>;
    fn set_process(&mut self, tgid: u32, mappings: &ProcessMappings) -> Result<(), UnwindError>;
    fn remove_process(&mut self, tgid: u32) -> Result<(), UnwindError>;
}

/// Which file a table belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FileKey {
    /// [`crate::files::content_id`] of the bytes the table was built from.
    Content(Arc<str>),
    Inode {
        dev: u64,
        inode: u64,
        size: u64,
    },
    Vdso,
}

/// An executable mapping of a process, as the loader needs it.
#[derive(Clone, Debug)]
pub struct MappedFile {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub path: Arc<str>,
    pub dev: u64,
    pub inode: u64,
}

/// Where the bytes of a mapped file come from.
pub trait FileSource {
    /// The file's identity and contents; `None` when it cannot be read
    /// (anonymous memory, gone, not an ELF file).
    fn open(&mut self, pid: u32, mapping: &MappedFile) -> Option<(FileKey, FileData)>;

    /// The identity `open` gave this very file before, if it is known
    /// without reading the file again (unchanged since); `None`: call `open`.
    fn identify(&mut self, _pid: u32, _mapping: &MappedFile) -> Option<FileKey> {
        None
    }
}

/// Figures for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoaderStats {
    /// Tables in the kernel now.
    pub tables: u64,
    /// Rows in the kernel now.
    pub rows: u64,
    /// Bytes of the rows map in use (whole chunks).
    pub bytes_used: u64,
    /// Size of the rows map.
    pub bytes_capacity: u64,
    /// Bytes of executable code the loaded tables describe.
    pub text_bytes: u64,
    /// Processes whose mappings are in the kernel now.
    pub processes: u64,
    /// Tables that did not fit in the rows map.
    pub table_full: u64,
    /// Files whose table could not be built (no CFI, unreadable, other arch).
    pub build_failures: u64,
    /// Mappings left out because a process had more than the kernel keeps.
    pub mappings_dropped: u64,
    /// Processes that did not fit in the kernel's process map.
    pub process_full: u64,
}

struct Loaded {
    /// First chunk, or FRAME_POINTER_TABLE.
    first_chunk: u32,
    chunks: u32,
    rows: u32,
    text_bytes: u64,
    refs: u32,
    /// (file offset, ELF address) of the mappings seen: a process mapping
    /// the file the same way needs no read of it.
    vaddrs: Vec<(u64, u64)>,
}

/// The tables and processes currently in the kernel.
pub struct TableLoader<M: TableMaps> {
    maps: M,
    capacity_chunks: u32,
    /// Free chunk ranges (start, len), sorted by start, never adjacent.
    free: Vec<(u32, u32)>,
    loaded: HashMap<FileKey, Loaded>,
    /// Files that failed, so they are not parsed again and again.
    failed: HashMap<FileKey, ()>,
    /// Per process: the files it uses, a digest of its mappings, when loaded.
    processes: HashMap<u32, (Vec<FileKey>, u64, Instant)>,
    stats: LoaderStats,
}

/// Don't reload a process more often than this.
const MIN_RELOAD_INTERVAL: Duration = Duration::from_millis(200);

impl<M: TableMaps> TableLoader<M> {
    pub fn new(maps: M, capacity_chunks: u32) -> Self {
        TableLoader {
            maps,
            capacity_chunks,
            free: vec![(0, capacity_chunks)],
            loaded: HashMap::new(),
            failed: HashMap::new(),
            processes: HashMap::new(),
            stats: LoaderStats {
                bytes_capacity: capacity_chunks as u64 * size_of::<RowChunk>() as u64,
                ..Default::default()
            },
        }
    }

    pub fn stats(&self) -> LoaderStats {
        self.stats
    }

    /// True when `pid` was loaded with these very mappings less than the
    /// reload interval ago (an exec or dlopen changes them: reload at once).
    pub fn recently_loaded(&self, pid: u32, mappings: &[MappedFile]) -> bool {
        self.processes.get(&pid).is_some_and(|(_, digest, at)| {
            *digest == digest_of(mappings) && at.elapsed() < MIN_RELOAD_INTERVAL
        })
    }

    /// Loads the tables of every mapping of `pid` and tells the kernel where
    /// they are.
    pub fn load_process(
        &mut self,
        pid: u32,
        mappings: &[MappedFile],
        files: &mut dyn FileSource,
    ) -> Result<(), UnwindError> {
        let mut entries = ProcessMappings::default();
        let mut keys = Vec::new();
        let mut sorted: Vec<&MappedFile> = mappings.iter().collect();
        sorted.sort_by_key(|mapping| mapping.start);
        if sorted.len() > MAX_PROCESS_MAPPINGS {
            self.stats.mappings_dropped += (sorted.len() - MAX_PROCESS_MAPPINGS) as u64;
            sorted.truncate(MAX_PROCESS_MAPPINGS);
        }
        for (slot, mapping) in sorted.into_iter().enumerate() {
            let mut entry = ExecMapping {
                start: mapping.start,
                end: mapping.end,
                ..Default::default()
            };
            let known = files.identify(pid, mapping);
            if let Some(key) = &known
                && self.failed.contains_key(key)
            {
                // Known to have no usable table: frame pointers.
            } else if let Some(key) = known
                && let Some((vaddr, loaded)) = self.reuse(&key, mapping.file_offset)
            {
                entry.bias = mapping.start.wrapping_sub(vaddr);
                entry.table_start = loaded.0;
                entry.table_len = loaded.1;
                keys.push(key);
            } else if let Some((key, data)) = files.open(pid, mapping)
                && let Some(vaddr) = table::vaddr_of_offset((*data).as_ref(), mapping.file_offset)
                && let Some(loaded) = self.acquire(&key, (*data).as_ref())
            {
                if let Some(known) = self.loaded.get_mut(&key)
                    && !known.vaddrs.contains(&(mapping.file_offset, vaddr))
                {
                    known.vaddrs.push((mapping.file_offset, vaddr));
                }
                entry.bias = mapping.start.wrapping_sub(vaddr);
                entry.table_start = loaded.0;
                entry.table_len = loaded.1;
                keys.push(key);
            }
            entries.mappings[slot] = entry;
            entries.len = slot as u32 + 1;
        }
        let digest = digest_of(mappings);
        let previous = self.processes.insert(pid, (keys, digest, Instant::now()));
        if let Some((old_keys, _, _)) = previous {
            for key in old_keys {
                self.release(&key);
            }
        }
        self.stats.processes = self.processes.len() as u64;
        match self.maps.set_process(pid, &entries) {
            Ok(()) => Ok(()),
            Err(err) => {
                self.stats.process_full += 1;
                self.forget_process(pid);
                Err(err)
            }
        }
    }

    /// Forgets a process (exited): its tables go when no other process uses them.
    pub fn forget_process(&mut self, pid: u32) {
        if let Some((keys, _, _)) = self.processes.remove(&pid) {
            for key in keys {
                self.release(&key);
            }
            let _ = self.maps.remove_process(pid);
        }
        self.stats.processes = self.processes.len() as u64;
    }

    /// Processes with mappings in the kernel.
    pub fn processes(&self) -> Vec<u32> {
        self.processes.keys().copied().collect()
    }

    /// A loaded table mapped at `file_offset` before: its ELF address there
    /// and placement, taking a reference.
    fn reuse(&mut self, key: &FileKey, file_offset: u64) -> Option<(u64, (u32, u32))> {
        let loaded = self.loaded.get_mut(key)?;
        let &(_, vaddr) = loaded
            .vaddrs
            .iter()
            .find(|(offset, _)| *offset == file_offset)?;
        loaded.refs += 1;
        Some((vaddr, placement(loaded)))
    }

    /// The table's (start, len) in the rows map, loading it if needed.
    fn acquire(&mut self, key: &FileKey, data: &[u8]) -> Option<(u32, u32)> {
        if let Some(loaded) = self.loaded.get_mut(key) {
            loaded.refs += 1;
            return Some(placement(loaded));
        }
        if self.failed.contains_key(key) {
            return None;
        }
        let table = match table::build(data) {
            Ok(table) => table,
            Err(err) => {
                tracing::debug!("no unwind table for {key:?}: {err}");
                self.stats.build_failures += 1;
                self.failed.insert(key.clone(), ());
                return None;
            }
        };
        let loaded = self.store(&table)?;
        let placed = placement(&loaded);
        self.stats.tables += 1;
        self.stats.rows += loaded.rows as u64;
        self.stats.text_bytes += loaded.text_bytes;
        self.stats.bytes_used += loaded.chunks as u64 * size_of::<RowChunk>() as u64;
        self.loaded.insert(key.clone(), loaded);
        Some(placed)
    }

    fn store(&mut self, table: &UnwindTable) -> Option<Loaded> {
        let rows = match &table.kind {
            TableKind::FramePointers => {
                return Some(Loaded {
                    first_chunk: FRAME_POINTER_TABLE,
                    chunks: 0,
                    rows: 0,
                    text_bytes: table.text_bytes,
                    refs: 1,
                    vaddrs: Vec::new(),
                });
            }
            TableKind::Rows(rows) => rows,
        };
        let chunks = rows.len().div_ceil(ROW_CHUNK) as u32;
        let Some(first) = self.allocate(chunks) else {
            self.stats.table_full += 1;
            tracing::debug!("unwind rows map full: {chunks} chunks do not fit");
            return None;
        };
        for (i, part) in rows.chunks(ROW_CHUNK).enumerate() {
            let mut chunk = RowChunk([UnwindRow::default(); ROW_CHUNK]);
            chunk.0[..part.len()].copy_from_slice(part);
            if let Err(err) = self.maps.write_chunk(first + i as u32, &chunk) {
                tracing::debug!("cannot write unwind rows: {err}");
                self.free_range(first, chunks);
                return None;
            }
        }
        Some(Loaded {
            first_chunk: first,
            chunks,
            rows: rows.len() as u32,
            text_bytes: table.text_bytes,
            refs: 1,
            vaddrs: Vec::new(),
        })
    }

    fn release(&mut self, key: &FileKey) {
        let Some(loaded) = self.loaded.get_mut(key) else {
            return;
        };
        loaded.refs -= 1;
        if loaded.refs > 0 {
            return;
        }
        let loaded = self.loaded.remove(key).expect("present above");
        self.stats.tables -= 1;
        self.stats.rows -= loaded.rows as u64;
        self.stats.text_bytes -= loaded.text_bytes;
        self.stats.bytes_used -= loaded.chunks as u64 * size_of::<RowChunk>() as u64;
        if loaded.first_chunk != FRAME_POINTER_TABLE {
            self.free_range(loaded.first_chunk, loaded.chunks);
        }
    }

    /// First fit over the free list.
    fn allocate(&mut self, chunks: u32) -> Option<u32> {
        if chunks == 0 || chunks > self.capacity_chunks {
            return None;
        }
        let index = self.free.iter().position(|&(_, len)| len >= chunks)?;
        let (start, len) = self.free[index];
        if len == chunks {
            self.free.remove(index);
        } else {
            self.free[index] = (start + chunks, len - chunks);
        }
        Some(start)
    }

    fn free_range(&mut self, start: u32, len: u32) {
        let index = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(index, (start, len));
        // Merge with the next, then with the previous range.
        if index + 1 < self.free.len() && start + len == self.free[index + 1].0 {
            self.free[index].1 += self.free[index + 1].1;
            self.free.remove(index + 1);
        }
        if index > 0 && self.free[index - 1].0 + self.free[index - 1].1 == start {
            self.free[index - 1].1 += self.free[index].1;
            self.free.remove(index);
        }
    }

    /// Free chunk ranges (for tests).
    #[cfg(test)]
    fn free_list(&self) -> &[(u32, u32)] {
        &self.free
    }
}

/// Identifies a set of mappings (which files, where).
fn digest_of(mappings: &[MappedFile]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
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
mod tests {
    use super::*;

    #[derive(Default)]
    struct FakeMaps {
        chunks: HashMap<u32, Box<RowChunk>>,
        processes: HashMap<u32, Box<ProcessMappings>>,
    }

    impl TableMaps for &mut FakeMaps {
        fn write_chunk(&mut self, index: u32, chunk: &RowChunk) -> Result<(), UnwindError> {
            self.chunks.insert(index, Box::new(*chunk));
            Ok(())
        }
        fn set_process(&mut self, tgid: u32, m: &ProcessMappings) -> Result<(), UnwindError> {
            self.processes.insert(tgid, Box::new(*m));
            Ok(())
        }
        fn remove_process(&mut self, tgid: u32) -> Result<(), UnwindError> {
            self.processes.remove(&tgid);
            Ok(())
        }
    }

    /// Every mapping is our own executable, under the key its path names.
    struct OwnExe(FileData);

    impl FileSource for OwnExe {
        fn open(&mut self, _pid: u32, mapping: &MappedFile) -> Option<(FileKey, FileData)> {
            Some((
                FileKey::Inode {
                    dev: 0,
                    inode: mapping.inode,
                    size: 0,
                },
                self.0.clone(),
            ))
        }
    }

    fn mapping(inode: u64, start: u64) -> MappedFile {
        MappedFile {
            start,
            end: start + 0x1000,
            file_offset: 0,
            path: "/x".into(),
            dev: 0,
            inode,
        }
    }

    #[test]
    fn tables_are_shared_and_freed_with_their_last_process() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let rows = table::build(&exe).unwrap().rows().len() as u32;
        let exe: FileData = Arc::new(exe);
        let chunks = rows.div_ceil(ROW_CHUNK as u32);
        let mut maps = FakeMaps::default();
        let mut files = OwnExe(exe);
        let mut loader = TableLoader::new(&mut maps, chunks * 3);
        loader
            .load_process(1, &[mapping(10, 0x10000)], &mut files)
            .unwrap();
        loader
            .load_process(2, &[mapping(10, 0x20000), mapping(11, 0x40000)], &mut files)
            .unwrap();
        let stats = loader.stats();
        assert_eq!(
            (stats.tables, stats.rows, stats.processes),
            (2, 2 * rows as u64, 2)
        );
        // A third file does not fit next to two: counted, not loaded.
        loader
            .load_process(3, &[mapping(12, 0x10000)], &mut files)
            .unwrap();
        assert_eq!(loader.stats().table_full, 0, "three tables fit in 3x");
        loader
            .load_process(4, &[mapping(13, 0x10000)], &mut files)
            .unwrap();
        assert_eq!(loader.stats().table_full, 1);
        loader.forget_process(1);
        assert_eq!(loader.stats().tables, 3, "file 10 is still used by pid 2");
        loader.forget_process(2);
        loader.forget_process(3);
        assert_eq!(loader.stats().tables, 0);
        assert_eq!(loader.free_list(), &[(0, chunks * 3)]);
        drop(loader);
        let process = &maps.processes[&4];
        assert_eq!(process.len, 1);
        assert_eq!(process.mappings[0].table_len, 0, "no table: frame pointers");
        assert!(!maps.processes.contains_key(&1));
    }
}
