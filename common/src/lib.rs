//! The kernel/userspace contract of hostprof.
//!
//! Everything both sides must agree on lives here and only here: the record the
//! eBPF sampler writes into the ring buffer ([`Sample`]), the names of maps,
//! programs and globals, the indices of the loss counters ([`Counter`]) and the
//! size limits. The eBPF programs (crate `agent-ebpf`) and the agent both depend
//! on this crate, so a change to the layout is one edit, seen by both compilers.
//! The unwinder's row and per-process mapping layouts are defined next to the
//! code that walks them (crate `hostprof-unwind`) and re-exported here as
//! [`unwind`].
//!
//! With the `user` feature the types implement `aya::Pod`, so the agent can read
//! them from maps.
#![no_std]

pub mod golang;
pub mod hotspot;
pub mod python;
pub mod runtime;
pub mod trace;
pub mod v8;
pub use hostprof_unwind as unwind;

/// Frames kept per kernel stack; the kernel's `bpf_get_stack` limit for the
/// default `kernel.perf_event_max_stack` (127).
pub const MAX_STACK_DEPTH: usize = 127;

/// Frames kept per user stack. The table-driven unwinder walks up to this
/// many; `bpf_get_stack` (frame pointers) stops at 127.
pub const MAX_USER_STACK_DEPTH: usize = 128;
const _: () = assert!(MAX_USER_STACK_DEPTH.is_power_of_two());

/// Length of `task_struct::comm`.
pub const COMM_LEN: usize = 16;

/// The perf_event program attached to every online CPU.
pub const PROGRAM_SAMPLE: &str = "sample_cpu";
/// Raw tracepoint on `sched_process_fork`: adds children of filtered processes
/// to the filter, so `hostprof record -- COMMAND` follows the whole tree.
pub const PROGRAM_FOLLOW_FORK: &str = "follow_fork";
/// Raw tracepoint on `sched_switch` (off-CPU profiling). As `prev` leaves the
/// CPU it records a full [`Sample`] (stacks, state, time) in
/// [`MAP_OFF_CPU_START`]; when a thread comes back as `next`, its record goes
/// to the ring buffer with the time it was away, if past the threshold.
/// Everything happens in one tracepoint: no kprobe or fexit, which some
/// kernels do not offer.
pub const PROGRAM_OFF_CPU_SWITCH: &str = "off_cpu_switch";
/// tid -> [`Sample`] of threads currently off CPU (LRU: exited threads age out).
pub const MAP_OFF_CPU_START: &str = "OFF_CPU_START";
/// Per-CPU scratch [`Sample`] (too large for the BPF stack).
pub const MAP_OFF_CPU_SCRATCH: &str = "OFF_CPU_SCRATCH";
/// Global `u64`: shortest off-CPU time that produces an event.
pub const GLOBAL_OFF_CPU_THRESHOLD_NS: &str = "OFF_CPU_THRESHOLD_NS";
/// Global `u32`: share of switch-outs tracked, in parts per million.
pub const GLOBAL_OFF_CPU_SAMPLE_PPM: &str = "OFF_CPU_SAMPLE_PPM";
/// Global `u32`: byte offset of `__state` (or `state`) in `task_struct`.
pub const GLOBAL_TASK_STATE_OFFSET: &str = "TASK_STATE_OFFSET";
/// Global `u32`: byte offset of `pid` (the thread id) in `task_struct`.
pub const GLOBAL_TASK_PID_OFFSET: &str = "TASK_PID_OFFSET";
/// Capacity of [`MAP_OFF_CPU_START`]: threads off CPU at once that can be
/// tracked (~2 KiB of kernel memory each).
pub const MAX_OFF_CPU_THREADS: u32 = 4096;
/// Ring buffer carrying [`Sample`] records to userspace.
pub const MAP_SAMPLES: &str = "SAMPLES";
/// Per-CPU `u64` counters indexed by [`Counter`].
pub const MAP_COUNTERS: &str = "COUNTERS";
/// tgid -> 1 for the processes to profile when [`GLOBAL_FILTER_BY_TGID`] is set.
pub const MAP_FILTER_TGIDS: &str = "FILTER_TGIDS";
/// Global `u8`: when non-zero only tgids present in [`MAP_FILTER_TGIDS`] are sampled.
pub const GLOBAL_FILTER_BY_TGID: &str = "FILTER_BY_TGID";

