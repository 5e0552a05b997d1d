//! CPython's interpreter frames, walked in the kernel for samples of the
//! Python processes the agent registered (see `hostprof_common::python`).
//!
//! A program of its own (`hostprof_common::TAIL_PYTHON`): the sampler and
//! the off-CPU tracepoint fill their record, then jump here ([`jump`]) for
//! Python processes, and the walk's program writes the record; so the walk
//! adds nothing to the verification of theirs. Modern variant (`bpf_loop`,
//! Linux 5.17+): each loop is a callback the verifier checks once. Legacy
//! (5.10+): [`LEGACY_STEPS_PER_CALL`] unrolled steps a run, and the
//! program calls itself for the next ones, its place kept per CPU.
use super::*;

use aya_ebpf::{bindings::bpf_pidns_info, helpers::generated::bpf_get_ns_current_pid_tgid};
use hostprof_common::{
    TAIL_PYTHON,
    python::{self as py, ABSENT, CODE_TAG_BITS, FRAME_ENTRY, MAX_FRAMES, MAX_THREADS},
    runtime::Runtime,
};

#[map(name = "PYTHON_PROCS")]
static PYTHON_PROCS: HashMap<u32, py::Process> = HashMap::with_max_entries(py::MAX_PROCESSES, 0);

#[map(name = "PYTHON_THREADS")]
static PYTHON_THREADS: HashMap<py::ThreadKey, u64> =
    HashMap::with_max_entries(py::MAX_THREAD_STATES, 0);

/// Where a legacy walk is between its runs, per CPU and `SLOT_*` (the
/// sampler's NMI can interrupt the off-CPU tracepoint's walk).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct LegacyWalk {
    /// The thread state (`THREADS`) or frame (`FRAMES`) looked at next.
    cursor: u64,
    /// The sampled thread's id in its process's pid namespace.
    tid: u32,
    stage: u32,
    /// Thread states or frames looked at so far in this stage.
    steps: u32,
    _pad: u32,
}

#[map(name = "PYTHON_LEGACY_WALK")]
static PYTHON_LEGACY_WALK: PerCpuArray<LegacyWalk> = PerCpuArray::with_max_entries(2, 0);

/// `LegacyWalk::stage`: set by [`jump`], the walk has not begun.
const START: u32 = 0;
/// Searching the interpreter's thread states for the sampled thread's.
const THREADS: u32 = 1;
/// Walking the thread's frames.
const FRAMES: u32 = 2;

/// Steps (thread states or frames) one run of the legacy walk takes before
/// it calls itself: the old verifiers walk each unrolled step, so a
/// whole walk (32 thread states and 136 frames) is more than one program.
pub(super) const LEGACY_STEPS_PER_CALL: u32 = 8;

/// Not a reason a walk ends with: the walk goes on.
const STEPPING: u32 = u32::MAX - 1;

/// Jumps to CPython's walk (the `TAIL_PYTHON` program of `tails`) when the
/// walk is on, `tgid` is a registered Python process and the sample
/// (filled, its `flags`) may have run the evaluation loop. Returns when it
/// is not, or the jump failed (no program there, or no tail calls left):
/// the caller then writes the record without interpreter frames, as it
/// filled it.
#[inline(always)]
pub(super) fn jump<C: EbpfContext>(
    ctx: &C,
    tails: &ProgramArray,
    slot: u32,
    tgid: u32,
    flags: u32,
) {
    if unsafe { read_volatile(&PYTHON_WALK) } == 0
        || !present(tgid, hostprof_common::present::PYTHON)
        || unsafe { PYTHON_PROCS.get(&tgid) }.is_none()
    {
        return;
    }
    if outside_the_loop(tgid, flags) {
        bump_runtime(Runtime::Cpython, py::event::OUTSIDE_LOOP);
        return;
    }
    if let Some(walk) = PYTHON_LEGACY_WALK.get_ptr_mut(slot) {
        // SAFETY: a per-CPU map value; nothing else runs on this CPU's slot.
        unsafe { (*walk).stage = START };
    }
    unsafe { tails.tail_call(ctx, TAIL_PYTHON) };
}

