//! Unwind tables for the in-kernel unwinder, and replay of recorded stacks
//! through the same unwinder on the host.
//!
//! - `hostprof_unwind::table`: `.eh_frame`/`.debug_frame` → sorted
//!   [`UnwindRow`]s (gimli).
//! - [`TableLoader`]: shares tables between processes in the kernel's maps,
//!   keeps them idle after their last process until their room is needed,
//!   bounds their memory.
//! - [`cache`]: tables built before, on disk by content id, so a restart
//!   does not build them again.
//! - [`spawn_service`]: the thread that loads processes' tables, busiest first, when the
//!   sampler asks for them (its samples say the process is unknown, or an
//!   address is outside its known mappings).
//! - [`replay`]: snapshots (registers + stack bytes + mappings) unwound by
//!   `hostprof_unwind`, the code the eBPF program runs.
//!
//! [`UnwindRow`]: hostprof_unwind::UnwindRow
mod budget;
pub mod cache;
pub mod early;
mod loader;
mod queue;
pub mod replay;
pub(crate) mod slow;

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use aya::maps::MapError;
use hostprof_common::{RowChunk, unwind::ProcessMappings};
use hostprof_unwind::table::{TableError, UnwindTable};

use crate::{files, model::Mapping};
pub use loader::{
    FileKey, FileSource, LoaderStats, TableLoader, TableMaps, capacity_totals, file_totals,
    functions_deferred, sparse_growths,
};
pub use queue::Requests;
use queue::{Closer, Job, MAX_PENDING, Shared};

/// Why a table could not be built or loaded.
#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    #[error(transparent)]
    Table(#[from] hostprof_unwind::table::TableError),
    #[error("cannot update the eBPF map {map}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
}

/// Bytes of a mapped file.
pub type FileData = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// The kernel's unwind maps, taken from the sampler (which defines them:
/// data flows from the sampler to this module, never back).
pub use crate::sampler::UnwindMaps as KernelMaps;

impl TableMaps for KernelMaps {
    fn write_chunk(&mut self, index: u32, chunk: &RowChunk) -> Result<(), UnwindError> {
        self.rows
            .set(index, chunk, 0)
            .map_err(|source| UnwindError::Map {
                map: hostprof_common::MAP_UNWIND_ROWS,
                source,
            })
    }

    fn set_process(&mut self, tgid: u32, mappings: &ProcessMappings) -> Result<(), UnwindError> {
        self.processes
            .insert(tgid, mappings, 0)
            .map_err(|source| UnwindError::Map {
                map: hostprof_common::MAP_PROCESS_MAPPINGS,
                source,
            })
    }

    fn process(&self, tgid: u32) -> Option<ProcessMappings> {
        self.processes.get(&tgid, 0).ok()
    }

    fn read_chunk(&self, index: u32) -> Option<RowChunk> {
        self.rows.get(&index, 0).ok()
    }

    fn remove_process(&mut self, tgid: u32) -> Result<(), UnwindError> {
        self.processes
            .remove(&tgid)
            .map_err(|source| UnwindError::Map {
                map: hostprof_common::MAP_PROCESS_MAPPINGS,
                source,
            })
    }

    /// The map's own size: the sampler sizes it by the processes that can
    /// sample.
    fn process_capacity(&self) -> usize {
        use aya::maps::IterableMap;
        self.processes
            .map()
            .info()
            .map_or(hostprof_common::MAX_UNWIND_PROCESSES, |info| {
                info.max_entries()
            }) as usize
    }
}

/// Files of live processes, read through [`crate::files`]:
/// `/proc/PID/map_files` (right even in containers and for deleted files),
/// else the path inside the process's root; and our own vDSO (the same image
/// in every process of this kernel).
#[derive(Default)]
pub struct ProcFiles {
    vdso: Option<Option<FileData>>,
    /// Where large files are read (none: inline).
    slow: Option<slow::SlowLane>,
    /// Tables the lane built, for the loader right after `open` gave their
    /// file (at most a few: each is taken at once).
    built: HashMap<FileKey, Result<(UnwindTable, bool), TableError>>,
}