/// Global `u8`: [`UNWIND_FP`] or [`UNWIND_DWARF`].
pub const GLOBAL_UNWIND_MODE: &str = "UNWIND_MODE";
/// User stacks through frame pointers only (`bpf_get_stack`).
pub const UNWIND_FP: u8 = 0;
/// User stacks through unwind tables ([`unwind`]), frame pointers where a
/// process or mapping has none.
pub const UNWIND_DWARF: u8 = 1;
/// Array of `[unwind::UnwindRow; unwind::ROW_CHUNK]`: every loaded unwind
/// table, each starting on a chunk.
pub const MAP_UNWIND_ROWS: &str = "UNWIND_ROWS";
/// Default number of chunks in [`MAP_UNWIND_ROWS`] (4 KiB each: 32 MiB).
pub const DEFAULT_UNWIND_CHUNKS: u32 = 8192;
/// tgid -> [`unwind::ProcessMappings`]: executable mappings and their tables.
pub const MAP_PROCESS_MAPPINGS: &str = "PROCESS_MAPPINGS";
/// Capacity of [`MAP_PROCESS_MAPPINGS`] (~8 KiB of kernel memory each, 8 MiB
/// in all; see `unwind::MAX_PROCESS_MAPPINGS`). Processes beyond it are
/// unwound with frame pointers, counted, and retried after a backoff.
pub const MAX_UNWIND_PROCESSES: u32 = 1024;
/// Per-CPU [`UnwindState`] scratch: one slot for the sampler, one for the
/// off-CPU tracepoint.
pub const MAP_UNWIND_STATE: &str = "UNWIND_STATE";
/// [`PROGRAM_SAMPLE`] for kernels without `bpf_loop` (before 5.17) or
/// `bpf_task_pt_regs` / `bpf_get_current_task_btf` (before 5.15): the same
/// sampler, with the unwinder's loops bounded in the program itself and the
/// user registers found at the top of the task's kernel stack
/// ([`GLOBAL_TASK_STACK_OFFSET`], [`GLOBAL_PT_REGS_SIZE`]). The agent loads
/// one variant or the other, never both.
pub const PROGRAM_SAMPLE_LEGACY: &str = "sample_legacy";
/// [`PROGRAM_OFF_CPU_SWITCH`] for the same older kernels.
pub const PROGRAM_OFF_CPU_SWITCH_LEGACY: &str = "off_cpu_legacy";
/// Program arrays of the legacy programs' tail calls, one per program type
/// (a program array serves one type): a legacy program walks a few frames
/// per run and tail-calls the next run, because the verifier of those
/// kernels accepts no loop over a whole stack in one program.
pub const MAP_LEGACY_SAMPLE_TAILS: &str = "LEGACY_SAMPLE_TAILS";
/// The off-CPU tracepoint's tail calls (raw tracepoints).
pub const MAP_LEGACY_OFF_CPU_TAILS: &str = "LEGACY_OFFCPU_TAILS";
/// Index, in each tails map, of the unwinder that walks a few frames and
/// calls itself.
pub const LEGACY_TAIL_UNWIND: u32 = 0;
/// Index, in each tails map, of the program that writes the record once the
/// stack is walked.
pub const LEGACY_TAIL_EMIT: u32 = 1;
/// Index, in each tails map, of V8's walk: the unwinder jumps there when
/// it reaches V8's code, so that walk is a program of its own, checked by
/// the verifier apart from the native unwinder's.
pub const LEGACY_TAIL_V8: u32 = 2;
/// Slots of each tails map (room for a runtime walk more).
pub const LEGACY_TAIL_SLOTS: u32 = 4;
/// (tails map, index, program) of every tail-called program; the first
/// [`LEGACY_TAIL_PERF_EVENT`] are perf_event programs, the others raw
/// tracepoints.
pub const LEGACY_TAIL_PROGRAMS: [(&str, u32, &str); 6] = [
    (
        MAP_LEGACY_SAMPLE_TAILS,
        LEGACY_TAIL_UNWIND,
        "sample_legacy_unwind",
    ),
    (
        MAP_LEGACY_SAMPLE_TAILS,
        LEGACY_TAIL_EMIT,
        "sample_legacy_emit",
    ),
    (MAP_LEGACY_SAMPLE_TAILS, LEGACY_TAIL_V8, "sample_legacy_v8"),
    (
        MAP_LEGACY_OFF_CPU_TAILS,
        LEGACY_TAIL_UNWIND,
        "off_cpu_legacy_unwind",
    ),
    (
        MAP_LEGACY_OFF_CPU_TAILS,
        LEGACY_TAIL_EMIT,
        "off_cpu_legacy_emit",
    ),
    (
        MAP_LEGACY_OFF_CPU_TAILS,
        LEGACY_TAIL_V8,
        "off_cpu_legacy_v8",
    ),
];
/// The first three of [`LEGACY_TAIL_PROGRAMS`] are perf_event programs.
pub const LEGACY_TAIL_PERF_EVENT: usize = 3;
/// Global `u32`: byte offset of `stack` (the kernel stack's base) in
/// `task_struct`, from BTF; only the legacy programs read it.
pub const GLOBAL_TASK_STACK_OFFSET: &str = "TASK_STACK_OFFSET";
/// Global `u32`: `sizeof(struct pt_regs)` in the running kernel, from BTF.
/// `task_pt_regs(task)` is `task->stack + THREAD_SIZE - sizeof(pt_regs)` on
/// both x86_64 and arm64.
pub const GLOBAL_PT_REGS_SIZE: &str = "PT_REGS_SIZE";
/// Global `u32`: the kernel stack size (`THREAD_SIZE`), 16 KiB on x86_64 and
/// on arm64 with 4 KiB pages, both without KASAN (the distributions' kernels).
pub const GLOBAL_THREAD_SIZE: &str = "THREAD_SIZE";
/// Default of [`GLOBAL_THREAD_SIZE`].
pub const DEFAULT_THREAD_SIZE: u32 = 16 << 10;
/// tgid -> [`python::Process`]: the Python processes and where their
/// interpreter's structures are.
pub const MAP_PYTHON_PROCESSES: &str = "PYTHON_PROCS";
/// [`python::ThreadKey`] -> `PyThreadState` address: the thread states the
/// agent found in each Python process's thread list, so that a thread older
/// than the newest [`python::MAX_THREADS`] is found at once.
pub const MAP_PYTHON_THREADS: &str = "PYTHON_THREADS";
/// tgid -> [`hotspot::Process`]: the JVMs and where their code heaps and
/// fields are.
pub const MAP_HOTSPOT_PROCESSES: &str = "HOTSPOT_PROCS";
/// tgid -> [`v8::Process`]: the V8 (Node.js) processes and where their
/// builtins and fields are.
pub const MAP_V8_PROCESSES: &str = "V8_PROCS";
/// tgid -> [`trace::Process`]: the processes that publish an OpenTelemetry
/// thread context, and where its thread-local is.
pub const MAP_TRACE_PROCESSES: &str = "TRACE_PROCS";
/// Global `u32`: byte offset, in `task_struct`, of the saved user thread
/// pointer (`thread.fsbase` on x86_64, `thread.uw.tp_value` on aarch64),
/// from BTF; 0 reads no thread context.
pub const GLOBAL_TASK_TP_OFFSET: &str = "TASK_TP_OFFSET";
/// tgid -> [`golang::Process`]: the Go processes whose goroutines' pprof
/// labels samples carry, and where `g` and its fields are.
pub const MAP_GO_PROCESSES: &str = "GO_PROCS";
/// Raw tracepoint on `sched_process_exec`: forgets the mappings of a process
/// that replaced its image, so its next samples ask the agent for new ones.
pub const PROGRAM_FORGET_EXEC: &str = "forget_exec";