/// Whether a sample of `tgid` whose record has `flags` ran no call of the
/// evaluation loop: its tables' walk reached the end of the stack and
/// marked no frame, in a process whose mappings mark the loop (the agent
/// marks them once it found the interpreter). Such a thread (a C library's
/// worker, the main thread before `Py_Main` runs code) has no interpreter
/// frames to walk, and its thread-state search would end in none.
#[inline(always)]
fn outside_the_loop(tgid: u32, flags: u32) -> bool {
    let complete = (flags >> SAMPLE_UNWIND_SHIFT) & 0xff == unwind::reason::COMPLETE;
    flags & SAMPLE_FLAG_USER_TABLES != 0
        && flags & SAMPLE_FLAG_MARKED == 0
        && complete
        && unsafe { PROCESS_MAPPINGS.get(&tgid) }
            .is_some_and(|process| process.flags & unwind::MARKED != 0)
}

/// The walk's program's work, before it writes the record: the current
/// thread's interpreter frames into `stack`, the `K` variant's way. The
/// legacy walk returns once it is over, or jumps to its next run.
#[inline(always)]
pub(super) fn walk<K: Kernel, C: EbpfContext>(
    ctx: &C,
    tails: &ProgramArray,
    slot: u32,
    stack: &mut py::Stack,
) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if K::BPF_LOOP {
        walk_modern(tgid, stack);
    } else {
        walk_legacy(ctx, tails, slot, tgid, stack);
    }
}

/// Ends a walk: its reason in the record and in the counters.
#[inline(always)]
fn finish(stack: &mut py::Stack, reason: u32) {
    stack.reason = reason;
    if reason != py::reason::NONE {
        bump_runtime(Runtime::Cpython, reason);
    }
}

#[inline(always)]
fn walk_modern(tgid: u32, stack: &mut py::Stack) {
    let Some(process) = (unsafe { PYTHON_PROCS.get(&tgid) }) else {
        return;
    };
    stack.len = 0;
    stack.reason = py::reason::NONE;
    bump_runtime(Runtime::Cpython, py::event::WALKED);
    let reason = walk_frames(tgid, process, stack);
    finish(stack, reason);
}

/// The sampled thread's id in `process`'s pid namespace.
#[inline(always)]
fn namespace_tid(process: &py::Process) -> Option<u32> {
    let mut ns = bpf_pidns_info { pid: 0, tgid: 0 };
    let found = unsafe {
        bpf_get_ns_current_pid_tgid(
            process.pidns_dev,
            process.pidns_ino,
            &mut ns,
            size_of::<bpf_pidns_info>() as u32,
        )
    };
    (found == 0).then_some(ns.pid)
}

/// The thread's innermost interpreter frame, from its state.
#[inline(always)]
fn first_frame(process: &py::Process, thread: u64) -> Result<u64, u32> {
    use py::reason::*;
    let frame = read_user::<u64>(thread + u64::from(process.thread_frame)).ok_or(READ_FAULT)?;
    if process.cframe_frame != ABSENT && frame != 0 {
        return read_user::<u64>(frame + u64::from(process.cframe_frame)).ok_or(READ_FAULT);
    }
    Ok(frame)
}

#[inline(always)]
fn walk_frames(tgid: u32, process: &py::Process, stack: &mut py::Stack) -> u32 {
    use py::reason::*;
    let Some(tid) = namespace_tid(process) else {
        return NO_NAMESPACE;
    };
    let thread = match thread_state(tgid, process, tid) {
        Ok(thread) => thread,
        Err(reason) => return reason,
    };
    let frame = match first_frame(process, thread) {
        Ok(frame) => frame,
        Err(reason) => return reason,
    };
    stack.len = 0;
    let mut walk = FrameWalk {
        process,
        stack,
        frame,
        reason: DEPTH_LIMIT,
        _pad: 0,
    };
    unsafe {
        bpf_loop(
            (MAX_FRAMES + 8) as u32,
            frame_step as *mut c_void,
            (&mut walk as *mut FrameWalk).cast(),
            0,
        )
    };
    walk.reason
}

