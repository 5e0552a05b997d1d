//! The kernel's event counters ([`Counter`]): every way a sample is taken,
//! skipped, lost or damaged, and how each runtime's walk ends, by index
//! into the per-CPU counters map, with the names the agent reports them by.
use crate::{hotspot, python, unwind, v8};

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
    /// Samples of Python processes whose interpreter frames were walked.
    PythonStacks = 22,
    /// Interpreter frame walks that reached the thread's first frame.
    PythonComplete = 23,
    /// Walks that found no thread state for the thread.
    PythonNoThread = 24,
    /// Walks stopped when reading the process's memory failed.
    PythonReadFault = 25,
    /// Walks stopped at `python::MAX_FRAMES` frames.
    PythonDepthLimit = 26,
    /// Walks that gave up after `python::MAX_THREADS` thread states.
    PythonThreadLimit = 27,
    /// Walks that could not read the thread's id in its pid namespace.
    PythonNoNamespace = 28,
    /// Java frames walked in the code cache of a JVM.
    HotspotFrames = 29,
    /// Java walks of processes without a HotSpot record.
    HotspotNoProcess = 30,
    /// Java walks stopped at a pc in no code blob.
    HotspotNoBlob = 31,
    /// Java walks stopped when reading the process's memory failed.
    HotspotReadFault = 32,
    /// Java walks stopped at an implausible frame.
    HotspotBadFrame = 33,
    /// Java walks stopped at `runtime::MAX_FRAMES` runtime frames.
    HotspotDepthLimit = 34,
    /// Python walks whose thread state came from the thread map.
    PythonThreadCached = 35,
    /// JavaScript frames walked in V8's code.
    V8Frames = 36,
    /// V8 walks of processes without a V8 record.
    V8NoProcess = 37,
    /// V8 walks stopped when reading the process's memory failed.
    V8ReadFault = 38,
    /// V8 walks stopped at an implausible frame.
    V8BadFrame = 39,
    /// V8 walks stopped at `runtime::MAX_FRAMES` runtime frames.
    V8DepthLimit = 40,
    /// V8 frames whose function slot held no `JSFunction` (kept as native).
    V8NotFunction = 41,
    /// Samples that carry a valid OpenTelemetry thread context record.
    TraceLinked = 42,
    /// Samples of registered processes whose thread had no context
    /// attached (a null pointer, a record not marked valid, or, for a
    /// variable in dynamic TLS, no block yet for its module).
    TraceDetached = 43,
    /// Thread-context reads that failed (thread pointer, variable or
    /// record unreadable).
    TraceReadFault = 44,
    /// Samples of registered Go processes that carry pprof labels.
    GoLabeled = 45,
    /// Samples of registered Go processes without labels (no user
    /// goroutine on the thread, or one without labels).
    GoUnlabeled = 46,
    /// Go label reads that failed (`g`, `m`, the goroutine, the labels,
    /// a key or a value unreadable).
    GoReadFault = 47,
    /// Samples whose goroutine had labels that were left out: past
    /// `golang::MAX_LABELS` or `golang::MAX_BUCKETS`, a key over
    /// `golang::MAX_KEY`, or no room left.
    GoLabelsCut = 48,
    /// Thread-context reads that failed because the thread was exiting:
    /// past `exit_mm` in `do_exit`, its user memory is gone (not a wrong
    /// offset, unlike [`Counter::TraceReadFault`]).
    TraceExited = 49,
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; 50] = [
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
        Counter::PythonStacks,
        Counter::PythonComplete,
        Counter::PythonNoThread,
        Counter::PythonReadFault,
        Counter::PythonDepthLimit,
        Counter::PythonThreadLimit,
        Counter::PythonNoNamespace,
        Counter::HotspotFrames,
        Counter::HotspotNoProcess,
        Counter::HotspotNoBlob,
        Counter::HotspotReadFault,
        Counter::HotspotBadFrame,
        Counter::HotspotDepthLimit,
        Counter::PythonThreadCached,
        Counter::V8Frames,
        Counter::V8NoProcess,
        Counter::V8ReadFault,
        Counter::V8BadFrame,
        Counter::V8DepthLimit,
        Counter::V8NotFunction,
        Counter::TraceLinked,
        Counter::TraceDetached,
        Counter::TraceReadFault,
        Counter::GoLabeled,
        Counter::GoUnlabeled,
        Counter::GoReadFault,
        Counter::GoLabelsCut,
        Counter::TraceExited,
    ];
    /// Every reason a table-driven user-stack walk stops before the end of
    /// the stack (one is counted per truncated stack).
    pub const UNWIND_STOPS: [Counter; 7] = [
        Counter::UnwindNoTable,
        Counter::UnwindPcNotCovered,
        Counter::UnwindUnsupportedRule,
        Counter::UnwindReadFault,
        Counter::UnwindDepthLimit,
        Counter::UnwindBadFrame,
        Counter::UnwindNoMapping,
    ];
    /// Every reason a walk of interpreter frames stops short of the
    /// thread's first frame.
    pub const PYTHON_STOPS: [Counter; 5] = [
        Counter::PythonNoThread,
        Counter::PythonReadFault,
        Counter::PythonDepthLimit,
        Counter::PythonThreadLimit,
        Counter::PythonNoNamespace,
    ];
    /// Every reason a walk of Java frames stops short of native code.
    pub const HOTSPOT_STOPS: [Counter; 5] = [
        Counter::HotspotNoProcess,
        Counter::HotspotNoBlob,
        Counter::HotspotReadFault,
        Counter::HotspotBadFrame,
        Counter::HotspotDepthLimit,
    ];
    /// Every reason a walk of JavaScript frames stops short of native code.
    pub const V8_STOPS: [Counter; 4] = [
        Counter::V8NoProcess,
        Counter::V8ReadFault,
        Counter::V8BadFrame,
        Counter::V8DepthLimit,
    ];
    /// Size of the [`MAP_COUNTERS`] array.
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
            Counter::PythonStacks => "python_stacks",
            Counter::PythonComplete => "python_complete",
            Counter::PythonNoThread => "python_no_thread",
            Counter::PythonReadFault => "python_read_fault",
            Counter::PythonDepthLimit => "python_depth_limit",
            Counter::PythonThreadLimit => "python_thread_limit",
            Counter::PythonNoNamespace => "python_no_namespace",
            Counter::HotspotFrames => "hotspot_frames",
            Counter::HotspotNoProcess => "hotspot_no_process",
            Counter::HotspotNoBlob => "hotspot_no_blob",
            Counter::HotspotReadFault => "hotspot_read_fault",
            Counter::HotspotBadFrame => "hotspot_bad_frame",
            Counter::HotspotDepthLimit => "hotspot_depth_limit",
            Counter::PythonThreadCached => "python_thread_cached",
            Counter::V8Frames => "v8_frames",
            Counter::V8NoProcess => "v8_no_process",
            Counter::V8ReadFault => "v8_read_fault",
            Counter::V8BadFrame => "v8_bad_frame",
            Counter::V8DepthLimit => "v8_depth_limit",
            Counter::V8NotFunction => "v8_not_function",
            Counter::TraceLinked => "trace_linked",
            Counter::TraceDetached => "trace_detached",
            Counter::TraceReadFault => "trace_read_fault",
            Counter::GoLabeled => "go_labeled",
            Counter::GoUnlabeled => "go_unlabeled",
            Counter::GoReadFault => "go_read_fault",
            Counter::GoLabelsCut => "go_labels_cut",
            Counter::TraceExited => "trace_exited",
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
            _ => Counter::UnwindBadFrame,
        }
    }

    /// The counter of a `python::reason` (`None` for `NONE`).
    pub const fn for_python_reason(reason: u32) -> Option<Counter> {
        Some(match reason {
            python::reason::COMPLETE => Counter::PythonComplete,
            python::reason::NO_THREAD => Counter::PythonNoThread,
            python::reason::READ_FAULT => Counter::PythonReadFault,
            python::reason::DEPTH_LIMIT => Counter::PythonDepthLimit,
            python::reason::THREAD_LIMIT => Counter::PythonThreadLimit,
            python::reason::NO_NAMESPACE => Counter::PythonNoNamespace,
            _ => return None,
        })
    }

    /// The counter of a `hotspot::reason` that ends a Java walk (`None`
    /// for `NATIVE`, where the native walk goes on).
    pub const fn for_hotspot_reason(reason: u32) -> Option<Counter> {
        Some(match reason {
            hotspot::reason::NO_PROCESS => Counter::HotspotNoProcess,
            hotspot::reason::NO_BLOB => Counter::HotspotNoBlob,
            hotspot::reason::READ_FAULT => Counter::HotspotReadFault,
            hotspot::reason::BAD_FRAME => Counter::HotspotBadFrame,
            hotspot::reason::DEPTH_LIMIT => Counter::HotspotDepthLimit,
            _ => return None,
        })
    }

    /// The counter of a `v8::reason` that ends a JavaScript walk (`None`
    /// for `NATIVE`, where the native walk goes on).
    pub const fn for_v8_reason(reason: u32) -> Option<Counter> {
        Some(match reason {
            v8::reason::NO_PROCESS => Counter::V8NoProcess,
            v8::reason::READ_FAULT => Counter::V8ReadFault,
            v8::reason::BAD_FRAME => Counter::V8BadFrame,
            v8::reason::DEPTH_LIMIT => Counter::V8DepthLimit,
            _ => return None,
        })
    }
}
