//! HotSpot's Java frames, walked in the kernel when the native unwinder
//! reaches a JVM's code cache (a mapping the agent marked
//! `unwind::RUNTIME_TABLE`; see `hostprof_common::hotspot`).
//!
//! Each step is one frame, from the same `bpf_loop` callback as the
//! native frames, so Java and native frames interleave as they ran (JNI
//! calls into C, C calling back into Java) and the native walk resumes by
//! itself below the Java entry (`JavaCalls::call_helper`). The code blob
//! holding the pc is found through its heap's segment map; its kind (the
//! first bytes of its name) says how to reach the caller: interpreted
//! frames by their frame pointer, compiled methods and stubs by their
//! frame size. The frame is recorded as the blob (or `Method*`) and an
//! offset; the agent names it. The legacy variant reaches the same step
//! from a tail-called program of its own (`legacy::legacy_hotspot`), its
//! segment-map search unrolled.
use super::*;

use super::{kernel::Kernel, unwinder::Entered};
use hostprof_common::{
    hotspot::{self as hs, kind},
    runtime::{self, Runtime, tag},
};

#[map(name = "HOTSPOT_PROCS")]
static HOTSPOT_PROCS: HashMap<u32, hs::Process> = HashMap::with_max_entries(hs::MAX_PROCESSES, 0);

/// The first four bytes of the names of the blob kinds told apart
/// (little-endian): `nmethod`, `native nmethod` (a JNI wrapper),
/// `Interpreter`, `vtable chunks`. Every other blob is a stub.
const NAME_NMETHOD: u32 = u32::from_le_bytes(*b"nmet");
const NAME_NATIVE: u32 = u32::from_le_bytes(*b"nati");
const NAME_INTERPRETER: u32 = u32::from_le_bytes(*b"Inte");
const NAME_VTABLE: u32 = u32::from_le_bytes(*b"vtab");

/// x86_64 `ret` and `pop %rbp`: a compiled method's epilogue, where its
/// frame is (partly) gone already.
#[cfg(not(bpf_target_arch = "aarch64"))]
const X86_RET: u8 = 0xc3;
#[cfg(not(bpf_target_arch = "aarch64"))]
const X86_POP_RBP: u8 = 0x5d;

/// Walks the Java frame at `state.regs` (a pc in the code cache): records
/// it in place of its native entry and moves the registers to its caller.
/// True when the unwind stops here (`state.reason` set).
#[inline(always)]
pub(super) fn step<K: Kernel>(state: &mut UnwindState) -> bool {
    let why = step_frame::<K>(state);
    bump_runtime(Runtime::Hotspot, why);
    if why == hs::reason::NATIVE {
        return false;
    }
    state.reason = unwind::reason::NO_TABLE;
    true
}

/// Where a step leads: the caller's pc, sp and frame pointer, and the
/// frame to record.
struct Caller {
    pc: u64,
    sp: u64,
    fp: u64,
    code: u64,
    instr: u64,
}

#[inline(always)]
fn step_frame<K: Kernel>(state: &mut UnwindState) -> u32 {
    use hs::reason::*;
    let Some(process) = (unsafe { HOTSPOT_PROCS.get(&state.tgid) }) else {
        return NO_PROCESS;
    };
    let regs = unsafe { read_volatile(&state.regs) };
    let Some(heap) = heap_of(process, regs.pc) else {
        return NO_BLOB;
    };
    let Some(blob) = find_blob::<K>(&heap, regs.pc, process.heap_block_size) else {
        return NO_BLOB;
    };
    let caller = match walk_blob(process, blob, &regs) {
        Ok(caller) => caller,
        Err(why) => return why,
    };
    let frame = runtime::Frame {
        code: caller.code,
        instr: caller.instr,
    };
    match super::unwinder::enter_caller(state, &regs, caller.pc, caller.sp, caller.fp, Some(frame))
    {
        Entered::Caller => NATIVE,
        Entered::DepthLimit => DEPTH_LIMIT,
        Entered::BadFrame => BAD_FRAME,
    }
}

