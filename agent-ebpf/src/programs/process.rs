//! Process events: an exec forgets the unwind mappings, a fork of a
//! profiled process joins the filter, and forks, execs and exits of wanted
//! processes go to the agent (`PROCESS_EVENTS`), which tracks processes
//! from them rather than from `/proc` reads per sample.
use super::*;

/// `sched_process_exec` runs in the process that replaced its image: its
/// old mappings are gone; until the agent loads the new ones, frame
/// pointers serve. The agent hears of the exec too.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn forget_exec(_ctx: RawTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let _ = PROCESS_MAPPINGS.remove(&tgid);
    if wanted(tgid) {
        // Wake the agent: it asks for the new image's tables at once.
        emit_event(PROCESS_EVENT_EXEC, tgid, 0, 0);
    }
    0
}

/// `sched_process_fork(struct task_struct *parent, struct task_struct *child)`
/// runs in the parent before the child first runs: a child of a profiled
/// process is in the filter before its first sample.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn follow_fork(ctx: RawTracePointContext) -> i32 {
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if unsafe { FILTER_TGIDS.get(&parent_tgid) }.is_none() {
        return 0;
    }
    let Some(child_tgid) = child_tgid(&ctx) else {
        return 0;
    };
    // A new thread shares its parent's tgid: nothing to add.
    if child_tgid != parent_tgid && FILTER_TGIDS.insert(&child_tgid, &1, 0).is_err() {
        bump(Counter::FilterFull);
    }
    0
}

/// The same tracepoint: tells the agent of every new process (not thread)
/// of a wanted parent, so a pid reused by a new process is told from the
/// old one without reading `/proc`.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn process_fork(ctx: RawTracePointContext) -> i32 {
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !wanted(parent_tgid) {
        return 0;
    }
    if let Some(child_tgid) = child_tgid(&ctx)
        && child_tgid != parent_tgid
    {
        emit_event(
            PROCESS_EVENT_FORK,
            child_tgid,
            parent_tgid,
            BPF_RB_NO_WAKEUP as u64,
        );
    }
    0
}

/// `sched_process_exit(struct task_struct *p)` runs in every exiting
/// thread; the main thread's exit ends the process for the agent (a pid
/// is reused only after the whole group is gone).
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit(_ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if pid_tgid as u32 == tgid && wanted(tgid) {
        emit_event(PROCESS_EVENT_EXIT, tgid, 0, BPF_RB_NO_WAKEUP as u64);
    }
    0
}

/// The tgid of the child of `sched_process_fork`, read at the offset the
/// agent found in the kernel's BTF (0: not found, no fork events).
#[inline(always)]
fn child_tgid(ctx: &RawTracePointContext) -> Option<u32> {
    let offset = unsafe { read_volatile(&TASK_TGID_OFFSET) } as usize;
    if offset == 0 {
        return None;
    }
    let child: *const u8 = ctx.arg(1);
    unsafe { bpf_probe_read_kernel(child.add(offset).cast::<u32>()) }.ok()
}

#[inline(always)]
fn emit_event(kind: u32, tgid: u32, parent_tgid: u32, flags: u64) {
    let event = ProcessEvent {
        kind,
        tgid,
        parent_tgid,
        _pad: 0,
        ktime_ns: unsafe { bpf_ktime_get_ns() },
    };
    if PROCESS_EVENTS
        .output::<ProcessEvent>(&event, flags)
        .is_err()
    {
        bump(Counter::ProcessEventsLost);
    }
}