impl ProcFiles {
    fn open_file(pid: u32, mapping: &Mapping) -> Option<files::OpenFile> {
        if mapping.inode == 0 || mapping.path.is_empty() || mapping.path.starts_with('[') {
            return None;
        }
        let range = files::MappedRange::from(mapping);
        files::open_mapping(pid, &range, files::Kind::Binary)
            .map_err(|err| tracing::debug!("pid {pid}: {err}"))
            .ok()
    }
}

impl FileSource for ProcFiles {
    fn open(&mut self, pid: u32, mapping: &Mapping) -> Option<(FileKey, FileData)> {
        if &*mapping.path == "[vdso]" {
            let vdso = self.vdso.get_or_insert_with(own_vdso).clone()?;
            return Some((FileKey::Vdso, vdso));
        }
        let file = Self::open_file(pid, mapping)?;
        let file = match &self.slow {
            Some(lane) => match lane.take(pid, file) {
                Ok(Some(built)) => {
                    let slow::Built { key, data, table } = *built;
                    if self.built.len() >= 16 {
                        self.built.clear();
                    }
                    self.built.insert(key.clone(), table);
                    return Some((key, data));
                }
                // On the lane: this process is asked for again when ready.
                Ok(None) => return None,
                Err(small) => small,
            },
            None => file,
        };
        // Read into memory, never mapped: a file truncated underneath cannot
        // fault us, and the table is built from the very bytes hashed.
        let data = file.read_parts(files::Parts::Unwind).ok()?;
        let key = FileKey::Content(data.content_id());
        Some((key, Arc::new(data)))
    }

    fn identify(&mut self, pid: u32, mapping: &Mapping) -> Option<FileKey> {
        if &*mapping.path == "[vdso]" {
            return Some(FileKey::Vdso);
        }
        // Same inode, same size and times (ctime cannot be set back by the
        // file's owner): the same bytes as when hashed, in this run or an
        // earlier one (see files::memo). Even if a tenant rewrote its file
        // without that showing, the key still names a table built from
        // bytes that hash to it; only processes mapping that very inode
        // could get it.
        let file = Self::open_file(pid, mapping)?;
        files::memo::known(file.stat()).map(FileKey::Content)
    }

    fn take_built(&mut self, key: &FileKey) -> Option<Result<(UnwindTable, bool), TableError>> {
        self.built.remove(key)
    }

    fn still_mapped(&mut self, pid: u32, mappings: &[Mapping]) -> bool {
        // Files only: anonymous code (a JIT's) comes and goes, and is not
        // what an exec changes first.
        let Some(now) = process_mappings(pid) else {
            return false;
        };
        let at = |mapping: &Mapping| (mapping.start, mapping.dev, mapping.inode);
        let now: std::collections::HashSet<_> = now.iter().map(at).collect();
        mappings
            .iter()
            .filter(|mapping| mapping.inode != 0)
            .all(|mapping| now.contains(&at(mapping)))
    }
}

/// A copy of this process's vDSO image.
pub(crate) fn own_vdso() -> Option<FileData> {
    Some(Arc::new(crate::files::own_vdso()?))
}

/// The executable mappings of a live process.
pub fn process_mappings(pid: u32) -> Option<Vec<Mapping>> {
    // The same parser as attribution's (procfs's panics on some paths a
    // process can choose).
    let text = std::fs::read(format!("/proc/{pid}/maps")).ok()?;
    let maps = crate::procs::parse_maps(&text).ok()?;
    Some(
        maps.iter()
            // The legacy vsyscall page is above user space.
            .filter(|map| &*map.path != "[vsyscall]")
            .map(|map| Mapping {
                // Anonymous memory, named or not, has no file to read.
                path: if map.inode == 0 && &*map.path != "[vdso]" {
                    "".into()
                } else {
                    map.path.clone()
                },
                ..(**map).clone()
            })
            .collect(),
    )
}

