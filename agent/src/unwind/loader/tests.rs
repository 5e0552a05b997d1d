//! The loader on fake kernel maps: sharing, capacity, backoff and the
//! bounded queues, without a kernel.
use super::*;
use hostprof_common::runtime::tag;

#[derive(Default)]
pub(super) struct FakeMaps {
    pub(super) chunks: HashMap<u32, Box<RowChunk>>,
    pub(super) processes: HashMap<u32, Box<ProcessMappings>>,
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
    fn process(&self, tgid: u32) -> Option<ProcessMappings> {
        self.processes.get(&tgid).map(|mappings| **mappings)
    }
    fn read_chunk(&self, index: u32) -> Option<RowChunk> {
        self.chunks.get(&index).map(|chunk| **chunk)
    }
}

/// Every mapping is our own executable, under the key its inode names;
/// counts the files opened.
pub(super) struct OwnExe(pub(super) FileData, pub(super) usize);

impl FileSource for OwnExe {
    fn open(&mut self, _pid: u32, mapping: &Mapping) -> Option<(FileKey, FileData)> {
        self.1 += 1;
        Some((
            FileKey::Inode {
                dev: 0,
                inode: mapping.inode,
                size: 0,
            },
            self.0.clone(),
        ))
    }

    fn identify(&mut self, _pid: u32, mapping: &Mapping) -> Option<FileKey> {
        Some(FileKey::Inode {
            dev: 0,
            inode: mapping.inode,
            size: 0,
        })
    }
}

fn mapping(inode: u64, start: u64) -> Mapping {
    Mapping {
        start,
        end: start + 0x1000,
        file_offset: 0,
        path: "/x".into(),
        dev: 0,
        inode,
        build_ids: Default::default(),
    }
}

/// No file can be read: every mapping is left to frame pointers.
struct NoFiles;

impl FileSource for NoFiles {
    fn open(&mut self, _pid: u32, _mapping: &Mapping) -> Option<(FileKey, FileData)> {
        None
    }
}

#[test]
fn processes_beyond_capacity_fall_back_and_back_off() {
    let mut maps = FakeMaps::default();
    let mut loader = TableLoader::new(&mut maps, 16).with_process_capacity(2);
    for pid in [1, 2] {
        loader
            .load_process(pid, &[mapping(10, 0x10000)], &mut NoFiles)
            .unwrap();
    }
    assert_eq!(loader.stats().loads, 2);
    // A third process does not fit: counted, then left alone however
    // often its samples ask.
    for _ in 0..100 {
        loader
            .load_process(3, &[mapping(10, 0x10000)], &mut NoFiles)
            .unwrap();
    }
    let stats = loader.stats();
    assert_eq!(
        (stats.loads, stats.process_full, stats.backoff_skips),
        (2, 1, 99)
    );
    assert!(loader.backing_off(3));
    assert!(loader.known_processes().contains(&3), "swept when it exits");
    loader.forget_process(3);
    assert!(!loader.backing_off(3));
    assert!(!loader.known_processes().contains(&3));

    // More mappings than the kernel keeps: file-backed ones first, the
    // rest dropped and counted, and no reload loop.
    let many: Vec<Mapping> = (0..MAX_PROCESS_MAPPINGS as u64 + 10)
        .map(|i| {
            let mut map = mapping(100 + i, 0x100000 + i * 0x2000);
            if i % 20 == 0 {
                map.inode = 0;
                map.path = "".into();
            }
            map
        })
        .collect();
    let anonymous = many.iter().filter(|map| map.inode == 0).count() as u64;
    assert!(anonymous >= 10);
    loader.load_process(2, &many, &mut NoFiles).unwrap();
    loader.load_process(2, &many, &mut NoFiles).unwrap();
    let stats = loader.stats();
    assert_eq!(stats.mappings_dropped, 10);
    assert_eq!(stats.loads, 3, "the second request waits out the backoff");
    drop(loader);
    let kept = &maps.processes[&2];
    assert_eq!(kept.len as usize, MAX_PROCESS_MAPPINGS);
    let kept = &kept.mappings[..MAX_PROCESS_MAPPINGS];
    assert!(kept.windows(2).all(|pair| pair[0].start < pair[1].start));
    let anonymous_kept = many
        .iter()
        .filter(|map| map.inode == 0 && kept.iter().any(|k| k.start == map.start))
        .count() as u64;
    assert_eq!(anonymous_kept, anonymous - 10, "anonymous code goes first");
}

