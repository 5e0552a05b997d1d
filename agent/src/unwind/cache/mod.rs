//! Unwind tables on disk, so that an agent restart (or a second `record`)
//! does not build again the tables of files it has seen.
//!
//! One file per table, named by the hex SHA-256 of the ELF file's bytes
//! (the loader's [`FileKey::Content`]), in a directory private to the agent
//! (mode 0700, owned by us: anyone who could write there could choose the
//! rows the kernel walks stacks with). A file is checked before use (magic,
//! format version, the row layout's size, the key, the exact length, a
//! CRC-32 of every other byte, rows sorted by address); one that fails is
//! ignored and counted, and the table built again overwrites it. Writes go
//! to a temporary file renamed into place: a reader sees a whole file or
//! none. The directory is bounded in bytes: past the bound, the files used
//! least recently (a hit refreshes a file's time) are deleted.
//!
//! A table is kept with its file's loadable segments, which place a mapping
//! of the file (its ELF address at a file offset): with the file's content
//! id remembered by [`crate::files::memo`] (kept in this directory too, as
//! [`MEMO_FILE`]), a restart loads a cached table with one `stat` of the
//! file and no read of it.
//!
//! Layout (little endian), [`HEADER_BYTES`], the key, the segments (a u32
//! count, then [`SEGMENT_BYTES`] each: offset, size, address, flags with
//! bit 0 executable), then the table as the kernel's rows map holds it
//! (`hostprof_unwind::packed`): a word per row (pc, rule index), a pad
//! word when the rows are odd, two words per distinct rule; its length
//! says how many rules:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..8 | [`MAGIC`] |
//! | 8..12 | [`FORMAT_VERSION`] |
//! | 12..16 | row size (8: a packed row) |
//! | 16..20 | architecture (0 x86_64, 1 aarch64) |
//! | 20..24 | kind (0 rows, 1 frame pointers) |
//! | 24..32 | bytes of executable code |
//! | 32..40 | rows |
//! | 40..44 | key length |
//! | 44..48 | CRC-32 of the file with this field zero |
use std::{
    fs::File,
    io::Read,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::SystemTime,
};

use hostprof_unwind::{
    Arch, PackedRow, RULE_WORDS,
    table::{self, LoadSegment, MAX_LOAD_SEGMENTS, TableError, TableKind, UnwindTable},
};

use super::FileKey;

/// The first bytes of every cache file.
pub const MAGIC: [u8; 8] = *b"HPUWTAB\0";
/// Bumped whenever the file's layout or the rows' meaning changes: an agent
/// never reads another version's files (they count as stale and are built
/// again). 4: aarch64 tables of functions that sign their return address
/// had lost their rows after `paciasp` (`DW_CFA_AARCH64_negate_ra_state`
/// misread); version 3's files of such binaries hold the loss.
pub const FORMAT_VERSION: u32 = 4;
/// Bytes before the key.
pub const HEADER_BYTES: usize = 48;
/// Bytes of one row in the file (and of a word of the rows' section).
const ROW_BYTES: usize = 8;
const _: () = assert!(size_of::<u64>() == ROW_BYTES);
/// Bytes of one loadable segment in the file.
pub const SEGMENT_BYTES: usize = 32;
/// The file id memo's file in the cache directory (never evicted: it is
/// bounded on its own, [`crate::files::memo::MAX_ENTRIES`]).
pub const MEMO_FILE: &str = "file-ids.memo";
/// Longest key accepted (`sha256:` and 64 hex digits fit well within it).
const MAX_KEY_BYTES: usize = 256;

/// Where the cache lives and how large it may grow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheOptions {
    pub dir: PathBuf,
    /// Most bytes of cache files; the least recently used go first.
    pub max_bytes: u64,
}

/// Why a cache file was not used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheFormatError {
    #[error("shorter than its header")]
    Truncated,
    #[error("not a hostprof unwind table file")]
    Magic,
    #[error("format version {0}, this agent reads {FORMAT_VERSION}")]
    Version(u32),
    #[error("rows of {0} bytes, this agent's are {ROW_BYTES}")]
    RowSize(u32),
    #[error("a field out of range")]
    Field,
    #[error("written for another file")]
    Key,
    #[error("length does not match its header")]
    Length,
    #[error("checksum mismatch")]
    Checksum,
    #[error("rows out of order")]
    Unsorted,
    #[error("more loadable segments than kept")]
    Segments,
}

