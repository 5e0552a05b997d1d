//! Go's pprof labels (`pprof.Do`, `pprof.SetGoroutineLabels`) in the
//! kernel: where a Go process keeps its current goroutine and the fields
//! that lead to its labels ([`Process`], in [`crate::MAP_GO_PROCESSES`]),
//! and how a sample carries them ([`crate::SAMPLE_FLAG_GO_LABELS`]).
//!
//! At each sample of a registered process the sampler reads `g` (the
//! goroutine the thread runs, maybe the scheduler's `g0`) at `thread
//! pointer + tls_offset`, then `g.m`, then `m.curg` (the user goroutine
//! of that thread: the one that made a cgo call, or none in the
//! scheduler), then `curg.labels`: a `*labelMap`. Up to Go 1.23 that is
//! a `map[string]string` ([`LAYOUT_MAP`]): the map header's first
//! [`MAX_BUCKETS`] buckets are read, [`BUCKET_SLOTS`] slots each; a
//! label map is never written after it is published (each `WithLabels`
//! builds a new one), so no growth is in progress and overflow buckets
//! only appear past 8 labels per bucket. Go 1.24 made it a sorted slice
//! of key/value pairs ([`LAYOUT_SLICE`]).
//!
//! The labels kept are packed into `Sample::attrs`, each entry `key
//! length: u8, value length: u8 (|` [`VALUE_CUT`] `when the value was
//! cut), key, value`; the sample's [`crate::trace::Link`] then has zero
//! ids and `attrs_len` bytes of them.

/// One registered Go process (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Process {
    /// [`G_IN_TLS`]: `g` is at `thread pointer + tls_offset` (x86_64: Go's
    /// own TLS slot at `fs - 8` without cgo, the executable's
    /// `runtime.tlsg` with it; arm64 with cgo: `runtime.tls_g`).
    /// [`G_IN_REGISTER`]: in the thread's user register
    /// [`G_REGISTER_AT`] (arm64 without cgo, where Go keeps `g` in R28
    /// and never in TLS); `tls_offset` is then unused.
    pub g_in: u32,
    pub _pad: u32,
    pub tls_offset: i64,
    /// `offsetof(runtime.g, m)`.
    pub m: u32,
    /// `offsetof(runtime.m, curg)`.
    pub curg: u32,
    /// `offsetof(runtime.g, labels)`.
    pub labels: u32,
    /// [`LAYOUT_MAP`] or [`LAYOUT_SLICE`].
    pub layout: u32,
}

const _: () = assert!(core::mem::size_of::<Process>() == 32);

/// [`Process::g_in`]: `g` in the thread's TLS.
pub const G_IN_TLS: u32 = 0;
/// [`Process::g_in`]: `g` in a register (arm64's R28).
pub const G_IN_REGISTER: u32 = 1;
/// Where arm64's R28 is in the kernel's `struct pt_regs` (`regs[28]`).
pub const G_REGISTER_AT: usize = 28 * 8;

/// `labels` points at a `map[string]string` (Go 1.9 to 1.23).
pub const LAYOUT_MAP: u32 = 1;
/// `labels` points at `struct { list []label }` (Go 1.24 and 1.25;
/// 1.26 and 1.27 have `struct { List []label.Label }`, the same memory:
/// a slice of key/value string pairs).
pub const LAYOUT_SLICE: u32 = 2;

/// `runtime.hmap` (Go 1.9 to 1.23; 1.24 keeps labels in a slice, so its
/// swiss maps never matter here): `count int` at 0, `B uint8` at 9 (log2
/// of the buckets), `buckets unsafe.Pointer` at 16.
pub const HMAP_COUNT: u64 = 0;
pub const HMAP_LOG2_BUCKETS: u64 = 9;
pub const HMAP_BUCKETS: u64 = 16;
/// A `map[string]string` bucket: `tophash [8]uint8`, 8 keys, 8 values
/// (string headers, 16 bytes each), the overflow pointer.
pub const BUCKET_SLOTS: usize = 8;
pub const BUCKET_KEYS_AT: u64 = 8;
pub const BUCKET_VALUES_AT: u64 = BUCKET_KEYS_AT + 16 * BUCKET_SLOTS as u64;
pub const BUCKET_BYTES: u64 = BUCKET_VALUES_AT + 16 * BUCKET_SLOTS as u64 + 8;
/// A slot's `tophash` below this is empty (or evacuated, which a label
/// map never is).
pub const MIN_TOP_HASH: u8 = 5;
/// Buckets read of a label map: two hold the 13 labels a map has before
/// its third bucket (load factor 6.5); a larger map is cut, counted.
pub const MAX_BUCKETS: u32 = 2;

/// Labels a sample keeps at most; more are cut, counted.
pub const MAX_LABELS: usize = 10;
/// Longest key kept: a longer one is left out (a cut key would be
/// another key), counted.
pub const MAX_KEY: usize = 64;
/// Longest value kept: a longer one is cut to this many bytes and marked
/// with [`VALUE_CUT`].
pub const MAX_VALUE: usize = 64;
/// Set in an entry's value length when the value was cut.
pub const VALUE_CUT: u8 = 0x80;
/// Bytes of the longest entry.
pub const MAX_ENTRY: usize = 2 + MAX_KEY + MAX_VALUE;
const _: () = assert!(MAX_VALUE < VALUE_CUT as usize && MAX_KEY < 256);
const _: () = assert!(crate::trace::ATTRS_ROOM >= 4 * MAX_ENTRY);

/// A Go string header, as in memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoString {
    pub data: u64,
    pub len: u64,
}