/// How often new content ids are written at most while the service is busy.
const MEMO_SAVE_INTERVAL: Duration = Duration::from_secs(1);

/// How often exited processes are dropped from the kernel.
const SWEEP_INTERVAL: Duration = Duration::from_secs(2);

/// Live figures of the unwind service.
pub type SharedStats = Arc<Mutex<LoaderStats>>;

/// `record`'s and `top`'s table thread's `nice`. A short foreground run's
/// stacks are incomplete until their tables are in, and on a saturated
/// host a thread at nice 0 gets one runnable thread's share of a CPU: the
/// bench's scale row (16 busy binaries on 2 CPUs, other builds beside)
/// had tables in after a median of 4 to 57 s of a 10 s record. At -10 (nine
/// times a nice-0 thread's weight) the same work, milliseconds per small
/// binary, is done first rather than spread over the run. `record` and
/// `top` run all their threads at it (`crate::cli::priority`), the large
/// files' lane (`slow`) included.
pub const FOREGROUND_NICE: i32 = -10;

/// The table thread's own `nice`, in every mode: the highest. At -10,
/// beside 200 busy binaries on 2 CPUs (`cargo xtask bench --only scale
/// --copies 200`), it got a tenth of a CPU (about 1 s of CPU in a 20 s
/// host-wide record, 5 ms a process load) and 15,000 of 20,000 samples
/// were taken before their tables. At -20 (88,761 to a nice-0 thread's
/// 1,024) it gets about half a CPU while it has work. The agent's thread
/// stays within its CPU budget (`budget`) all the same.
pub const TABLES_NICE: i32 = -20;

