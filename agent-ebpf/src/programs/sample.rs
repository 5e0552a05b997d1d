//! `sample_cpu`: one record per cpu-clock event of a wanted process, with
//! both stacks; the tail-called CPython walk that writes a Python
//! process's record (both variants); and, legacy, the tail-called
//! unwinder, V8 and HotSpot walks and writer.
use super::*;

use super::{
    kernel::Legacy,
    kernel::Modern,
    legacy::{legacy_continue, legacy_hotspot, legacy_start, legacy_v8},
    python,
};

#[perf_event]
pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
    try_sample_cpu::<Modern>(&ctx);
    0
}

/// `sample_cpu` without the JIT runtimes' walks and Go's labels
/// (`hostprof_common::PROGRAM_SAMPLE_LEAN`): about half of its verifier
/// work, for a start where no process needs them yet.
#[perf_event]
pub fn sample_cpu_lean(ctx: PerfEventContext) -> u32 {
    try_sample_cpu::<Modern<false>>(&ctx);
    0
}

/// `sample_cpu` for kernels before 5.17 (`hostprof_common::PROGRAM_SAMPLE_LEGACY`).
#[perf_event]
pub fn sample_legacy(ctx: PerfEventContext) -> u32 {
    if let Some(pid_tgid) = sample_wanted() {
        let tgid = (pid_tgid >> 32) as u32;
        legacy_start(&ctx, &SAMPLE_TAILS, SLOT_CPU, tgid);
        emit_cpu_sample::<Legacy>(&ctx, pid_tgid);
    }
    0
}

/// The unwinder of `sample_legacy`.
#[perf_event]
pub fn sample_legacy_unwind(ctx: PerfEventContext) -> u32 {
    legacy_continue(&ctx, &SAMPLE_TAILS, SLOT_CPU);
    0
}

/// V8's walk for `sample_legacy`'s unwinder.
#[perf_event]
pub fn sample_legacy_v8(ctx: PerfEventContext) -> u32 {
    legacy_v8(&ctx, &SAMPLE_TAILS, SLOT_CPU);
    0
}

/// HotSpot's walk for `sample_legacy`'s unwinder.
#[perf_event]
pub fn sample_legacy_java(ctx: PerfEventContext) -> u32 {
    legacy_hotspot(&ctx, &SAMPLE_TAILS, SLOT_CPU);
    0
}

/// Writes the record of `sample_legacy` once its stack is walked.
#[perf_event]
pub fn sample_legacy_emit(ctx: PerfEventContext) -> u32 {
    emit_cpu_sample::<Legacy>(&ctx, bpf_get_current_pid_tgid());
    0
}

/// CPython's walk for `sample_cpu` (`hostprof_common::TAIL_PYTHON`),
/// then the record.
#[perf_event]
pub fn sample_python(ctx: PerfEventContext) -> u32 {
    python_sample::<Modern>(&ctx);
    0
}

/// CPython's walk for `sample_legacy`: a few steps a run, then the record.
#[perf_event]
pub fn sample_legacy_python(ctx: PerfEventContext) -> u32 {
    python_sample::<Legacy>(&ctx);
    0
}

#[inline(always)]
fn python_sample<K: Kernel>(ctx: &PerfEventContext) {
    let Some(scratch) = SAMPLE_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: the per-CPU record the sampler filled before jumping here.
    python::walk::<K, _>(ctx, &SAMPLE_TAILS, SLOT_CPU, unsafe {
        &mut (*scratch).runtime
    });
    send_cpu_sample::<K>(scratch, bpf_get_current_pid_tgid());
}

/// The current task when its process is to be sampled: the sample
/// counts it either way.
#[inline(always)]
pub(super) fn sample_wanted() -> Option<u64> {
    bump(Counter::Fired);
    let pid_tgid = bpf_get_current_pid_tgid();
    // The per-CPU idle task (swapper) is the only task with pid 0.
    if pid_tgid as u32 == 0 {
        bump(Counter::Idle);
        return None;
    }
    if !wanted((pid_tgid >> 32) as u32) {
        bump(Counter::Filtered);
        return None;
    }
    Some(pid_tgid)
}

