//! The OpenTelemetry thread context (OTEP 4947) in the kernel: where a
//! process keeps its `otel_thread_ctx_v1` thread-local ([`Process`], in
//! [`crate::MAP_TRACE_PROCESSES`]), the record that variable points at
//! ([`Record`], the SDK's layout), and what a sample keeps of it
//! ([`Link`], the record's tail when [`crate::SAMPLE_FLAG_TRACE`] is set).
//!
//! At each sample of a registered process the sampler reads the thread
//! pointer from the task (`fsbase` on x86_64, `tpidr_el0` on aarch64,
//! offset from BTF), then finds the variable: at `thread pointer +
//! tls_offset` when it is in static TLS, or, in dynamic TLS (a library
//! `dlopen`ed), in the block the thread's DTV holds for its module. When
//! the variable's pointer is not null it reads the record's first 28
//! bytes; a record whose `valid` byte is 1 becomes the sample's [`Link`].
//! When its `attrs-data-size` is not 0 and at most [`MAX_ATTRS`], the
//! attributes' bytes follow (into `Sample::attrs`, and in a ring record
//! just before the link: see [`Link::attrs_len`]); the host names them
//! with the process context's `threadlocal.attribute_key_map`.

/// Capacity of the processes map (16 bytes each).
pub const MAX_PROCESSES: u32 = 4096;

/// Where one process's `otel_thread_ctx_v1` is in each of its threads.
///
/// Static TLS (`module` 0: the executable's block, a library loaded at
/// start, a `dlopen`ed library the loader placed in the static surplus):
/// at `thread pointer + tls_offset`. Dynamic TLS (`module` > 0): at
/// `tls_offset` into the block `dtv[module]` points at, the DTV's address
/// being at `thread pointer + dtv_at`. The vector's shape is the C
/// library's, told by the host ([`Dtv`]): glibc's 16-byte entries whose
/// first word is the block's address, the vector's length in entry -1;
/// musl's one-word entries, the length in entry 0. An entry of 0 or -1
/// has no block yet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Process {
    /// Static TLS: address of the variable minus the thread pointer
    /// (negative on x86_64, TLS variant II). Dynamic TLS: the variable's
    /// offset in its module's block.
    pub tls_offset: i64,
    /// 0: static TLS; otherwise the TLS module id of the variable's library.
    pub module: u32,
    /// Dynamic TLS: the thread's vector (unused for static TLS).
    pub dtv: Dtv,
}

/// Where a thread's DTV is and how it is laid out: the C library's
/// choice, the same for every thread of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dtv {
    /// Where the thread's DTV pointer is, from the thread pointer.
    pub at: i16,
    /// log2 of an entry's bytes: [`DTV_ENTRY_SHIFT_GLIBC`] or
    /// [`DTV_ENTRY_SHIFT_MUSL`] (anything else reads as glibc's).
    pub entry_shift: u8,
    /// The entry holding the vector's length: -1 (glibc) or 0 (musl).
    pub length_entry: i8,
}

impl Dtv {
    /// glibc's: `tcbhead_t.dtv` (8 on x86_64, after the TCB's self
    /// pointer; 0 on aarch64), `dtv_t` entries, the length in `dtv[-1]`.
    pub const fn glibc(aarch64: bool) -> Dtv {
        Dtv {
            at: if aarch64 { 0 } else { 8 },
            entry_shift: DTV_ENTRY_SHIFT_GLIBC,
            length_entry: -1,
        }
    }

    /// musl's: `struct pthread`'s `dtv` (its second word on x86_64; its
    /// last, just below the thread pointer, on aarch64), word entries, the
    /// module count in `dtv[0]`.
    pub const fn musl(aarch64: bool) -> Dtv {
        Dtv {
            at: if aarch64 { -8 } else { 8 },
            entry_shift: DTV_ENTRY_SHIFT_MUSL,
            length_entry: 0,
        }
    }
}

const _: () = assert!(core::mem::size_of::<Process>() == 16);

/// glibc's `dtv_t`: the block's address, then what to free.
pub const DTV_ENTRY_SHIFT_GLIBC: u8 = 4;

/// musl's DTV entries: the block's address alone.
pub const DTV_ENTRY_SHIFT_MUSL: u8 = 3;

/// Largest module id the sampler looks up (glibc numbers modules with TLS
/// from 1, one per library; a larger id is a bad registration).
pub const MAX_MODULE: u32 = 1 << 16;

/// The first bytes of a Thread-Local Context Record, as the SDK writes
/// them (byte-packed, host endianness); the attributes follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// 1 when the record may be read; anything else: ignore it.
    pub valid: u8,
    pub trace_flags: u8,
    pub attrs_size: u16,
}

/// Bytes of [`Record`] the sampler reads.
pub const RECORD_BYTES: usize = 28;
const _: () = assert!(core::mem::size_of::<Record>() == RECORD_BYTES);

/// Bytes of attributes (`attrs-data`) a sample carries at most. OTEP 4947
/// recommends whole records of at most 640 bytes, 28 of them the fixed
/// part; a record announcing more keeps its link and loses its attributes
/// ([`attrs::OVER_CAP`]): a cut list could end mid-entry.
pub const MAX_ATTRS: usize = 640 - RECORD_BYTES;

/// Room for the attributes in a `Sample`: [`MAX_ATTRS`] rounded up to
/// whole words, since a ring record pads them to 8 bytes.
pub const ATTRS_ROOM: usize = (MAX_ATTRS + 7) & !7;

/// What a sample keeps of its thread's record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Link {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub trace_flags: u8,
    /// Why the record's attributes were not kept ([`attrs`]; 0: kept, or
    /// none published).
    pub attrs_refused: u8,
    /// Bytes of attributes read (at most [`MAX_ATTRS`]). In a ring record
    /// they sit right before the link, padded with zeros to a multiple of
    /// 8; in a stack-copy record, in `Sample::attrs`.
    pub attrs_len: u16,
    pub _pad: [u8; 4],
}

/// Values of [`Link::attrs_refused`].
pub mod attrs {
    /// `attrs-data-size` over [`super::MAX_ATTRS`].
    pub const OVER_CAP: u8 = 1;
    /// The attributes were not readable memory.
    pub const UNREADABLE: u8 = 2;
}

/// Bytes a [`Link`] adds to a record.
pub const LINK_BYTES: usize = 32;
const _: () = assert!(core::mem::size_of::<Link>() == LINK_BYTES);
