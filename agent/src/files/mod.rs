//! The one way hostprof reads a file on behalf of a process: binaries and
//! libraries it maps (symbols, unwind tables, build ids), their separate debug
//! files, its perf map.
//!
//! Every such file is chosen by whoever controls the process, so every open
//! here is built not to trust it:
//!
//! - **No escape**: paths are resolved by `openat2(RESOLVE_IN_ROOT |
//!   RESOLVE_NO_MAGICLINKS)` under the process's root (`/proc/PID/root`),
//!   so absolute symlinks and `..` stay inside a container, and magic links
//!   (`/proc/self/root/...`) are refused; a mapped file is opened through
//!   `/proc/PID/map_files/START-END`, the very inode the process maps.
//! - **No blocking, no device**: the path is opened `O_PATH` (which never
//!   calls a driver's or a FIFO's open), `fstat`ed, and only a regular file is
//!   reopened for reading (`O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC`).
//!   A FIFO, a device (`/dev/zero`), a socket or a directory is refused.
//! - **Bounded**: each [`Kind`] has a size cap, checked against `fstat` and
//!   again while reading, so a file growing underneath cannot exceed it.
//! - **No SIGBUS**: contents are read into memory, never `mmap`ed: a file
//!   truncated while it is read gives fewer bytes, not a fault.
//! - **Only what is used**: binaries are read into an image that holds only
//!   the sections a job reads ([`Parts`]), so memory follows symbol and
//!   unwind data, not code size.
//!
//! Refusals are counted ([`refusals`]) and logged at debug level.
//!
//! What is shared between processes is keyed by [`content_id`], a SHA-256 of
//! the bytes read, never by a build id a file merely claims.
pub mod memo;
mod read;
mod root;
mod sparse;

use std::{
    io,
    sync::atomic::{AtomicU64, Ordering},
};

pub use read::FileData;
pub use root::Root;
use rustix::fs::{FileType, Stat as RawStat};
use sha2::{Digest, Sha256};
pub use sparse::{DwarfLimit, DynamicImage, Parts, SPARSE_FROM};

/// What a file is read for; each kind has its own size cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An executable or library a process maps (symbols, unwind tables).
    Binary,
    /// A separate debug file (`.build-id/xx/….debug`, `.gnu_debuglink`).
    DebugFile,
    /// A JIT's perf map (`/tmp/perf-PID.map`).
    PerfMap,
}

/// Largest binary read: 512 MiB (the largest common binaries, browsers and
/// LLVM with symbols, are 150 to 300 MiB).
pub const MAX_BINARY_BYTES: u64 = 512 << 20;
/// Largest debug file read: 1 GiB (debug files hold all of DWARF, of which
/// only some sections are kept, within the symbol cache's own limit).
pub const MAX_DEBUG_FILE_BYTES: u64 = 1 << 30;
/// Largest perf map read: 64 MiB, about 600 000 JIT functions.
pub const MAX_PERF_MAP_BYTES: u64 = 64 << 20;

impl Kind {
    /// The most bytes a file of this kind may have.
    pub const fn max_bytes(self) -> u64 {
        match self {
            Kind::Binary => MAX_BINARY_BYTES,
            Kind::DebugFile => MAX_DEBUG_FILE_BYTES,
            Kind::PerfMap => MAX_PERF_MAP_BYTES,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Binary => "binary",
            Kind::DebugFile => "debug file",
            Kind::PerfMap => "perf map",
        }
    }
}

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("refused {path}: a {what}, not a regular file")]
    NotRegular { path: String, what: &'static str },
    #[error("refused {path}: {size} bytes, more than the {limit} a {kind} may have")]
    TooLarge {
        path: String,
        size: u64,
        limit: u64,
        kind: &'static str,
    },
    #[error("refused {path}: resolving it goes through a magic link or a symlink loop")]
    Escape { path: String },
    #[error("{path} is no longer the file the process mapped")]
    Replaced { path: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl FileError {
    /// True when the file was refused (not merely missing or unreadable).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            FileError::NotRegular { .. } | FileError::TooLarge { .. } | FileError::Escape { .. }
        )
    }
}

