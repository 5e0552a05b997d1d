//! Symbolization: addresses in, source-level function names out.
//!
//! [`Symbolizer`] is shared by every process. A mapped file is found by
//! device and inode (from `/proc/PID/maps`, so a cache hit needs no syscall,
//! even after the process exited), and parsed once per *identity* (the
//! SHA-256 of its bytes): a hundred containers mapping the same libc share
//! one [`Module`]. Parsed modules and per-address results live in
//! LRU caches bounded by estimated memory.
//!
//! Names come from DWARF (lines and inlined calls, via `addr2line`), the
//! symbol tables (`.symtab`, `.dynsym`, MiniDebugInfo), `.gopclntab` for
//! stripped Go binaries, separate debug files (build-id directories and
//! `.gnu_debuglink`, also in extra debug directories), and perf maps for JIT
//! code. Files are opened through the process's own view
//! (`/proc/PID/map_files/…`, then its root with `RESOLVE_IN_ROOT`), so
//! binaries inside containers and binaries deleted after they were mapped
//! still resolve; every open and read goes through [`crate::files`].
//!
//! Sharing is by content: a module is cached under the SHA-256 of the
//! binary's bytes (plus that of a debug file found inside a container), so a
//! file claiming another's build id never lends or borrows its names.
//!
//! Over 600 lines on purpose: what is cached under which identity, when a
//! file is checked again and when it is too heavy for DWARF is one piece of
//! state behind one lock, kept in one place; parsing (`module.rs`, `elf.rs`,
//! `dwarf.rs`, …), the LRU (`cache.rs`), perf maps and debuginfod live in
//! their own files, and the kernel's names in `kernel.rs`.
//!
//! ```no_run
//! # use hostprof::symbolize::{Symbolizer, SymbolizerOptions};
//! let symbolizer = Symbolizer::with_options(SymbolizerOptions {
//!     debug_dirs: vec!["/srv/debug".into()],
//!     ..SymbolizerOptions::default()
//! });
//! let line = symbolizer.kernel_symbol(0xffffffff81000100);
//! ```
mod buildid;
mod cache;
mod debuginfo;
mod debuginfod;
mod demangle;
mod dwarf;
mod dwz;
mod elf;
mod gopclntab;
mod kallsyms;
mod kernel;
mod module;
mod names;
mod perfmap;
mod split;
mod xz;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

pub use buildid::{Note, gnu_build_id, hex, htlhash, htlhash_of_bytes, kernel_build_id, notes};
use cache::SizedLru;
use debuginfo::DebugDirs;
pub use debuginfod::{Debuginfod, DebuginfodOptions};
pub use demangle::demangle;
pub use elf::ElfSymbols;
pub use gopclntab::parse as parse_gopclntab;
pub use kallsyms::{KernelSymbols, Modules};
use kernel::KernelTable;
pub use module::Module;
use perfmap::PerfEntry;
pub use perfmap::PerfMap;

use crate::{
    files::{self, FileError, Kind, MappedRange, OpenFile, Root},
    model::{BuildIds, Frame, FrameKind, Line, Mapping},
};

