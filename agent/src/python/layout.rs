//! Where CPython keeps what the walk and the names need, per version.
//!
//! 3.13 and later publish their offsets in `_Py_DebugOffsets`, the first
//! bytes of `_PyRuntime`; 3.11 and 3.12 do not, and their offsets below were
//! measured with `offsetof` against each version's own headers (release
//! builds, x86_64 and aarch64 alike: every field is pointer-sized or sits
//! after pointer-sized ones). 3.8 to 3.10 are `super::legacy`'s.
use hostprof_common::python::{ABSENT, Process};

/// Offsets of the fields the agent reads to name a code object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub filename: u64,
    pub qualname: u64,
    pub firstlineno: u64,
    pub linetable: u64,
    /// Start of the bytecode (`co_code_adaptive`).
    pub code_adaptive: u64,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's bytes start.
    pub ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where other compact strings' start.
    pub compact_size: u64,
    /// What `linetable` holds, and what a frame's instruction is.
    pub lines: Lines,
}

/// The form of a version's line table and frame instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lines {
    /// 3.11+: PEP 626 location table; the instruction is a pointer into
    /// the code object's bytecode (`code_adaptive`).
    Locations,
    /// 3.8, 3.9: `co_lnotab`; `f_lasti` in bytes (`super::legacy`).
    Lnotab,
    /// 3.10: `co_linetable` pairs; `f_lasti` in 2-byte code units.
    Pairs,
}

/// One version's layout: the kernel's part (runtime address and pid
/// namespace left for the caller) and the names' part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub kernel: Process,
    pub code: CodeLayout,
}

/// `PyBytesObject.ob_sval` and `PyVarObject.ob_size`, the same in every
/// version since 3.0.
pub const BYTES_DATA: u64 = 32;
pub const VAR_SIZE: u64 = 16;
/// `PyObject.ob_type`.
pub const OB_TYPE: u64 = 8;
/// `PyASCIIObject.length` and `.state`.
pub const UNICODE_LENGTH: u64 = 16;
pub const UNICODE_STATE: u64 = 32;

/// Bytes of `_Py_DebugOffsets` read (its 3.14 form is 0x300 bytes long;
/// only its first 50 fields are used).
pub const DEBUG_OFFSETS_BYTES: usize = 0x200;

/// The layout of a version without debug offsets (3.8 to 3.12).
pub fn fixed(minor: u8) -> Option<Layout> {
    let (kernel, code) = match minor {
        11 => (
            Process {
                interpreters_head: 40,
                threads_head: 16,
                thread_next: 8,
                thread_native_id: 160,
                thread_frame: 56,
                cframe_frame: 8,
                frame_previous: 48,
                frame_code: 32,
                frame_instr: 56,
                frame_owner: 69,
                frame_is_entry: 68,
                owner_cstack: u16::MAX,
                owner_skip: u16::MAX,
                ..Process::default()
            },
            CodeLayout {
                filename: 112,
                qualname: 128,
                firstlineno: 72,
                linetable: 136,
                code_adaptive: 184,
                ascii_size: 48,
                compact_size: 72,
                lines: Lines::Locations,
            },
        ),
        12 => (
            Process {
                interpreters_head: 40,
                threads_head: 72,
                thread_next: 8,
                thread_native_id: 144,
                thread_frame: 56,
                cframe_frame: 0,
                frame_previous: 8,
                frame_code: 0,
                frame_instr: 56,
                frame_owner: 70,
                frame_is_entry: ABSENT,
                owner_cstack: 3,
                owner_skip: u16::MAX,
                ..Process::default()
            },
            CodeLayout {
                filename: 112,
                qualname: 128,
                firstlineno: 68,
                linetable: 136,
                code_adaptive: 192,
                ascii_size: 40,
                compact_size: 56,
                lines: Lines::Locations,
            },
        ),
        _ => return super::legacy::layout(minor),
    };
    Some(Layout { kernel, code })
}

/// The layout `_Py_DebugOffsets` (as read from the start of `_PyRuntime`)
/// describes, for the versions whose form of it is known (3.13, 3.14);
/// `None` when the cookie or version does not match.
pub fn from_debug_offsets(minor: u8, blob: &[u8]) -> Option<Layout> {
    let field = |index: usize| -> Option<u32> {
        let bytes = blob.get(index * 8..index * 8 + 8)?;
        let value = u64::from_le_bytes(bytes.try_into().ok()?);
        // An offset into a struct: anything past 1 MiB is not one.
        (value < 1 << 20).then_some(value as u32)
    };
    if blob.get(..8)? != b"xdebugpy" {
        return None;
    }
    let version = u64::from_le_bytes(blob.get(8..16)?.try_into().ok()?);
    if (version >> 16) & 0xff != u64::from(minor) || field(2)? != 0 {
        // Another version than the symbols said, or a free-threaded build
        // (whose thread states and frames differ).
        return None;
    }
    // Indices of the u64 fields: the structs grew between versions
    // (pycore_runtime.h in 3.13, pycore_debug_offsets.h in 3.14).
    struct Index {
        interpreters_head: usize,
        threads_head: usize,
        thread_next: usize,
        current_frame: usize,
        native_thread_id: usize,
        previous: usize,
        executable: usize,
        instr_ptr: usize,
        owner: usize,
        filename: usize,
        qualname: usize,
        linetable: usize,
        firstlineno: usize,
        code_adaptive: usize,
    }
    let (at, owner_cstack, owner_skip) = match minor {
        13 => (
            Index {
                interpreters_head: 5,
                threads_head: 9,
                thread_next: 21,
                current_frame: 23,
                native_thread_id: 25,
                previous: 29,
                executable: 30,
                instr_ptr: 31,
                owner: 33,
                filename: 35,
                qualname: 37,
                linetable: 38,
                firstlineno: 39,
                code_adaptive: 43,
            },
            3,
            u16::MAX,
        ),
        14 => (
            Index {
                interpreters_head: 5,
                threads_head: 9,
                thread_next: 24,
                current_frame: 26,
                native_thread_id: 28,
                previous: 32,
                executable: 33,
                instr_ptr: 34,
                owner: 36,
                filename: 40,
                qualname: 42,
                linetable: 43,
                firstlineno: 44,
                code_adaptive: 48,
            },
            // 3.14's evaluation loop marks its entry frame
            // FRAME_OWNED_BY_INTERPRETER (3); FRAME_OWNED_BY_CSTACK (4) is
            // left unused, and skipped should it appear.
            3,
            4,
        ),
        _ => return None,
    };
    Some(Layout {
        kernel: Process {
            interpreters_head: field(at.interpreters_head)?,
            threads_head: field(at.threads_head)?,
            thread_next: field(at.thread_next)?,
            thread_native_id: field(at.native_thread_id)?,
            thread_frame: field(at.current_frame)?,
            cframe_frame: ABSENT,
            frame_previous: field(at.previous)?,
            frame_code: field(at.executable)?,
            frame_instr: field(at.instr_ptr)?,
            frame_owner: field(at.owner)?,
            frame_is_entry: ABSENT,
            owner_cstack,
            owner_skip,
            ..Process::default()
        },
        code: CodeLayout {
            filename: field(at.filename)?.into(),
            qualname: field(at.qualname)?.into(),
            firstlineno: field(at.firstlineno)?.into(),
            linetable: field(at.linetable)?.into(),
            code_adaptive: field(at.code_adaptive)?.into(),
            // Unchanged since 3.12 (no more wstr).
            ascii_size: 40,
            compact_size: 56,
            lines: Lines::Locations,
        },
    })
}