/// Ring buffer of [`ProcessEvent`]s (forks, execs, exits of wanted
/// processes): the agent tracks processes from these, not from a `/proc`
/// read per sample.
pub const MAP_PROCESS_EVENTS: &str = "PROCESS_EVENTS";
/// Size of [`MAP_PROCESS_EVENTS`]: 8,192 events (32 bytes with the ring's
/// header), drained every [`RING_DRAIN_INTERVAL_MS`] (80,000 forks, execs
/// and exits a second), or every 250 ms by the agent (32,000 a second; a
/// host with 600 forks a second makes ~1,800). Every page counts in the
/// agent's memory from the start (the ring is mapped twice).
pub const PROCESS_EVENTS_BYTES: u32 = 256 << 10;
/// Raw tracepoint on `sched_process_fork`: a [`PROCESS_EVENT_FORK`] for each
/// new process (not thread) of a wanted parent.
pub const PROGRAM_PROCESS_FORK: &str = "process_fork";
/// Raw tracepoint on `sched_process_exit`: a [`PROCESS_EVENT_EXIT`] when a
/// wanted process's main thread exits.
pub const PROGRAM_PROCESS_EXIT: &str = "process_exit";
/// [`ProcessEvent::kind`]: `tgid` was forked by `parent_tgid`.
pub const PROCESS_EVENT_FORK: u32 = 1;
/// [`ProcessEvent::kind`]: `tgid` replaced its image (execve).
pub const PROCESS_EVENT_EXEC: u32 = 2;
/// [`ProcessEvent::kind`]: the main thread of `tgid` exited.
pub const PROCESS_EVENT_EXIT: u32 = 3;

