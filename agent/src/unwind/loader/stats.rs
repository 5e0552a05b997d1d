//! What the loader has done, for reports and the agent's metrics.
use std::sync::atomic::{AtomicU64, Ordering};

/// Figures for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoaderStats {
    /// Tables in the kernel now (in use, or idle).
    pub tables: u64,
    /// Of those, tables no process uses now: kept for the next process
    /// mapping the same file, evicted (oldest first) when room is needed.
    pub idle_tables: u64,
    /// Idle tables evicted to make room or to bound their number.
    pub evicted: u64,
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
    /// Processes that did not fit in the kernel's process map (or whose
    /// load it refused): left to frame pointers, retried after a backoff.
    pub process_full: u64,
    /// Requests for tables dropped because the service was behind (the
    /// process's next sample asks again).
    pub requests_dropped: u64,
    /// Files forgotten from the set of those without a usable table, to
    /// keep it bounded (they may be parsed again).
    pub failed_forgotten: u64,
    /// Process loads done (each reads the process's mappings and writes
    /// them to the kernel): bounded by processes × backoff rounds, however
    /// often samples ask.
    pub loads: u64,
    /// Requests ignored because the process was backing off.
    pub backoff_skips: u64,
    /// Files read (and hashed, unless the file id memo knew them) for
    /// their tables.
    pub files_read: u64,
    /// Of those, files whose table was then found in the disk cache: read
    /// only because their content id was not known (a first start, or a
    /// file changed or just written).
    pub read_for_cached: u64,
    /// Tables taken from the disk cache without reading their file (its
    /// content id known from the memo, its segments from the cache).
    pub cached_unread: u64,
    /// Tables built for the code that runs, in the kernel now.
    pub sparse_tables: u64,
    /// Times such a table grew by the functions walks stopped at.
    pub sparse_growths: u64,
    /// Requests to grow such a table past its most functions, refused.
    pub sparse_full: u64,
}

/// Process-wide totals of [`LoaderStats::process_full`] and
/// [`LoaderStats::loads`], for the agent's metrics.
pub(super) static PROCESSES_DEGRADED: AtomicU64 = AtomicU64::new(0);
pub(super) static PROCESS_LOADS: AtomicU64 = AtomicU64::new(0);
pub(super) static FILES_READ: AtomicU64 = AtomicU64::new(0);
pub(super) static READ_FOR_CACHED: AtomicU64 = AtomicU64::new(0);
pub(super) static CACHED_UNREAD: AtomicU64 = AtomicU64::new(0);
pub(super) static SPARSE_GROWTHS: AtomicU64 = AtomicU64::new(0);

/// Process-wide [`LoaderStats::sparse_growths`], for the agent's metrics.
pub fn sparse_growths() -> u64 {
    SPARSE_GROWTHS.load(Ordering::Relaxed)
}

/// Addresses and stack copies a request for functions left out, past its
/// caps (`MAX_PCS_PER_REQUEST`, `MAX_STACKS_PER_REQUEST`): deferred, not
/// lost (the next sample that stops there asks again), but each is a
/// walk that stopped short meanwhile.
static FUNCTIONS_DEFERRED: AtomicU64 = AtomicU64::new(0);

/// Counts `count` addresses or copies left out of a request for functions.
pub fn defer_functions(count: u64) {
    FUNCTIONS_DEFERRED.fetch_add(count, Ordering::Relaxed);
}

/// Process-wide count of [`defer_functions`], for reports and metrics.
pub fn functions_deferred() -> u64 {
    FUNCTIONS_DEFERRED.load(Ordering::Relaxed)
}

/// Process-wide [`LoaderStats::files_read`], [`LoaderStats::read_for_cached`]
/// and [`LoaderStats::cached_unread`], for the agent's metrics.
pub fn file_totals() -> (u64, u64, u64) {
    (
        FILES_READ.load(Ordering::Relaxed),
        READ_FOR_CACHED.load(Ordering::Relaxed),
        CACHED_UNREAD.load(Ordering::Relaxed),
    )
}

/// (processes left to frame pointers for lack of room, process loads) so
/// far in this process.
pub fn capacity_totals() -> (u64, u64) {
    (
        PROCESSES_DEGRADED.load(Ordering::Relaxed),
        PROCESS_LOADS.load(Ordering::Relaxed),
    )
}
