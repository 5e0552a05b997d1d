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

pub mod counter;
pub mod golang;
pub mod hotspot;
pub mod python;
pub mod runtime;
pub mod trace;
pub mod v8;
pub use counter::Counter;
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
/// [`PROGRAM_SAMPLE`] without the JIT runtimes' walks and Go's labels
/// (modern variant): attached first by `record` and `top`, replaced by
/// the whole program once a process needs those.
pub const PROGRAM_SAMPLE_LEAN: &str = "sample_cpu_lean";
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
/// Array of [`RowChunk`]s: every loaded unwind table (its packed rows,
/// then its rules: `unwind::packed`), each starting on a chunk.
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
/// Program arrays of the programs' tail calls, one per program type (a
/// program array serves one type). The legacy programs walk a few frames
/// per run and tail-call the next run, because the verifier of those
/// kernels accepts no loop over a whole stack in one program; both
/// variants jump to CPython's walk ([`TAIL_PYTHON`]), a program of its own.
pub const MAP_SAMPLE_TAILS: &str = "SAMPLE_TAILS";
/// The off-CPU tracepoint's tail calls (raw tracepoints).
pub const MAP_OFF_CPU_TAILS: &str = "OFF_CPU_TAILS";
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
/// Index, in each tails map, of HotSpot's walk (as V8's).
pub const LEGACY_TAIL_HOTSPOT: u32 = 3;
/// Index, in each tails map, of CPython's walk (both variants): the
/// sampler jumps there once a Python process's record is filled, and that
/// program walks the interpreter frames and writes the record, so the walk
/// costs the sampler's verification nothing. The legacy one walks a few
/// frames per run and calls itself.
pub const TAIL_PYTHON: u32 = 4;
/// Slots of each tails map.
pub const TAIL_SLOTS: u32 = 5;
/// (tails map, index, program) of every tail-called program of the legacy
/// unwind; the first [`LEGACY_TAIL_PERF_EVENT`] are perf_event programs,
/// the others raw tracepoints.
pub const LEGACY_TAIL_PROGRAMS: [(&str, u32, &str); 8] = [
    (MAP_SAMPLE_TAILS, LEGACY_TAIL_UNWIND, "sample_legacy_unwind"),
    (MAP_SAMPLE_TAILS, LEGACY_TAIL_EMIT, "sample_legacy_emit"),
    (MAP_SAMPLE_TAILS, LEGACY_TAIL_V8, "sample_legacy_v8"),
    (MAP_SAMPLE_TAILS, LEGACY_TAIL_HOTSPOT, "sample_legacy_java"),
    (
        MAP_OFF_CPU_TAILS,
        LEGACY_TAIL_UNWIND,
        "off_cpu_legacy_unwind",
    ),
    (MAP_OFF_CPU_TAILS, LEGACY_TAIL_EMIT, "off_cpu_legacy_emit"),
    (MAP_OFF_CPU_TAILS, LEGACY_TAIL_V8, "off_cpu_legacy_v8"),
    (
        MAP_OFF_CPU_TAILS,
        LEGACY_TAIL_HOTSPOT,
        "off_cpu_legacy_java",
    ),
];
/// The first four of [`LEGACY_TAIL_PROGRAMS`] are perf_event programs.
pub const LEGACY_TAIL_PERF_EVENT: usize = 4;
/// (tails map, modern program, legacy program) of CPython's walks, at
/// [`TAIL_PYTHON`]: the CPU sampler's (perf_event), then the off-CPU
/// tracepoint's.
pub const PYTHON_TAIL_PROGRAMS: [(&str, &str, &str); 2] = [
    (MAP_SAMPLE_TAILS, "sample_python", "sample_legacy_python"),
    (MAP_OFF_CPU_TAILS, "off_cpu_python", "off_cpu_legacy_python"),
];
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
/// `u64`s of [`present`] bytes, one byte per tgid slot: the kinds of
/// process registered among the tgids of each slot, so that a sample of a
/// process registered as none of them skips those maps' hash lookups
/// (an array's is a few instructions; a hash map's miss costs ~40 ns).
pub const MAP_PRESENT: &str = "PRESENT";

/// The kinds of [`MAP_PRESENT`] and where a tgid's are.
pub mod present {
    /// A process in [`super::MAP_TRACE_PROCESSES`].
    pub const TRACE: u8 = 1;
    /// A process in [`super::MAP_PYTHON_PROCESSES`].
    pub const PYTHON: u8 = 2;
    /// A process in [`super::MAP_GO_PROCESSES`].
    pub const GO: u8 = 4;
    /// Every kind.
    pub const ALL: [u8; 3] = [TRACE, PYTHON, GO];

