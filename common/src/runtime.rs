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

/// A language runtime whose frames the kernel walks. Each has a block of
/// [`EVENTS`] slots in the counters map, after the [`crate::Counter`]s:
/// its walk's `reason`s by number, then events of its own
/// ([`crate::python::event`], [`crate::hotspot::event`],
/// [`crate::v8::event`]). A new runtime adds a variant here and its names,
/// not counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runtime {
    Cpython = 0,
    Hotspot = 1,
    V8 = 2,
}

/// Counter slots per runtime.
pub const EVENTS: u32 = 16;

impl Runtime {
    pub const ALL: [Runtime; 3] = [Runtime::Cpython, Runtime::Hotspot, Runtime::V8];

    /// Its name as OTLP's `profile.frame.type` says it.
    pub const fn name(self) -> &'static str {
        match self {
            Runtime::Cpython => "cpython",
            Runtime::Hotspot => "jvm",
            Runtime::V8 => "v8js",
        }
    }

    /// Its counted events' names by number (`""`: nothing counted there).
    pub const fn events(self) -> &'static [&'static str] {
        match self {
            Runtime::Cpython => &crate::python::event::NAMES,
            Runtime::Hotspot => &crate::hotspot::event::NAMES,
            Runtime::V8 => &crate::v8::event::NAMES,
        }
    }

    /// The events that end its walk short of where it should end.
    pub const fn stops(self) -> &'static [u32] {
        match self {
            Runtime::Cpython => &crate::python::reason::STOPS,
            Runtime::Hotspot => &crate::hotspot::reason::STOPS,
            Runtime::V8 => &crate::v8::reason::STOPS,
        }
    }

    /// The counters map's index of its `event`.
    #[inline(always)]
    pub const fn counter(self, event: u32) -> u32 {
        crate::Counter::COUNT + self as u32 * EVENTS + (event & (EVENTS - 1))
    }
}

/// Size of the counters map: the [`crate::Counter`]s, then each runtime's
/// block.
pub const COUNTERS: u32 = crate::Counter::COUNT + Runtime::ALL.len() as u32 * EVENTS;
const _: () = assert!(EVENTS.is_power_of_two());
// Every runtime's names fit its block, and every counted stop has a name.
const _: () = {
    let mut r = 0;
    while r < Runtime::ALL.len() {
        let runtime = Runtime::ALL[r];
        assert!(runtime as usize == r);
        let names = runtime.events();
        assert!(names.len() <= EVENTS as usize);
        let stops = runtime.stops();
        let mut s = 0;
        while s < stops.len() {
            assert!((stops[s] as usize) < names.len() && !names[stops[s] as usize].is_empty());
            s += 1;
        }
        r += 1;
    }
};

/// Runtime frames kept per sample.
pub const MAX_FRAMES: usize = 128;
const _: () = assert!(MAX_FRAMES.is_power_of_two());

/// A user-stack entry that is not an address but runtime frame number
/// `entry & FRAME_INDEX_MASK` (no user address has these bits).
pub const FRAME_MARK: u64 = 0xfff0_0000_0000_0000;
/// The index bits of a [`FRAME_MARK`] entry.
pub const FRAME_INDEX_MASK: u64 = 0xffff;

/// Marks of native frames that stand for a runtime's (`unwind`'s mapping
/// marks, `hostprof_unwind::TABLE_MARK_SHIFT`): the agent marks the
/// mappings of an interpreter's loop, and the unwinder copies the mark
/// into each such frame's stack entry (`hostprof_unwind::stack_mark`).
pub mod mark {
    /// CPython's evaluation loop (`_PyEval_EvalFrameDefault` and the
    /// parts the compiler split off it): each call of it ran the
    /// interpreter frames of one group of the sample's [`super::Stack`]
    /// (up to a `crate::python::FRAME_ENTRY` frame).
    pub const CPYTHON: u32 = 1;
    /// The largest mark a mapping can carry.
    pub const MAX: u32 = 7;
}

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
