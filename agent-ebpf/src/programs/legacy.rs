//! The legacy variant's unwind (Linux 5.10 to 5.16): a chain of tail
//! calls, each run walking a few frames, then a program that writes the
//! record. A language runtime's walk is a program of its own in the same
//! chain, reached when the native unwinder steps into that runtime's code
//! (V8's or HotSpot's), so its verifier cost adds nothing to the native
//! unwinder's, nor one runtime's to another's.
use super::*;

use super::{
    kernel::*,
    unwinder::{frame, rows_base, start_unwind},
};
use hostprof_common::runtime::tag;

/// `UnwindState::reason` of a legacy slot with no unwind waiting to be
/// handed over (the process has no tables: frame pointers serve).
pub(super) const IDLE: u32 = u32::MAX - 1;

/// Frames one legacy unwinder run walks.
pub(super) const LEGACY_FRAMES_PER_CALL: usize = 3;
/// Unwinder runs per stack after the first: the kernel allows 32 tail calls
/// in a row (33 since 5.16); one starts the unwind, 30 continue it, one
/// writes the record. 31 runs of 3 frames after the first frame: user
/// stacks of up to 94 frames.
pub(super) const LEGACY_UNWIND_CALLS: u32 = 30;

/// Tail-call indices in each tails map.
pub(super) const TAIL_UNWIND: u32 = hostprof_common::LEGACY_TAIL_UNWIND;
pub(super) const TAIL_EMIT: u32 = hostprof_common::LEGACY_TAIL_EMIT;
pub(super) const TAIL_V8: u32 = hostprof_common::LEGACY_TAIL_V8;
pub(super) const TAIL_HOTSPOT: u32 = hostprof_common::LEGACY_TAIL_HOTSPOT;

/// `UnwindState::reason` while the unwind waits for V8's walk: the native
/// unwinder reached V8's code and stopped there (`Kernel::runtime_step`).
pub(super) const AT_V8: u32 = u32::MAX - 2;
/// The same for HotSpot's walk (the JVM's code cache).
pub(super) const AT_HOTSPOT: u32 = u32::MAX - 3;

/// V8 frames one run of V8's walk steps, while the caller is V8's code
/// too (JavaScript calling JavaScript, through V8's builtins); more than
/// the native unwinder's [`LEGACY_FRAMES_PER_CALL`] because a V8 step is
/// cheaper (no table search) and JavaScript stacks are long.
pub(super) const LEGACY_V8_FRAMES_PER_CALL: usize = 4;
/// Java frames one run of HotSpot's walk steps, while the caller is in
/// the code cache too. Fewer than V8's: each step searches a code heap's
/// segment map (up to `MAX_SEGMAP_HOPS` reads, unrolled here, where
/// there is no `bpf_loop`), and the verifier walks each.
pub(super) const LEGACY_HOTSPOT_FRAMES_PER_CALL: usize = 3;

/// Starts the unwind of the current task in `slot` when its process has
/// tables, then jumps to the unwinder in `tails`.
/// Returns when there is nothing to unwind (or the jump failed): the
/// caller then writes the record itself.
#[inline(always)]
pub(super) fn legacy_start<C: EbpfContext>(ctx: &C, tails: &ProgramArray, slot: u32, tgid: u32) {
    let Some(state) = UNWIND_STATE.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: a per-CPU map value; nothing else runs on this CPU's slot.
    let state = unsafe { &mut *state };
    state.reason = IDLE;
    state.tail_calls = 0;
    state.runtime_len = 0;
    let dwarf = unsafe { read_volatile(&UNWIND_MODE) } == UNWIND_DWARF;
    if !dwarf || unsafe { PROCESS_MAPPINGS.get(&tgid) }.is_none() {
        return;
    }
    if start_unwind::<Legacy>(state, tgid).is_some() {
        unsafe { tails.tail_call(ctx, TAIL_UNWIND) };
    }
}