/// How long a file is trusted unchanged before a hit checks it again
/// (reopen + fstat): bounds the cost of noticing a file rewritten in place.
const REVALIDATE_AFTER: Duration = Duration::from_secs(30);
/// How long a file that could not be parsed is left alone.
const RETRY_FAILED_AFTER: Duration = Duration::from_secs(60);
/// How long a process's root is taken as known: a process that chroots,
/// or a pid reused by another container, may keep the names of its old
/// root's debug files that long.
const ROOT_RECHECK: Duration = Duration::from_secs(1);
/// How often `/proc/kallsyms` may be read again for an address outside the
/// kernel image (a module or BPF program loaded since): a reading takes
/// ~0.1 s of CPU for its ~120 000 lines.
const KALLSYMS_RECHECK: Duration = Duration::from_secs(30);
/// Modules and results no frame used for this long go (see
/// [`Symbolizer::release_idle`]): between one and two of these after
/// their last use.
pub const IDLE_PERIOD: Duration = Duration::from_secs(60);
/// Share of the cache budget for per-address results; the rest is modules.
const RESULTS_SHARE: usize = 8;
/// Index entries (one per device/inode seen) before the index is reset.
const MAX_INDEXED_FILES: usize = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum SymbolizeError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("not a readable ELF file: {0}")]
    Parse(#[source] object::Error),
    #[error("cannot read section {name}: {source}")]
    Section {
        name: &'static str,
        #[source]
        source: object::Error,
    },
    #[error(
        "section {name} claims {claimed} bytes uncompressed from {compressed}: corrupt, ignored"
    )]
    SectionTooLarge {
        name: &'static str,
        claimed: u64,
        compressed: usize,
    },
    #[error(
        "DWARF would take ~{} MiB, more than the {} MiB a file may use in the symbol cache",
        estimate >> 20,
        limit >> 20
    )]
    DwarfTooLarge { estimate: usize, limit: usize },
    #[error("malformed DWARF: {0}")]
    Dwarf(#[from] gimli::Error),
}

/// Settings of a [`Symbolizer`].
#[derive(Clone, Debug)]
pub struct SymbolizerOptions {
    /// Extra host directories holding debug files (`--debug-dir`), searched
    /// before `/usr/lib/debug`: `.build-id/xx/rest.debug` or debuglink names.
    pub debug_dirs: Vec<PathBuf>,
    /// Memory budget for parsed files and cached results, in bytes.
    pub cache_bytes: usize,
    /// Fetch debug files the host lacks from debuginfod servers; `None`
    /// (off) by default.
    pub debuginfod: Option<DebuginfodOptions>,
}

impl Default for SymbolizerOptions {
    fn default() -> Self {
        SymbolizerOptions {
            debug_dirs: Vec::new(),
            cache_bytes: 512 << 20,
            debuginfod: None,
        }
    }
}

/// Which file: device and inode, as `/proc/PID/maps` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    inode: u64,
}

/// What a file was when we last looked: a change means a rewrite in place
/// (ctime moves on every write, and its owner cannot set it back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(stat: &files::Stat) -> Self {
        Stamp {
            size: stat.size,
            mtime_ns: stat.mtime_ns,
            ctime_ns: stat.ctime_ns,
        }
    }
}

/// A process's root directory (device, inode): which container it is in.
type RootId = (u64, u64);

struct FileEntry {
    stamp: Stamp,
    identity: Arc<str>,
    checked_at: Instant,
    /// Set when the module's names came partly from a debug file inside a
    /// process's root: valid only for processes with that root.
    root: Option<RootId>,
}

/// A parsed module and the number its cached results are filed under
/// (unique per load, so results of an evicted module are never reused).
#[derive(Clone)]
struct Loaded {
    serial: u64,
    module: Arc<Module>,
}

struct State {
    files: HashMap<FileKey, FileEntry>,
    failed: HashMap<FileKey, Instant>,
    modules: SizedLru<Arc<str>, Loaded>,
    results: SizedLru<(u64, u64), Arc<[Line]>>,
    perf_maps: SizedLru<u32, PerfEntry>,
    next_serial: u64,
    /// Files loaded without DWARF whose debug file was asked of debuginfod,
    /// by build id: forgotten when it arrives, so they load again with it.
    awaiting_debuginfo: HashMap<Arc<str>, Vec<(FileKey, Arc<str>)>>,
    /// Each process's root as last seen, and when: a `stat` of
    /// `/proc/PID/root` for every frame was 5 % of record's CPU.
    roots: HashMap<u32, (Option<RootId>, Instant)>,
    /// When modules and results unused for a while were last let go.
    released_at: Instant,
}