/// A table from the cache, with its file's loadable segments.
#[derive(Clone, Debug)]
pub struct CachedTable {
    pub table: UnwindTable,
    pub segments: Vec<LoadSegment>,
}

impl CacheFormatError {
    /// Written by another version of hostprof: not damage.
    fn is_stale(&self) -> bool {
        matches!(
            self,
            CacheFormatError::Version(_) | CacheFormatError::RowSize(_)
        )
    }
}

/// What lookups and writes of the cache came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheTotals {
    /// Tables read from the cache (not built).
    pub hits: u64,
    /// Tables not in the cache (built, then stored).
    pub misses: u64,
    /// Files of another format version or row layout (built again).
    pub stale: u64,
    /// Files that failed a check (ignored, built again, overwritten).
    pub corrupt: u64,
    /// Tables that could not be stored (full disk, permissions).
    pub write_errors: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    stale: AtomicU64,
    corrupt: AtomicU64,
    write_errors: AtomicU64,
}

impl Counters {
    fn totals(&self) -> CacheTotals {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CacheTotals {
            hits: get(&self.hits),
            misses: get(&self.misses),
            stale: get(&self.stale),
            corrupt: get(&self.corrupt),
            write_errors: get(&self.write_errors),
        }
    }
}

/// Process-wide totals, for the agent's metrics and record's report.
static TOTALS: Counters = Counters {
    hits: AtomicU64::new(0),
    misses: AtomicU64::new(0),
    stale: AtomicU64::new(0),
    corrupt: AtomicU64::new(0),
    write_errors: AtomicU64::new(0),
};

/// Every cache's lookups and writes so far in this process.
pub fn totals() -> CacheTotals {
    TOTALS.totals()
}

/// Bumps a counter of this cache and the process-wide one.
fn count(mine: &AtomicU64, global: &AtomicU64) {
    mine.fetch_add(1, Ordering::Relaxed);
    global.fetch_add(1, Ordering::Relaxed);
}

/// An open cache directory.
pub struct TableCache {
    options: CacheOptions,
    counters: Counters,
}