/// The legacy walk: [`LEGACY_STEPS_PER_CALL`] steps from where the last
/// run left it, then a jump to the next run while it goes on. Returns
/// when it is over; a jump that fails (out of tail calls: the native
/// unwind before it took most) ends it at the depth limit, keeping the
/// innermost frames.
#[inline(always)]
fn walk_legacy<C: EbpfContext>(
    ctx: &C,
    tails: &ProgramArray,
    slot: u32,
    tgid: u32,
    stack: &mut py::Stack,
) {
    let Some(walk) = PYTHON_LEGACY_WALK.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: as in `jump`.
    let walk = unsafe { &mut *walk };
    let Some(process) = (unsafe { PYTHON_PROCS.get(&tgid) }) else {
        return;
    };
    let mut reason = STEPPING;
    if unsafe { read_volatile(&walk.stage) } == START {
        stack.len = 0;
        stack.reason = py::reason::NONE;
        bump_runtime(Runtime::Cpython, py::event::WALKED);
        reason = legacy_begin(tgid, process, walk);
    }
    if reason == STEPPING {
        for _ in 0..LEGACY_STEPS_PER_CALL {
            reason = legacy_step(process, walk, stack);
            if reason != STEPPING {
                break;
            }
        }
    }
    if reason == STEPPING {
        unsafe { tails.tail_call(ctx, TAIL_PYTHON) };
        reason = py::reason::DEPTH_LIMIT;
    }
    finish(stack, reason);
}

/// Starts a legacy walk where [`search_start`] says: at the thread's
/// frames, or at the thread states to search.
#[inline(always)]
fn legacy_begin(tgid: u32, process: &py::Process, walk: &mut LegacyWalk) -> u32 {
    use py::reason::*;
    let Some(tid) = namespace_tid(process) else {
        return NO_NAMESPACE;
    };
    walk.tid = tid;
    walk.steps = 0;
    match search_start(tgid, process, tid) {
        Ok(Start::Cached(state)) => match first_frame(process, state) {
            Ok(frame) => {
                walk.cursor = frame;
                walk.stage = FRAMES;
                STEPPING
            }
            Err(reason) => reason,
        },
        Ok(Start::Head(thread)) => {
            walk.cursor = thread;
            walk.stage = THREADS;
            STEPPING
        }
        Err(reason) => reason,
    }
}

/// One step of a legacy walk: a thread state of the search, or a frame.
/// Limits as the modern walk's loops: `MAX_THREADS` states, `MAX_FRAMES
/// + 8` frames.
#[inline(always)]
fn legacy_step(process: &py::Process, walk: &mut LegacyWalk, stack: &mut py::Stack) -> u32 {
    use py::reason::*;
    let steps = unsafe { read_volatile(&walk.steps) };
    walk.steps = steps + 1;
    if unsafe { read_volatile(&walk.stage) } == THREADS {
        if steps >= MAX_THREADS {
            return THREAD_LIMIT;
        }
        return match thread_next(process, walk.cursor, u64::from(walk.tid)) {
            Ok(next) => {
                walk.cursor = next;
                STEPPING
            }
            Err(FOUND) => match first_frame(process, walk.cursor) {
                Ok(frame) => {
                    walk.cursor = frame;
                    walk.stage = FRAMES;
                    walk.steps = 0;
                    STEPPING
                }
                Err(reason) => reason,
            },
            Err(reason) => reason,
        };
    }
    if steps >= (MAX_FRAMES + 8) as u32 {
        return DEPTH_LIMIT;
    }
    match frame_next(process, stack, walk.cursor) {
        Ok(previous) => {
            walk.cursor = previous;
            STEPPING
        }
        Err(reason) => reason,
    }
}