impl State {
    /// `pid`'s root, seen at most [`ROOT_RECHECK`] ago.
    fn root_of(&mut self, pid: u32) -> Option<RootId> {
        if let Some((root, at)) = self.roots.get(&pid)
            && at.elapsed() < ROOT_RECHECK
        {
            return *root;
        }
        if self.roots.len() >= MAX_INDEXED_FILES {
            self.roots.clear();
        }
        let root = root_id(pid);
        self.roots.insert(pid, (root, Instant::now()));
        root
    }
}

/// Resolves kernel and user addresses to function names.
pub struct Symbolizer {
    kernel: Mutex<KernelTable>,
    /// How old the kernel's symbols may be for an address outside its image.
    kernel_recheck: Duration,
    kernel_build_id: Option<Arc<str>>,
    debug_dirs: DebugDirs,
    /// Most bytes one file's DWARF may take: half the modules' budget, so
    /// one huge binary cannot evict everything else (or never fit).
    dwarf_limit: usize,
    debuginfod: Option<Debuginfod>,
    /// Our own vDSO and its size, parsed on first use: the kernel maps the
    /// same image into every process of our ABI, so it names theirs.
    vdso: std::sync::OnceLock<Option<(Arc<Module>, u64)>>,
    state: Mutex<State>,
    /// Raised whenever names given before may have changed (a debug file
    /// arrived): see [`Symbolizer::generation`].
    generation: std::sync::atomic::AtomicU64,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// Loads kernel symbols with default options; user files are read lazily.
    pub fn new() -> Self {
        Self::with_options(SymbolizerOptions::default())
    }

    /// Loads kernel symbols; user files are read lazily.
    pub fn with_options(options: SymbolizerOptions) -> Self {
        let debuginfod = options.debuginfod.map(Debuginfod::start);
        let mut debug_dirs = options.debug_dirs;
        // Fetched files are found like any other, after the user's.
        debug_dirs.extend(debuginfod.as_ref().map(|d| d.cache_dir().to_path_buf()));
        let results_budget = options.cache_bytes / RESULTS_SHARE;
        let module_budget = options.cache_bytes - results_budget;
        Symbolizer {
            kernel: Mutex::new(KernelTable::read()),
            kernel_recheck: KALLSYMS_RECHECK,
            kernel_build_id: kernel_build_id(),
            debug_dirs: DebugDirs { extra: debug_dirs },
            dwarf_limit: module_budget / 2,
            debuginfod,
            vdso: std::sync::OnceLock::new(),
            state: Mutex::new(State {
                files: HashMap::new(),
                failed: HashMap::new(),
                modules: SizedLru::new(module_budget),
                results: SizedLru::new(results_budget),
                // JIT maps are small next to DWARF; a slice of the results'
                // budget is plenty.
                perf_maps: SizedLru::new(results_budget / 4),
                next_serial: 0,
                awaiting_debuginfo: HashMap::new(),
                roots: HashMap::new(),
                released_at: Instant::now(),
            }),
            generation: Default::default(),
        }
    }

