//! Symbolization: addresses in, source-level function names out.
//!
//! [`Symbolizer`] is shared by every process. A mapped file is found by
//! device and inode (from `/proc/PID/maps`, so a cache hit needs no syscall,
//! even after the process exited), and parsed once per *identity* (GNU
//! build-id, else htlhash, plus size): a hundred containers mapping the same
//! libc share one [`Module`]. Parsed modules and per-address results live in
//! LRU caches bounded by estimated memory.
//!
//! Names come from DWARF (lines and inlined calls, via `addr2line`), the
//! symbol tables (`.symtab`, `.dynsym`, MiniDebugInfo), `.gopclntab` for
//! stripped Go binaries, separate debug files (build-id directories and
//! `.gnu_debuglink`, also in extra debug directories), and perf maps for JIT
//! code. Files are opened through the process's own view
//! (`/proc/PID/map_files/…`, then its root with `RESOLVE_IN_ROOT`), so
//! binaries inside containers and binaries deleted after they were mapped
//! still resolve.
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
mod demangle;
mod dwarf;
mod elf;
mod gopclntab;
mod kallsyms;
mod module;
mod perfmap;
mod rootfs;

use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

pub use buildid::{Note, gnu_build_id, htlhash, htlhash_of_bytes, kernel_build_id, notes};
use cache::SizedLru;
use debuginfo::DebugDirs;
pub use demangle::demangle;
pub use elf::ElfSymbols;
pub use gopclntab::parse as parse_gopclntab;
pub use kallsyms::KernelSymbols;
pub use module::Module;
pub use perfmap::PerfMap;
pub use rootfs::Root;

use crate::model::{BuildIds, Frame, FrameKind, Line, Mapping};

/// How long a file is trusted unchanged before a hit checks it again
/// (reopen + fstat): bounds the cost of noticing a file rewritten in place.
const REVALIDATE_AFTER: Duration = Duration::from_secs(30);
/// How long a file that could not be parsed is left alone.
const RETRY_FAILED_AFTER: Duration = Duration::from_secs(60);
/// How often a process's perf map is checked for new JIT entries.
const PERF_MAP_RECHECK: Duration = Duration::from_secs(1);
/// How often `/proc/kallsyms` may be read again for an address outside the
/// kernel image (a module or BPF program loaded since): a reading takes
/// ~0.1 s of CPU for its ~120 000 lines.
const KALLSYMS_RECHECK: Duration = Duration::from_secs(30);
/// Share of the cache budget for per-address results; the rest is modules.
const RESULTS_SHARE: usize = 8;
/// Index entries (one per device/inode seen) before the index is reset.
const MAX_INDEXED_FILES: usize = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum SymbolizeError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
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
    Dwarf(#[source] gimli::Error),
}

/// Settings of a [`Symbolizer`].
#[derive(Clone, Debug)]
pub struct SymbolizerOptions {
    /// Extra host directories holding debug files (`--debug-dir`), searched
    /// before `/usr/lib/debug`: `.build-id/xx/rest.debug` or debuglink names.
    pub debug_dirs: Vec<PathBuf>,
    /// Memory budget for parsed files and cached results, in bytes.
    pub cache_bytes: usize,
}

impl Default for SymbolizerOptions {
    fn default() -> Self {
        SymbolizerOptions {
            debug_dirs: Vec::new(),
            cache_bytes: 512 << 20,
        }
    }
}

/// Which file: device and inode, as `/proc/PID/maps` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    inode: u64,
}

/// What a file was when we last looked: a change means a rewrite in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime_ns: i128,
}

impl Stamp {
    fn of(metadata: &std::fs::Metadata) -> Self {
        Stamp {
            size: metadata.size(),
            mtime_ns: i128::from(metadata.mtime()) * 1_000_000_000
                + i128::from(metadata.mtime_nsec()),
        }
    }
}

struct FileEntry {
    stamp: Stamp,
    identity: Arc<str>,
    checked_at: Instant,
}

/// A parsed module and the number its cached results are filed under
/// (unique per load, so results of an evicted module are never reused).
#[derive(Clone)]
struct Loaded {
    serial: u64,
    module: Arc<Module>,
}

#[derive(Clone)]
struct PerfEntry {
    map: Arc<PerfMap>,
    checked_at: Instant,
}