#[test]
fn runtime_code_is_marked_for_its_walker_and_reloads() {
    let mut maps = FakeMaps::default();
    let mut loader = TableLoader::new(&mut maps, 16);
    let mut jit = mapping(0, 0x7000_0000);
    jit.path = "".into();
    let other = mapping(0, 0x7100_0000);
    let file = mapping(10, 0x10000);
    let all = [file.clone(), jit.clone(), other.clone()];
    loader.load_process(1, &all, &mut NoFiles).unwrap();
    assert!(loader.recently_loaded(1, &all));
    // A runtime found since: the same mappings load again, at once.
    loader.set_runtime_code(
        1,
        vec![CodeRange::anonymous(0x7000_0800, 0x7000_1000, tag::HOTSPOT)],
    );
    assert!(!loader.recently_loaded(1, &all));
    loader.load_process(1, &all, &mut NoFiles).unwrap();
    drop(loader);
    let entries = &maps.processes[&1];
    let table_of = |start: u64| {
        entries.mappings[..entries.len as usize]
            .iter()
            .find(|entry| entry.start == start)
            .map(|entry| (entry.table_start, entry.table_len))
    };
    assert_eq!(table_of(jit.start), Some((RUNTIME_TABLE, 0)));
    let jit_entry = entries
        .mappings
        .iter()
        .find(|e| e.start == jit.start)
        .unwrap();
    assert_eq!(
        jit_entry.bias,
        u64::from(tag::HOTSPOT),
        "the runtime's tag, for the kernel to pick its walker"
    );
    assert_eq!(table_of(other.start), Some((0, 0)), "other anonymous code");
    assert_eq!(table_of(file.start), Some((0, 0)), "a file (with no table)");
}

#[test]
fn tables_are_shared_kept_idle_and_evicted_for_room() {
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let rows = table::build(&exe).unwrap().rows().unwrap().to_vec();
    let words = hostprof_unwind::pack(&rows).len() as u32;
    let rows = rows.len() as u32;
    let exe: FileData = Arc::new(exe);
    let chunks = words.div_ceil(ROW_CHUNK as u32);
    let mut maps = FakeMaps::default();
    let mut files = OwnExe(exe, 0);
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
    assert_eq!(files.1, 2, "file 10 is read once for both processes");
    // A fourth file does not fit next to three, all in use: counted, not
    // loaded.
    loader
        .load_process(3, &[mapping(12, 0x10000)], &mut files)
        .unwrap();
    assert_eq!(loader.stats().table_full, 0, "three tables fit in 3x");
    loader
        .load_process(4, &[mapping(13, 0x10000)], &mut files)
        .unwrap();
    assert_eq!(loader.stats().table_full, 1);
    loader.forget_process(1);
    assert_eq!(
        loader.stats().idle_tables,
        0,
        "file 10 is still used by pid 2"
    );
    loader.forget_process(2);
    let stats = loader.stats();
    assert_eq!((stats.tables, stats.idle_tables), (3, 2));

    // The next process mapping file 11 takes its idle table: no read.
    let opened = files.1;
    loader
        .load_process(5, &[mapping(11, 0x10000)], &mut files)
        .unwrap();
    let stats = loader.stats();
    assert_eq!((files.1, stats.tables, stats.idle_tables), (opened, 3, 1));

    // A new file needs room: the idle table (file 10) goes for it.
    loader
        .load_process(6, &[mapping(14, 0x10000)], &mut files)
        .unwrap();
    let stats = loader.stats();
    assert_eq!(
        (
            stats.tables,
            stats.idle_tables,
            stats.evicted,
            stats.table_full
        ),
        (3, 0, 1, 1),
        "file 14 fitted where file 10 was"
    );
    for pid in [3, 5, 6] {
        loader.forget_process(pid);
    }
    assert_eq!(loader.stats().idle_tables, 3);
    // Evicted or idle, every chunk is accounted for.
    while loader.evict_oldest_idle() {}
    assert_eq!(loader.stats().tables, 0);
    assert_eq!(loader.free_list(), &[(0, chunks * 3)]);
    drop(loader);
    let process = &maps.processes[&4];
    assert_eq!(process.len, 1);
    assert_eq!(process.mappings[0].table_len, 0, "no table: frame pointers");
    assert!(!maps.processes.contains_key(&1));
}

