//! `off_cpu_switch`: where and why threads leave the CPU, emitted when they
//! come back; the tail-called CPython walk that keeps a Python process's
//! record (both variants); and, legacy, the tail-called unwinder, V8 and
//! HotSpot walks and writer.
use super::*;

use super::{
    kernel::Legacy,
    kernel::Modern,
    legacy::{legacy_continue, legacy_hotspot, legacy_start, legacy_v8},
    python,
};

pub(super) const TASK_DEAD: u32 = 0x80;

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, …)`
/// runs as `prev`, just before it leaves the CPU.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn off_cpu_switch(ctx: RawTracePointContext) -> i32 {
    off_cpu::<Modern>(&ctx)
}

#[inline(always)]
pub(super) fn off_cpu<K: Kernel>(ctx: &RawTracePointContext) -> i32 {
    let now = unsafe { bpf_ktime_get_ns() };
    off_cpu_back(ctx, now);
    if let Some(state) = off_cpu_leaving(ctx) {
        off_cpu_record::<K>(ctx, now, state);
    }
    0
}

/// `off_cpu_switch` for kernels before 5.17
/// (`hostprof_common::PROGRAM_OFF_CPU_SWITCH_LEGACY`).
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn off_cpu_legacy(ctx: RawTracePointContext) -> i32 {
    let now = unsafe { bpf_ktime_get_ns() };
    off_cpu_back(&ctx, now);
    let Some(state) = off_cpu_leaving(&ctx) else {
        return 0;
    };
    let Some(scratch) = OFF_CPU_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // What the record needs after the tail calls.
    unsafe {
        (*scratch).ktime_ns = now;
        (*scratch).thread_state = state;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    legacy_start(&ctx, &OFF_CPU_TAILS, SLOT_OFF_CPU, tgid);
    off_cpu_record::<Legacy>(&ctx, now, state);
    0
}

/// The unwinder of `off_cpu_legacy`.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn off_cpu_legacy_unwind(ctx: RawTracePointContext) -> i32 {
    legacy_continue(&ctx, &OFF_CPU_TAILS, SLOT_OFF_CPU);
    0
}

/// V8's walk for `off_cpu_legacy`'s unwinder.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn off_cpu_legacy_v8(ctx: RawTracePointContext) -> i32 {
    legacy_v8(&ctx, &OFF_CPU_TAILS, SLOT_OFF_CPU);
    0
}

/// HotSpot's walk for `off_cpu_legacy`'s unwinder.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn off_cpu_legacy_java(ctx: RawTracePointContext) -> i32 {
    legacy_hotspot(&ctx, &OFF_CPU_TAILS, SLOT_OFF_CPU);
    0
}

/// Records the thread `off_cpu_legacy` saw leave, once its stack is walked.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn off_cpu_legacy_emit(ctx: RawTracePointContext) -> i32 {
    let Some(scratch) = OFF_CPU_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    let (now, state) = unsafe { ((*scratch).ktime_ns, (*scratch).thread_state) };
    off_cpu_record::<Legacy>(&ctx, now, state);
    0
}

/// CPython's walk for `off_cpu_switch` (`hostprof_common::TAIL_PYTHON`),
/// then the record is kept: the Python function a thread waits in
/// (`time.sleep`, a lock, a socket). `prev` is the current task here, its
/// memory readable.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn off_cpu_python(ctx: RawTracePointContext) -> i32 {
    python_off_cpu::<Modern>(&ctx);
    0
}

/// CPython's walk for `off_cpu_legacy`: a few steps a run, then the record.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn off_cpu_legacy_python(ctx: RawTracePointContext) -> i32 {
    python_off_cpu::<Legacy>(&ctx);
    0
}

#[inline(always)]
fn python_off_cpu<K: Kernel>(ctx: &RawTracePointContext) {
    let Some(scratch) = OFF_CPU_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: the per-CPU record the tracepoint filled before jumping here.
    python::walk::<K, _>(ctx, &OFF_CPU_TAILS, SLOT_OFF_CPU, unsafe {
        &mut (*scratch).runtime
    });
    keep_off_cpu(scratch, bpf_get_current_pid_tgid() as u32);
}

/// `next` comes back: emit its record if it was away long enough.
#[inline(always)]
pub(super) fn off_cpu_back(ctx: &RawTracePointContext, now: u64) {
    let next: *const u8 = ctx.arg(2);
    let offset = unsafe { read_volatile(&TASK_PID_OFFSET) } as usize;
    if offset == 0 {
        return;
    }
    let Ok(tid) = (unsafe { bpf_probe_read_kernel(next.add(offset).cast::<u32>()) }) else {
        return;
    };
    let Some(record) = OFF_CPU_START.get_ptr_mut(&tid) else {
        return;
    };
    let away = now.saturating_sub(unsafe { (*record).ktime_ns });
    if away >= unsafe { read_volatile(&OFF_CPU_THRESHOLD_NS) } {
        // SAFETY: a map value of this thread, removed right below.
        unsafe { (*record).off_cpu_ns = away };
        bump(Counter::OffCpuEmitted);
        output(record);
    }
    let _ = OFF_CPU_START.remove(&tid);
}

/// `prev` (the current thread) leaves: its state (`__state`) when it is
/// to be recorded.
#[inline(always)]
pub(super) fn off_cpu_leaving(ctx: &RawTracePointContext) -> Option<u32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if tid == 0 || !wanted((pid_tgid >> 32) as u32) {
        return None;
    }
    // Probabilistic tracking bounds the cost on hosts that switch a lot.
    let ppm = unsafe { read_volatile(&OFF_CPU_SAMPLE_PPM) };
    if ppm < 1_000_000 && unsafe { bpf_get_prandom_u32() } % 1_000_000 >= ppm {
        return None;
    }
    let preempted: u64 = ctx.arg(0);
    let prev: *const u8 = ctx.arg(1);
    let offset = unsafe { read_volatile(&TASK_STATE_OFFSET) } as usize;
    let mut state = if offset == 0 {
        0
    } else {
        unsafe { bpf_probe_read_kernel(prev.add(offset).cast::<u32>()) }.unwrap_or(0)
    };
    // Preempted threads can still run, whatever __state says.
    if preempted & 0xff != 0 {
        state = 0;
    }
    if state & TASK_DEAD != 0 {
        return None;
    }
    Some(state)
}

/// Records where the current thread leaves the CPU, and why (`state`).
#[inline(always)]
pub(super) fn off_cpu_record<K: Kernel>(ctx: &RawTracePointContext, now: u64, state: u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let Some(scratch) = OFF_CPU_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    unsafe {
        fill::<K, _>(
            ctx,
            scratch,
            pid_tgid,
            SAMPLE_KIND_OFF_CPU,
            now,
            state,
            true,
        )
    };
    // A Python process's record is kept by CPython's walk.
    python::jump(
        ctx,
        &OFF_CPU_TAILS,
        SLOT_OFF_CPU,
        (pid_tgid >> 32) as u32,
        unsafe { (*scratch).flags },
    );
    keep_off_cpu(scratch, tid);
}

/// Keeps the filled record `scratch` of thread `tid` until it comes back.
#[inline(always)]
fn keep_off_cpu(scratch: *mut Sample, tid: u32) {
    if OFF_CPU_START.insert(&tid, unsafe { &*scratch }, 0).is_err() {
        bump(Counter::OffCpuMapFull);
    }
}
