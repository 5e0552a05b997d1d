//! HotSpot (the JVM) in the kernel: what the agent tells the sampler about
//! a Java process ([`Process`], in [`crate::MAP_HOTSPOT_PROCESSES`]) and how
//! the sampler records the Java frames it walks (in `crate::runtime::Stack`).
//!
//! The agent reads every offset from the JVM's own description of itself
//! (`gHotSpotVMStructs` and friends, exported by `libjvm.so`), and marks the
//! code cache's mappings in the process's unwind mappings
//! (`unwind::RUNTIME_TABLE`). When the native unwinder reaches one, the
//! sampler finds the code blob that holds the pc through the code heap's
//! segment map, records a frame and steps to the caller by the blob's kind:
//! interpreted frames by their frame pointer, compiled ones by their frame
//! size, stubs by either. Naming happens on the host.

/// Code heaps a process may describe (HotSpot has one, or three with the
/// segmented code cache: non-methods, profiled and non-profiled methods).
pub const MAX_HEAPS: usize = 4;
/// Capacity of the processes map.
pub const MAX_PROCESSES: u32 = 256;
/// Segment-map hops tried to find a blob's first segment (each hop moves
/// at most 254 segments back; the longest chains seen are about 9).
pub const MAX_SEGMAP_HOPS: u32 = 16;
/// Words above a compiled frame's computed end searched for a return
/// address into the code cache (x86_64 code may push words its frame
/// size does not count).
pub const RA_SEARCH_SLOTS: usize = 6;

/// One code heap: its reserved range and its segment map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Heap {
    /// `CodeHeap::_memory` low and high boundary.
    pub low: u64,
    pub high: u64,
    /// `CodeHeap::_segmap`'s low boundary: one byte per segment.
    pub segmap: u64,
    /// `CodeHeap::_log2_segment_size`.
    pub log2_segment: u32,
    pub _pad: u32,
}

/// Where the structures of one JVM are: its code heaps and the byte
/// offsets of the fields the walk reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Process {
    pub heaps: [Heap; MAX_HEAPS],
    /// Valid entries of `heaps`.
    pub heap_count: u32,
    /// `sizeof(HeapBlock)`: a blob starts this far into its first segment.
    pub heap_block_size: u32,
    /// `CodeBlob::_name` (a `const char *`; its first bytes tell the kind).
    pub blob_name: u32,
    /// `CodeBlob::_frame_size` (`int`, in words).
    pub blob_frame_size: u32,
    /// `CodeBlob::_frame_complete_offset` (`int`, bytes from code begin).
    pub blob_frame_complete: u32,
    /// `CodeBlob::_code_begin` (a pointer) or `_code_offset` (an `int`
    /// from the blob, JDK 23+: see `code_begin_is_offset`).
    pub blob_code_begin: u32,
    /// 1 when `blob_code_begin` is an offset from the blob.
    pub code_begin_is_offset: u32,
    /// `nmethod::_compile_id` (`int`): checks on the host that the blob
    /// named is still the one sampled.
    pub nmethod_compile_id: u32,
    /// `Method::_constMethod`.
    pub method_const_method: u32,
    /// `sizeof(ConstMethod)`: the bytecodes follow it.
    pub const_method_size: u32,
    /// Words below the frame pointer of an interpreted frame's bytecode
    /// pointer slot (8 on x86_64, 9 on aarch64; JDK 9+).
    pub interp_bcp_slot: u32,
    pub _pad: u32,
}

/// Kinds of HotSpot frame, in a recorded frame's tag (`runtime::tag`).
pub mod kind {
    /// An interpreted frame: `code` is the `Method*`, `instr` the
    /// bytecode index (low 32 bits; [`super::NO_BCI`] when unknown) and
    /// `ConstMethod* >> 3` (high 32 bits, a check).
    pub const INTERPRETED: u8 = 1;
    /// A compiled method (C1, C2, a native wrapper): `code` is the
    /// `nmethod*`, `instr` the pc's offset from its code begin (low 32
    /// bits) and its compile id (high 32 bits, a check).
    pub const COMPILED: u8 = 2;
    /// A stub, adapter or other blob: `code` is the blob, `instr` the
    /// pc's offset from its code begin.
    pub const STUB: u8 = 3;
}

/// [`kind::INTERPRETED`]'s bytecode index when it is not known.
pub const NO_BCI: u32 = 0xffff;

/// Why a walk of Java frames stopped (counted per reason; the native
/// unwinder's own reason says how the whole stack ended).
pub mod reason {
    /// Back in native code below the Java frames: the walk continues there.
    pub const NATIVE: u32 = 0;
    /// The process has no record (not (yet) registered).
    pub const NO_PROCESS: u32 = 1;
    /// The pc is in no code heap, or the segment map led nowhere.
    pub const NO_BLOB: u32 = 2;
    /// Reading the process's memory failed.
    pub const READ_FAULT: u32 = 3;
    /// No plausible return address where the frame said.
    pub const BAD_FRAME: u32 = 4;
    /// `runtime::MAX_FRAMES` runtime frames kept, more left.
    pub const DEPTH_LIMIT: u32 = 5;
    /// Those that stop a walk short of native code.
    pub const STOPS: [u32; 5] = [NO_PROCESS, NO_BLOB, READ_FAULT, BAD_FRAME, DEPTH_LIMIT];
}

/// What the walks count (`runtime::Runtime::Hotspot`'s counters): each
/// step's [`reason`], `NATIVE` being a Java frame walked.
pub mod event {
    /// A Java frame walked (its step ended in [`super::reason::NATIVE`]).
    pub const FRAME: u32 = super::reason::NATIVE;
    /// Names by number.
    pub const NAMES: [&str; 6] = [
        "frame",
        "no_process",
        "no_blob",
        "read_fault",
        "bad_frame",
        "depth_limit",
    ];
}
