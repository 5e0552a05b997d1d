//! CPython's interpreter frames, walked in the kernel for samples of the
//! Python processes the agent registered (see `hostprof_common::python`).
//!
//! Plain bounded loops (no `bpf_loop`). Modern variant only for now: Linux
//! 5.10's verifier rejects the walk inside `sample_legacy`.
use super::*;

use aya_ebpf::{bindings::bpf_pidns_info, helpers::generated::bpf_get_ns_current_pid_tgid};
use hostprof_common::python::{
    self as py, ABSENT, CODE_TAG_BITS, FRAME_ENTRY, MAX_FRAMES, MAX_THREADS,
};

#[map(name = "PYTHON_PROCS")]
static PYTHON_PROCS: HashMap<u32, py::Process> = HashMap::with_max_entries(py::MAX_PROCESSES, 0);

/// Walks the current thread's interpreter frames into `stack` when its
/// process is a registered Python process; counts how the walk ended.
#[inline(always)]
pub(super) fn walk(tgid: u32, stack: &mut py::Stack) {
    stack.len = 0;
    stack.reason = py::reason::NONE;
    let Some(process) = (unsafe { PYTHON_PROCS.get(&tgid) }) else {
        return;
    };
    bump(Counter::PythonStacks);
    let reason = walk_frames(process, stack);
    stack.reason = reason;
    if let Some(counter) = Counter::for_python_reason(reason) {
        bump(counter);
    }
}

#[inline(always)]
fn walk_frames(process: &py::Process, stack: &mut py::Stack) -> u32 {
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
    let tid = u64::from(ns.pid);
    let Some(interpreter) =
        read_user::<u64>(process.runtime + u64::from(process.interpreters_head))
    else {
        return READ_FAULT;
    };
    let Some(mut thread) = read_user::<u64>(interpreter + u64::from(process.threads_head)) else {
        return READ_FAULT;
    };
    let mut matched = false;
    for _ in 0..MAX_THREADS {
        if thread == 0 {
            return NO_THREAD;
        }
        let Some(native) = read_user::<u64>(thread + u64::from(process.thread_native_id)) else {
            return READ_FAULT;
        };
        if native == tid {
            matched = true;
            break;
        }
        let Some(next) = read_user::<u64>(thread + u64::from(process.thread_next)) else {
            return READ_FAULT;
        };
        thread = next;
    }
    if !matched {
        return THREAD_LIMIT;
    }
    let Some(mut frame) = read_user::<u64>(thread + u64::from(process.thread_frame)) else {
        return READ_FAULT;
    };
    if process.cframe_frame != ABSENT && frame != 0 {
        let Some(current) = read_user::<u64>(frame + u64::from(process.cframe_frame)) else {
            return READ_FAULT;
        };
        frame = current;
    }
    // The count lives in the record, read and written through memory: as a
    // register its exact value would differ between the paths through the
    // loop (frame kept or skipped) and the verifier would walk each apart.
    unsafe { write_volatile(&mut stack.len, 0) };
    for _ in 0..MAX_FRAMES + 8 {
        if frame == 0 {
            return COMPLETE;
        }
        let Some(owner) = read_user::<u8>(frame + u64::from(process.frame_owner)) else {
            return READ_FAULT;
        };
        let owner = u16::from(owner);
        let len = unsafe { read_volatile(&stack.len) } as usize;
        if owner == process.owner_cstack || owner == process.owner_skip {
            // Not Python code. The shim a call of the evaluation loop
            // pushes below its first frame marks that frame as the entry.
            if owner == process.owner_cstack && len > 0 {
                stack.frames[(len - 1) & (MAX_FRAMES - 1)].code |= FRAME_ENTRY;
            }
        } else {
            if len >= MAX_FRAMES {
                return DEPTH_LIMIT;
            }
            let (Some(code), Some(instr)) = (
                read_user::<u64>(frame + u64::from(process.frame_code)),
                read_user::<u64>(frame + u64::from(process.frame_instr)),
            ) else {
                return READ_FAULT;
            };
            let entry = if process.frame_is_entry != ABSENT
                && read_user::<u8>(frame + u64::from(process.frame_is_entry)).unwrap_or(0) != 0
            {
                FRAME_ENTRY
            } else {
                0
            };
            let slot = &mut stack.frames[len & (MAX_FRAMES - 1)];
            slot.code = (code & !CODE_TAG_BITS) | entry;
            slot.instr = instr;
            unsafe { write_volatile(&mut stack.len, len as u32 + 1) };
        }
        let Some(previous) = read_user::<u64>(frame + u64::from(process.frame_previous)) else {
            return READ_FAULT;
        };
        frame = previous;
    }
    DEPTH_LIMIT
}