    /// Entries of [`super::MAP_PRESENT`]: 65,536 slots in 64 KiB; tgids
    /// below 65,536 (every one under Linux's default `pid_max` on hosts
    /// of up to 64 CPUs) have a slot each.
    pub const ENTRIES: u32 = 8192;
    const SLOTS: u32 = ENTRIES * 8;

    /// Where `tgid`'s kinds are: the entry, and the shift of its byte in it.
    pub const fn slot(tgid: u32) -> (u32, u32) {
        let slot = tgid & (SLOTS - 1);
        (slot >> 3, (slot & 7) * 8)
    }
}
/// Global `u32`: byte offset, in `task_struct`, of the saved user thread
/// pointer (`thread.fsbase` on x86_64, `thread.uw.tp_value` on aarch64),
/// from BTF; 0 reads no thread context.
pub const GLOBAL_TASK_TP_OFFSET: &str = "TASK_TP_OFFSET";
/// Global `u32`: byte offset of `mm` in `task_struct`, from BTF; 0 counts
/// a failed thread-context read of an exiting thread as any other.
pub const GLOBAL_TASK_MM_OFFSET: &str = "TASK_MM_OFFSET";
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

/// One element of [`MAP_UNWIND_ROWS`]: 8-byte words, each a
/// `unwind::PackedRow` or half of a `unwind::UnwindRule`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RowChunk(pub [u64; unwind::ROW_CHUNK]);

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
    /// The marks of the frames walked so far, or'ed
    /// (`unwind::TABLE_MARK_SHIFT`).
    pub marks: u32,
    /// The mark of the mapping of the frame being walked (written where
    /// the lookup reads it: in map memory, its value is the same unknown
    /// to the verifier on every path).
    pub mark: u32,
    pub _pad: u32,
    /// The row search of the frame being walked (modern variant): in map
    /// memory, not on the stack, so that the verifier finds the state at
    /// each `bpf_loop` probe the same whatever the probes before it read
    /// (Linux 6.18.44's verifier walks a callback until its state
    /// converges, and a search kept on the stack never did).
    pub search: unwind::Search,
    pub frames: [u64; MAX_USER_STACK_DEPTH],
    /// Runtime frames found in place of native ones (JIT code), which
    /// `frames` refers to by `runtime::FRAME_MARK` entries.
    pub runtime: [runtime::Frame; runtime::MAX_FRAMES],
    /// The user stack the walk read last (see [`unwind::StackWindow`]).
    pub window: unwind::StackWindow,
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
/// Global (u32, set at load): 1 jumps to CPython's walk
/// ([`TAIL_PYTHON`]) for the registered Python processes; 0 leaves the
/// jump out of the programs (the verifier prunes it).
pub const GLOBAL_PYTHON_WALK: &str = "PYTHON_WALK";
/// Global (u32, set at load): 1 walks the frames of JIT runtimes (HotSpot's
/// Java frames, V8's JavaScript frames) of the registered processes; 0
/// leaves the walks out of the program (the verifier prunes them), for
/// kernels whose verifier they were not checked on.
pub const GLOBAL_RUNTIME_WALK: &str = "RUNTIME_WALK";
/// Global: 1 reads Go goroutines' pprof labels; 0 leaves the read out of
/// the program (pruned by the verifier) on kernels it was not checked on.
pub const GLOBAL_GO_LABELS: &str = "GO_LABELS";
/// Global (u32, set at load): 1 times the thread-context code of every
/// sample (its read and its copy to the ring) into
/// [`Counter::TraceContextNs`](crate::Counter::TraceContextNs); 0 leaves
/// the clock out (pruned by the verifier). Set with `--bpf-stats`, for
/// `cargo xtask bench`: the program's whole run time varies by more than
/// the context costs from one run to the next.
pub const GLOBAL_TIME_CONTEXT: &str = "TIME_CONTEXT";
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
/// A frame of the user stack carries its mapping's mark: an
/// interpreter's loop ran (`runtime::mark`).
pub const SAMPLE_FLAG_MARKED: u32 = 1 << 7;
/// Bits 8..16 of the flags: why the table-driven unwind of the user stack
/// stopped (an `unwind::reason`).
pub const SAMPLE_UNWIND_SHIFT: u32 = 8;

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
    const _: () = assert!(core::mem::size_of::<super::v8::Process>() == 176);
    // SAFETY: two integers, no padding (asserted below).
    unsafe impl aya::Pod for super::trace::Process {}
    const _: () = assert!(core::mem::size_of::<super::trace::Process>() == 16);
    // SAFETY: integers only, no padding (asserted below).
    unsafe impl aya::Pod for super::golang::Process {}
    const _: () = assert!(core::mem::size_of::<super::golang::Process>() == 32);
    // SAFETY: an array of integers.
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
    const _: () = assert!(core::mem::size_of::<super::RowChunk>() == 4096);
    const _: () = assert!(core::mem::size_of::<super::ProcessEvent>() == 4 * 4 + 8);
}