/// The code heap holding `pc`.
#[inline(always)]
fn heap_of(process: &hs::Process, pc: u64) -> Option<hs::Heap> {
    let count = process.heap_count as usize;
    for (index, heap) in process.heaps.iter().enumerate() {
        if index < count && heap.low <= pc && pc < heap.high {
            return Some(*heap);
        }
    }
    None
}

/// True when `address` is in one of the process's code heaps.
#[cfg(not(bpf_target_arch = "aarch64"))]
#[inline(always)]
fn in_code_cache(process: &hs::Process, address: u64) -> bool {
    heap_of(process, address).is_some()
}

/// The search of a heap's segment map for the first segment of the
/// block holding a pc, for `bpf_loop`: each map byte is 0 at a block's
/// first segment, else how many segments to go back (at most 254 per
/// hop), and 0xff for free segments.
#[repr(C)]
struct SegmapWalk {
    segmap: u64,
    segment: u64,
    /// 1 found, 2 failed, 0 still going.
    done: u32,
    _pad: u32,
}

extern "C" fn segmap_hop(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the SegmapWalk on the caller's stack.
    let walk = unsafe { &mut *(ctx as *mut SegmapWalk) };
    i64::from(hop(walk))
}

/// One hop of the segment map's search; true when it is over
/// (`walk.done` set).
#[inline(always)]
fn hop(walk: &mut SegmapWalk) -> bool {
    let Some(hop) = read_user::<u8>(walk.segmap.wrapping_add(walk.segment)) else {
        walk.done = 2;
        return true;
    };
    if hop == 0 {
        walk.done = 1;
        return true;
    }
    if hop == 0xff || u64::from(hop) > walk.segment {
        walk.done = 2;
        return true;
    }
    walk.segment -= u64::from(hop);
    false
}

/// The code blob holding `pc`, in `heap`.
#[inline(always)]
fn find_blob<K: Kernel>(heap: &hs::Heap, pc: u64, block_header: u32) -> Option<u64> {
    let shift = u64::from(heap.log2_segment & 31);
    let mut walk = SegmapWalk {
        segmap: heap.segmap,
        segment: (pc - heap.low) >> shift,
        done: 0,
        _pad: 0,
    };
    if K::BPF_LOOP {
        unsafe {
            bpf_loop(
                hs::MAX_SEGMAP_HOPS,
                segmap_hop as *mut c_void,
                (&mut walk as *mut SegmapWalk).cast(),
                0,
            )
        };
    } else {
        for _ in 0..hs::MAX_SEGMAP_HOPS {
            if hop(&mut walk) {
                break;
            }
        }
    }
    if walk.done != 1 {
        return None;
    }
    Some(heap.low + (walk.segment << shift) + u64::from(block_header))
}

/// The caller of the frame of `blob` at `regs`, by the blob's kind.
#[inline(always)]
fn walk_blob(process: &hs::Process, blob: u64, regs: &Regs) -> Result<Caller, u32> {
    use hs::reason::*;
    let field = |offset: u32| blob.wrapping_add(u64::from(offset));
    let name = read_user::<u64>(field(process.blob_name)).ok_or(READ_FAULT)?;
    let name = read_user::<u32>(name).ok_or(READ_FAULT)?;
    let frame_size = read_user::<i32>(field(process.blob_frame_size)).ok_or(READ_FAULT)?;
    let frame_size = (frame_size as i64 as u64).wrapping_mul(8);
    let code_begin = if process.code_begin_is_offset != 0 {
        let offset = read_user::<i32>(field(process.blob_code_begin)).ok_or(READ_FAULT)?;
        blob.wrapping_add(offset as i64 as u64)
    } else {
        read_user::<u64>(field(process.blob_code_begin)).ok_or(READ_FAULT)?
    };
    let offset = regs.pc.wrapping_sub(code_begin) & 0xffff_ffff;
    if name == NAME_INTERPRETER {
        return interpreted(process, regs);
    }
    if name == NAME_NMETHOD || name == NAME_NATIVE {
        let id = read_user::<u32>(field(process.nmethod_compile_id)).ok_or(READ_FAULT)?;
        let complete =
            read_user::<i32>(field(process.blob_frame_complete)).ok_or(READ_FAULT)? as i64 as u64;
        let mut caller = compiled(process, regs, frame_size, code_begin, complete)?;
        caller.code = tag::apply(tag::HOTSPOT | kind::COMPILED, blob);
        caller.instr = offset | (u64::from(id) << 32);
        return Ok(caller);
    }
    let mut caller = if name == NAME_VTABLE {
        // A megamorphic call's dispatch: no frame, only the return address.
        frameless(regs)?
    } else if frame_size == 0 {
        // Stubs without a frame size (the call stub among them) keep a
        // frame-pointer frame.
        by_frame_pointer(regs)?
    } else {
        by_frame_size(regs.sp.wrapping_add(frame_size))?
    };
    caller.code = tag::apply(tag::HOTSPOT | kind::STUB, blob);
    caller.instr = offset;
    Ok(caller)
}

