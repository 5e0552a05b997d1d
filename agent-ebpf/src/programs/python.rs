//! CPython's interpreter frames, walked in the kernel for samples of the
//! Python processes the agent registered (see `hostprof_common::python`).
//!
//! Modern variant only (`bpf_loop`, Linux 5.17+): each loop is a callback
//! the verifier checks once, not once per iteration as it did the plain
//! bounded loops this walk had (a fifth of `sample_cpu`'s verified
//! instructions, paid again at every start).
use super::*;

use aya_ebpf::{bindings::bpf_pidns_info, helpers::generated::bpf_get_ns_current_pid_tgid};
use hostprof_common::python::{
    self as py, ABSENT, CODE_TAG_BITS, FRAME_ENTRY, MAX_FRAMES, MAX_THREADS,
};

#[map(name = "PYTHON_PROCS")]
static PYTHON_PROCS: HashMap<u32, py::Process> = HashMap::with_max_entries(py::MAX_PROCESSES, 0);

#[map(name = "PYTHON_THREADS")]
static PYTHON_THREADS: HashMap<py::ThreadKey, u64> =
    HashMap::with_max_entries(py::MAX_THREAD_STATES, 0);

/// Walks the current thread's interpreter frames into `stack` when its
/// process is a registered Python process; counts how the walk ended.
#[inline(always)]
pub(super) fn walk(tgid: u32, stack: &mut py::Stack) {
    let Some(process) = (unsafe { PYTHON_PROCS.get(&tgid) }) else {
        return;
    };
    stack.len = 0;
    stack.reason = py::reason::NONE;
    bump(Counter::PythonStacks);
    let reason = walk_frames(tgid, process, stack);
    stack.reason = reason;
    if let Some(counter) = Counter::for_python_reason(reason) {
        bump(counter);
    }
}

#[inline(always)]
fn walk_frames(tgid: u32, process: &py::Process, stack: &mut py::Stack) -> u32 {
    use py::reason::*;
    let mut ns = bpf_pidns_info { pid: 0, tgid: 0 };
    let found = unsafe {
        bpf_get_ns_current_pid_tgid(
            process.pidns_dev,
            process.pidns_ino,
            &mut ns,
            size_of::<bpf_pidns_info>() as u32,
        )
    };
    if found != 0 {
        return NO_NAMESPACE;
    }
    let thread = match thread_state(tgid, process, ns.pid) {
        Ok(thread) => thread,
        Err(reason) => return reason,
    };
    let Some(mut frame) = read_user::<u64>(thread + u64::from(process.thread_frame)) else {
        return READ_FAULT;
    };
    if process.cframe_frame != ABSENT && frame != 0 {
        let Some(current) = read_user::<u64>(frame + u64::from(process.cframe_frame)) else {
            return READ_FAULT;
        };
        frame = current;
    }
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

/// Not a reason a walk ends with: the thread search found the sampled
/// thread's state.
const FOUND: u32 = u32::MAX;

/// The sampled thread's `PyThreadState`: the agent's entry for it when that
/// state still belongs to the thread (states are freed with their thread,
/// and the agent's map lags), else the newest thread states' search.
/// `Err`: the reason the search gave up.
#[inline(always)]
fn thread_state(tgid: u32, process: &py::Process, tid: u32) -> Result<u64, u32> {
    use py::reason::*;
    let key = py::ThreadKey { tgid, tid };
    if let Some(&cached) = unsafe { PYTHON_THREADS.get(&key) }
        && thread_id(process, cached) == Some(u64::from(tid))
    {
        bump(Counter::PythonThreadCached);
        return Ok(cached);
    }
    let interpreter = read_user::<u64>(process.runtime + u64::from(process.interpreters_head))
        .ok_or(READ_FAULT)?;
    let thread =
        read_user::<u64>(interpreter + u64::from(process.threads_head)).ok_or(READ_FAULT)?;
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
    use py::reason::*;
    // SAFETY: bpf_loop passes the ThreadSearch on the caller's stack.
    let ctx = unsafe { &mut *(ctx as *mut ThreadSearch) };
    // SAFETY: a PYTHON_PROCS value, valid for the whole program run.
    let Some(process) = (unsafe { ctx.process.as_ref() }) else {
        ctx.reason = NONE;
        return 1;
    };
    if ctx.thread == 0 {
        ctx.reason = NO_THREAD;
        return 1;
    }
    let Some(native) = thread_id(process, ctx.thread) else {
        ctx.reason = READ_FAULT;
        return 1;
    };
    if native == ctx.tid {
        ctx.reason = FOUND;
        return 1;
    }
    let Some(next) = read_user::<u64>(ctx.thread + u64::from(process.thread_next)) else {
        ctx.reason = READ_FAULT;
        return 1;
    };
    ctx.thread = next;
    0
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
    use py::reason::*;
    // SAFETY: bpf_loop passes the FrameWalk on the caller's stack.
    let ctx = unsafe { &mut *(ctx as *mut FrameWalk) };
    // SAFETY: a PYTHON_PROCS value and the per-CPU record being filled,
    // both valid for the whole program run.
    let (Some(process), Some(stack)) = (unsafe { ctx.process.as_ref() }, unsafe {
        ctx.stack.as_mut()
    }) else {
        ctx.reason = NONE;
        return 1;
    };
    let frame = ctx.frame;
    if frame == 0 {
        ctx.reason = COMPLETE;
        return 1;
    }
    // Frame objects (3.8 to 3.10) are all Python code, each run by a call
    // of its own of the evaluation loop.
    let objects = process.frame_owner == ABSENT;
    let owner = if objects {
        u16::MAX - 1
    } else {
        let Some(owner) = read_user::<u8>(frame + u64::from(process.frame_owner)) else {
            ctx.reason = READ_FAULT;
            return 1;
        };
        u16::from(owner)
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
            ctx.reason = DEPTH_LIMIT;
            return 1;
        }
        let (Some(code), Some(instr)) = (
            read_user::<u64>(frame + u64::from(process.frame_code)),
            read_user::<u64>(frame + u64::from(process.frame_instr)),
        ) else {
            ctx.reason = READ_FAULT;
            return 1;
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
    let Some(previous) = read_user::<u64>(frame + u64::from(process.frame_previous)) else {
        ctx.reason = READ_FAULT;
        return 1;
    };
    ctx.frame = previous;
    0
}