/// Files refused since the agent started, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusals {
    /// FIFOs, devices, sockets, directories.
    pub not_regular: u64,
    /// Larger than their kind's cap.
    pub too_large: u64,
    /// Paths through a magic link (`/proc/PID/root`, `/proc/PID/fd/N`) or
    /// a symlink loop.
    pub escape: u64,
}

impl Refusals {
    pub fn total(&self) -> u64 {
        self.not_regular + self.too_large + self.escape
    }
}

static REFUSED_NOT_REGULAR: AtomicU64 = AtomicU64::new(0);
static REFUSED_TOO_LARGE: AtomicU64 = AtomicU64::new(0);
static REFUSED_ESCAPE: AtomicU64 = AtomicU64::new(0);

/// Files refused since the agent started.
pub fn refusals() -> Refusals {
    Refusals {
        not_regular: REFUSED_NOT_REGULAR.load(Ordering::Relaxed),
        too_large: REFUSED_TOO_LARGE.load(Ordering::Relaxed),
        escape: REFUSED_ESCAPE.load(Ordering::Relaxed),
    }
}

/// Counts and logs a refusal; passes the error on.
fn refused(error: FileError) -> FileError {
    let counter = match &error {
        FileError::NotRegular { .. } => &REFUSED_NOT_REGULAR,
        FileError::TooLarge { .. } => &REFUSED_TOO_LARGE,
        FileError::Escape { .. } => &REFUSED_ESCAPE,
        _ => return error,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    tracing::debug!("{error}");
    error
}

/// What `fstat` said of an opened file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stat {
    pub dev: u64,
    pub inode: u64,
    pub size: u64,
    pub mtime_ns: i128,
    /// Change time: set by the kernel on every write or attribute change,
    /// and, unlike mtime, not settable by the file's owner.
    pub ctime_ns: i128,
}

impl Stat {
    /// What `fstat` says of `file` now.
    fn now(file: &std::fs::File) -> Option<Self> {
        rustix::fs::fstat(file).ok().map(|raw| Self::of(&raw))
    }

    fn of(raw: &RawStat) -> Self {
        let ns = |sec: i64, nsec: i64| i128::from(sec) * 1_000_000_000 + i128::from(nsec);
        Stat {
            dev: raw.st_dev,
            inode: raw.st_ino,
            size: raw.st_size.max(0) as u64,
            mtime_ns: ns(raw.st_mtime, raw.st_mtime_nsec as i64),
            ctime_ns: ns(raw.st_ctime, raw.st_ctime_nsec as i64),
        }
    }
}

/// A regular file, open for reading, not read yet.
#[derive(Debug)]
pub struct OpenFile {
    file: std::fs::File,
    stat: Stat,
    kind: Kind,
    path: String,
}

impl OpenFile {
    /// What `fstat` said when it was opened.
    pub fn stat(&self) -> &Stat {
        &self.stat
    }

    /// The path it was opened by (for messages).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Fills `buf` from `offset` (a few header bytes, to decide whether
    /// the file is worth reading at all).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }

    /// Reads the whole file into memory, at most its kind's cap.
    pub fn read(self) -> Result<FileData, FileError> {
        read::read_all(self)
    }

    /// Reads only the `parts` of an ELF file a job needs (every byte is
    /// still read once, for the content id); see [`Parts`].
    pub fn read_parts(self, parts: Parts) -> Result<FileData, FileError> {
        sparse::read_parts(self, parts)
    }

    /// Reads only an ELF file's [`Parts::Dynamic`], and no other byte:
    /// no content id (see [`DynamicImage`]).
    pub fn read_dynamic(self) -> Result<DynamicImage, FileError> {
        sparse::read_dynamic(self)
    }
}

/// A mapping of a process, as `/proc/PID/maps` describes it.
#[derive(Clone, Copy, Debug)]
pub struct MappedRange<'a> {
    pub start: u64,
    pub end: u64,
    /// The path as the process sees it.
    pub path: &'a str,
    pub dev: u64,
    pub inode: u64,
}