/// An interpreted frame: its frame pointer holds the frame together
/// (caller's fp at fp, return address above it, the caller's stack
/// pointer, the `Method*` and the bytecode pointer in slots below).
#[inline(always)]
fn interpreted(process: &hs::Process, regs: &Regs) -> Result<Caller, u32> {
    use hs::reason::*;
    let fp = regs.fp;
    // A frame pointer far from the stack pointer is not this frame's.
    if regs.fp_valid == 0 || fp < regs.sp || fp - regs.sp > 0x10000 {
        return Err(BAD_FRAME);
    }
    let word = |slot: i64| read_user::<u64>(fp.wrapping_add((slot * 8) as u64));
    let caller_fp = word(0).ok_or(READ_FAULT)?;
    let return_address = word(1).ok_or(READ_FAULT)?;
    let sender_sp = word(-1).ok_or(READ_FAULT)?;
    let method = word(-3).ok_or(READ_FAULT)?;
    let bcp = word(-(i64::from(process.interp_bcp_slot & 15))).ok_or(READ_FAULT)?;
    let const_method =
        read_user::<u64>(method.wrapping_add(u64::from(process.method_const_method)))
            .ok_or(READ_FAULT)?;
    let code = const_method.wrapping_add(u64::from(process.const_method_size));
    let bci = bcp.wrapping_sub(code);
    let bci = if bcp >= code && bci < u64::from(hs::NO_BCI) {
        bci
    } else {
        u64::from(hs::NO_BCI)
    };
    Ok(Caller {
        pc: return_address,
        sp: sender_sp,
        fp: caller_fp,
        code: tag::apply(tag::HOTSPOT | kind::INTERPRETED, method),
        instr: bci | ((const_method >> 3) << 32),
    })
}

/// A compiled method's frame: `frame_size` bytes from the stack pointer
/// once built (the return address and the caller's fp at its top).
#[inline(always)]
fn compiled(
    process: &hs::Process,
    regs: &Regs,
    frame_size: u64,
    code_begin: u64,
    complete: u64,
) -> Result<Caller, u32> {
    let interrupted = regs.interrupted != 0;
    // Stopped in the prologue: the frame is not built yet.
    if interrupted && regs.pc < code_begin.wrapping_add(complete) {
        return frameless(regs);
    }
    if interrupted && let Some(caller) = epilogue(regs) {
        return caller;
    }
    // A frame pointer inside this frame is its own (native wrappers keep
    // one); else rbp is just another register in compiled code.
    if regs.fp_valid != 0 && regs.fp >= regs.sp && regs.fp < regs.sp + frame_size + 48 {
        return by_frame_pointer(regs);
    }
    return_address_above(process, regs.sp.wrapping_add(frame_size))
}