#[test]
fn idle_tables_are_bounded_in_number() {
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let words = hostprof_unwind::pack(table::build(&exe).unwrap().rows().unwrap()).len() as u32;
    let chunks = words.div_ceil(ROW_CHUNK as u32);
    let mut maps = FakeMaps::default();
    let mut files = OwnExe(Arc::new(exe), 0);
    // Room for ten tables, but at most two kept idle.
    let mut loader = TableLoader::new(&mut maps, chunks * 10).with_max_idle(2);
    for pid in 0..5 {
        loader
            .load_process(pid, &[mapping(100 + pid as u64, 0x10000)], &mut files)
            .unwrap();
        loader.forget_process(pid);
    }
    let stats = loader.stats();
    assert_eq!((stats.tables, stats.idle_tables, stats.evicted), (2, 2, 3));
    // The two kept are the latest: pid 4's file is reused without a read.
    let opened = files.1;
    loader
        .load_process(9, &[mapping(104, 0x10000)], &mut files)
        .unwrap();
    assert_eq!(files.1, opened);
    assert_eq!(loader.stats().idle_tables, 1);
}

#[test]
fn runtime_code_inside_a_file_is_cut_out_of_its_mapping() {
    let mut text = mapping(10, 0x40_0000);
    text.end = 0x40_0000 + 0x10_0000;
    text.file_offset = 0x1000;
    let blob = CodeRange::in_files(0x44_0000, 0x46_0000, tag::V8);
    let jit = CodeRange::anonymous(0, u64::MAX, tag::V8);
    let mut anonymous = mapping(0, 0x7000_0000);
    anonymous.path = "".into();
    let mut vdso = mapping(0, 0x7100_0000);
    vdso.path = "[vdso]".into();
    let pieces = runtime_pieces(&[text.clone(), anonymous.clone(), vdso], &[blob, jit]);
    let cut: Vec<(u64, u64, u64, Option<CodeUse>)> = pieces
        .iter()
        .map(|piece| {
            let mapping = &piece.mapping;
            (mapping.start, mapping.end, mapping.file_offset, piece.by)
        })
        .collect();
    assert_eq!(
        cut[..4],
        [
            (0x40_0000, 0x44_0000, 0x1000, None),
            (
                0x44_0000,
                0x46_0000,
                0x4_1000,
                Some(CodeUse::Walked(tag::V8))
            ),
            (0x46_0000, 0x50_0000, 0x6_1000, None),
            (
                anonymous.start,
                anonymous.end,
                0,
                Some(CodeUse::Walked(tag::V8))
            ),
        ]
    );
    assert_eq!(pieces.len(), 5);
    assert_eq!(pieces[4].by, None, "the vdso is never a runtime's code");
    assert_eq!(
        pieces.iter().map(|piece| piece.whole).collect::<Vec<_>>(),
        [0, 0, 0, 1, 2],
        "each piece knows the mapping its file is opened by"
    );
}

/// Our own executable under a content id: what the cache keeps.
struct OwnExeByContent(FileData);

impl FileSource for OwnExeByContent {
    fn open(&mut self, _pid: u32, _mapping: &Mapping) -> Option<(FileKey, FileData)> {
        let id = crate::files::content_id((*self.0).as_ref());
        Some((FileKey::Content(id), self.0.clone()))
    }
}

