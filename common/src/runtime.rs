//! Frames of language runtimes (CPython, HotSpot, …) that a sample carries
//! beside its native ones ([`Stack`], the record's tail).
//!
//! A runtime frame is two words: `code` (the runtime's object for the
//! function: a code object, a `Method*`, an `nmethod*`) and `instr` (where
//! in it). The top byte of `code` is its [`tag`]: 0 for CPython (whose
//! frames came first and keep their layout), a runtime and kind otherwise.
//! Frames a walk found in place of native frames (JIT code) stand in the
//! native stack as a [`FRAME_MARK`] with their index here, so the host
//! puts them back where they ran.

/// Runtime frames kept per sample.
pub const MAX_FRAMES: usize = 128;
const _: () = assert!(MAX_FRAMES.is_power_of_two());

/// A user-stack entry that is not an address but runtime frame number
/// `entry & FRAME_INDEX_MASK` (no user address has these bits).
pub const FRAME_MARK: u64 = 0xfff0_0000_0000_0000;
/// The index bits of a [`FRAME_MARK`] entry.
pub const FRAME_INDEX_MASK: u64 = 0xffff;

/// The tag byte of a runtime frame's `code`.
pub mod tag {
    /// Bits of `code` that hold the tag.
    pub const SHIFT: u32 = 56;
    /// `code` without its tag.
    pub const ADDRESS_MASK: u64 = (1 << SHIFT) - 1;
    /// CPython (tag 0: its frames are untagged code object pointers).
    pub const CPYTHON: u8 = 0;
    /// HotSpot: `HOTSPOT | kind` (`crate::hotspot::kind`).
    pub const HOTSPOT: u8 = 0x10;
    /// V8: `V8 | kind` (`crate::v8::kind`).
    pub const V8: u8 = 0x20;
    /// The runtime bits of a tag.
    pub const RUNTIME_MASK: u8 = 0xf0;

    /// `address` tagged with `tag`.
    #[inline(always)]
    pub const fn apply(tag: u8, address: u64) -> u64 {
        ((tag as u64) << SHIFT) | (address & ADDRESS_MASK)
    }

    /// The tag of a frame's `code`.
    #[inline(always)]
    pub const fn of(code: u64) -> u8 {
        (code >> SHIFT) as u8
    }
}

/// One runtime frame; innermost first in [`Stack::frames`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub code: u64,
    pub instr: u64,
}

/// The runtime frames of one sample. A record carries only its `len`
/// frames (it ends there).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Stack {
    /// Valid entries of `frames`.
    pub len: u32,
    /// CPython: a `python::reason`.
    pub reason: u32,
    pub frames: [Frame; MAX_FRAMES],
}
