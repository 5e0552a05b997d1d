//! V8's JavaScript frames, walked in the kernel when the native unwinder
//! reaches V8's code (its JIT code space or its embedded builtins, which
//! the agent marked `unwind::RUNTIME_TABLE`; see `hostprof_common::v8`).
//!
//! V8 keeps frame pointers in all the code it generates, so each step is
//! one frame-pointer step: modern, from the same `bpf_loop` callback as
//! the native frames; legacy, in a tail-called program of its own
//! (`legacy::legacy_v8`), a few frames a run. JavaScript and native
//! frames interleave as they ran (native add-ons called from JavaScript,
//! C++ calling back into it) and the native walk resumes by itself below
//! V8's entry frame. A JavaScript
//! frame (a context, not a type marker, below its frame pointer) is
//! recorded as its function's `SharedFunctionInfo` (its `JSFunction` when
//! the frame runs compiled code) and where in it the frame was; frames of other types (entry, exit, stubs) stay native
//! addresses (the builtins have symbols).
use super::*;

use super::unwinder::Entered;
use hostprof_common::{
    runtime::{self, Runtime, tag},
    v8::{self, kind},
};

#[map(name = "V8_PROCS")]
static V8_PROCS: HashMap<u32, v8::Process> = HashMap::with_max_entries(v8::MAX_PROCESSES, 0);

/// Walks the frame at `state.regs` (a pc in code the agent marked as
/// V8's): records it when it is JavaScript and moves the registers to its
/// caller. True when the unwind stops here (`state.reason` set).
#[inline(always)]
pub(super) fn step(state: &mut UnwindState) -> bool {
    // SAFETY: a map value, valid for the program run.
    let why = match unsafe { V8_PROCS.get(&state.tgid) } {
        Some(process) => step_frame(state, process),
        // Unregistered since the mappings were marked.
        None => v8::reason::NO_PROCESS,
    };
    if why == v8::reason::NATIVE {
        return false;
    }
    bump_runtime(Runtime::V8, why);
    state.reason = unwind::reason::NO_TABLE;
    true
}

/// A tagged heap pointer's address (V8 tags them with 1 in the low bits);
/// `None` for a small integer or anything else.
#[inline(always)]
fn heap_object(tagged: u64) -> Option<u64> {
    (tagged & 3 == 1).then_some(tagged & !3)
}

/// The instance type of the heap object at `object`.
#[inline(always)]
fn instance_type(process: &v8::Process, object: u64) -> Option<u32> {
    let map = read_user::<u64>(object.wrapping_add(u64::from(process.heap_object_map)))?;
    let map = heap_object(map)?;
    read_user::<u16>(map.wrapping_add(u64::from(process.map_instance_type))).map(u32::from)
}

/// The `SharedFunctionInfo` of the `JSFunction` tagged `function`.
#[inline(always)]
fn shared_info(process: &v8::Process, function: u64) -> Option<u64> {
    let function = heap_object(function)?;
    let kind = instance_type(process, function)?;
    if kind < process.type_function_first || kind > process.type_function_last {
        return None;
    }
    let shared = read_user::<u64>(function.wrapping_add(u64::from(process.function_shared)))?;
    let shared = heap_object(shared)?;
    (instance_type(process, shared)? == process.type_shared_info).then_some(shared)
}

/// True when `pc` is in one of the process's embedded builtins.
#[inline(always)]
fn in_builtins(process: &v8::Process, pc: u64) -> bool {
    let mut found = false;
    for blob in &process.blobs {
        found |= blob.low <= pc && pc < blob.high;
    }
    found
}