#[test]
fn a_new_loader_takes_the_tables_it_built_before_from_the_cache() {
    use super::super::cache::{CacheOptions, CacheTotals, TableCache};
    let dir = std::env::temp_dir().join(format!("hostprof-loader-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let open = || {
        TableCache::open(CacheOptions {
            dir: dir.clone(),
            max_bytes: 1 << 30,
        })
        .unwrap()
    };
    let exe: FileData = Arc::new(std::fs::read(std::env::current_exe().unwrap()).unwrap());
    let rows_written = |cache: TableCache| {
        let mut maps = FakeMaps::default();
        let mut loader = TableLoader::new(&mut maps, 4096).with_cache(Some(Arc::new(cache)));
        loader
            .load_process(
                1,
                &[mapping(10, 0x10000)],
                &mut OwnExeByContent(exe.clone()),
            )
            .unwrap();
        let totals = loader.cache.as_ref().unwrap().totals();
        assert_eq!(loader.stats().tables, 1);
        drop(loader);
        let mut chunks: Vec<(u32, Box<RowChunk>)> = maps.chunks.into_iter().collect();
        chunks.sort_by_key(|(index, _)| *index);
        (chunks, totals)
    };
    let (built, totals) = rows_written(open());
    assert_eq!(
        totals,
        CacheTotals {
            misses: 1,
            ..Default::default()
        }
    );
    // After a restart: the same rows in the kernel, none built.
    let (cached, totals) = rows_written(open());
    assert_eq!(
        totals,
        CacheTotals {
            hits: 1,
            ..Default::default()
        }
    );
    assert!(!built.is_empty());
    assert!(
        built.len() == cached.len()
            && built
                .iter()
                .zip(&cached)
                .all(|(a, b)| a.0 == b.0 && a.1.0 == b.1.0)
    );
    // A key that names no bytes is never cached.
    let mut maps = FakeMaps::default();
    let mut loader = TableLoader::new(&mut maps, 4096).with_cache(Some(Arc::new(open())));
    let mut files = OwnExe(exe.clone(), 0);
    loader
        .load_process(1, &[mapping(10, 0x10000)], &mut files)
        .unwrap();
    assert_eq!(
        loader.cache.as_ref().unwrap().totals(),
        CacheTotals::default()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// [`crate::unwind::ProcFiles`] reading our own mappings whatever pid the
/// loader asks for.
struct AsOurs(crate::unwind::ProcFiles);

impl FileSource for AsOurs {
    fn open(&mut self, _pid: u32, mapping: &Mapping) -> Option<(FileKey, FileData)> {
        self.0.open(std::process::id(), mapping)
    }

    fn identify(&mut self, _pid: u32, mapping: &Mapping) -> Option<FileKey> {
        self.0.identify(std::process::id(), mapping)
    }

    fn take_built(&mut self, key: &FileKey) -> Option<Result<(UnwindTable, bool), TableError>> {
        self.0.take_built(key)
    }
}

/// `path` mapped into this process, described as `/proc/PID/maps` would.
fn map_file(path: &std::path::Path) -> Mapping {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::open(path).unwrap();
    let meta = file.metadata().unwrap();
    // SAFETY: a fresh private read-only mapping of a file only this test
    // writes (before mapping it); left mapped for the test's life.
    let start = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            meta.len() as usize,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(start, libc::MAP_FAILED);
    Mapping {
        start: start as u64,
        end: start as u64 + meta.len().next_multiple_of(4096),
        file_offset: 0,
        path: path.to_str().unwrap().into(),
        dev: meta.dev(),
        inode: meta.ino(),
        build_ids: Default::default(),
    }
}

/// A process mapping a large file is loaded at once without that file's
/// table; the file is read on its own lane, and a small program's table
/// loads while it is held there; once it is ready, the process that wanted
/// it is asked for again and gets it.
#[test]
fn a_large_file_does_not_hold_up_a_small_programs_table() {
    use crate::unwind::slow::{self, SlowLane};
    use std::sync::{Mutex, mpsc};
    let dir = std::env::temp_dir().join(format!("hostprof-large-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Large: our own executable padded to 48 MiB (an ELF file may end with
    // anything). Small: a system program of a few dozen KiB.
    let large = dir.join("large.so");
    let mut bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    bytes.resize(bytes.len().max(48 << 20), 0);
    std::fs::write(&large, &bytes).unwrap();
    drop(bytes);
    let small = dir.join("true");
    let system = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|path| std::path::Path::new(path).exists())
        .expect("a true program");
    std::fs::copy(system, &small).unwrap();
    let threshold = 4 << 20;
    assert!(std::fs::metadata(&small).unwrap().len() < threshold);
    let (large_map, small_map) = (map_file(&large), map_file(&small));

    // The lane reads nothing until the test lets it.
    let (gate, held) = mpsc::channel::<()>();
    let held = Mutex::new(held);
    let (ready_tx, ready) = mpsc::channel::<Vec<u32>>();
    let lane = SlowLane::spawn(
        threshold,
        false,
        Box::new(move |file| {
            held.lock().unwrap().recv().ok()?;
            slow::read_and_build(file, None)
        }),
        Box::new(move |pids| ready_tx.send(pids.to_vec()).unwrap()),
    )
    .unwrap();
    let mut files = AsOurs(crate::unwind::ProcFiles {
        slow: Some(lane),
        ..Default::default()
    });
    let waiting = |files: &AsOurs| files.0.slow.as_ref().unwrap().waiting();
    let mut maps = FakeMaps::default();
    let mut loader = TableLoader::new(&mut maps, 1 << 16);

    loader
        .load_process(1, std::slice::from_ref(&large_map), &mut files)
        .unwrap();
    assert_eq!(loader.stats().tables, 0, "the large file was read inline");
    assert_eq!(waiting(&files), 1);

    loader
        .load_process(2, std::slice::from_ref(&small_map), &mut files)
        .unwrap();
    assert_eq!(loader.stats().tables, 1, "{:?}", loader.stats());
    assert_eq!(
        waiting(&files),
        1,
        "the small table waited for the large file"
    );
    assert!(ready.try_recv().is_err());

    // A second process mapping the large file joins the wait (as the
    // same pid: AsOurs reads every file as this process).
    loader
        .load_process(3, std::slice::from_ref(&large_map), &mut files)
        .unwrap();
    gate.send(()).unwrap();
    assert_eq!(ready.recv().unwrap(), [std::process::id()]);
    assert_eq!(waiting(&files), 0);
    for pid in [1, 3] {
        loader
            .load_process(pid, std::slice::from_ref(&large_map), &mut files)
            .unwrap();
    }
    let stats = loader.stats();
    assert_eq!(stats.tables, 2, "{stats:?}");
    assert_eq!(stats.build_failures, 0);
    drop(loader);
    for pid in [1, 2, 3] {
        let entry = maps.processes[&pid].mappings[0];
        assert!(entry.table_len > 0, "pid {pid}: {entry:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn maps_read_in_the_middle_of_an_exec_are_not_written() {
    // Between the old image's end and the new one's mapping, the maps
    // hold no code: an empty list in the kernel would stop the new image's
    // samples at their first frame until the next load.
    let mut maps = FakeMaps::default();
    let mut loader = TableLoader::new(&mut maps, 16);
    loader.load_process(1, &[], &mut NoFiles).unwrap();
    assert!(!loader.recently_loaded(1, &[]), "the next ask loads again");
    assert_eq!(loader.stats().loads, 0);
    drop(loader);
    assert!(
        maps.processes.is_empty(),
        "the kernel still copies its stacks"
    );
    let mut loader = TableLoader::new(&mut maps, 16);
    let file = mapping(10, 0x10000);
    loader
        .load_process(1, std::slice::from_ref(&file), &mut NoFiles)
        .unwrap();
    drop(loader);
    assert_eq!(maps.processes[&1].len, 1);
}

/// A process that exec'd while its tables were built.
struct Replaced;

impl FileSource for Replaced {
    fn open(&mut self, _pid: u32, _mapping: &Mapping) -> Option<(FileKey, FileData)> {
        None
    }

    fn still_mapped(&mut self, _pid: u32, _mappings: &[Mapping]) -> bool {
        false
    }
}

#[test]
fn the_old_images_mappings_are_not_written_after_an_exec() {
    let mut maps = FakeMaps::default();
    let mut loader = TableLoader::new(&mut maps, 16);
    let old = [mapping(10, 0x10000)];
    loader.load_process(1, &old, &mut Replaced).unwrap();
    assert!(
        !loader.recently_loaded(1, &old),
        "the new image loads at once"
    );
    drop(loader);
    assert!(
        maps.processes.is_empty(),
        "the kernel still copies its stacks"
    );
}

#[test]
fn a_young_process_but_not_our_own_copies_samples_that_reach_unmapped_code() {
    let mut maps = FakeMaps::default();
    let mut loader = TableLoader::new(&mut maps, 16);
    let ours = std::process::id();
    for pid in [1, ours] {
        loader
            .load_process(pid, &[mapping(10, 0x10000)], &mut NoFiles)
            .unwrap();
    }
    drop(loader);
    assert_eq!(maps.processes[&1].flags, COPY_UNMAPPED);
    assert_eq!(maps.processes[&ours].flags, 0, "our executable is left out");
}

#[test]
fn a_runtimes_marked_code_keeps_its_files_table_and_carries_the_mark() {
    let exe: FileData = Arc::new(std::fs::read(std::env::current_exe().unwrap()).unwrap());
    let mut maps = FakeMaps::default();
    let mut files = OwnExe(exe, 0);
    let mut loader = TableLoader::new(&mut maps, 4096);
    let text = mapping(10, 0x10000);
    let mark = hostprof_common::runtime::mark::CPYTHON;
    loader.set_runtime_code(1, vec![CodeRange::marked(0x10400, 0x10800, mark)]);
    loader.load_process(1, &[text], &mut files).unwrap();
    drop(loader);
    assert_eq!(
        files.1, 1,
        "the file is read once, through its whole mapping"
    );
    let entries = &maps.processes[&1];
    let pieces = &entries.mappings[..entries.len as usize];
    let cuts: Vec<(u64, u64, u32)> = pieces.iter().map(|p| (p.start, p.end, p.mark())).collect();
    assert_eq!(
        cuts,
        [
            (0x10000, 0x10400, 0),
            (0x10400, 0x10800, mark),
            (0x10800, 0x11000, 0)
        ]
    );
    // One table, one bias: the pieces differ only by the mark.
    assert!(pieces[0].rows() > 0);
    assert!(pieces.iter().all(|p| (p.table_start, p.rows(), p.bias)
        == (pieces[0].table_start, pieces[0].rows(), pieces[0].bias)));
    assert_eq!(entries.flags & MARKED, MARKED, "the process says it marks");
}
