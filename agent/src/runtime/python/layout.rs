//! Where CPython keeps what the walk and the names need, per version.
//!
//! 3.13 and later publish their offsets in `_Py_DebugOffsets`, the first
//! bytes of `_PyRuntime`; 3.11 and 3.12 do not, and their offsets below were
//! measured with `offsetof` against each version's own headers (release
//! builds, x86_64 and aarch64 alike: every field is pointer-sized or sits
//! after pointer-sized ones). 3.8 to 3.10 are `super::legacy`'s.
use hostprof_common::python::{ABSENT, Process};

use super::limits::{MAX_OBJECT_BYTES, MAX_STATE_BYTES, Refusal};

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
    pub line_table: LineTable,
}

/// The form of a version's line table and frame instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTable {
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
                line_table: LineTable::Locations,
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
                line_table: LineTable::Locations,
            },
        ),
        _ => return super::legacy::layout(minor),
    };
    Some(Layout { kernel, code })
}

/// Why `_Py_DebugOffsets` gave no layout.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DebugOffsetsError {
    /// Not the cookie, another version than the symbols said, a
    /// free-threaded build (whose thread states and frames differ) or a
    /// version whose form of it is not known.
    #[error("its _Py_DebugOffsets is not one hostprof knows")]
    Unknown,
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// The layout `_Py_DebugOffsets` (as read from the start of `_PyRuntime`)
/// describes, for the versions whose form of it is known (3.13, 3.14).
///
/// Each struct's size is capped ([`MAX_OBJECT_BYTES`], [`MAX_STATE_BYTES`])
/// and each field must end within its struct's size: the offsets are the
/// process's to write, and the kernel and the code-object reader read at
/// them per frame per sample.
pub fn from_debug_offsets(minor: u8, blob: &[u8]) -> Result<Layout, DebugOffsetsError> {
    use DebugOffsetsError::Unknown;
    let raw = |index: usize| -> Result<u64, DebugOffsetsError> {
        let bytes = blob.get(index * 8..index * 8 + 8).ok_or(Unknown)?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| Unknown)?))
    };
    if blob.get(..8) != Some(b"xdebugpy".as_slice()) {
        return Err(Unknown);
    }
    if (raw(1)? >> 16) & 0xff != u64::from(minor) || raw(2)? != 0 {
        return Err(Unknown);
    }
    // Indices of the u64 fields: the structs grew between versions
    // (pycore_runtime.h in 3.13, pycore_debug_offsets.h in 3.14). Each
    // struct starts with its size.
    struct Index {
        interpreter_size: usize,
        thread_size: usize,
        frame_size: usize,
        code_size: usize,
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
                interpreter_size: 6,
                thread_size: 19,
                frame_size: 28,
                code_size: 34,
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
                interpreter_size: 6,
                thread_size: 22,
                frame_size: 31,
                code_size: 39,
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
        _ => return Err(Unknown),
    };
    let size = |index: usize, what: &'static str, cap: u64| -> Result<u64, DebugOffsetsError> {
        let value = raw(index)?;
        if value > cap {
            return Err(Refusal::Offset {
                what,
                value,
                limit: cap,
            }
            .into());
        }
        Ok(value)
    };
    // `_PyRuntimeState` (index 3) and each struct the walk reads.
    let runtime = size(3, "sizeof(_PyRuntimeState)", MAX_STATE_BYTES)?;
    let interpreter = size(
        at.interpreter_size,
        "sizeof(PyInterpreterState)",
        MAX_STATE_BYTES,
    )?;
    let thread = size(at.thread_size, "sizeof(PyThreadState)", MAX_OBJECT_BYTES)?;
    let frame = size(
        at.frame_size,
        "sizeof(_PyInterpreterFrame)",
        MAX_OBJECT_BYTES,
    )?;
    let code = size(at.code_size, "sizeof(PyCodeObject)", MAX_OBJECT_BYTES)?;
    // A field of `width` bytes at the offset at `index`, within `size`.
    let field = |index: usize, what: &'static str, width: u64, size: u64| {
        let value = raw(index)?;
        match value.checked_add(width) {
            Some(end) if end <= size => Ok::<u32, DebugOffsetsError>(value as u32),
            _ => Err(Refusal::Offset {
                what,
                value,
                limit: size,
            }
            .into()),
        }
    };
    // Pointers and `unsigned long`s are 8 bytes, `co_firstlineno` an int,
    // `owner` a char; `co_code_adaptive` is the object's trailing array.
    let pointer = |index: usize, what: &'static str, size: u64| field(index, what, 8, size);
    Ok(Layout {
        kernel: Process {
            interpreters_head: pointer(at.interpreters_head, "interpreters.head", runtime)?,
            threads_head: pointer(at.threads_head, "threads.head", interpreter)?,
            thread_next: pointer(at.thread_next, "PyThreadState.next", thread)?,
            thread_native_id: pointer(at.native_thread_id, "native_thread_id", thread)?,
            thread_frame: pointer(at.current_frame, "current_frame", thread)?,
            cframe_frame: ABSENT,
            frame_previous: pointer(at.previous, "frame previous", frame)?,
            frame_code: pointer(at.executable, "f_executable", frame)?,
            frame_instr: pointer(at.instr_ptr, "instr_ptr", frame)?,
            frame_owner: field(at.owner, "frame owner", 1, frame)?,
            frame_is_entry: ABSENT,
            owner_cstack,
            owner_skip,
            ..Process::default()
        },
        code: CodeLayout {
            filename: pointer(at.filename, "co_filename", code)?.into(),
            qualname: pointer(at.qualname, "co_qualname", code)?.into(),
            firstlineno: field(at.firstlineno, "co_firstlineno", 4, code)?.into(),
            linetable: pointer(at.linetable, "co_linetable", code)?.into(),
            code_adaptive: field(at.code_adaptive, "co_code_adaptive", 0, code)?.into(),
            // Unchanged since 3.12 (no more wstr).
            ascii_size: 40,
            compact_size: 56,
            line_table: LineTable::Locations,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::{DebugOffsetsError, Refusal, from_debug_offsets};

    /// A 3.13 `_Py_DebugOffsets` (sizes and offsets of a release build,
    /// about), with `changes` (field index, value) made.
    fn debug_offsets_313(changes: &[(usize, u64)]) -> Vec<u8> {
        let mut fields = [0u64; 64];
        fields[1] = 0x030d_00f0;
        for (index, value) in [
            (3, 0x5_0000),
            (5, 0x620),
            (6, 0x8_0000),
            (9, 0x1c48),
            (19, 0x150),
            (21, 8),
            (23, 0x48),
            (25, 0x98),
            (28, 0x50),
            (29, 0),
            (30, 8),
            (31, 0x38),
            (33, 0x46),
            (34, 0xd0),
            (35, 0x70),
            (37, 0x80),
            (38, 0x88),
            (39, 0x44),
            (43, 0xc8),
        ]
        .into_iter()
        .chain(changes.iter().copied())
        {
            fields[index] = value;
        }
        let mut blob: Vec<u8> = fields
            .iter()
            .flat_map(|field| field.to_le_bytes())
            .collect();
        blob[..8].copy_from_slice(b"xdebugpy");
        blob
    }

    #[test]
    fn debug_offsets_in_range_give_a_layout() {
        let layout = from_debug_offsets(13, &debug_offsets_313(&[])).expect("a layout");
        assert_eq!(layout.kernel.thread_native_id, 0x98);
        assert_eq!(layout.code.qualname, 0x80);
        assert_eq!(layout.code.code_adaptive, 0xc8);
    }

    #[test]
    fn huge_offsets_and_sizes_are_refused() {
        let refused =
            |changes: &[(usize, u64)]| match from_debug_offsets(13, &debug_offsets_313(changes)) {
                Err(DebugOffsetsError::Refused(Refusal::Offset { what, .. })) => what,
                other => panic!("{changes:x?} gave {other:?}"),
            };
        // A qualname offset of 512 KiB (each frame would read that much).
        assert_eq!(refused(&[(37, 0x8_0000)]), "co_qualname");
        // Within the old 1 MiB bound, but past sizeof(PyCodeObject).
        assert_eq!(refused(&[(38, 0xd0)]), "co_linetable");
        assert_eq!(refused(&[(39, 0xcd)]), "co_firstlineno");
        assert_eq!(refused(&[(34, 1 << 20)]), "sizeof(PyCodeObject)");
        assert_eq!(refused(&[(19, u64::MAX)]), "sizeof(PyThreadState)");
        assert_eq!(refused(&[(33, u64::MAX)]), "frame owner");
        assert_eq!(refused(&[(3, 1 << 40)]), "sizeof(_PyRuntimeState)");
        assert_eq!(refused(&[(9, 0x7_fff9)]), "threads.head");
    }

    #[test]
    fn other_blobs_are_unknown() {
        let blob = debug_offsets_313(&[]);
        assert_eq!(
            from_debug_offsets(14, &blob),
            Err(DebugOffsetsError::Unknown)
        );
        assert_eq!(
            from_debug_offsets(13, &blob[..100]),
            Err(DebugOffsetsError::Unknown)
        );
        let free_threaded = debug_offsets_313(&[(2, 1)]);
        assert_eq!(
            from_debug_offsets(13, &free_threaded),
            Err(DebugOffsetsError::Unknown)
        );
        let mut bad_cookie = blob.clone();
        bad_cookie[0] = b'X';
        assert_eq!(
            from_debug_offsets(13, &bad_cookie),
            Err(DebugOffsetsError::Unknown)
        );
        assert_eq!(from_debug_offsets(13, &[]), Err(DebugOffsetsError::Unknown));
    }
}
