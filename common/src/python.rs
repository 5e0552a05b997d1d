//! CPython in the kernel: what the agent tells the sampler about a Python
//! process ([`Process`], in [`crate::MAP_PYTHON_PROCESSES`]),
//! and the interpreter frames the sampler records per sample ([`Stack`]).
//!
//! The sampler finds the sampled thread's `PyThreadState` in the thread map
//! the agent fills ([`crate::MAP_PYTHON_THREADS`], keyed by [`ThreadKey`]),
//! checked against the state's own thread id; failing that, by walking the
//! newest [`MAX_THREADS`] of the runtime's first interpreter's thread list
//! for the thread's id (as the process's pid namespace numbers it, which is
//! what CPython stores). A walk that gives up tells the agent, in its
//! record's reason, to fill the map for that process. Then it follows the
//! interpreter frames from the thread's current one. Per frame
//! it keeps the code object's address and the instruction pointer; the agent
//! names them later from the process's memory. Every offset comes from the
//! agent, so one program serves every CPython version.

pub use crate::runtime::{Frame, MAX_FRAMES, Stack};

/// Thread states looked at to find the sampled thread's when the thread
/// map has none for it: new threads are at the head of the list, so this
/// finds them before the agent knows them.
pub const MAX_THREADS: u32 = 32;
/// Capacity of the thread map (thread states of every Python process;
/// about 64 bytes each, preallocated as `perf_event` programs require).
pub const MAX_THREAD_STATES: u32 = 8192;
/// Capacity of the processes map (48 bytes each).
pub const MAX_PROCESSES: u32 = 4096;
/// An offset the version does not have.
pub const ABSENT: u32 = u32::MAX;
/// Bit 0 of [`Frame::code`]: this frame is the first one its call of the
/// evaluation loop (`_PyEval_EvalFrameDefault`) ran, so the frames after it
/// belong to an older call of the loop, further down the native stack.
/// Code objects are at least 8-aligned, so the bit is free.
pub const FRAME_ENTRY: u64 = 1;
/// Low bits of `f_executable` that are tags, not address (3.14 stack refs).
pub const CODE_TAG_BITS: u64 = 7;

/// Why a walk of the interpreter frames stopped.
pub mod reason {
    /// Not a Python process (no record): nothing walked.
    pub const NONE: u32 = 0;
    /// Reached the thread's first frame.
    pub const COMPLETE: u32 = 1;
    /// The thread has no thread state (not (yet) known to the interpreter),
    /// or the process no interpreter (it links libpython without starting
    /// it, as perf does).
    pub const NO_THREAD: u32 = 2;
    /// Reading the process's memory failed.
    pub const READ_FAULT: u32 = 3;
    /// [`super::MAX_FRAMES`] frames kept, more left.
    pub const DEPTH_LIMIT: u32 = 4;
    /// The thread is neither in the thread map nor among the newest
    /// [`super::MAX_THREADS`] thread states: the agent fills the map.
    pub const THREAD_LIMIT: u32 = 5;
    /// The thread's id in its pid namespace could not be read.
    pub const NO_NAMESPACE: u32 = 6;
    /// Those that stop a walk short of the thread's first frame.
    pub const STOPS: [u32; 5] = [
        NO_THREAD,
        READ_FAULT,
        DEPTH_LIMIT,
        THREAD_LIMIT,
        NO_NAMESPACE,
    ];
}

/// What the walks count (`runtime::Runtime::Cpython`'s counters): how each
/// ended ([`reason`], `NONE` aside), then these.
pub mod event {
    /// A walk began (a sample of a registered process).
    pub const WALKED: u32 = 7;
    /// A walk's thread state came from the thread map.
    pub const THREAD_CACHED: u32 = 8;
    /// No walk: the sample's native stack, walked whole, ran no call of
    /// the evaluation loop (none of its frames was marked).
    pub const OUTSIDE_LOOP: u32 = 9;
    /// Names by number.
    pub const NAMES: [&str; 10] = [
        "",
        "complete",
        "no_thread",
        "read_fault",
        "depth_limit",
        "thread_limit",
        "no_namespace",
        "walked",
        "thread_cached",
        "outside_loop",
    ];
}

/// Key of [`crate::MAP_PYTHON_THREADS`]; the value is the `PyThreadState`'s
/// address (`u64`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ThreadKey {
    /// The process, as the sampler sees it (the root pid namespace).
    pub tgid: u32,
    /// The thread's id in the process's own pid namespace: what CPython
    /// keeps in `PyThreadState.native_thread_id`.
    pub tid: u32,
}

/// Where the structures of one Python process are: the runtime's address and
/// byte offsets of the fields the walk reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Process {
    /// Address of `_PyRuntime`.
    pub runtime: u64,
    /// Device (kernel encoding) and inode of the process's pid namespace.
    pub pidns_dev: u64,
    pub pidns_ino: u64,
    /// `_PyRuntimeState.interpreters.head`.
    pub interpreters_head: u32,
    /// `PyInterpreterState.threads.head`.
    pub threads_head: u32,
    /// `PyThreadState.next`.
    pub thread_next: u32,
    /// `PyThreadState.native_thread_id` (3.11+); [`ABSENT`] before, where
    /// the thread's id is read from its `pthread_t` (next two fields).
    pub thread_native_id: u32,
    /// `PyThreadState.cframe` (3.11, 3.12) or `.current_frame` (3.13+).
    pub thread_frame: u32,
    /// `_PyCFrame.current_frame` (3.11, 3.12); [`ABSENT`] when
    /// `thread_frame` is the frame itself.
    pub cframe_frame: u32,
    /// `_PyInterpreterFrame.previous`.
    pub frame_previous: u32,
    /// `_PyInterpreterFrame.f_code` / `.f_executable`.
    pub frame_code: u32,
    /// `_PyInterpreterFrame.prev_instr` / `.instr_ptr`.
    pub frame_instr: u32,
    /// `_PyInterpreterFrame.owner`; [`ABSENT`] for frame objects (3.8 to
    /// 3.10: `PyFrameObject`, whose fields the `frame_*` offsets then name:
    /// `f_back`, `f_code`, `f_lasti`), each one its own call of the
    /// evaluation loop.
    pub frame_owner: u32,
    /// `_PyInterpreterFrame.is_entry` (3.11); [`ABSENT`] from 3.12 on.
    pub frame_is_entry: u32,
    /// `owner` of the shim frame each call of the evaluation loop pushes
    /// (3 from 3.12 to 3.14: `FRAME_OWNED_BY_CSTACK`, then
    /// `FRAME_OWNED_BY_INTERPRETER`); `u16::MAX` in 3.11, which has none.
    pub owner_cstack: u16,
    /// Another `owner` of frames that are not Python code
    /// (`FRAME_OWNED_BY_CSTACK`, 4, in 3.14); `u16::MAX` when none.
    pub owner_skip: u16,
    /// `PyThreadState.thread_id` (the thread's `pthread_t`, which is its
    /// `struct pthread` in glibc and musl), for versions without
    /// `native_thread_id` (3.8 to 3.10); [`ABSENT`] otherwise.
    pub thread_pthread: u32,
    /// Offset of the kernel's thread id in that `struct pthread` (the C
    /// library's; found by the agent per process).
    pub pthread_tid: u32,
}
