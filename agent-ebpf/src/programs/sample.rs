//! `sample_cpu`: one record per cpu-clock event of a wanted process, with
//! both stacks (and, legacy, its tail-called unwinder and writer).
use super::*;

use super::{
    kernel::Legacy,
    kernel::Modern,
    unwinder::{LEGACY_SAMPLE_TAILS, legacy_continue, legacy_start},
};

#[perf_event]
pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
    try_sample_cpu::<Modern>(&ctx);
    0
}

/// `sample_cpu` for kernels before 5.17 (`hostprof_common::PROGRAM_SAMPLE_LEGACY`).
#[perf_event]
pub fn sample_legacy(ctx: PerfEventContext) -> u32 {
    if let Some(pid_tgid) = sample_wanted() {
        let tgid = (pid_tgid >> 32) as u32;
        legacy_start(&ctx, &LEGACY_SAMPLE_TAILS, SLOT_CPU, tgid);
        emit_cpu_sample::<Legacy>(&ctx, pid_tgid);
    }
    0
}

/// The unwinder of `sample_legacy`.
#[perf_event]
pub fn sample_legacy_unwind(ctx: PerfEventContext) -> u32 {
    legacy_continue(&ctx, &LEGACY_SAMPLE_TAILS, SLOT_CPU);
    0
}

/// Writes the record of `sample_legacy` once its stack is walked.
#[perf_event]
pub fn sample_legacy_emit(ctx: PerfEventContext) -> u32 {
    emit_cpu_sample::<Legacy>(&ctx, bpf_get_current_pid_tgid());
    0
}

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
    let mut copy = unsafe { read_volatile(&STACK_COPY_BYTES) };
    // A process without tables in the kernel yet: copy the top of its stack
    // for the agent to unwind once they are loaded.
    if copy == 0 {
        let early = unsafe { read_volatile(&EARLY_COPY_BYTES) };
        let tgid = (pid_tgid >> 32) as u32;
        if early != 0
            && unsafe { read_volatile(&UNWIND_MODE) } == UNWIND_DWARF
            && unsafe { PROCESS_MAPPINGS.get(&tgid) }.is_none()
        {
            copy = early;
        }
    }
    if copy != 0 {
        let Some(mut entry) = SAMPLES.reserve::<StackSample>(0) else {
            bump(Counter::RingFull);
            return;
        };
        let dst = entry.as_mut_ptr();
        let flags = unsafe {
            fill::<K, _>(
                ctx,
                &raw mut (*dst).sample,
                pid_tgid,
                SAMPLE_KIND_CPU,
                bpf_ktime_get_ns(),
                0,
            );
            copy_stack::<K>(dst, copy);
            (*dst).sample.flags
        };
        entry.submit(wakeup_flags(flags));
        bump(Counter::Submitted);
        return;
    }
    let Some(scratch) = SAMPLE_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    unsafe {
        fill::<K, _>(
            ctx,
            scratch,
            pid_tgid,
            SAMPLE_KIND_CPU,
            bpf_ktime_get_ns(),
            0,
        );
        if read_volatile(&PYTHON_WALK) != 0 {
            K::python((pid_tgid >> 32) as u32, &raw mut (*scratch).python);
        }
    };
    output(scratch);
}