impl TableCache {
    /// Creates the directory (mode 0700) if needed; refuses one that is not
    /// a directory owned by us, or that others may read or write.
    pub fn open(options: CacheOptions) -> std::io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&options.dir)?;
        let meta = std::fs::symlink_metadata(&options.dir)?;
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != euid {
            return Err(std::io::Error::other(format!(
                "{} is not a directory owned by uid {euid}",
                options.dir.display()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            // An existing directory (systemd's CacheDirectory= is 0755
            // unless told): ours, so make it private.
            std::fs::set_permissions(&options.dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(TableCache {
            options,
            counters: Counters::default(),
        })
    }

    /// This cache's lookups and writes so far.
    pub fn totals(&self) -> CacheTotals {
        self.counters.totals()
    }

    /// The table of `key` if the cache has a good one.
    pub fn get(&self, key: &str) -> Option<CachedTable> {
        self.lookup(key, true).ok()
    }

    /// [`Self::get`], counting no miss when there is none (the caller
    /// reads the file next, and [`table_of`] counts it then). `Err(true)`:
    /// a file was there but not usable (counted: [`table_of`] need not
    /// look again).
    pub fn peek(&self, key: &str) -> Result<CachedTable, bool> {
        self.lookup(key, false)
    }

    fn lookup(&self, key: &str, count_miss: bool) -> Result<CachedTable, bool> {
        let path = self.path(key).ok_or(false)?;
        let bytes = match self.read(&path) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                if count_miss {
                    count(&self.counters.misses, &TOTALS.misses);
                }
                return Err(false);
            }
            Err(err) => {
                tracing::debug!("unwind table cache {}: {err}", path.display());
                count(&self.counters.corrupt, &TOTALS.corrupt);
                return Err(true);
            }
        };
        match decode(key, &bytes) {
            Ok(table) => {
                count(&self.counters.hits, &TOTALS.hits);
                // Used now: the last to be evicted.
                if let Ok(file) = File::open(&path) {
                    let _ = file.set_modified(SystemTime::now());
                }
                Ok(table)
            }
            Err(err) if err.is_stale() => {
                tracing::debug!("unwind table cache {}: {err}", path.display());
                count(&self.counters.stale, &TOTALS.stale);
                Err(true)
            }
            Err(err) => {
                tracing::debug!("unwind table cache {}: {err}: ignored", path.display());
                count(&self.counters.corrupt, &TOTALS.corrupt);
                Err(true)
            }
        }
    }

    /// Stores `table` as `key`'s, then evicts past the bound. Failures are
    /// counted, never fatal.
    pub fn put(&self, key: &str, table: &UnwindTable, segments: &[LoadSegment]) {
        let Some(path) = self.path(key) else {
            return;
        };
        let bytes = encode(key, table, segments);
        if bytes.len() as u64 > self.options.max_bytes {
            return;
        }
        if let Err(err) = crate::files::memo::write_atomic(&path, &bytes) {
            tracing::debug!("cannot store unwind table {}: {err}", path.display());
            count(&self.counters.write_errors, &TOTALS.write_errors);
            return;
        }
        evict(&self.options.dir, self.options.max_bytes);
    }

    /// The file of `key`; `None` for a key that is not a content id (never
    /// a path from outside the directory).
    fn path(&self, key: &str) -> Option<PathBuf> {
        let hex = key.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| self.options.dir.join(format!("{hex}.table")))
    }

    /// The file's bytes; `None` when there is none. A file that is not
    /// regular, or larger than the whole cache may be, is an error.
    fn read(&self, path: &Path) -> std::io::Result<Option<Vec<u8>>> {
        let mut file = match File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
        {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() > self.options.max_bytes {
            return Err(std::io::Error::other("not a regular file within the bound"));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        // Bounded even if the file grows meanwhile.
        (&mut file)
            .take(self.options.max_bytes + 1)
            .read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    }
}

/// `key`'s table: from `cache` when it has it, else built from `data` (and
/// stored, with `segments`). Only content ids are cached: other keys name
/// no bytes. `lookup` false: the caller found the cache's file unusable
/// already. True with a table taken from the cache.
pub(super) fn table_of(
    cache: Option<&TableCache>,
    key: &FileKey,
    data: &[u8],
    segments: &[LoadSegment],
    lookup: bool,
) -> Result<(UnwindTable, bool), TableError> {
    let cached = match (cache, key) {
        (Some(cache), FileKey::Content(id)) => Some((cache, id)),
        _ => None,
    };
    if let Some((cache, id)) = cached
        && lookup
        && let Some(found) = cache.get(id)
    {
        return Ok((found.table, true));
    }
    let table = table::build(data)?;
    if let Some((cache, id)) = cached {
        cache.put(id, &table, segments);
    }
    Ok((table, false))
}

/// The file for `key`'s table.
pub fn encode(key: &str, table: &UnwindTable, segments: &[LoadSegment]) -> Vec<u8> {
    let rows = table.row_count();
    let words = table.packed();
    let segments = &segments[..segments.len().min(MAX_LOAD_SEGMENTS)];
    let mut out = Vec::with_capacity(
        HEADER_BYTES + key.len() + 4 + segments.len() * SEGMENT_BYTES + words.len() * ROW_BYTES,
    );
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(ROW_BYTES as u32).to_le_bytes());
    let arch: u32 = match table.arch {
        Arch::X86_64 => 0,
        Arch::Aarch64 => 1,
    };
    out.extend_from_slice(&arch.to_le_bytes());
    let kind: u32 = match table.kind {
        TableKind::Rows(_) | TableKind::Packed { .. } => 0,
        TableKind::FramePointers => 1,
    };
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&table.text_bytes.to_le_bytes());
    out.extend_from_slice(&(rows as u64).to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(segments.len() as u32).to_le_bytes());
    for segment in segments {
        out.extend_from_slice(&segment.offset.to_le_bytes());
        out.extend_from_slice(&segment.size.to_le_bytes());
        out.extend_from_slice(&segment.address.to_le_bytes());
        out.extend_from_slice(&u64::from(segment.executable).to_le_bytes());
    }
    for word in words.iter() {
        out.extend_from_slice(&word.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out[44..48].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The table in `bytes`, if they are a whole, intact file of this format
/// for `key`.
pub fn decode(key: &str, bytes: &[u8]) -> Result<CachedTable, CacheFormatError> {
    let header = bytes
        .get(..HEADER_BYTES)
        .ok_or(CacheFormatError::Truncated)?;
    let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap());
    if header[..8] != MAGIC {
        return Err(CacheFormatError::Magic);
    }
    if u32_at(8) != FORMAT_VERSION {
        return Err(CacheFormatError::Version(u32_at(8)));
    }
    if u32_at(12) != ROW_BYTES as u32 {
        return Err(CacheFormatError::RowSize(u32_at(12)));
    }
    let arch = match u32_at(16) {
        0 => Arch::X86_64,
        1 => Arch::Aarch64,
        _ => return Err(CacheFormatError::Field),
    };
    let (text_bytes, rows, key_len) = (u64_at(24), u64_at(32), u32_at(40) as usize);
    let frame_pointers = match u32_at(20) {
        0 => false,
        1 if rows == 0 => true,
        _ => return Err(CacheFormatError::Field),
    };
    if key_len > MAX_KEY_BYTES {
        return Err(CacheFormatError::Key);
    }
    let count_at = HEADER_BYTES + key_len;
    let segment_count = bytes
        .get(count_at..count_at + 4)
        .map(|raw| u32::from_le_bytes(raw.try_into().unwrap()) as usize)
        .ok_or(CacheFormatError::Length)?;
    if segment_count > MAX_LOAD_SEGMENTS {
        return Err(CacheFormatError::Segments);
    }
    let rows_at = count_at + 4 + segment_count * SEGMENT_BYTES;
    // The rows (padded to even), then whole rules: their number is what
    // the length leaves.
    let rows = usize::try_from(rows).map_err(|_| CacheFormatError::Length)?;
    let least = rows
        .checked_add(rows & 1)
        .and_then(|words| words.checked_mul(ROW_BYTES))
        .and_then(|row_bytes| row_bytes.checked_add(rows_at));
    let rule_bytes = RULE_WORDS as usize * ROW_BYTES;
    match least {
        Some(least) if least <= bytes.len() && (bytes.len() - least).is_multiple_of(rule_bytes) => {
        }
        _ => return Err(CacheFormatError::Length),
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[..44]);
    hasher.update(&[0; 4]);
    hasher.update(&bytes[HEADER_BYTES..]);
    if hasher.finalize() != u32_at(44) {
        return Err(CacheFormatError::Checksum);
    }
    if &bytes[HEADER_BYTES..HEADER_BYTES + key_len] != key.as_bytes() {
        return Err(CacheFormatError::Key);
    }
    let segments = bytes[count_at + 4..rows_at]
        .chunks_exact(SEGMENT_BYTES)
        .map(|raw| {
            let u64_at = |at: usize| u64::from_le_bytes(raw[at..at + 8].try_into().unwrap());
            LoadSegment {
                offset: u64_at(0),
                size: u64_at(8),
                address: u64_at(16),
                executable: u64_at(24) & 1 != 0,
            }
        })
        .collect();
    let words: Vec<u64> = bytes[rows_at..]
        .chunks_exact(ROW_BYTES)
        .map(|raw| u64::from_le_bytes(raw.try_into().unwrap()))
        .collect();
    // The kernel's search needs them sorted, as the builder leaves them.
    let pc = |word: &u64| PackedRow::from_word(*word).pc;
    if !words[..rows]
        .windows(2)
        .all(|pair| pc(&pair[0]) < pc(&pair[1]))
    {
        return Err(CacheFormatError::Unsorted);
    }
    // A rule index past the rules is damage the checksum missed.
    if !hostprof_unwind::packed_rows_valid(&words, rows) {
        return Err(CacheFormatError::Field);
    }
    Ok(CachedTable {
        table: UnwindTable {
            arch,
            kind: if frame_pointers {
                TableKind::FramePointers
            } else {
                TableKind::Packed { words, rows }
            },
            text_bytes,
        },
        segments,
    })
}

/// Deletes the least recently used files until at most `budget` bytes
/// remain (leftover partial files of a crash count, and are old).
fn evict(dir: &Path, budget: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(SystemTime, u64, PathBuf)> = entries
        .flatten()
        // The memo is bounded on its own, and rewritten in place.
        .filter(|entry| !entry.file_name().to_string_lossy().contains(MEMO_FILE))
        .filter_map(|entry| {
            let meta = entry.metadata().ok()?;
            meta.is_file().then(|| {
                let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                (used, meta.len(), entry.path())
            })
        })
        .collect();
    let mut total: u64 = files.iter().map(|(_, size, _)| size).sum();
    if total <= budget {
        return;
    }
    files.sort();
    for (_, size, path) in files {
        if total <= budget {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= size;
        }
    }
}

#[cfg(test)]
mod tests;
