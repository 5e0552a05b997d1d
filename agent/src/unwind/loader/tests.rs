//! The loader on fake kernel maps: sharing, capacity, backoff and the
//! bounded queues, without a kernel.
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
    fn open(&mut self, _pid: u32, mapping: &Mapping) -> Option<(FileKey, FileData)> {
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