/// Starts the thread that loads tables for the processes asked for (and
/// `preload` right away, which the returned receiver signals when done); it
/// ends when every [`Requests`] is dropped.
///
/// `background`: the agent, which must take no more than a bounded share
/// of the host's CPU to build tables: the thread runs ahead of the host's
/// busy processes but within a CPU budget (`budget`). `record` and `top`
/// want their tables at once: their thread runs ahead of the host's busy
/// processes (see [`FOREGROUND_NICE`]) for as long as they run. `eager`: ask for a process's
/// tables at its exec (a targeted session, where every exec is wanted).
/// `runtime_code`: where processes' runtime code is (see
/// [`crate::runtime::RuntimeCode`]). `cache`: where built tables are kept
/// on disk (none: built at every start).
pub fn spawn_service(
    maps: KernelMaps,
    capacity_chunks: u32,
    cache: Option<cache::CacheOptions>,
    preload: Vec<u32>,
    background: bool,
    eager: bool,
    runtime_code: crate::runtime::RuntimeCode,
) -> std::io::Result<(
    Requests,
    SharedStats,
    mpsc::Receiver<()>,
    early::SharedMirror,
)> {
    let mut maps = maps;
    let mirror = match maps.rows_reader.take() {
        Some(rows) => early::Mirror::reading(Box::new(move |index| rows.get(&index, 0).ok())),
        None => early::SharedMirror::default(),
    };
    let maps = early::Mirrored {
        inner: maps,
        mirror: mirror.clone(),
    };
    let (preloaded_tx, preloaded) = mpsc::sync_channel(1);
    let (raised_tx, raised) = mpsc::sync_channel(1);
    let stats: SharedStats = Arc::default();
    let published = stats.clone();
    let shared = Arc::new(Shared::default());
    let jobs = shared.clone();
    std::thread::Builder::new()
        .name("hostprof-unwind".into())
        .spawn(move || {
            let budget = background.then(|| budget::CpuBudget::new(budget::SHARE, budget::BURST));
            // SAFETY: setpriority on our own thread id. Without the right to
            // raise it (CAP_SYS_NICE) the call fails: normal priority then.
            unsafe {
                libc::setpriority(
                    libc::PRIO_PROCESS,
                    libc::gettid() as libc::id_t,
                    TABLES_NICE,
                )
            };
            if background {
                // The agent kept it after setup for this alone.
                crate::privileges::drop_nice();
            }
            let _ = raised_tx.send(());
            let cache = cache.and_then(|options| {
                let dir = options.dir.clone();
                let cache = cache::TableCache::open(options)
                    .map_err(|err| {
                        tracing::warn!(
                            "unwind table cache off: cannot use {}: {err}",
                            dir.display()
                        )
                    })
                    .ok()?;
                // Content ids beside the tables, as private: a restart
                // finds a file's table without reading (hashing) the file.
                files::memo::persist(dir.join(cache::MEMO_FILE));
                Some(Arc::new(cache))
            });
            // Targeted sessions are short and want every stack whole from
            // the start: whole tables. The agent and host-wide sessions
            // meet every binary of the host: tables for the code that runs.
            let mut loader = TableLoader::new(maps, capacity_chunks)
                .with_cache(cache.clone())
                .with_sparse(!eager);
            let mut files = ProcFiles::default();
            let asker = jobs.clone();
            let lane = slow::SlowLane::spawn(
                slow::LARGE_FILE,
                background,
                Box::new(move |file| slow::read_and_build(file, cache.as_deref())),
                // Ready: load the processes that wanted it, even if they
                // were loaded a moment ago (without it).
                Box::new(move |pids| {
                    let mut queue = asker.queue();
                    for &pid in pids {
                        if queue.ask(pid) && queue.forced.len() < MAX_PENDING {
                            queue.forced.insert(pid);
                        }
                    }
                    drop(queue);
                    asker.ready.notify_one();
                }),
            );
            match lane {
                Ok(lane) => files.slow = Some(lane),
                Err(err) => tracing::warn!("large files' unwind tables read inline: {err}"),
            }
            let own_exe = std::env::current_exe().unwrap_or_default();
            let mut own_loaded = false;
            let mut load = |loader: &mut TableLoader<early::Mirrored<KernelMaps>>,
                            files: &mut ProcFiles,
                            pid: u32| {
                // Left to frame pointers for now: not even /proc is read.
                if loader.backing_off(pid) {
                    return;
                }
                // Our own samples miss the mapping left out below and ask
                // again and again; our libraries do not change (no dlopen).
                if pid == std::process::id() && std::mem::replace(&mut own_loaded, true) {
                    return;
                }
                let Some(mut mappings) = process_mappings(pid) else {
                    return;
                };
                if pid == std::process::id() {
                    // Our libraries, not our own (large) executable.
                    mappings.retain(|mapping| own_exe.as_path() != Path::new(&*mapping.path));
                }
                loader.set_runtime_code(pid, runtime_code.get(pid));
                let forced = jobs.queue().forced.remove(&pid);
                if !forced && loader.recently_loaded(pid, &mappings) {
                    return;
                }
                let started = Instant::now();
                if let Err(err) = loader.load_process(pid, &mappings, files) {
                    tracing::debug!("pid {pid}: cannot load unwind tables: {err}");
                }
                // An exec while the tables were built: the loader wrote
                // nothing (`FileSource::still_mapped`); the new image now.
                if pid != std::process::id()
                    && let Some(again) = process_mappings(pid)
                    && !loader.recently_loaded(pid, &again)
                    && let Err(err) = loader.load_process(pid, &again, files)
                {
                    tracing::debug!("pid {pid}: cannot load unwind tables: {err}");
                }
                tracing::debug!("pid {pid}: unwind tables loaded in {:?}", started.elapsed());
            };
            // Our own libraries first (libc, ld.so, the vDSO): nearly every
            // process maps them, and they are the largest tables to build.
            load(&mut loader, &mut files, std::process::id());
            for pid in preload {
                load(&mut loader, &mut files, pid);
            }
            publish(&published, loader.stats());
            files::memo::save();
            let _ = preloaded_tx.send(());
            let mut last_sweep = Instant::now();
            let mut last_save = Instant::now();
            loop {
                let job = {
                    let mut queue = jobs.queue();
                    loop {
                        if let Some(job) = queue.next() {
                            break Some(job);
                        }
                        if queue.closed {
                            break None;
                        }
                        let wait = SWEEP_INTERVAL.saturating_sub(last_sweep.elapsed());
                        if wait.is_zero() {
                            break None;
                        }
                        queue = jobs
                            .ready
                            .wait_timeout(queue, wait)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                };
                match job {
                    Some(Job::Forget(pid)) => loader.forget_process(pid),
                    Some(Job::Functions(pid, pcs, stacks)) => {
                        loader.add_functions(pid, &pcs, &stacks, &mut files);
                        // Cheap, but a process can ask for thousands.
                        if let Some(budget) = &budget {
                            budget.pause();
                        }
                    }
                    Some(Job::Load(pid)) => {
                        load(&mut loader, &mut files, pid);
                        if let Some(budget) = &budget {
                            budget.pause();
                        }
                    }
                    None if jobs.queue().closed => {
                        files::memo::save();
                        break;
                    }
                    None => {}
                }
                // New ids on disk once the queue is drained (a `record`
                // may end soon after), or every second while it is not;
                // nothing is written when nothing was hashed.
                if last_save.elapsed() >= MEMO_SAVE_INTERVAL || jobs.queue().loads.is_empty() {
                    files::memo::save();
                    last_save = Instant::now();
                }
                if last_sweep.elapsed() >= SWEEP_INTERVAL {
                    for pid in loader.known_processes() {
                        if !crate::procs::is_alive(pid) {
                            loader.forget_process(pid);
                        }
                    }
                    last_sweep = Instant::now();
                }
                publish(&published, loader.stats());
            }
        })?;
    // Raised (and, in the agent, CAP_SYS_NICE dropped) before the caller
    // goes on: it drops the capability next.
    let _ = raised.recv();
    let requests = Requests {
        _closer: Arc::new(Closer(shared.clone())),
        shared,
        eager,
        stats: stats.clone(),
    };
    Ok((requests, stats, preloaded, mirror))
}

/// Publishes the loader's figures, keeping the count of requests dropped
/// on the way to it.
fn publish(shared: &SharedStats, stats: LoaderStats) {
    let mut published = shared.lock().unwrap_or_else(|e| e.into_inner());
    *published = LoaderStats {
        requests_dropped: published.requests_dropped,
        ..stats
    };
}

#[cfg(test)]
mod tests {
    use super::queue::{Job, MAX_PENDING, Queue};
    use hostprof_unwind::{
        cfa, reg,
        table::{build, plt_expression},
    };

    #[test]
    fn the_busiest_process_is_loaded_first() {
        let mut queue = Queue::default();
        // A short-lived compiler asks first, the hot service after it but
        // with three samples, then one more process with two.
        for pid in [10, 20, 30, 20, 30, 20] {
            assert!(queue.ask(pid));
        }
        queue.forget(99);
        let order: Vec<Job> = std::iter::from_fn(|| queue.next()).collect();
        assert_eq!(
            order,
            [Job::Forget(99), Job::Load(20), Job::Load(30), Job::Load(10)]
        );
        // Equal counts: the longest waiting first.
        for pid in [7, 5, 6] {
            queue.ask(pid);
        }
        let order: Vec<Job> = std::iter::from_fn(|| queue.next()).collect();
        assert_eq!(order, [Job::Load(7), Job::Load(5), Job::Load(6)]);
    }

    #[test]
    fn functions_to_add_come_before_processes_to_load() {
        let mut queue = Queue::default();
        for pid in [1, 2] {
            assert!(queue.ask(pid));
        }
        let stack = |pc: u64| super::early::StackCopy::new([pc, 0x7000, 0, 0], &[1; 16]);
        // The reader asks without a copy, the held copies' walks with one.
        for (pid, pc, copy) in [
            (3, 0x10, None),
            (4, 0x20, None),
            (3, 0x30, Some(stack(1))),
            (3, 0x10, Some(stack(2))),
            (3, 0x10, Some(stack(3))),
        ] {
            assert!(queue.ask_function(pid, pc, copy.as_ref()));
        }
        let order: Vec<Job> = std::iter::from_fn(|| queue.next()).collect();
        assert_eq!(order.len(), 4);
        // One job per process, its addresses once each, in order, and one
        // copy per address.
        let three = Job::Functions(3, vec![0x10, 0x30], vec![stack(1), stack(2)]);
        assert!(order[..2].contains(&three));
        assert!(order[..2].contains(&Job::Functions(4, vec![0x20], vec![])));
        assert_eq!(order[2..], [Job::Load(1), Job::Load(2)]);
    }

    #[test]
    fn functions_asked_for_past_a_requests_caps_are_counted() {
        let mut queue = Queue::default();
        let before = super::functions_deferred();
        let stack = |pc: u64| super::early::StackCopy::new([pc, 0x7000, 0, 0], &[1; 16]);
        // 70 addresses, the first 6 with a copy each: 6 addresses and 2
        // copies past the caps (64 and 4); the same address again, none.
        for pc in 0..70u64 {
            let copy = (pc < 6).then(|| stack(pc));
            assert!(queue.ask_function(5, 0x1000 + pc, copy.as_ref()));
        }
        assert!(queue.ask_function(5, 0x1000, None));
        let deferred = super::functions_deferred() - before;
        assert!(deferred >= 8, "{deferred} counted");
        let Some(Job::Functions(5, pcs, stacks)) = queue.next() else {
            panic!("no job");
        };
        assert_eq!((pcs.len(), stacks.len()), (64, 4));
    }

    #[test]
    fn a_full_queue_still_counts_the_processes_in_it() {
        let mut queue = Queue::default();
        for pid in 0..MAX_PENDING as u32 {
            assert!(queue.ask(pid));
        }
        assert!(!queue.ask(u32::MAX), "a new process past the bound");
        assert!(queue.ask(3), "a process already waiting");
        assert_eq!(queue.next(), Some(Job::Load(3)));
        assert!(queue.ask(u32::MAX), "room again");
    }

    #[test]
    fn recognises_the_binutils_plt_expression() {
        let bytes = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert_eq!(plt_expression(&bytes), Some((8, 11)));
        assert_eq!(plt_expression(&bytes[1..]), None);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn own_executable_has_a_sorted_table_covering_this_function() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let table = build(&exe).unwrap();
        let rows = table.rows().unwrap();
        assert!(rows.len() > 1000, "{} rows", rows.len());
        assert!(rows.windows(2).all(|pair| pair[0].pc < pair[1].pc));
        // The row for this very function says how to find its caller.
        let file = object::File::parse(&*exe).unwrap();
        let here =
            object::ObjectSymbolTable::symbols(&object::Object::symbol_table(&file).unwrap())
                .find(|symbol| {
                    object::ObjectSymbol::name(symbol).is_ok_and(|name| {
                        name.contains("own_executable_has_a_sorted_table_covering_this_function")
                    })
                })
                .map(|symbol| object::ObjectSymbol::address(&symbol))
                .expect("test function symbol");
        let index = rows.partition_point(|row| row.pc as u64 <= here) - 1;
        let row = rows[index];
        assert_eq!(row.cfa_rule, cfa::SP, "{row:?}");
        assert_eq!(
            (row.cfa_offset, row.ra_rule, row.ra_offset),
            (8, reg::AT_CFA, -8)
        );
    }
}