/// One record of [`MAP_PROCESS_EVENTS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessEvent {
    /// A `PROCESS_EVENT_*`.
    pub kind: u32,
    pub tgid: u32,
    /// Forks: the parent's tgid; 0 otherwise.
    pub parent_tgid: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns()` of the event (the clock of [`Sample::ktime_ns`]).
    pub ktime_ns: u64,
}

/// One element of [`MAP_UNWIND_ROWS`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RowChunk(pub [unwind::UnwindRow; unwind::ROW_CHUNK]);

/// Scratch state of one in-kernel unwind (too large for the BPF stack).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwindState {
    pub regs: unwind::Regs,
    pub tgid: u32,
    pub len: u32,
    pub reason: u32,
    /// Legacy programs: tail calls made so far for this unwind.
    pub tail_calls: u32,
    /// Valid entries of `runtime`.
    pub runtime_len: u32,
    pub _pad: u32,
    pub frames: [u64; MAX_USER_STACK_DEPTH],
    /// Runtime frames found in place of native ones (JIT code), which
    /// `frames` refers to by `runtime::FRAME_MARK` entries.
    pub runtime: [runtime::Frame; runtime::MAX_FRAMES],
}

/// Global `u32`: byte offset of `tgid` in the running kernel's `task_struct`
/// (from its BTF); [`PROGRAM_FOLLOW_FORK`] reads the child's tgid with it.
pub const GLOBAL_TASK_TGID_OFFSET: &str = "TASK_TGID_OFFSET";

/// Capacity of [`MAP_FILTER_TGIDS`].
pub const MAX_FILTER_TGIDS: u32 = 4096;
/// Default size of the [`MAP_SAMPLES`] ring buffer (a power of two pages).
pub const DEFAULT_RING_BYTES: u32 = 8 << 20;
/// The sampler wakes the reader only once this much data waits in the ring;
/// the reader also drains it every [`RING_DRAIN_INTERVAL_MS`]. One wakeup per
/// ~128 samples instead of one per sample keeps the agent's CPU low.
pub const RING_WAKEUP_BYTES: u64 = 256 << 10;
/// How often `record` and `top` drain the ring without being woken (the
/// agent: less often).
pub const RING_DRAIN_INTERVAL_MS: u64 = 100;

/// Global `u32`: bytes of user stack to copy per CPU sample
/// (`hostprof record --stack-copy`); 0, the default, copies none and the
/// ring carries plain [`Sample`]s.
pub const GLOBAL_STACK_COPY_BYTES: &str = "STACK_COPY_BYTES";
/// Global `u32`: bytes of user stack to copy with a CPU sample of a process
/// whose unwind tables are not in the kernel yet (tables mode only), so the
/// agent can unwind it on the host once they are (8 KiB by default); 0
/// turns that off.
/// Ignored when [`GLOBAL_STACK_COPY_BYTES`] copies every sample anyway.
pub const GLOBAL_EARLY_COPY_BYTES: &str = "EARLY_COPY_BYTES";
/// Global (u32, set at load): 1 walks CPython's interpreter frames of the
/// registered Python processes; 0 leaves the walk out of the program (the
/// verifier prunes it), for kernels whose verifier rejects it.
pub const GLOBAL_PYTHON_WALK: &str = "PYTHON_WALK";
/// Global (u32, set at load): 1 walks the frames of JIT runtimes (HotSpot's
/// Java frames, V8's JavaScript frames) of the registered processes; 0
/// leaves the walks out of the program (the verifier prunes them), for
/// kernels whose verifier they were not checked on.
pub const GLOBAL_RUNTIME_WALK: &str = "RUNTIME_WALK";
/// Global: 1 reads Go goroutines' pprof labels; 0 leaves the read out of
/// the program (pruned by the verifier) on kernels it was not checked on.
pub const GLOBAL_GO_LABELS: &str = "GO_LABELS";
/// Largest `--stack-copy`: the stack bytes a [`StackSample`] holds.
pub const MAX_STACK_COPY: usize = 16384;
const _: () = assert!(MAX_STACK_COPY.is_power_of_two());

/// A CPU sample with a raw snapshot of the user stack, written instead of a
/// [`Sample`] only when [`GLOBAL_STACK_COPY_BYTES`] is set: the user
/// registers the unwinder started from and the stack from `sp` up, so
/// userspace can replay the unwind (`hostprof::unwind::replay`). The reader
/// tells the two records apart by their size.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackSample {
    pub sample: Sample,
    /// User pc, sp, frame pointer and link register (aarch64; x86_64: the pc
    /// again), from the task's saved `pt_regs`.
    pub regs: [u64; 4],
    /// Valid bytes of `stack`, copied from `regs[1]` (sp) up; 0 when the
    /// stack could not be read.
    pub stack_len: u32,
    /// 1 when `regs` were read.
    pub regs_valid: u32,
    pub stack: [u8; MAX_STACK_COPY],
}

/// One CPU sample, filled by the kernel in a per-CPU scratch buffer.
///
/// Stacks are arrays of instruction pointers, leaf first; only the first
/// `*_stack_len` entries are valid. **Compact layout**: the user frames
/// start right after the kernel ones (at `kernel_stack[kernel_stack_len]`,
/// spilling into `user_stack`), and the ring gets only the used part,
/// [`SAMPLE_HEADER_BYTES`] + 8 × (kernel + user frames). A record as long
/// as a whole `Sample` is the same layout with 127 kernel frames. The agent
/// moves the user frames back into `user_stack` when it decodes a record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Process id (`task->tgid`).
    pub tgid: u32,
    /// Thread id (`task->pid`).
    pub tid: u32,
    /// Logical CPU the sample was taken on.
    pub cpu: u32,
    /// Bit set of `SAMPLE_FLAG_*`.
    pub flags: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds. For off-CPU samples,
    /// when the thread left the CPU.
    pub ktime_ns: u64,
    /// Off-CPU samples: how long the thread was away, in nanoseconds.
    pub off_cpu_ns: u64,
    /// [`SAMPLE_KIND_CPU`] or [`SAMPLE_KIND_OFF_CPU`].
    pub kind: u32,
    /// Off-CPU samples: the thread's `__state` when it left (`TASK_*` bits;
    /// 0 = preempted while runnable).
    pub thread_state: u32,
    /// Thread name, NUL padded.
    pub comm: [u8; COMM_LEN],
    /// Valid entries of `kernel_stack`.
    pub kernel_stack_len: u32,
    /// Valid entries of `user_stack`.
    pub user_stack_len: u32,
    pub kernel_stack: [u64; MAX_STACK_DEPTH],
    pub user_stack: [u64; MAX_USER_STACK_DEPTH],
    /// Frames of language runtimes (CPython, HotSpot): only the used
    /// ones are in the record, which ends with them (or with `trace`).
    pub runtime: runtime::Stack,
    /// The thread's OpenTelemetry context, when [`SAMPLE_FLAG_TRACE`] is
    /// set. Not at this place in a ring record: the sampler appends it
    /// after the record's used part, whose last [`trace::LINK_BYTES`] it
    /// then is (a stack-copy record keeps it here).
    pub trace: trace::Link,
    /// The first `trace.attrs_len` bytes: the record's attributes, as the
    /// SDK wrote them. Not at this place in a ring record either: they go
    /// just before the link there (see [`trace::Link::attrs_len`]).
    pub attrs: [u8; trace::ATTRS_ROOM],
}

/// Where [`Sample::attrs`] is.
pub const SAMPLE_ATTRS_AT: usize = core::mem::offset_of!(Sample, attrs);
const _: () = assert!(SAMPLE_ATTRS_AT == SAMPLE_TRACE_AT + trace::LINK_BYTES);
const _: () = assert!(core::mem::size_of::<Sample>() == SAMPLE_ATTRS_AT + trace::ATTRS_ROOM);
const _: () = assert!(SAMPLE_ATTRS_AT.is_multiple_of(8));

/// Where [`Sample::trace`] is: the used part of a record ends at or before it.
pub const SAMPLE_TRACE_AT: usize = core::mem::offset_of!(Sample, trace);

/// Bytes of a [`Sample`] before its frames (everything up to
/// `kernel_stack`): the shortest ring record.
pub const SAMPLE_HEADER_BYTES: usize = core::mem::offset_of!(Sample, kernel_stack);
const _: () = assert!(SAMPLE_HEADER_BYTES == 64);

/// A cpu-clock sample: the thread was running.
pub const SAMPLE_KIND_CPU: u32 = 0;
/// An off-CPU event: the thread was blocked or waiting for `off_cpu_ns`.
pub const SAMPLE_KIND_OFF_CPU: u32 = 1;

/// The kernel stack filled every slot: frames beyond it were cut.
pub const SAMPLE_FLAG_KERNEL_TRUNCATED: u32 = 1 << 0;
/// The user stack filled every slot: frames beyond it were cut.
pub const SAMPLE_FLAG_USER_TRUNCATED: u32 = 1 << 1;
/// `bpf_get_stack` failed for the kernel stack.
pub const SAMPLE_FLAG_KERNEL_ERROR: u32 = 1 << 2;
/// `bpf_get_stack` failed for the user stack.
pub const SAMPLE_FLAG_USER_ERROR: u32 = 1 << 3;
/// The user stack was walked with unwind tables.
pub const SAMPLE_FLAG_USER_TABLES: u32 = 1 << 4;
/// The sample carries its thread's OpenTelemetry context (a
/// [`trace::Link`] ends the record).
pub const SAMPLE_FLAG_TRACE: u32 = 1 << 5;
/// With [`SAMPLE_FLAG_TRACE`]: the [`trace::Link`] carries no trace (its
/// ids are zero), only `attrs_len` bytes of the goroutine's pprof labels
/// in [`golang`]'s encoding, in place of OTEP attributes.
pub const SAMPLE_FLAG_GO_LABELS: u32 = 1 << 6;
/// Bits 8..16 of the flags: why the table-driven unwind of the user stack
/// stopped (an `unwind::reason`).
pub const SAMPLE_UNWIND_SHIFT: u32 = 8;

/// Indices into the per-CPU [`MAP_COUNTERS`] array: every way a sample can be
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
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; 49] = [
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

#[cfg(feature = "user")]
mod user {
    // SAFETY: `Sample` is `repr(C)`, `Copy`, made only of integers and arrays of
    // integers, with no padding (checked by the size assertion below).
    unsafe impl aya::Pod for super::Sample {}
    // SAFETY: as above: a Sample, integers and bytes, no padding (asserted).
    unsafe impl aya::Pod for super::StackSample {}
    // SAFETY: as above, integers only, no padding (asserted below).
    unsafe impl aya::Pod for super::python::Process {}
    // SAFETY: two u32, no padding (asserted below).
    unsafe impl aya::Pod for super::python::ThreadKey {}
    const _: () = assert!(core::mem::size_of::<super::python::ThreadKey>() == 8);
    // SAFETY: as above, integers only, no padding (asserted below).
    unsafe impl aya::Pod for super::hotspot::Process {}
    // SAFETY: as above, integers only, no padding (asserted below).
    unsafe impl aya::Pod for super::v8::Process {}
    const _: () = assert!(core::mem::size_of::<super::v8::Process>() == 168);
    // SAFETY: two integers, no padding (asserted below).
    unsafe impl aya::Pod for super::trace::Process {}
    const _: () = assert!(core::mem::size_of::<super::trace::Process>() == 16);
    // SAFETY: integers only, no padding (asserted below).
    unsafe impl aya::Pod for super::golang::Process {}
    const _: () = assert!(core::mem::size_of::<super::golang::Process>() == 24);
    // SAFETY: as above; a chunk of rows is an array of a padding-free struct.
    unsafe impl aya::Pod for super::RowChunk {}

    const _: () = assert!(
        core::mem::size_of::<super::Sample>()
            == 4 * 4
                + 8 * 2
                + 4 * 2
                + super::COMM_LEN
                + 4 * 2
                + 8 * (super::MAX_STACK_DEPTH + super::MAX_USER_STACK_DEPTH)
                + 4 * 2
                + 16 * super::runtime::MAX_FRAMES
                + super::trace::LINK_BYTES
                + super::trace::ATTRS_ROOM
    );
    const _: () = assert!(
        core::mem::size_of::<super::hotspot::Process>() == 32 * super::hotspot::MAX_HEAPS + 4 * 12
    );
    const _: () = assert!(core::mem::size_of::<super::python::Process>() == 8 * 3 + 4 * 14);
    const _: () = assert!(
        core::mem::size_of::<super::StackSample>()
            == core::mem::size_of::<super::Sample>() + 8 * 4 + 4 * 2 + super::MAX_STACK_COPY
    );
    const _: () = assert!(core::mem::size_of::<super::unwind::UnwindRow>() == 16);
    const _: () = assert!(core::mem::size_of::<super::ProcessEvent>() == 4 * 4 + 8);
}
