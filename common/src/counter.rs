//! The kernel's event counters ([`Counter`]): every way a sample is taken,
//! skipped, lost or damaged, by index into the per-CPU counters map, with
//! the names the agent reports them by. How each runtime's walk ends is
//! counted after them, by (runtime, event): [`crate::runtime::Runtime`].
use crate::unwind;

/// Indices into the per-CPU [`MAP_COUNTERS`](crate::MAP_COUNTERS) array: every way a sample can be
/// taken, skipped, lost or damaged.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// The program ran (one perf event fired).
    Fired = 0,
    /// Skipped: the CPU was idle (tgid 0).
    Idle = 1,
    /// Skipped: the process is not among the selected tgids.
    Filtered = 2,
    /// Written to the ring buffer.
    Submitted = 3,
    /// Lost: the ring buffer had no room.
    RingFull = 4,
    /// Damaged: the kernel stack could not be read.
    KernelStackError = 5,
    /// Damaged: the user stack could not be read.
    UserStackError = 6,
    /// Damaged: a stack was longer than [`MAX_STACK_DEPTH`] and was cut.
    Truncated = 7,
    /// A child of a profiled process could not be added to the full filter map.
    FilterFull = 8,
    /// Off-CPU events emitted (past the threshold).
    OffCpuEmitted = 9,
    /// Lost: an off-CPU start could not be recorded (map update failed).
    OffCpuMapFull = 10,
    /// User stacks walked with unwind tables.
    UnwindTables = 11,
    /// Table-driven unwinds that ended at the end of the stack.
    UnwindComplete = 12,
    /// Unwinds stopped in a mapping without a table (frame pointers failed).
    UnwindNoTable = 13,
    /// Unwinds stopped at an address no table row covers.
    UnwindPcNotCovered = 14,
    /// Unwinds stopped at a rule the unwinder does not evaluate.
    UnwindUnsupportedRule = 15,
    /// Unwinds stopped when reading the stack failed.
    UnwindReadFault = 16,
    /// Unwinds stopped at [`MAX_USER_STACK_DEPTH`] frames.
    UnwindDepthLimit = 17,
    /// Unwinds stopped at an implausible frame.
    UnwindBadFrame = 18,
    /// Samples of processes whose mappings were not loaded yet (frame
    /// pointers used instead).
    UnwindUnknownProcess = 19,
    /// Unwinds stopped at an address outside the known mappings.
    UnwindNoMapping = 20,
    /// Lost: a process event found [`MAP_PROCESS_EVENTS`] full.
    ProcessEventsLost = 21,
    /// Samples that carry a valid OpenTelemetry thread context record.
    TraceLinked = 22,
    /// Samples of registered processes whose thread had no context
    /// attached (a null pointer, a record not marked valid, or, for a
    /// variable in dynamic TLS, no block yet for its module).
    TraceDetached = 23,
    /// Thread-context reads that failed (thread pointer, variable or
    /// record unreadable).
    TraceReadFault = 24,
    /// Samples of registered Go processes that carry pprof labels.
    GoLabeled = 25,
    /// Samples of registered Go processes without labels (no user
    /// goroutine on the thread, or one without labels).
    GoUnlabeled = 26,
    /// Go label reads that failed (`g`, `m`, the goroutine, the labels,
    /// a key or a value unreadable).
    GoReadFault = 27,
    /// Samples whose goroutine had labels that were left out: past
    /// `golang::MAX_LABELS` or `golang::MAX_BUCKETS`, a key over
    /// `golang::MAX_KEY`, or no room left.
    GoLabelsCut = 28,
    /// Thread-context reads that failed because the thread was exiting:
    /// past `exit_mm` in `do_exit`, its user memory is gone (not a wrong
    /// offset, unlike [`Counter::TraceReadFault`]).
    TraceExited = 29,
    /// Unwinds stopped at an address whose rows a table built for the code
    /// that runs does not have yet (the agent adds them).
    UnwindNotLoaded = 30,
    /// Nanoseconds spent in the thread-context code (its read, Go's labels'
    /// read, the copy to the ring), only while it is timed
    /// ([`GLOBAL_TIME_CONTEXT`](crate::GLOBAL_TIME_CONTEXT)).
    TraceContextNs = 31,
    /// Samples whose thread-context code was timed.
    TraceContextTimed = 32,
    /// Of [`Counter::TraceContextNs`], the samples' that left with a link
    /// (an OpenTelemetry record or Go labels).
    TraceLinkedNs = 33,
    /// Of [`Counter::TraceContextTimed`], the samples that left with a link.
    TraceLinkedTimed = 34,
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; 35] = [
        Counter::Fired,
        Counter::Idle,
        Counter::Filtered,
        Counter::Submitted,
        Counter::RingFull,
        Counter::KernelStackError,
        Counter::UserStackError,
        Counter::Truncated,
        Counter::FilterFull,
        Counter::OffCpuEmitted,
        Counter::OffCpuMapFull,
        Counter::UnwindTables,
        Counter::UnwindComplete,
        Counter::UnwindNoTable,
        Counter::UnwindPcNotCovered,
        Counter::UnwindUnsupportedRule,
        Counter::UnwindReadFault,
        Counter::UnwindDepthLimit,
        Counter::UnwindBadFrame,
        Counter::UnwindUnknownProcess,
        Counter::UnwindNoMapping,
        Counter::ProcessEventsLost,
        Counter::TraceLinked,
        Counter::TraceDetached,
        Counter::TraceReadFault,
        Counter::GoLabeled,
        Counter::GoUnlabeled,
        Counter::GoReadFault,
        Counter::GoLabelsCut,
        Counter::TraceExited,
        Counter::UnwindNotLoaded,
        Counter::TraceContextNs,
        Counter::TraceContextTimed,
        Counter::TraceLinkedNs,
        Counter::TraceLinkedTimed,
    ];
    /// Every reason a table-driven user-stack walk stops before the end of
    /// the stack (one is counted per truncated stack).
    pub const UNWIND_STOPS: [Counter; 8] = [
        Counter::UnwindNoTable,
        Counter::UnwindPcNotCovered,
        Counter::UnwindUnsupportedRule,
        Counter::UnwindReadFault,
        Counter::UnwindDepthLimit,
        Counter::UnwindBadFrame,
        Counter::UnwindNoMapping,
        Counter::UnwindNotLoaded,
    ];
    /// Counters of this kind (the map holds the runtimes' after them:
    /// [`crate::runtime::COUNTERS`]).
    pub const COUNT: u32 = Self::ALL.len() as u32;

    /// A short snake_case name, for reports and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Fired => "fired",
            Counter::Idle => "idle",
            Counter::Filtered => "filtered",
            Counter::Submitted => "submitted",
            Counter::RingFull => "lost_ring_full",
            Counter::KernelStackError => "kernel_stack_error",
            Counter::UserStackError => "user_stack_error",
            Counter::Truncated => "stack_truncated",
            Counter::FilterFull => "filter_full",
            Counter::OffCpuEmitted => "off_cpu_emitted",
            Counter::OffCpuMapFull => "off_cpu_map_full",
            Counter::UnwindTables => "unwind_tables",
            Counter::UnwindComplete => "unwind_complete",
            Counter::UnwindNoTable => "unwind_no_table",
            Counter::UnwindPcNotCovered => "unwind_pc_not_covered",
            Counter::UnwindUnsupportedRule => "unwind_unsupported_rule",
            Counter::UnwindReadFault => "unwind_read_fault",
            Counter::UnwindDepthLimit => "unwind_depth_limit",
            Counter::UnwindBadFrame => "unwind_bad_frame",
            Counter::UnwindUnknownProcess => "unwind_unknown_process",
            Counter::UnwindNoMapping => "unwind_no_mapping",
            Counter::ProcessEventsLost => "process_events_lost",
            Counter::TraceLinked => "trace_linked",
            Counter::TraceDetached => "trace_detached",
            Counter::TraceReadFault => "trace_read_fault",
            Counter::GoLabeled => "go_labeled",
            Counter::GoUnlabeled => "go_unlabeled",
            Counter::GoReadFault => "go_read_fault",
            Counter::GoLabelsCut => "go_labels_cut",
            Counter::TraceExited => "trace_exited",
            Counter::UnwindNotLoaded => "unwind_not_loaded",
            Counter::TraceContextNs => "trace_context_ns",
            Counter::TraceContextTimed => "trace_context_timed",
            Counter::TraceLinkedNs => "trace_linked_ns",
            Counter::TraceLinkedTimed => "trace_linked_timed",
        }
    }

    /// The counter of an `unwind::reason`.
    pub const fn for_unwind_reason(reason: u32) -> Counter {
        match reason {
            unwind::reason::COMPLETE => Counter::UnwindComplete,
            unwind::reason::NO_TABLE => Counter::UnwindNoTable,
            unwind::reason::PC_NOT_COVERED => Counter::UnwindPcNotCovered,
            unwind::reason::UNSUPPORTED_RULE => Counter::UnwindUnsupportedRule,
            unwind::reason::READ_FAULT => Counter::UnwindReadFault,
            unwind::reason::DEPTH_LIMIT => Counter::UnwindDepthLimit,
            unwind::reason::UNKNOWN_PROCESS => Counter::UnwindUnknownProcess,
            unwind::reason::NO_MAPPING => Counter::UnwindNoMapping,
            unwind::reason::NOT_LOADED => Counter::UnwindNotLoaded,
            _ => Counter::UnwindBadFrame,
        }
    }
}