    /// A number that changes when names given before may no longer be the
    /// ones [`Symbolizer::symbolize`] would give (a debug file arrived from
    /// debuginfod): whoever keeps names starts over then.
    pub fn generation(&self) -> u64 {
        self.take_debuginfod_arrivals();
        self.generation.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Fills `frame.lines` for a kernel or user frame; leaves them empty when
    /// the address cannot be named (the frame keeps mapping and offset).
    /// Frames of Go binaries become [`FrameKind::Go`].
    ///
    /// `return_address`: the frame is a caller's (not the leaf), so its address
    /// points after the call; look up the byte before it, or a call that ends a
    /// function would be named after the next one.
    pub fn symbolize(&self, pid: u32, frame: &mut Frame, return_address: bool) {
        let back = u64::from(return_address);
        if frame.kind == FrameKind::Kernel {
            let lines: Vec<Line> = self
                .kernel_symbol(frame.address.saturating_sub(back))
                .into_iter()
                .collect();
            if !lines.is_empty() {
                frame.lines = lines.into();
            }
            return;
        }
        let Some(mapping) = &frame.mapping else {
            return;
        };
        if let Some(vdso) = self.vdso_for(mapping) {
            let offset = frame.file_offset.saturating_sub(back);
            frame.lines = vdso.lookup_offset(offset).into();
            return;
        }
        if mapping.inode == 0 {
            // Anonymous executable memory: JIT code, named by a perf map.
            if mapping.path.is_empty()
                && let Some(name) = self.jit_symbol(pid, frame.address.saturating_sub(back))
            {
                frame.lines = Arc::new([Line::named(name.clone(), name)]);
            }
            return;
        }
        let Some(loaded) = self.module_for(pid, mapping) else {
            return;
        };
        if loaded.module.is_go() {
            frame.kind = FrameKind::Go;
        }
        let offset = frame.file_offset.saturating_sub(back);
        let key = (loaded.serial, offset);
        let hit = self.lock().results.get(&key);
        if let Some(lines) = hit {
            frame.lines = lines;
            return;
        }
        let lines: Arc<[Line]> = loaded.module.lookup_offset(offset).into();
        let weight = lines.iter().map(line_size).sum::<usize>() + 64;
        self.lock().results.insert(key, lines.clone(), weight);
        frame.lines = lines;
    }

    /// Build ids of the file behind `mapping` (for OTLP mapping attributes);
    /// `None` for anonymous memory or a file that cannot be read.
    pub fn build_ids(&self, pid: u32, mapping: &Mapping) -> Option<BuildIds> {
        if let Some(vdso) = self.vdso_for(mapping) {
            return Some(vdso.build_ids().clone());
        }
        if mapping.inode == 0 {
            return None;
        }
        Some(self.module_for(pid, mapping)?.module.build_ids().clone())
    }

    /// The build ids of `mapping`'s file if it is already loaded; never reads
    /// a file (for a hurried shutdown).
    pub fn cached_build_ids(&self, mapping: &Mapping) -> Option<BuildIds> {
        let key = FileKey {
            dev: mapping.dev,
            inode: mapping.inode,
        };
        let mut state = self.lock();
        let identity = state.files.get(&key)?.identity.clone();
        let loaded = state.modules.get(&identity)?;
        Some(loaded.module.build_ids().clone())
    }

    /// The vDSO image that names `mapping` when it is a process's `[vdso]`:
    /// ours, when it is the same size (a 32-bit process maps another image,
    /// which ours would misname).
    fn vdso_for(&self, mapping: &Mapping) -> Option<Arc<Module>> {
        if mapping.inode != 0 || &*mapping.path != "[vdso]" {
            return None;
        }
        let (vdso, size) = self
            .vdso
            .get_or_init(|| {
                let image = files::own_vdso()?;
                let module = Module::from_bytes(&image, &[]).ok()?;
                Some((Arc::new(module), image.len() as u64))
            })
            .clone()?;
        (mapping.end.saturating_sub(mapping.start) == size).then_some(vdso)
    }

    /// Loads (or finds cached) the file at host path `path`: for tools and
    /// benchmarks that symbolize files rather than processes.
    pub fn module_for_path(&self, path: &Path) -> Result<Arc<Module>, SymbolizeError> {
        self.take_debuginfod_arrivals();
        let shown = path.to_string_lossy();
        let file = files::open_host(&shown, Kind::Binary)?;
        let key = FileKey {
            dev: file.stat().dev,
            inode: file.stat().inode,
        };
        // The host is the root: debug, dwz and split DWARF files named
        // relative to the binary are found beside it.
        let root = Root::host().ok();
        self.load(key, file, &shown, root.as_ref())
            .map(|loaded| loaded.module)
    }

    /// Lets go of the modules and results no frame used for `period` (each
    /// goes one to two periods after its last use), at most once a period:
    /// a node's agent that met a hundred short-lived binaries keeps none
    /// of them for ever, while its services' stay. Returns the modules let
    /// go.
    pub fn release_idle(&self, period: Duration) -> usize {
        let released = {
            let mut state = self.lock();
            if state.released_at.elapsed() < period {
                return 0;
            }
            state.released_at = Instant::now();
            state.results.release_unused();
            state.modules.release_unused()
        };
        if released > 0 {
            give_back_freed_memory();
        }
        released
    }

    /// Estimated bytes held by the caches (modules, results).
    pub fn cache_usage(&self) -> (usize, usize) {
        let state = self.lock();
        (state.modules.used(), state.results.used())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves caches that are
        // still consistent (every update is a single insert), so keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until debuginfod fetches are done, at most `limit` (before
    /// writing a profile; tests). True when none is left.
    pub fn wait_for_debuginfod(&self, limit: Duration) -> bool {
        self.debuginfod
            .as_ref()
            .is_none_or(|debuginfod| debuginfod.wait_settled(limit))
    }

    /// Forgets files whose debug file debuginfod just delivered.
    fn take_debuginfod_arrivals(&self) {
        let Some(debuginfod) = &self.debuginfod else {
            return;
        };
        let arrived = debuginfod.take_arrivals();
        if arrived.is_empty() {
            return;
        }
        let mut state = self.lock();
        for id in arrived {
            for (key, identity) in state.awaiting_debuginfo.remove(&*id).unwrap_or_default() {
                state.files.remove(&key);
                state.failed.remove(&key);
                state.modules.remove(&identity);
            }
        }
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn module_for(&self, pid: u32, mapping: &Mapping) -> Option<Loaded> {
        self.take_debuginfod_arrivals();
        let key = FileKey {
            dev: mapping.dev,
            inode: mapping.inode,
        };
        let cached = {
            let mut state = self.lock();
            let entry = state.files.get(&key).map(|entry| {
                (
                    entry.identity.clone(),
                    entry.checked_at.elapsed(),
                    entry.root,
                )
            });
            let cached = entry.and_then(|(identity, age, root)| {
                // Names from a debug file in another container's root are
                // not this process's.
                if root.is_some() && root != state.root_of(pid) {
                    return None;
                }
                let loaded = state.modules.get(&identity)?;
                Some((loaded, age))
            });
            match cached {
                // The hot path: no syscall at all.
                Some((loaded, age)) if age < REVALIDATE_AFTER => return Some(loaded),
                Some((loaded, _)) => Some(loaded),
                None => {
                    let recently_failed = state
                        .failed
                        .get(&key)
                        .is_some_and(|at| at.elapsed() < RETRY_FAILED_AFTER);
                    if recently_failed {
                        return None;
                    }
                    None
                }
            }
        };
        let range = MappedRange::from(mapping);
        let file = match files::open_mapping(pid, &range, Kind::Binary) {
            Ok(file) => file,
            Err(err) => {
                // The process may be gone: a stale module beats none.
                tracing::debug!("pid {pid}: {err}");
                return cached;
            }
        };
        let root = Root::of_process(pid).ok();
        self.load(key, file, &mapping.path, root.as_ref()).ok()
    }

    /// Finds or parses the module for an opened file.
    fn load(
        &self,
        key: FileKey,
        file: OpenFile,
        path: &str,
        root: Option<&Root>,
    ) -> Result<Loaded, SymbolizeError> {
        let stamp = Stamp::of(file.stat());
        let root_id = root.and_then(|root| root.id().ok());
        {
            let mut state = self.lock();
            if let Some(entry) = state.files.get_mut(&key)
                && entry.stamp == stamp
                && (entry.root.is_none() || entry.root == root_id)
            {
                entry.checked_at = Instant::now();
                let identity = entry.identity.clone();
                if let Some(loaded) = state.modules.get(&identity) {
                    return Ok(loaded);
                }
            }
        }
        // Read and parse outside the lock: other threads keep symbolizing.
        // The bytes are a private copy: a file truncated meanwhile cannot
        // fault us, and what is shared is keyed by what was read. Code and
        // data are not kept (names never come from them).
        let data = file.read_parts(files::Parts::Names {
            dwarf: files::DwarfLimit {
                is_needed: dwarf::is_needed,
                limit: self.dwarf_limit as u64,
            },
        })?;
        let content = data.content_id();
        let shared = self.lock().modules.get(&content);
        if let Some(loaded) = shared {
            self.index(key, stamp, content, None);
            return Ok(loaded);
        }
        let started = Instant::now();
        let module = match Module::load(&data, path, root, &self.debug_dirs, self.dwarf_limit) {
            Ok(module) => {
                tracing::debug!(
                    "loaded {path} ({} bytes, dwarf: {}) in {:?}",
                    data.len(),
                    module.has_dwarf(),
                    started.elapsed()
                );
                Arc::new(module)
            }
            Err(err) => {
                let mut state = self.lock();
                if state.failed.len() >= MAX_INDEXED_FILES {
                    state.failed.clear();
                }
                state.failed.insert(key, Instant::now());
                return Err(err);
            }
        };
        drop(data);
        // Names that came from a debug file inside this process's root are
        // shared only with the same binary *and* debug file, and indexed for
        // this root only.
        let (identity, entry_root) = match module.debug_file() {
            Some(debug) if debug.in_root => (
                Arc::from(format!("{content}+debug:{}", debug.content)),
                Some(root_id.unwrap_or_default()),
            ),
            _ => (content, None),
        };
        let mut state = self.lock();
        let loaded = match state.modules.get(&identity) {
            Some(loaded) => loaded,
            None => {
                state.next_serial += 1;
                let loaded = Loaded {
                    serial: state.next_serial,
                    module,
                };
                let weight = loaded.module.estimated_size();
                state
                    .modules
                    .insert(identity.clone(), loaded.clone(), weight);
                if weight > self.dwarf_limit.saturating_mul(2) {
                    // Too heavy to cache even without DWARF (symbol tables
                    // alone): use it for this frame, then leave the file
                    // alone for a while rather than parse it again on every
                    // sample.
                    tracing::debug!(
                        "{path}: {} MiB of symbols exceed the symbol cache; not cached",
                        weight >> 20
                    );
                    state.failed.insert(key, Instant::now());
                    drop(state);
                    self.index(key, stamp, identity, entry_root);
                    return Ok(loaded);
                }
                loaded
            }
        };
        state.failed.remove(&key);
        if let Some(debuginfod) = &self.debuginfod
            && !loaded.module.has_dwarf()
            && let Some(id) = &loaded.module.build_ids().gnu
        {
            debuginfod.request(id);
            state
                .awaiting_debuginfo
                .entry(id.clone())
                .or_default()
                .push((key, identity.clone()));
        }
        drop(state);
        self.index(key, stamp, identity, entry_root);
        Ok(loaded)
    }

    /// Remembers which module the file `key` holds.
    fn index(&self, key: FileKey, stamp: Stamp, identity: Arc<str>, root: Option<RootId>) {
        let mut state = self.lock();
        if state.files.len() >= MAX_INDEXED_FILES {
            state.files.clear();
        }
        state.files.insert(
            key,
            FileEntry {
                stamp,
                identity,
                checked_at: Instant::now(),
                root,
            },
        );
    }
}

/// Returns the memory free in the allocator's heaps to the system: glibc
/// keeps a freed module's smaller blocks (its DWARF units, its names)
/// in its arenas otherwise, and the agent's resident memory would not
/// fall when it lets modules go.
fn give_back_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: no arguments beyond the padding to keep; glibc takes its
    // arenas' locks itself.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The root directory of `pid`, as (device, inode).
fn root_id(pid: u32) -> Option<RootId> {
    let stat = rustix::fs::stat(format!("/proc/{pid}/root")).ok()?;
    Some((stat.st_dev, stat.st_ino))
}

fn line_size(line: &Line) -> usize {
    std::mem::size_of::<Line>() + line.function.len() + line.system_name.len()
}

#[cfg(test)]
mod tests;