/// Not a reason a walk ends with: the thread search found the sampled
/// thread's state.
const FOUND: u32 = u32::MAX;

/// Where the search for the sampled thread's state starts.
enum Start {
    /// The agent's entry for the thread, still the thread's (states are
    /// freed with their thread, and the agent's map lags).
    Cached(u64),
    /// The head of the interpreter's thread states, to search from.
    Head(u64),
}

/// Where the sampled thread's state is found: [`Start`]. `Err`: why not
/// (`NO_THREAD` for an interpreter never started: a program that links
/// libpython without running it, such as perf, has no interpreter, which
/// is not a read fault).
#[inline(always)]
fn search_start(tgid: u32, process: &py::Process, tid: u32) -> Result<Start, u32> {
    use py::reason::*;
    let key = py::ThreadKey { tgid, tid };
    if let Some(&cached) = unsafe { PYTHON_THREADS.get(&key) }
        && thread_id(process, cached) == Some(u64::from(tid))
    {
        bump_runtime(Runtime::Cpython, py::event::THREAD_CACHED);
        return Ok(Start::Cached(cached));
    }
    let interpreter = read_user::<u64>(process.runtime + u64::from(process.interpreters_head))
        .ok_or(READ_FAULT)?;
    if interpreter == 0 {
        return Err(NO_THREAD);
    }
    let thread =
        read_user::<u64>(interpreter + u64::from(process.threads_head)).ok_or(READ_FAULT)?;
    Ok(Start::Head(thread))
}

/// The sampled thread's `PyThreadState`: see [`search_start`], then the
/// newest thread states' search. `Err`: the reason the search gave up.
#[inline(always)]
fn thread_state(tgid: u32, process: &py::Process, tid: u32) -> Result<u64, u32> {
    use py::reason::*;
    let thread = match search_start(tgid, process, tid)? {
        Start::Cached(state) => return Ok(state),
        Start::Head(thread) => thread,
    };
    let mut search = ThreadSearch {
        process,
        thread,
        tid: u64::from(tid),
        reason: THREAD_LIMIT,
        _pad: 0,
    };
    unsafe {
        bpf_loop(
            MAX_THREADS,
            thread_step as *mut c_void,
            (&mut search as *mut ThreadSearch).cast(),
            0,
        )
    };
    if search.reason == FOUND {
        Ok(search.thread)
    } else {
        Err(search.reason)
    }
}

/// The id of the thread whose state is at `state`, as its pid namespace
/// numbers it: CPython's own copy (3.11+), else the C library's, in the
/// `struct pthread` the state's `pthread_t` points at.
#[inline(always)]
fn thread_id(process: &py::Process, state: u64) -> Option<u64> {
    if process.thread_native_id != ABSENT {
        return read_user::<u64>(state + u64::from(process.thread_native_id));
    }
    let pthread = read_user::<u64>(state + u64::from(process.thread_pthread))?;
    read_user::<u32>(pthread + u64::from(process.pthread_tid)).map(u64::from)
}

/// The search for the sampled thread's state among the interpreter's,
/// for `bpf_loop` (on the caller's stack).
#[repr(C)]
struct ThreadSearch {
    process: *const py::Process,
    /// The thread state looked at next; the match once `reason` is FOUND.
    thread: u64,
    /// The sampled thread's id in the process's pid namespace.
    tid: u64,
    reason: u32,
    _pad: u32,
}

/// One thread state per call; returns 1 to stop (`reason` set).
extern "C" fn thread_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the ThreadSearch on the caller's stack.
    let ctx = unsafe { &mut *(ctx as *mut ThreadSearch) };
    // SAFETY: a PYTHON_PROCS value, valid for the whole program run.
    let Some(process) = (unsafe { ctx.process.as_ref() }) else {
        ctx.reason = py::reason::NONE;
        return 1;
    };
    match thread_next(process, ctx.thread, ctx.tid) {
        Ok(next) => {
            ctx.thread = next;
            0
        }
        Err(reason) => {
            ctx.reason = reason;
            1
        }
    }
}

