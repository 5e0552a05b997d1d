//! Process events: an exec forgets the unwind mappings, a fork of a
//! profiled process joins the filter.
use super::*;

/// are gone; until the agent loads the new ones, frame pointers serve.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn forget_exec(_ctx: RawTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let _ = PROCESS_MAPPINGS.remove(&tgid);
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
    let offset = unsafe { read_volatile(&TASK_TGID_OFFSET) } as usize;
    if offset == 0 {
        return 0;
    }
    let child: *const u8 = ctx.arg(1);
    let Ok(child_tgid) = (unsafe { bpf_probe_read_kernel(child.add(offset).cast::<u32>()) }) else {
        return 0;
    };
    // A new thread shares its parent's tgid: nothing to add.
    if child_tgid != parent_tgid && FILTER_TGIDS.insert(&child_tgid, &1, 0).is_err() {
        bump(Counter::FilterFull);
    }
    0
}
