//! Content ids remembered by what `fstat` says of a file, so that a file
//! read before is not hashed again: in memory for every read, and, once
//! [`persist`] names a file (the agent's table cache directory), across
//! restarts, so a restart finds a cached table with one `stat` and no read.
//!
//! The key is the whole [`Stat`], each field for a reason:
//! - device and inode: which file (the same path may name another file
//!   after an upgrade; another container's file may have the same path);
//! - size: a rewrite that changes the length;
//! - mtime with nanoseconds: every write sets it (an owner can set it back,
//!   hence the next field);
//! - ctime with nanoseconds: the kernel sets it on every write, rename,
//!   chmod or `utimensat`, to the current time, and no owner can choose it.
//!   A file rewritten in place (same inode, same size, mtime set back) or
//!   deleted and its inode reused gets a new ctime.
//!
//! ctime is as fine as the kernel's coarse clock (a few ms), or whole
//! seconds on some filesystems: a file written again within the same tick
//! would keep it. So an id is only written to the memo file when the
//! file's ctime was at least a tick older than the moment its hash was
//! known ([`is_racy`]; git treats index entries the same way): a file that
//! was just written is hashed again after a restart, not trusted. (Within
//! one run such an id is used, as it was before ids were kept on disk.)
//!
//! File layout (little endian): [`MAGIC`], [`FORMAT_VERSION`] (u32), entry
//! count (u32), CRC-32 of the whole file with this field zero (u32), then
//! [`ENTRY_BYTES`] per entry: device, inode, size (u64 each), mtime and
//! ctime in ns (i128 each), the SHA-256 (32 bytes). A file that fails any
//! check is ignored (counted) and replaced at the next write; writes go to
//! a temporary file renamed into place, mode 0600.
use std::{
    collections::HashMap,
    io::{Read, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use super::Stat;

/// The first bytes of a memo file.
pub const MAGIC: [u8; 8] = *b"HPIDMEM\0";
/// Bumped whenever the layout changes; a file of another version is
/// ignored (and counted as stale, not corrupt).
pub const FORMAT_VERSION: u32 = 1;
const HEADER_BYTES: usize = 20;
/// Bytes of one entry on disk.
pub const ENTRY_BYTES: usize = 8 * 3 + 16 * 2 + 32;
/// Files remembered at most; past it the oldest half is forgotten (a host
/// has a few thousand binaries, and forgetting costs one more hash each).
pub const MAX_ENTRIES: usize = 8192;

#[derive(Default)]
struct Memo {
    /// Stat → (content id, order of insertion, kept on disk: see
    /// [`is_racy`]).
    ids: HashMap<Stat, Entry>,
    seq: u64,
    /// Where it is kept across restarts, if anywhere.
    path: Option<PathBuf>,
    /// Entries added since the last write.
    dirty: bool,
}

/// (content id, order of insertion, kept on disk).
type Entry = (Arc<str>, u64, bool);

static MEMO: Mutex<Option<Memo>> = Mutex::new(None);

fn memo() -> MutexGuard<'static, Option<Memo>> {
    MEMO.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the memo did, since this process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoTotals {
    /// Ids taken from the memo: files not hashed.
    pub hits: u64,
    /// Ids remembered after hashing a file.
    pub remembered: u64,
    /// Entries read from the memo file at start.
    pub loaded: u64,
    /// Memo files ignored: damaged (failed a check).
    pub corrupt: u64,
    /// Memo files ignored: another format version.
    pub stale: u64,
    /// Writes of the memo file that failed (full disk, permissions).
    pub write_errors: u64,
}

static HITS: AtomicU64 = AtomicU64::new(0);
static REMEMBERED: AtomicU64 = AtomicU64::new(0);
static LOADED: AtomicU64 = AtomicU64::new(0);
static CORRUPT: AtomicU64 = AtomicU64::new(0);
static STALE: AtomicU64 = AtomicU64::new(0);
static WRITE_ERRORS: AtomicU64 = AtomicU64::new(0);

/// The memo's figures so far in this process.
pub fn totals() -> MemoTotals {
    let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    MemoTotals {
        hits: get(&HITS),
        remembered: get(&REMEMBERED),
        loaded: get(&LOADED),
        corrupt: get(&CORRUPT),
        stale: get(&STALE),
        write_errors: get(&WRITE_ERRORS),
    }
}

/// The content id of the file `fstat` says `stat` of, if it was hashed
/// before (in this process, or in an earlier one whose memo file
/// [`persist`] read).
pub fn known(stat: &Stat) -> Option<Arc<str>> {
    let id = memo().as_ref()?.ids.get(stat).map(|(id, _, _)| id.clone());
    if id.is_some() {
        HITS.fetch_add(1, Ordering::Relaxed);
    }
    id
}

/// Remembers `id` as the content of the file `stat` describes, which the
/// caller checked did not change while it was hashed; kept on disk only if
/// the file was not written too recently to tell a next write apart
/// ([`is_racy`]).
pub fn remember(stat: Stat, id: Arc<str>) {
    if digest_of(&id).is_none() {
        return;
    }
    let durable = !is_racy(&stat, SystemTime::now());
    let mut memo = memo();
    let memo = memo.get_or_insert_with(Memo::default);
    if memo
        .ids
        .get(&stat)
        .is_some_and(|(known, _, _)| *known == id)
    {
        return;
    }
    if memo.ids.len() >= MAX_ENTRIES {
        forget_oldest_half(memo);
    }
    memo.seq += 1;
    memo.ids.insert(stat, (id, memo.seq, durable));
    memo.dirty |= durable;
    REMEMBERED.fetch_add(1, Ordering::Relaxed);
}

fn forget_oldest_half(memo: &mut Memo) {
    let mut seqs: Vec<u64> = memo.ids.values().map(|(_, seq, _)| *seq).collect();
    seqs.sort_unstable();
    let cutoff = seqs[seqs.len() / 2];
    memo.ids.retain(|_, (_, seq, _)| *seq >= cutoff);
}

/// True when the file's last change is too close to `now` for its ctime to
/// tell a next write apart: within a second on a filesystem that keeps
/// whole seconds (no nanoseconds), else within the kernel's coarse clock
/// tick (at most 10 ms; 20 ms leaves room).
pub fn is_racy(stat: &Stat, now: SystemTime) -> bool {
    let Ok(now) = now.duration_since(UNIX_EPOCH) else {
        return true;
    };
    let whole_seconds = stat.ctime_ns % 1_000_000_000 == 0;
    let tick = if whole_seconds {
        Duration::from_secs(1)
    } else {
        Duration::from_millis(20)
    };
    (now.as_nanos() as i128) < stat.ctime_ns + tick.as_nanos() as i128
}

/// Keeps the memo in `path` from now on: reads what an earlier run left
/// there (a damaged or foreign file is ignored and counted), and
/// [`save`] writes it back.
pub fn persist(path: PathBuf) {
    let entries = match read_file(&path) {
        Ok(entries) => entries,
        Err(err) => {
            tracing::debug!("file id memo {}: {err}: ignored", path.display());
            if err == MemoFormatError::Version {
                STALE.fetch_add(1, Ordering::Relaxed);
            } else {
                CORRUPT.fetch_add(1, Ordering::Relaxed);
            }
            Vec::new()
        }
    };
    let mut memo = memo();
    let memo = memo.get_or_insert_with(Memo::default);
    LOADED.fetch_add(entries.len() as u64, Ordering::Relaxed);
    for (stat, id) in entries {
        if memo.ids.len() >= MAX_ENTRIES {
            break;
        }
        memo.seq += 1;
        let seq = memo.seq;
        memo.ids.entry(stat).or_insert((id, seq, true));
    }
    memo.path = Some(path);
}

/// Writes the memo to its file if entries were added since the last write
/// (and [`persist`] named one). Failures are counted, never fatal.
pub fn save() {
    let (path, bytes) = {
        let mut memo = memo();
        let Some(memo) = memo.as_mut() else {
            return;
        };
        let Some(path) = memo.path.clone().filter(|_| memo.dirty) else {
            return;
        };
        memo.dirty = false;
        let mut entries: Vec<(&Stat, &Entry)> = memo
            .ids
            .iter()
            .filter(|(_, (_, _, durable))| *durable)
            .collect();
        // Oldest first: read back in this order, they keep their age.
        entries.sort_unstable_by_key(|(_, (_, seq, _))| *seq);
        (
            path,
            encode(entries.into_iter().map(|(stat, (id, _, _))| (stat, id))),
        )
    };
    if let Err(err) = write_atomic(&path, &bytes) {
        tracing::debug!("cannot write file id memo {}: {err}", path.display());
        WRITE_ERRORS.fetch_add(1, Ordering::Relaxed);
        // Try again at the next save.
        if let Some(memo) = memo().as_mut() {
            memo.dirty = true;
        }
    }
}

/// Why a memo file was ignored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MemoFormatError {
    #[error("cannot read it: {0}")]
    Read(String),
    #[error("not a hostprof file id memo")]
    Magic,
    #[error("another format version")]
    Version,
    #[error("length does not match its header")]
    Length,
    #[error("checksum mismatch")]
    Checksum,
}

/// The 32 bytes of a `sha256:` content id.
fn digest_of(id: &str) -> Option<[u8; 32]> {
    let hex = id.strip_prefix("sha256:")?.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        let text = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

/// The memo file holding `entries`.
pub fn encode<'a>(entries: impl Iterator<Item = (&'a Stat, &'a Arc<str>)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut count = 0u32;
    for (stat, id) in entries {
        let Some(digest) = digest_of(id) else {
            continue;
        };
        out.extend_from_slice(&stat.dev.to_le_bytes());
        out.extend_from_slice(&stat.inode.to_le_bytes());
        out.extend_from_slice(&stat.size.to_le_bytes());
        out.extend_from_slice(&stat.mtime_ns.to_le_bytes());
        out.extend_from_slice(&stat.ctime_ns.to_le_bytes());
        out.extend_from_slice(&digest);
        count += 1;
    }
    out[12..16].copy_from_slice(&count.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out[16..20].copy_from_slice(&crc.to_le_bytes());
    out
}

/// The entries of a memo file's `bytes`, if they are a whole, intact file
/// of this format.
pub fn decode(bytes: &[u8]) -> Result<Vec<(Stat, Arc<str>)>, MemoFormatError> {
    let header = bytes.get(..HEADER_BYTES).ok_or(MemoFormatError::Length)?;
    let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
    if header[..8] != MAGIC {
        return Err(MemoFormatError::Magic);
    }
    if u32_at(8) != FORMAT_VERSION {
        return Err(MemoFormatError::Version);
    }
    let count = u32_at(12) as usize;
    if count > MAX_ENTRIES || bytes.len() != HEADER_BYTES + count * ENTRY_BYTES {
        return Err(MemoFormatError::Length);
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[..16]);
    hasher.update(&[0; 4]);
    hasher.update(&bytes[HEADER_BYTES..]);
    if hasher.finalize() != u32_at(16) {
        return Err(MemoFormatError::Checksum);
    }
    Ok(bytes[HEADER_BYTES..]
        .chunks_exact(ENTRY_BYTES)
        .map(|raw| {
            let u64_at = |at: usize| u64::from_le_bytes(raw[at..at + 8].try_into().unwrap());
            let i128_at = |at: usize| i128::from_le_bytes(raw[at..at + 16].try_into().unwrap());
            let stat = Stat {
                dev: u64_at(0),
                inode: u64_at(8),
                size: u64_at(16),
                mtime_ns: i128_at(24),
                ctime_ns: i128_at(40),
            };
            let id: Arc<str> = format!("sha256:{}", crate::symbolize::hex(&raw[56..88])).into();
            (stat, id)
        })
        .collect())
}

/// The entries of the memo file at `path`; none when there is no file.
fn read_file(path: &Path) -> Result<Vec<(Stat, Arc<str>)>, MemoFormatError> {
    let max = (HEADER_BYTES + MAX_ENTRIES * ENTRY_BYTES) as u64;
    let mut file = match std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(MemoFormatError::Read(err.to_string())),
    };
    let meta = file
        .metadata()
        .map_err(|err| MemoFormatError::Read(err.to_string()))?;
    if !meta.is_file() || meta.len() > max {
        return Err(MemoFormatError::Length);
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // Bounded even if the file grows meanwhile.
    (&mut file)
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| MemoFormatError::Read(err.to_string()))?;
    decode(&bytes)
}

/// Writes `bytes` next to `path` (mode 0600, never through a symlink),
/// then renames it into place: a reader sees a whole file or the previous
/// one. The memo's and the table cache's files.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let partial = dir.join(format!(".{name}.{}.partial", std::process::id()));
    let result = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&partial)
        .and_then(|mut file| file.write_all(bytes))
        .and_then(|()| std::fs::rename(&partial, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

#[cfg(test)]
mod tests;