/// The thread state after `thread` in the interpreter's list; `Err`:
/// `FOUND` when `thread` is the sampled thread's (`tid`), else the reason
/// the search ends.
#[inline(always)]
fn thread_next(process: &py::Process, thread: u64, tid: u64) -> Result<u64, u32> {
    use py::reason::*;
    if thread == 0 {
        return Err(NO_THREAD);
    }
    let native = thread_id(process, thread).ok_or(READ_FAULT)?;
    if native == tid {
        return Err(FOUND);
    }
    read_user::<u64>(thread + u64::from(process.thread_next)).ok_or(READ_FAULT)
}

/// The walk down the sampled thread's interpreter frames, for `bpf_loop`
/// (on the caller's stack).
#[repr(C)]
struct FrameWalk {
    process: *const py::Process,
    stack: *mut py::Stack,
    /// The frame looked at next (0: the walk is complete).
    frame: u64,
    reason: u32,
    _pad: u32,
}

/// One interpreter frame per call; returns 1 to stop (`reason` set).
extern "C" fn frame_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the FrameWalk on the caller's stack.
    let ctx = unsafe { &mut *(ctx as *mut FrameWalk) };
    // SAFETY: a PYTHON_PROCS value and the per-CPU record being filled,
    // both valid for the whole program run.
    let (Some(process), Some(stack)) = (unsafe { ctx.process.as_ref() }, unsafe {
        ctx.stack.as_mut()
    }) else {
        ctx.reason = py::reason::NONE;
        return 1;
    };
    match frame_next(process, stack, ctx.frame) {
        Ok(previous) => {
            ctx.frame = previous;
            0
        }
        Err(reason) => {
            ctx.reason = reason;
            1
        }
    }
}

/// Records `frame` (0: the walk is complete) in `stack` when it is Python
/// code; `Ok`: the frame below it, `Err`: the reason the walk ends.
#[inline(always)]
fn frame_next(process: &py::Process, stack: &mut py::Stack, frame: u64) -> Result<u64, u32> {
    use py::reason::*;
    if frame == 0 {
        return Err(COMPLETE);
    }
    // Frame objects (3.8 to 3.10) are all Python code, each run by a call
    // of its own of the evaluation loop.
    let objects = process.frame_owner == ABSENT;
    let owner = if objects {
        u16::MAX - 1
    } else {
        u16::from(read_user::<u8>(frame + u64::from(process.frame_owner)).ok_or(READ_FAULT)?)
    };
    let len = stack.len as usize;
    if owner == process.owner_cstack || owner == process.owner_skip {
        // Not Python code. The shim a call of the evaluation loop pushes
        // below its first frame marks that frame as the entry.
        if owner == process.owner_cstack && len > 0 {
            stack.frames[(len - 1) & (MAX_FRAMES - 1)].code |= FRAME_ENTRY;
        }
    } else {
        if len >= MAX_FRAMES {
            return Err(DEPTH_LIMIT);
        }
        let (Some(code), Some(instr)) = (
            read_user::<u64>(frame + u64::from(process.frame_code)),
            read_user::<u64>(frame + u64::from(process.frame_instr)),
        ) else {
            return Err(READ_FAULT);
        };
        let entry = if objects
            || (process.frame_is_entry != ABSENT
                && read_user::<u8>(frame + u64::from(process.frame_is_entry)).unwrap_or(0) != 0)
        {
            FRAME_ENTRY
        } else {
            0
        };
        let slot = &mut stack.frames[len & (MAX_FRAMES - 1)];
        slot.code = (code & !CODE_TAG_BITS) | entry;
        slot.instr = instr;
        stack.len = len as u32 + 1;
    }
    read_user::<u64>(frame + u64::from(process.frame_previous)).ok_or(READ_FAULT)
}