/// Walks the next frames of the unwind in `slot`; jumps to itself while
/// there are more, then to the program that writes the record. An unwind still going after the last run counts as
/// cut at the depth limit.
#[inline(always)]
pub(super) fn legacy_continue<C: EbpfContext>(ctx: &C, tails: &ProgramArray, slot: u32) {
    let Some(state) = UNWIND_STATE.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: as in `legacy_start`.
    let state = unsafe { &mut *state };
    if let Some(mappings) = unsafe { PROCESS_MAPPINGS.get(&state.tgid) } {
        let base = rows_base();
        for _ in 0..LEGACY_FRAMES_PER_CALL {
            let reason = unsafe { read_volatile(&state.reason) };
            if reason != RUNNING || frame::<Legacy>(state, mappings, base) {
                break;
            }
        }
    } else {
        state.reason = unwind::reason::UNKNOWN_PROCESS;
    }
    let reason = state.reason;
    if reason == AT_V8 || reason == AT_HOTSPOT {
        // Out of tail calls, the unwind counts as cut at the depth limit.
        state.reason = RUNNING;
        if state.tail_calls < LEGACY_UNWIND_CALLS {
            state.tail_calls += 1;
            let walk = if reason == AT_V8 {
                TAIL_V8
            } else {
                TAIL_HOTSPOT
            };
            unsafe { tails.tail_call(ctx, walk) };
        }
    }
    legacy_next(ctx, tails, state);
}

/// Jumps to the unwinder while the unwind goes on and tail calls are
/// left, else to the program that writes the record.
#[inline(always)]
fn legacy_next<C: EbpfContext>(ctx: &C, tails: &ProgramArray, state: &mut UnwindState) {
    if state.reason == RUNNING && state.tail_calls < LEGACY_UNWIND_CALLS {
        state.tail_calls += 1;
        unsafe { tails.tail_call(ctx, TAIL_UNWIND) };
    }
    unsafe { tails.tail_call(ctx, TAIL_EMIT) };
    // Both jumps failed: the record is lost.
    bump(Counter::RingFull);
}

/// V8's walk: steps the V8 frames from the one the unwinder stopped at
/// (`LEGACY_V8_FRAMES_PER_CALL` at most, while each caller is V8's code
/// too), then hands the unwind back to the native unwinder.
#[inline(always)]
pub(super) fn legacy_v8<C: EbpfContext>(ctx: &C, tails: &ProgramArray, slot: u32) {
    legacy_runtime(ctx, tails, slot, tag::V8, LEGACY_V8_FRAMES_PER_CALL);
}

/// HotSpot's walk, as V8's: Java frames while each caller is in the code
/// cache, then back to the native unwinder (below `JavaCalls::call_helper`,
/// or in the C a JNI call went to).
#[inline(always)]
pub(super) fn legacy_hotspot<C: EbpfContext>(ctx: &C, tails: &ProgramArray, slot: u32) {
    legacy_runtime(
        ctx,
        tails,
        slot,
        tag::HOTSPOT,
        LEGACY_HOTSPOT_FRAMES_PER_CALL,
    );
}

/// Steps `runtime`'s frames from the one the unwinder stopped at (`frames`
/// at most, while each caller is that runtime's code too), then hands the
/// unwind on. `runtime` is a constant in each program: only its own step
/// is in it.
#[inline(always)]
fn legacy_runtime<C: EbpfContext>(
    ctx: &C,
    tails: &ProgramArray,
    slot: u32,
    runtime: u8,
    frames: usize,
) {
    let Some(state) = UNWIND_STATE.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: as in `legacy_start`.
    let state = unsafe { &mut *state };
    if let Some(mappings) = unsafe { PROCESS_MAPPINGS.get(&state.tgid) } {
        for _ in 0..frames {
            if unsafe { read_volatile(&state.reason) } != RUNNING {
                break;
            }
            let stopped = if runtime == tag::V8 {
                super::v8::step(state)
            } else {
                super::hotspot::step::<Legacy>(state)
            };
            if stopped {
                break;
            }
            // The caller: a return address, looked up inside its call.
            let pc = unsafe { read_volatile(&state.regs.pc) }.wrapping_sub(1);
            if runtime_at(mappings, pc) != Some(runtime) {
                break;
            }
        }
    } else {
        state.reason = unwind::reason::UNKNOWN_PROCESS;
    }
    legacy_next(ctx, tails, state);
}

/// The runtime whose code holds `pc`, if the agent marked its mapping as
/// a runtime's: the mappings' search alone (no rows), as the native
/// unwinder's lookup starts.
#[inline(always)]
fn runtime_at(mappings: &ProcessMappings, pc: u64) -> Option<u8> {
    let search = #[inline(always)]
    |what: Sorted, len: u32, target: u64| match what {
        Sorted::Mappings => search_mappings(mappings, len, target),
        Sorted::Rows { .. } => None,
    };
    match unwind::lookup_in(mappings, pc, search, |_, _, _| None) {
        Lookup::Runtime(runtime) => Some(runtime),
        _ => None,
    }
}