#[inline(always)]
pub(super) fn try_sample_cpu<K: Kernel>(ctx: &PerfEventContext) {
    if let Some(pid_tgid) = sample_wanted() {
        emit_cpu_sample::<K>(ctx, pid_tgid);
    }
}

/// Writes the CPU sample of the current task to the ring.
#[inline(always)]
pub(super) fn emit_cpu_sample<K: Kernel>(ctx: &PerfEventContext, pid_tgid: u64) {
    let Some(scratch) = SAMPLE_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // One `fill` (the whole unwinder, inlined) for both kinds of record, and
    // nothing that tells them apart decided before it: otherwise the
    // verifier checks the unwinder once per kind (about 70 ms of every
    // start on Linux 6.18).
    unsafe {
        fill::<K, _>(
            ctx,
            scratch,
            pid_tgid,
            SAMPLE_KIND_CPU,
            bpf_ktime_get_ns(),
            0,
            interrupted_in_kernel(ctx),
        )
    };
    // A Python process's record goes on in CPython's walk, which then
    // writes it as below: its interpreter frames are in before the stack
    // copy is decided, so a sample taken before its process's unwind
    // tables load (copied, unwound later on the host) keeps them too.
    python::jump(
        ctx,
        &SAMPLE_TAILS,
        SLOT_CPU,
        (pid_tgid >> 32) as u32,
        unsafe { (*scratch).flags },
    );
    send_cpu_sample::<K>(scratch, pid_tgid);
}

/// Writes the filled record `scratch` to the ring, with a copy of the top
/// of the stack when that is wanted.
#[inline(always)]
fn send_cpu_sample<K: Kernel>(scratch: *mut Sample, pid_tgid: u64) {
    let mut copy = unsafe { read_volatile(&STACK_COPY_BYTES) };
    // A process without tables in the kernel yet, one whose walk reached
    // an address its loaded mappings do not hold yet (`COPY_UNMAPPED`), or
    // a function whose rows are not loaded yet: copy the top of its stack
    // for the agent to unwind once they are.
    if copy == 0 {
        let early = unsafe { read_volatile(&EARLY_COPY_BYTES) };
        let tgid = (pid_tgid >> 32) as u32;
        if early != 0 && unsafe { read_volatile(&UNWIND_MODE) } == UNWIND_DWARF {
            // Told by why the walk stopped, which `fill` recorded: the
            // process's mappings are looked up again only in the rare case
            // that needs their flags, not on every sample.
            let why = (unsafe { (*scratch).flags } >> SAMPLE_UNWIND_SHIFT) & 0xff;
            let wanted = why == unwind::reason::UNKNOWN_PROCESS
                || why == unwind::reason::NOT_LOADED
                || (why == unwind::reason::NO_MAPPING
                    && unsafe { PROCESS_MAPPINGS.get(&tgid) }
                        .is_none_or(|process| process.flags & unwind::COPY_UNMAPPED != 0));
            if wanted {
                copy = early;
            }
        }
    }
    if copy != 0 {
        output_with_stack::<K>(scratch, copy);
        return;
    }
    output(scratch);
}

/// Writes `sample` followed by the task's user registers and the top
/// `copy` bytes of its stack (a [`StackSample`]).
#[inline(always)]
fn output_with_stack<K: Kernel>(sample: *mut Sample, copy: u32) {
    // A ring too full for a copy (18 KiB) may still take the sample: it
    // then keeps its frame-pointer stack (counted by the host) rather than
    // being lost, and the ring need not be sized for bursts of copies.
    let Some(mut entry) = SAMPLES.reserve::<StackSample>(0) else {
        output(sample);
        return;
    };
    let dst = entry.as_mut_ptr();
    let flags = unsafe {
        // A helper copy of the whole record: a plain assignment would be
        // unrolled into hundreds of instructions.
        let read = aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            (&raw mut (*dst).sample).cast(),
            size_of::<Sample>() as u32,
            sample.cast(),
        );
        if read != 0 {
            // Not expected (the source is a map value): the sample goes
            // without its stack rather than not at all.
            entry.discard(0);
            output(sample);
            return;
        }
        copy_stack::<K>(dst, copy);
        (*dst).sample.flags
    };
    entry.submit(wakeup_flags(flags));
    bump(Counter::Submitted);
}