/// Where the frame's own code called the builtin the thread stopped in,
/// when that builtin has no frame of its own (Sparkplug calls such
/// builtins for its arithmetic, comparisons and checks: most of its
/// time). The frame pointer is still the caller's, so without this the
/// frame would carry the builtin's pc and the host could not say which
/// line of the caller ran. Only a frame holding a bytecode array
/// qualifies (Sparkplug's; an interpreted one was told apart before by
/// its bytecode offset): a JavaScript builtin's own frame
/// (`Array.prototype.sort`) holds none. Only at the leaf: past it, where
/// the builtin keeps the return address is unknown.
#[inline(always)]
fn frameless_call(process: &v8::Process, regs: &Regs, slot: &impl Fn(u32) -> u64) -> Option<u64> {
    if regs.interrupted == 0 {
        return None;
    }
    let bytecode = heap_object(slot(process.slot_bytecode_array))?;
    if instance_type(process, bytecode)? != process.type_bytecode_array {
        return None;
    }
    // Nothing pushed yet: the return address is at the stack pointer
    // (x86_64), or still in the link register (aarch64).
    #[cfg(not(bpf_target_arch = "aarch64"))]
    let call = read_user::<u64>(regs.sp)?;
    #[cfg(bpf_target_arch = "aarch64")]
    let call = unwind::strip_pointer_auth(ARCH, regs.lr);
    // A call from generated code, not from a builtin. A value the builtin
    // pushed since (setting up a frame of its own) passes here, but the
    // host finds it outside the function's code: its definition line.
    (call != 0 && !in_builtins(process, call)).then_some(call)
}

#[inline(always)]
fn step_frame(state: &mut UnwindState, process: &v8::Process) -> u32 {
    use v8::reason::*;
    let regs = unsafe { read_volatile(&state.regs) };
    let fp = regs.fp;
    // A frame pointer below the stack pointer, or far above it, is not
    // this frame's (code before its frame is set up, or no frame).
    if regs.fp_valid == 0 || fp < regs.sp || fp - regs.sp > v8::MAX_FRAME_BYTES {
        return BAD_FRAME;
    }
    let Some(window) = read_user::<[u64; v8::WINDOW_WORDS]>(fp.wrapping_sub(v8::WINDOW_LOW)) else {
        return READ_FAULT;
    };
    let slot = |index: u32| window[index as usize & (v8::WINDOW_WORDS - 1)];
    let header = (v8::WINDOW_LOW / 8) as usize;
    let caller_fp = window[header];
    let return_address = window[header + 1];
    let marker = slot(process.slot_marker);
    // A type marker (a small integer: low bit clear) is a frame of V8's
    // own; a context (a heap pointer) a JavaScript frame.
    let frame = if marker & 1 == 0 {
        None
    } else if let Some(shared) = shared_info(process, slot(process.slot_function)) {
        bump_runtime(Runtime::V8, v8::event::FRAME);
        let (kind, object, instr) = if in_builtins(process, regs.pc) {
            let offset = slot(process.slot_bytecode_offset);
            // The interpreter keeps the bytecode offset as a small
            // integer (in the upper half); a JavaScript builtin does not.
            if offset & 1 == 0 {
                (kind::INTERPRETED, shared, offset >> 32)
            } else if let Some(call) = frameless_call(process, &regs, &slot) {
                let function = slot(process.slot_function) & !3;
                (kind::COMPILED_CALL, function, call)
            } else {
                (kind::BUILTIN, shared, regs.pc)
            }
        } else {
            // The function, not its shared info: its code (which the pc
            // is in) hangs from the function alone.
            let function = slot(process.slot_function) & !3;
            (kind::COMPILED, function, regs.pc)
        };
        Some(runtime::Frame {
            code: tag::apply(tag::V8 | kind, object),
            instr,
        })
    } else {
        bump_runtime(Runtime::V8, v8::event::NOT_FUNCTION);
        None
    };
    let caller_sp = fp.wrapping_add(v8::FRAME_HEADER);
    // An aarch64 entry frame's caller (C++, walked by its CFI from its
    // stack pointer) starts above the registers JSEntry saved; one
    // frame-header up, every sp-based CFA of the C++ below read garbage.
    #[cfg(bpf_target_arch = "aarch64")]
    let caller_sp = if marker == v8::ENTRY_MARKERS[0] || marker == v8::ENTRY_MARKERS[1] {
        caller_sp.wrapping_add(v8::AARCH64_ENTRY_SAVED)
    } else {
        caller_sp
    };
    match super::unwinder::enter_caller(state, &regs, return_address, caller_sp, caller_fp, frame) {
        Entered::Caller => NATIVE,
        Entered::DepthLimit => DEPTH_LIMIT,
        Entered::BadFrame => BAD_FRAME,
    }
}
