//! V8 (Node.js) in the kernel: what the agent tells the sampler about a
//! V8 process ([`Process`], in [`crate::MAP_V8_PROCESSES`]) and how the
//! sampler records the JavaScript frames it walks (in
//! `crate::runtime::Stack`).
//!
//! V8's generated code keeps frame pointers, and a frame says what it is
//! in the slots below its frame pointer: a JavaScript frame holds its
//! context (a tagged heap pointer) and its `JSFunction`; every other frame
//! (entry, exit, stub, …) a type marker (a small integer) where the
//! context would be. The agent reads the slots' offsets and the object
//! layouts from the binary's own postmortem constants (`v8dbg_*`, exported
//! by `node`), and marks V8's code (the JIT code space and the embedded
//! builtins) in the process's unwind mappings (`unwind::RUNTIME_TABLE`).
//! When the native unwinder reaches it, the sampler records each
//! JavaScript frame's `SharedFunctionInfo` and where in it the frame was,
//! and steps to the caller by the frame pointer. Naming happens on the host.

/// Capacity of the processes map.
pub const MAX_PROCESSES: u32 = 256;
/// Ranges of embedded builtins the kernel tells apart per process: the
/// copy in the binary, and the copy V8 maps next to each isolate's code
/// space (short builtin calls: one per worker thread too).
pub const MAX_BLOBS: usize = 8;
/// Words of a frame read at once: from [`WINDOW_LOW`] bytes below the
/// frame pointer to the return address above it.
pub const WINDOW_WORDS: usize = 8;
/// Bytes below the frame pointer where the window starts.
pub const WINDOW_LOW: u64 = 48;
/// Bytes from a frame pointer to its caller's stack pointer (the saved
/// frame pointer and the return address).
pub const FRAME_HEADER: u64 = 16;
/// The type markers of V8's entry frames, through which C++ calls
/// JavaScript (`StackFrame::ENTRY` and `CONSTRUCT_ENTRY`, the first two
/// frame types since V8 6, as `TypeToMarker` stores them: type << 1).
pub const ENTRY_MARKERS: [u64; 2] = [1 << 1, 2 << 1];
/// Bytes an aarch64 entry frame keeps above its frame pointer's pair and
/// below its caller's stack pointer: the callee-saved x19–x28 and d8–d15
/// that `JSEntry` pushes before the pair (`PushCalleeSavedRegisters`,
/// `EntryFrameConstants::kCalleeSavedRegisterBytesPushedBeforeFpLrPair`).
/// x86_64's pushes them below its frame pointer: nothing to add there.
pub const AARCH64_ENTRY_SAVED: u64 = 18 * 8;
/// Largest distance from a frame's stack pointer to its frame pointer
/// believed (a frame's locals and spills).
pub const MAX_FRAME_BYTES: u64 = 1 << 20;

/// One range of code: `[low, high)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Range {
    pub low: u64,
    pub high: u64,
}

/// Where the structures of one V8 are: its builtins and the offsets the
/// walk reads. Frame slots are word indices into the window
/// ([`WINDOW_LOW`] bytes below the frame pointer, [`WINDOW_WORDS`] words).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Process {
    pub blobs: [Range; MAX_BLOBS],
    /// The slot of the context or frame type marker.
    pub slot_marker: u32,
    /// The slot of a JavaScript frame's `JSFunction`.
    pub slot_function: u32,
    /// The slot of an interpreted frame's bytecode offset (a Smi).
    pub slot_bytecode_offset: u32,
    /// `HeapObject::map`.
    pub heap_object_map: u32,
    /// `Map::instance_type` (`u16`).
    pub map_instance_type: u32,
    /// `JSFunction::shared`.
    pub function_shared: u32,
    /// Instance types of `JSFunction`s: `[first, last]`.
    pub type_function_first: u32,
    pub type_function_last: u32,
    /// Instance type of `SharedFunctionInfo`.
    pub type_shared_info: u32,
    /// The slot of an interpreted or Sparkplug frame's `BytecodeArray`.
    pub slot_bytecode_array: u32,
    /// Instance type of `BytecodeArray`.
    pub type_bytecode_array: u32,
    pub _pad: u32,
}

/// Kinds of JavaScript frame, in a recorded frame's tag
/// (`runtime::tag::V8 | kind`); `code` is the `SharedFunctionInfo`, but
/// for [`kind::COMPILED`].
pub mod kind {
    /// Run by the interpreter (Ignition): `instr` is the bytecode offset.
    pub const INTERPRETED: u8 = 1;
    /// Run in code V8 generated (Sparkplug, Maglev, TurboFan): `code` is
    /// the `JSFunction` (whose code the host looks the pc up in), `instr`
    /// the pc.
    pub const COMPILED: u8 = 2;
    /// A JavaScript builtin (`Array.prototype.sort`, …), run in the
    /// embedded builtins: `instr` is the pc.
    pub const BUILTIN: u8 = 3;
    /// Stopped in a builtin without a frame of its own that compiled
    /// code (Sparkplug's) called: `code` is the `JSFunction`, `instr` the
    /// return address into its code (a caller's pc, not the leaf's).
    pub const COMPILED_CALL: u8 = 4;
}

/// Why a V8 step stopped the walk (counted per reason; the native
/// unwinder's own reason says how the whole stack ended).
pub mod reason {
    /// The step went on to the caller.
    pub const NATIVE: u32 = 0;
    /// The process has no record (not (yet) registered).
    pub const NO_PROCESS: u32 = 1;
    /// Reading the process's memory failed.
    pub const READ_FAULT: u32 = 2;
    /// No plausible frame at the frame pointer.
    pub const BAD_FRAME: u32 = 3;
    /// `runtime::MAX_FRAMES` runtime frames kept, more left.
    pub const DEPTH_LIMIT: u32 = 4;
    /// Those that stop a walk short of native code.
    pub const STOPS: [u32; 4] = [NO_PROCESS, READ_FAULT, BAD_FRAME, DEPTH_LIMIT];
}

/// What the walks count (`runtime::Runtime::V8`'s counters): the
/// [`reason`]s that stop a walk (a step that goes on is not counted), then
/// these.
pub mod event {
    /// A JavaScript frame walked.
    pub const FRAME: u32 = 5;
    /// A frame whose function slot held no `JSFunction` (kept as native).
    pub const NOT_FUNCTION: u32 = 6;
    /// Names by number.
    pub const NAMES: [&str; 7] = [
        "",
        "no_process",
        "read_fault",
        "bad_frame",
        "depth_limit",
        "frame",
        "not_function",
    ];
}

/// Instance types a `JSFunction` may have past the first: V8 9.6 and
/// later give class constructors and a few other functions types of
/// their own, right after `JS_FUNCTION_TYPE`.
pub const FUNCTION_TYPES: u32 = 15;
