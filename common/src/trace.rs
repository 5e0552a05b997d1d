//! The OpenTelemetry thread context (OTEP 4947) in the kernel: where a
//! process keeps its `otel_thread_ctx_v1` thread-local ([`Process`], in
//! [`crate::MAP_TRACE_PROCESSES`]), the record that variable points at
//! ([`Record`], the SDK's layout), and what a sample keeps of it
//! ([`Link`], the record's tail when [`crate::SAMPLE_FLAG_TRACE`] is set).
//!
//! At each sample of a registered process the sampler reads the thread
//! pointer from the task (`fsbase` on x86_64, `tpidr_el0` on aarch64,
//! offset from BTF), the variable at `thread pointer + tls_offset`, then,
//! when that pointer is not null, the record's first 28 bytes; a record
//! whose `valid` byte is 1 becomes the sample's [`Link`]. Attributes are
//! not read.

/// Capacity of the processes map (16 bytes each).
pub const MAX_PROCESSES: u32 = 4096;

/// Where one process's `otel_thread_ctx_v1` is, relative to each thread's
/// thread pointer (static TLS: the executable's block or a library loaded
/// at start).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Process {
    /// Address of the variable minus the thread pointer (negative on
    /// x86_64, TLS variant II).
    pub tls_offset: i64,
    pub _reserved: u64,
}

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

/// What a sample keeps of its thread's record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Link {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub trace_flags: u8,
    pub _pad: [u8; 7],
}

/// Bytes a [`Link`] adds to a record.
pub const LINK_BYTES: usize = 32;
const _: () = assert!(core::mem::size_of::<Link>() == LINK_BYTES);