impl<'a> From<&'a crate::model::Mapping> for MappedRange<'a> {
    fn from(mapping: &'a crate::model::Mapping) -> Self {
        MappedRange {
            start: mapping.start,
            end: mapping.end,
            path: &mapping.path,
            dev: mapping.dev,
            inode: mapping.inode,
        }
    }
}

/// Opens `path` as process `pid` sees it, inside its root.
pub fn open_in_process(pid: u32, path: &str, kind: Kind) -> Result<OpenFile, FileError> {
    Root::of_process(pid)
        .map_err(|source| FileError::Open {
            path: format!("/proc/{pid}/root"),
            source,
        })?
        .open(path, kind)
}

/// Opens the file behind `mapping` of process `pid`: through
/// `/proc/PID/map_files` (the mapped inode itself, even deleted or replaced
/// since), else by its path inside the process's root if it still names the
/// mapped inode, else, when the process is gone, by its path on the host if
/// that is the same device and inode (a host process's file).
pub fn open_mapping(pid: u32, mapping: &MappedRange, kind: Kind) -> Result<OpenFile, FileError> {
    let by_mapping = format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    match root::open_magic(&by_mapping, kind) {
        Ok(file) => return Ok(file),
        Err(err @ (FileError::NotRegular { .. } | FileError::TooLarge { .. })) => return Err(err),
        Err(_) => {}
    }
    let shown = format!("/proc/{pid}/root{}", mapping.path);
    if !mapping.path.starts_with('/') {
        return Err(FileError::Open {
            path: shown,
            source: io::ErrorKind::NotFound.into(),
        });
    }
    let (file, same) = match Root::of_process(pid) {
        Ok(root) => {
            let file = root.open(mapping.path, kind)?;
            // The path may now name another file than the one mapped.
            let same = file.stat.inode == mapping.inode;
            (file, same)
        }
        Err(_) => {
            // The process is gone: its file is reachable only if the same
            // file (device and inode, as its maps said) is at that path on
            // the host — true for a host process, never wrongly true for a
            // container's.
            let file = Root::host()
                .map_err(|source| FileError::Open {
                    path: "/".into(),
                    source,
                })?
                .open(mapping.path, kind)?;
            let same = file.stat.inode == mapping.inode && file.stat.dev == mapping.dev;
            (file, same)
        }
    };
    if !same {
        return Err(FileError::Replaced { path: shown });
    }
    Ok(file)
}

/// Opens a host path (debug directories, tools), with the same checks.
pub fn open_host(path: &str, kind: Kind) -> Result<OpenFile, FileError> {
    Root::host()
        .map_err(|source| FileError::Open {
            path: "/".into(),
            source,
        })?
        .open(path, kind)
}

/// The identity of a file's contents: `sha256:` and the hex SHA-256 of every
/// byte. Two files share it only if they are the same bytes, whatever build
/// id they claim.
pub fn content_id(data: &[u8]) -> std::sync::Arc<str> {
    let digest = Sha256::digest(data);
    format!("sha256:{}", crate::symbolize::hex(&digest)).into()
}

fn file_type_name(file_type: FileType) -> &'static str {
    match file_type {
        FileType::Fifo => "FIFO",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Socket => "socket",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        _ => "special file",
    }
}

#[cfg(test)]
mod tests;

/// A copy of this process's vDSO image: the kernel maps the same one into
/// every process of our ABI, so it stands for theirs (unwind tables, names).
pub fn own_vdso() -> Option<Vec<u8>> {
    let maps = std::fs::read("/proc/self/maps").ok()?;
    let maps = crate::procs::parse_maps(&maps).ok()?;
    let vdso = maps.iter().find(|map| &*map.path == "[vdso]")?;
    let (start, end) = (vdso.start, vdso.end);
    // SAFETY: the vDSO is mapped readable for the life of the process.
    let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, (end - start) as usize) };
    Some(bytes.to_vec())
}