struct State {
    files: HashMap<FileKey, FileEntry>,
    failed: HashMap<FileKey, Instant>,
    modules: SizedLru<Arc<str>, Loaded>,
    results: SizedLru<(u64, u64), Arc<[Line]>>,
    perf_maps: SizedLru<u32, PerfEntry>,
    next_serial: u64,
}

/// The kernel's symbols and when they were read.
struct KernelTable {
    symbols: Arc<KernelSymbols>,
    read_at: Instant,
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
    state: Mutex<State>,
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
        let kernel = read_kallsyms();
        if kernel.is_empty() {
            tracing::warn!(
                "/proc/kallsyms hides kernel addresses: run as root or set kernel.kptr_restrict=0"
            );
        }
        let results_budget = options.cache_bytes / RESULTS_SHARE;
        let module_budget = options.cache_bytes - results_budget;
        Symbolizer {
            kernel: Mutex::new(KernelTable {
                symbols: Arc::new(kernel),
                read_at: Instant::now(),
            }),
            kernel_recheck: KALLSYMS_RECHECK,
            kernel_build_id: kernel_build_id(),
            debug_dirs: DebugDirs {
                extra: options.debug_dirs,
            },
            dwarf_limit: module_budget / 2,
            state: Mutex::new(State {
                files: HashMap::new(),
                failed: HashMap::new(),
                modules: SizedLru::new(module_budget),
                results: SizedLru::new(results_budget),
                // JIT maps are small next to DWARF; a slice of the results'
                // budget is plenty.
                perf_maps: SizedLru::new(results_budget / 4),
                next_serial: 0,
            }),
        }
    }

    /// Reads `/proc/kallsyms` again for an address outside the kernel image
    /// when the symbols are older than `every` (default 30 s; each reading
    /// costs ~0.1 s of CPU).
    pub fn with_kernel_recheck(mut self, every: Duration) -> Self {
        self.kernel_recheck = every;
        self
    }

    /// The kernel function containing `address`: `name`, or `name [module]`
    /// in a module or BPF program. Outside the kernel image, the symbols are
    /// read again (at most every 30 s, [`Symbolizer::with_kernel_recheck`])
    /// when they may be older than the module or program holding the address.
    pub fn kernel_symbol(&self, address: u64) -> Option<Line> {
        let symbols = {
            let mut table = self.kernel_table();
            let symbols = table.symbols.clone();
            if symbols.in_image(address) || table.read_at.elapsed() < self.kernel_recheck {
                return symbols.lookup(address);
            }
            // Claimed before reading, so one reading serves every caller.
            table.read_at = Instant::now();
            symbols
        };
        let fresh = Arc::new(read_kallsyms());
        if fresh.is_empty() && !symbols.is_empty() {
            return symbols.lookup(address);
        }
        self.kernel_table().symbols = fresh.clone();
        fresh.lookup(address)
    }

    fn kernel_table(&self) -> std::sync::MutexGuard<'_, KernelTable> {
        // Replaced whole, never left half-updated by a panic.
        self.kernel
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The running kernel's GNU build-id (`/sys/kernel/notes`).
    pub fn kernel_build_id(&self) -> Option<Arc<str>> {
        self.kernel_build_id.clone()
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
        let Some(mapping) = &frame.mapping else {
            if frame.kind == FrameKind::Kernel {
                frame
                    .lines
                    .extend(self.kernel_symbol(frame.address.saturating_sub(back)));
            }
            return;
        };
        if frame.kind == FrameKind::Kernel {
            frame
                .lines
                .extend(self.kernel_symbol(frame.address.saturating_sub(back)));
            return;
        }
        if mapping.inode == 0 {
            // Anonymous executable memory: JIT code, named by a perf map.
            if mapping.path.is_empty()
                && let Some(name) = self.jit_symbol(pid, frame.address.saturating_sub(back))
            {
                frame.lines.push(Line::named(name.clone(), name));
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
            frame.lines.extend(lines.iter().cloned());
            return;
        }
        let lines: Arc<[Line]> = loaded.module.lookup_offset(offset).into();
        let weight = lines.iter().map(line_size).sum::<usize>() + 64;
        self.lock().results.insert(key, lines.clone(), weight);
        frame.lines.extend(lines.iter().cloned());
    }

    /// Build ids of the file behind `mapping` (for OTLP mapping attributes);
    /// `None` for anonymous memory or a file that cannot be read.
    pub fn build_ids(&self, pid: u32, mapping: &Mapping) -> Option<BuildIds> {
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

    /// Loads (or finds cached) the file at host path `path`: for tools and
    /// benchmarks that symbolize files rather than processes.
    pub fn module_for_path(&self, path: &Path) -> Result<Arc<Module>, SymbolizeError> {
        let open_error = |source| SymbolizeError::Open {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(open_error)?;
        let metadata = file.metadata().map_err(open_error)?;
        let key = FileKey {
            dev: metadata.dev(),
            inode: metadata.ino(),
        };
        let path = path.to_string_lossy();
        self.load(key, file, &path, None)
            .map(|loaded| loaded.module)
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

    fn module_for(&self, pid: u32, mapping: &Mapping) -> Option<Loaded> {
        let key = FileKey {
            dev: mapping.dev,
            inode: mapping.inode,
        };
        let cached = {
            let mut state = self.lock();
            let entry = state
                .files
                .get(&key)
                .map(|entry| (entry.identity.clone(), entry.checked_at.elapsed()));
            let cached = entry.and_then(|(identity, age)| {
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
        let root = Root::of_process(pid).ok();
        let file = match open_mapped_file(pid, mapping, root.as_ref()) {
            Ok(file) => file,
            Err(err) => {
                // The process may be gone: a stale module beats none.
                tracing::debug!("pid {pid}: {err}");
                return cached;
            }
        };
        self.load(key, file, &mapping.path, root.as_ref()).ok()
    }

    /// Finds or parses the module for an opened file.
    fn load(
        &self,
        key: FileKey,
        file: File,
        path: &str,
        root: Option<&Root>,
    ) -> Result<Loaded, SymbolizeError> {
        let metadata = file.metadata().map_err(|source| SymbolizeError::Open {
            path: path.to_string(),
            source,
        })?;
        let stamp = Stamp::of(&metadata);
        {
            let mut state = self.lock();
            if let Some(entry) = state.files.get_mut(&key)
                && entry.stamp == stamp
            {
                entry.checked_at = Instant::now();
                let identity = entry.identity.clone();
                if let Some(loaded) = state.modules.get(&identity) {
                    return Ok(loaded);
                }
            }
        }
        // Parse outside the lock: other threads keep symbolizing meanwhile.
        let identity = identify(&file, stamp.size);
        let shared = self.lock().modules.get(&identity);
        if let Some(loaded) = shared {
            self.lock().files.insert(
                key,
                FileEntry {
                    stamp,
                    identity,
                    checked_at: Instant::now(),
                },
            );
            return Ok(loaded);
        }
        let started = Instant::now();
        let module = match Module::load(
            &file,
            stamp.size,
            path,
            root,
            &self.debug_dirs,
            self.dwarf_limit,
        ) {
            Ok(module) => {
                tracing::debug!(
                    "loaded {path} ({} bytes, dwarf: {}) in {:?}",
                    stamp.size,
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
        let mut state = self.lock();
        state.next_serial += 1;
        let loaded = Loaded {
            serial: state.next_serial,
            module,
        };
        let weight = loaded.module.estimated_size();
        state
            .modules
            .insert(identity.clone(), loaded.clone(), weight);
        if state.files.len() >= MAX_INDEXED_FILES {
            state.files.clear();
        }
        state.files.insert(
            key,
            FileEntry {
                stamp,
                identity,
                checked_at: Instant::now(),
            },
        );
        if weight > self.dwarf_limit.saturating_mul(2) {
            // Too heavy to cache even without DWARF (symbol tables alone):
            // use it for this frame, then leave the file alone for a while
            // rather than parse it again on every sample.
            tracing::debug!(
                "{path}: {} MiB of symbols exceed the symbol cache; not cached",
                weight >> 20
            );
            state.failed.insert(key, Instant::now());
        } else {
            state.failed.remove(&key);
        }
        Ok(loaded)
    }

    /// Names JIT code at `address` of `pid` from its perf map.
    fn jit_symbol(&self, pid: u32, address: u64) -> Option<Arc<str>> {
        let cached = self.lock().perf_maps.get(&pid);
        if let Some(entry) = &cached
            && entry.checked_at.elapsed() < PERF_MAP_RECHECK
        {
            return entry.map.lookup(address);
        }
        let map = read_perf_map(pid, cached.map(|entry| entry.map));
        let weight = map.estimated_size();
        let lookup = map.lookup(address);
        self.lock().perf_maps.insert(
            pid,
            PerfEntry {
                map,
                checked_at: Instant::now(),
            },
            weight,
        );
        lookup
    }
}

/// The kernel's symbols, empty (after a warning) when unreadable.
fn read_kallsyms() -> KernelSymbols {
    KernelSymbols::load().unwrap_or_else(|err| {
        tracing::warn!("cannot read /proc/kallsyms ({err}): kernel frames will show as addresses");
        KernelSymbols::default()
    })
}

/// Reads `pid`'s perf map unless `previous` is still current.
fn read_perf_map(pid: u32, previous: Option<Arc<PerfMap>>) -> Arc<PerfMap> {
    let path = format!("/tmp/perf-{}.map", perfmap::namespaced_pid(pid));
    let Some(file) = Root::of_process(pid)
        .ok()
        .and_then(|root| root.open_file(&path).ok())
    else {
        return Arc::default();
    };
    let stamp = file
        .metadata()
        .ok()
        .and_then(|metadata| Some((metadata.modified().ok()?, metadata.len())));
    if let Some(previous) = previous
        && stamp.is_some()
        && previous.stamp == stamp
    {
        return previous;
    }
    let mut map = std::io::read_to_string(file)
        .map(|text| PerfMap::parse(&text))
        .unwrap_or_default();
    map.stamp = stamp;
    Arc::new(map)
}

/// The cache identity of a file: its GNU build-id if it has one, else its
/// htlhash; with the size, so a stripped and an unstripped copy of one build
/// (which symbolize differently) stay apart.
fn identify(file: &File, size: u64) -> Arc<str> {
    let gnu = map_file(file).ok().and_then(|data| {
        let object = object::File::parse(&*data).ok()?;
        buildid::gnu_build_id(&object)
    });
    match gnu {
        Some(id) => format!("gnu:{id}:{size}").into(),
        None => match htlhash(file, size) {
            Ok(hash) => format!("htl:{hash}:{size}").into(),
            // Unreadable: a key that cannot collide with a real identity,
            // and loading will fail the same way.
            Err(_) => format!("unreadable:{size}").into(),
        },
    }
}

fn line_size(line: &Line) -> usize {
    std::mem::size_of::<Line>() + line.function.len() + line.system_name.len()
}

/// Opens the file behind `mapping` as process `pid` sees it.
fn open_mapped_file(
    pid: u32,
    mapping: &Mapping,
    root: Option<&Root>,
) -> Result<File, SymbolizeError> {
    // map_files names the mapped inode itself: right even when the path was
    // deleted or replaced, and inside the process's mount namespace.
    let by_mapping = format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    if let Ok(file) = File::open(&by_mapping) {
        return Ok(file);
    }
    let open_error = |source| SymbolizeError::Open {
        path: format!("/proc/{pid}/root{}", mapping.path),
        source,
    };
    if !mapping.path.starts_with('/') {
        return Err(open_error(std::io::ErrorKind::NotFound.into()));
    }
    let Some(root) = root else {
        // The process is gone: its files are reachable only if the same file
        // (device and inode, as its maps said) is at that path on the host —
        // true for a host process, never wrongly true for a container's.
        let file = File::open(&*mapping.path).map_err(open_error)?;
        let metadata = file.metadata().map_err(open_error)?;
        if metadata.ino() != mapping.inode || metadata.dev() != mapping.dev {
            return Err(open_error(std::io::ErrorKind::NotFound.into()));
        }
        return Ok(file);
    };
    let file = root.open_file(&mapping.path).map_err(open_error)?;
    // The path may now name another file than the one mapped.
    let metadata = file.metadata().map_err(open_error)?;
    if metadata.ino() != mapping.inode {
        return Err(open_error(std::io::ErrorKind::NotFound.into()));
    }
    Ok(file)
}

fn map_file(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only; a file truncated underneath us would
    // fault, which executables in use cannot be (ETXTBSY) and libraries are not
    // in practice. Reading whole multi-hundred-MB binaries would cost more.
    unsafe { memmap2::Mmap::map(file) }
}

#[cfg(test)]
mod tests;