/// Stopped in an x86_64 epilogue: on its `ret`, only the return address
/// is left; on its `pop %rbp`, the saved fp and the return address.
#[cfg(not(bpf_target_arch = "aarch64"))]
#[inline(always)]
fn epilogue(regs: &Regs) -> Option<Result<Caller, u32>> {
    let code = read_user::<u8>(regs.pc)?;
    if code == X86_RET {
        return Some(frameless(regs));
    }
    if code != X86_POP_RBP {
        return None;
    }
    let read = || {
        let fp = read_user::<u64>(regs.sp).ok_or(hs::reason::READ_FAULT)?;
        let pc = read_user::<u64>(regs.sp + 8).ok_or(hs::reason::READ_FAULT)?;
        Ok(caller_at(pc, regs.sp + 16, fp))
    };
    Some(read())
}

/// aarch64 epilogues restore fp and lr before `ret`; not told apart yet.
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn epilogue(_regs: &Regs) -> Option<Result<Caller, u32>> {
    None
}

/// The caller of a compiled frame whose stack pointer ends at `end`.
/// x86_64 code may have pushed words its frame size does not count: the
/// return address is the first word from there up that points into the
/// code cache (every caller of compiled code is in it).
#[cfg(not(bpf_target_arch = "aarch64"))]
#[inline(always)]
fn return_address_above(process: &hs::Process, end: u64) -> Result<Caller, u32> {
    let mut words = [0u64; hs::RA_SEARCH_SLOTS];
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            words.as_mut_ptr().cast(),
            size_of::<[u64; hs::RA_SEARCH_SLOTS]>() as u32,
            end.wrapping_sub(8) as *const c_void,
        )
    };
    if read != 0 {
        return Err(hs::reason::READ_FAULT);
    }
    for (slot, word) in words.iter().enumerate() {
        if in_code_cache(process, *word) {
            let sp = end + 8 * slot as u64;
            let fp = read_user::<u64>(sp - 16).ok_or(hs::reason::READ_FAULT)?;
            return Ok(caller_at(*word, sp, fp));
        }
    }
    Err(hs::reason::BAD_FRAME)
}

/// aarch64 frames are exactly their frame size.
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn return_address_above(_process: &hs::Process, end: u64) -> Result<Caller, u32> {
    by_frame_size(end)
}

/// A frame whose caller's stack pointer is `end`: the return address and
/// the caller's fp are the two words below it.
#[inline(always)]
fn by_frame_size(end: u64) -> Result<Caller, u32> {
    let pc = read_user::<u64>(end.wrapping_sub(8)).ok_or(hs::reason::READ_FAULT)?;
    let fp = read_user::<u64>(end.wrapping_sub(16)).ok_or(hs::reason::READ_FAULT)?;
    Ok(caller_at(pc, end, fp))
}

/// A frame built on the frame pointer: the caller's fp at fp, the return
/// address above it.
#[inline(always)]
fn by_frame_pointer(regs: &Regs) -> Result<Caller, u32> {
    if regs.fp_valid == 0 || regs.fp < regs.sp {
        return Err(hs::reason::BAD_FRAME);
    }
    let fp = read_user::<u64>(regs.fp).ok_or(hs::reason::READ_FAULT)?;
    let pc = read_user::<u64>(regs.fp.wrapping_add(8)).ok_or(hs::reason::READ_FAULT)?;
    Ok(caller_at(pc, regs.fp.wrapping_add(16), fp))
}

/// A frame with nothing on the stack but the return address (x86_64).
#[cfg(not(bpf_target_arch = "aarch64"))]
#[inline(always)]
fn frameless(regs: &Regs) -> Result<Caller, u32> {
    let pc = read_user::<u64>(regs.sp).ok_or(hs::reason::READ_FAULT)?;
    Ok(caller_at(pc, regs.sp + 8, regs.fp))
}

/// A frame with nothing on the stack: the return address is still in the
/// link register (aarch64), known only where the thread stopped.
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn frameless(regs: &Regs) -> Result<Caller, u32> {
    if regs.interrupted == 0 {
        return Err(hs::reason::BAD_FRAME);
    }
    Ok(caller_at(regs.lr, regs.sp, regs.fp))
}

#[inline(always)]
fn caller_at(pc: u64, sp: u64, fp: u64) -> Caller {
    Caller {
        pc,
        sp,
        fp,
        code: 0,
        instr: 0,
    }
}
