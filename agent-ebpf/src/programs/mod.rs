//! The eBPF programs, one file per program family; this file holds the
//! globals the agent sets at load time, the maps, and what every program
//! shares (counters, stack reading, the record's fill and submit).
//!
//! - `sample`: `sample_cpu` on every cpu-clock event (and its legacy variant);
//! - `off_cpu`: `off_cpu_switch` on `sched_switch`;
//! - `process`: `forget_exec`, `follow_fork`, and the process events
//!   (`process_fork`, `forget_exec`, `process_exit`);
//! - `kernel`: what differs between kernels (modern: `bpf_loop`; legacy:
//!   5.10 to 5.16) and the user registers;
//! - `unwinder`: the table-driven unwinder's kernel side, in `bpf_loop`
//!   callbacks;
//! - `legacy`: the legacy variant's chain of tail calls (the unwinder's
//!   runs, V8's walk, the record's writer);
//! - `python`: CPython's interpreter frames, a tail-called program's walk;
//! - `trace`: the OpenTelemetry thread context of the sampled thread;
//! - `golang`: the pprof labels of the goroutine the sampled thread runs;
//! - `hotspot`: HotSpot's Java frames, stepped by the unwinder in the code
//!   cache;
//! - `v8`: V8's JavaScript frames, stepped by the unwinder in V8's code.
mod golang;
mod hotspot;
mod kernel;
mod legacy;
mod off_cpu;
mod process;
mod python;
mod sample;
mod trace;
mod unwinder;
mod v8;

use core::{
    ffi::c_void,
    mem::size_of,
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        generated::{
            bpf_get_current_task, bpf_get_current_task_btf, bpf_get_prandom_u32,
            bpf_get_smp_processor_id, bpf_get_stack, bpf_ktime_get_ns, bpf_loop, bpf_task_pt_regs,
        },
    },
    macros::{map, perf_event, raw_tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
    programs::{PerfEventContext, RawTracePointContext},
};
use hostprof_common::{
    COMM_LEN, Counter, DEFAULT_RING_BYTES, DEFAULT_THREAD_SIZE, DEFAULT_UNWIND_CHUNKS,
    MAX_FILTER_TGIDS, MAX_OFF_CPU_THREADS, MAX_STACK_COPY, MAX_STACK_DEPTH, MAX_UNWIND_PROCESSES,
    MAX_USER_STACK_DEPTH, PROCESS_EVENT_EXEC, PROCESS_EVENT_EXIT, PROCESS_EVENT_FORK,
    PROCESS_EVENTS_BYTES, ProcessEvent, RING_WAKEUP_BYTES, RowChunk, SAMPLE_ATTRS_AT,
    SAMPLE_FLAG_KERNEL_ERROR, SAMPLE_FLAG_KERNEL_TRUNCATED, SAMPLE_FLAG_MARKED, SAMPLE_FLAG_TRACE,
    SAMPLE_FLAG_USER_ERROR, SAMPLE_FLAG_USER_TABLES, SAMPLE_FLAG_USER_TRUNCATED,
    SAMPLE_HEADER_BYTES, SAMPLE_KIND_CPU, SAMPLE_KIND_OFF_CPU, SAMPLE_TRACE_AT,
    SAMPLE_UNWIND_SHIFT, Sample, StackSample, UNWIND_DWARF, UnwindState, runtime,
    unwind::{self, Arch, Lookup, ProcessMappings, ROW_CHUNK, Regs, Search, Sorted, Step},
};

use kernel::{Kernel, read_user_regs};

/// Set by the agent at load time (`hostprof_common::GLOBAL_FILTER_BY_TGID`).
#[unsafe(no_mangle)]
static FILTER_BY_TGID: u8 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_TASK_TGID_OFFSET`).
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_OFF_CPU_THRESHOLD_NS`).
#[unsafe(no_mangle)]
static OFF_CPU_THRESHOLD_NS: u64 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_OFF_CPU_SAMPLE_PPM`).
#[unsafe(no_mangle)]
static OFF_CPU_SAMPLE_PPM: u32 = 1_000_000;

/// Set by the agent at load time (`hostprof_common::GLOBAL_TASK_STATE_OFFSET`).
#[unsafe(no_mangle)]
static TASK_STATE_OFFSET: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_TASK_PID_OFFSET`).
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_TASK_STACK_OFFSET`).
#[unsafe(no_mangle)]
static TASK_STACK_OFFSET: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_PT_REGS_SIZE`).
#[unsafe(no_mangle)]
static PT_REGS_SIZE: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_THREAD_SIZE`).
#[unsafe(no_mangle)]
static THREAD_SIZE: u32 = DEFAULT_THREAD_SIZE;

#[map(name = "OFF_CPU_START")]
static OFF_CPU_START: LruHashMap<u32, Sample> =
    LruHashMap::with_max_entries(MAX_OFF_CPU_THREADS, 0);

/// Per-CPU scratch `Sample` of the CPU sampler: filled there, then only
/// its used part goes to the ring (`output`). Not shared with the
/// off-CPU tracepoint, which the sampler's NMI can interrupt.
#[map(name = "SAMPLE_SCRATCH")]
static SAMPLE_SCRATCH: PerCpuArray<Sample> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "OFF_CPU_SCRATCH")]
static OFF_CPU_SCRATCH: PerCpuArray<Sample> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "SAMPLES")]
static SAMPLES: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

#[map(name = "PROCESS_EVENTS")]
static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(PROCESS_EVENTS_BYTES, 0);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(hostprof_common::runtime::COUNTERS, 0);

#[map(name = "FILTER_TGIDS")]
static FILTER_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_FILTER_TGIDS, 0);

/// Set by the agent at load time (`hostprof_common::GLOBAL_UNWIND_MODE`).
#[unsafe(no_mangle)]
static UNWIND_MODE: u8 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_STACK_COPY_BYTES`).
#[unsafe(no_mangle)]
static STACK_COPY_BYTES: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_EARLY_COPY_BYTES`).
#[unsafe(no_mangle)]
static EARLY_COPY_BYTES: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_PYTHON_WALK`).
#[unsafe(no_mangle)]
static PYTHON_WALK: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_RUNTIME_WALK`).
#[unsafe(no_mangle)]
static RUNTIME_WALK: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_GO_LABELS`).
#[unsafe(no_mangle)]
static GO_LABELS: u32 = 0;

#[map(name = "UNWIND_ROWS")]
static UNWIND_ROWS: Array<RowChunk> = Array::with_max_entries(DEFAULT_UNWIND_CHUNKS, 0);

#[map(name = "PROCESS_MAPPINGS")]
static PROCESS_MAPPINGS: HashMap<u32, ProcessMappings> =
    HashMap::with_max_entries(MAX_UNWIND_PROCESSES, 0);

/// Which kinds of process the agent registered, per tgid slot
/// (`hostprof_common::present`): a sample skips the hash lookups of the
/// kinds its process is not (a tenth of its fixed cost on a host without
/// them; a miss of each on every other process's samples beside them).
#[map(name = "PRESENT")]
static PRESENT: Array<u64> = Array::with_max_entries(hostprof_common::present::ENTRIES, 0);

/// Whether a process of kind `bit` was registered among `tgid`'s slot
/// (see [`PRESENT`]): false means `tgid` is not in that kind's map.
#[inline(always)]
fn present(tgid: u32, bit: u8) -> bool {
    let (entry, shift) = hostprof_common::present::slot(tgid);
    PRESENT
        .get_ptr(entry)
        .is_some_and(|kinds| (unsafe { read_volatile(kinds) } >> shift) & u64::from(bit) != 0)
}

/// The row each recent search of a table found, per CPU (see
/// `hostprof_unwind::hint_holds`): the same return addresses come back
/// sample after sample, and checking a hint is two row reads where a
/// search is a dozen `bpf_loop` calls.
#[map(name = "ROW_HINTS")]
static ROW_HINTS: PerCpuArray<u32> = PerCpuArray::with_max_entries(unwind::ROW_HINT_SLOTS, 0);

/// Per CPU and per depth in the stack, the mapping the last search of a
/// process's mappings at that depth found (checked the same way): the
/// next samples' stacks mostly repeat the last one's binaries frame by
/// frame, and checking the hint is two reads where the branch-free search
/// is nine probes. One hint for all depths missed at every change of
/// binary within a stack (an executable's frames, libc's, the
/// executable's `_start` again): two or three searches a sample.
#[map(name = "MAPPING_HINTS")]
static MAPPING_HINTS: PerCpuArray<u32> =
    PerCpuArray::with_max_entries(MAX_USER_STACK_DEPTH as u32, 0);

/// The tail-call targets of the CPU sampler (`hostprof_common::TAIL_PYTHON`,
/// `hostprof_common::LEGACY_TAIL_PROGRAMS`): CPython's walk (both
/// variants), and the legacy unwinders that walk
/// `legacy::LEGACY_FRAMES_PER_CALL` frames and call themselves, and the
/// programs that then write the record. Tail calls, not a loop, because
/// the verifiers of those kernels walk every path of a loop: a whole
/// stack in one program is more than they accept, and so is the record's
/// code after every way an unwind can end.
#[map(name = "SAMPLE_TAILS")]
static SAMPLE_TAILS: ProgramArray = ProgramArray::with_max_entries(hostprof_common::TAIL_SLOTS, 0);

/// The same for the off-CPU tracepoint (a program array serves one
/// program type).
#[map(name = "OFF_CPU_TAILS")]
static OFF_CPU_TAILS: ProgramArray = ProgramArray::with_max_entries(hostprof_common::TAIL_SLOTS, 0);

#[map(name = "UNWIND_STATE")]
static UNWIND_STATE: PerCpuArray<UnwindState> = PerCpuArray::with_max_entries(2, 0);

const STACK_BYTES: u32 = (MAX_STACK_DEPTH * size_of::<u64>()) as u32;
/// Masks a kernel stack's length for the verifier (at most 127 frames).
const KERNEL_FRAMES_MASK: usize = 127;
const _: () = assert!(MAX_STACK_DEPTH == KERNEL_FRAMES_MASK);
const USER_STACK_BYTES: u32 = (MAX_USER_STACK_DEPTH * size_of::<u64>()) as u32;

#[cfg(bpf_target_arch = "aarch64")]
const ARCH: Arch = Arch::Aarch64;
#[cfg(not(bpf_target_arch = "aarch64"))]
const ARCH: Arch = Arch::X86_64;

/// Byte offsets of pc, sp, frame pointer and link register in the
/// architecture's `struct pt_regs` (a stable kernel ABI).
#[cfg(bpf_target_arch = "aarch64")]
const PT_REGS: [usize; 4] = [32 * 8, 31 * 8, 29 * 8, 30 * 8];
#[cfg(not(bpf_target_arch = "aarch64"))]
const PT_REGS: [usize; 4] = [16 * 8, 19 * 8, 4 * 8, 16 * 8];

/// Legacy kernels read `struct pt_regs` through a helper call each time:
/// the registers come in one read of the [`PT_REGS_BLOCK_WORDS`] words from
/// this offset on, which hold all four on arm64 (x29, x30, sp, pc) and all
/// but the frame pointer on x86_64 (ip, cs, flags, sp), read alone.
#[cfg(bpf_target_arch = "aarch64")]
const PT_REGS_BLOCK: usize = 29 * 8;
#[cfg(not(bpf_target_arch = "aarch64"))]
const PT_REGS_BLOCK: usize = 16 * 8;
const PT_REGS_BLOCK_WORDS: usize = 4;

/// `UnwindState::reason` while the unwind is still going.
const RUNNING: u32 = u32::MAX;

/// UNWIND_STATE slots: the sampler and the off-CPU tracepoint never
/// share one.
const SLOT_CPU: u32 = 0;
const SLOT_OFF_CPU: u32 = 1;

#[inline(always)]
fn bump(counter: Counter) {
    bump_slot(counter as u32);
}

/// Counts `event` of `runtime`'s walk (its block of the counters).
#[inline(always)]
fn bump_runtime(runtime: hostprof_common::runtime::Runtime, event: u32) {
    bump_slot(runtime.counter(event));
}

#[inline(always)]
fn bump_slot(index: u32) {
    add_slot(index, 1);
}

#[inline(always)]
fn add_slot(index: u32, value: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // Per-CPU slot and perf_event programs do not nest on one CPU: a
        // plain increment is race-free.
        unsafe { *slot += value };
    }
}

/// Reads one stack into `dst`; returns (frames, flags to set).
#[inline(always)]
fn read_stack<C: EbpfContext>(ctx: &C, dst: *mut u64, user: bool) -> (u32, u32) {
    let (flags, bytes) = if user {
        (BPF_F_USER_STACK as u64, USER_STACK_BYTES)
    } else {
        (0, STACK_BYTES)
    };
    let written = unsafe { bpf_get_stack(ctx.as_ptr(), dst as *mut c_void, bytes, flags) };
    let (error_flag, truncated_flag, error_counter) = if user {
        (
            SAMPLE_FLAG_USER_ERROR,
            SAMPLE_FLAG_USER_TRUNCATED,
            Counter::UserStackError,
        )
    } else {
        (
            SAMPLE_FLAG_KERNEL_ERROR,
            SAMPLE_FLAG_KERNEL_TRUNCATED,
            Counter::KernelStackError,
        )
    };
    if written < 0 {
        bump(error_counter);
        return (0, error_flag);
    }
    let frames = (written as u32) / size_of::<u64>() as u32;
    if frames as usize >= MAX_STACK_DEPTH {
        bump(Counter::Truncated);
        return (frames, truncated_flag);
    }
    (frames, 0)
}

/// Where the privilege level of the interrupted code is in the perf
/// event's `struct pt_regs` (a stable kernel ABI): x86_64's `cs`, whose
/// low two bits are 3 in user mode; arm64's `pstate`, whose mode bits are
/// 0 (EL0) in user mode.
#[cfg(bpf_target_arch = "aarch64")]
const PT_REGS_MODE: (usize, u64, u64) = (33 * 8, 0xf, 0);
#[cfg(not(bpf_target_arch = "aarch64"))]
const PT_REGS_MODE: (usize, u64, u64) = (17 * 8, 3, 3);

/// True unless the perf event interrupted user code (then the kernel
/// stack is empty).
#[inline(always)]
fn interrupted_in_kernel(ctx: &PerfEventContext) -> bool {
    let (offset, mask, user) = PT_REGS_MODE;
    // SAFETY: `bpf_perf_event_data` starts with the interrupted registers;
    // the verifier checks the offset against the context's layout.
    let mode = unsafe { *(ctx.as_ptr() as *const u8).add(offset).cast::<u64>() };
    mode & mask != user
}

/// True when the process is to be profiled (no filter, or in the filter).
#[inline(always)]
fn wanted(tgid: u32) -> bool {
    // Volatile: the loader rewrites this constant, the compiler must not fold it.
    let filtering = unsafe { read_volatile(&FILTER_BY_TGID) } != 0;
    !filtering || unsafe { FILTER_TGIDS.get(&tgid) }.is_some()
}

/// Fills `sample` with the current thread and both its stacks;
/// `in_kernel`: false when the thread was interrupted in user code, which
/// has no kernel stack to read (the helper would still zero its whole
/// buffer, a kilobyte, on every such sample).
#[inline(always)]
unsafe fn fill<K: Kernel, C: EbpfContext>(
    ctx: &C,
    sample: *mut Sample,
    pid_tgid: u64,
    kind: u32,
    ktime_ns: u64,
    state: u32,
    in_kernel: bool,
) {
    unsafe {
        (*sample).tgid = (pid_tgid >> 32) as u32;
        (*sample).tid = pid_tgid as u32;
        (*sample).cpu = bpf_get_smp_processor_id();
        (*sample).ktime_ns = ktime_ns;
        (*sample).off_cpu_ns = 0;
        (*sample).kind = kind;
        (*sample).thread_state = state;
        // Straight into the record: aya's `bpf_get_current_comm` returns
        // the name by value, and its copies, byte by byte, were a few hundred
        // instructions a sample. The helper pads the name with zeros, and
        // zeroes the whole buffer when it fails.
        aya_ebpf::helpers::generated::bpf_get_current_comm(
            (&raw mut (*sample).comm).cast(),
            COMM_LEN as u32,
        );
        let (kernel_len, kernel_flags) = if in_kernel {
            read_stack(ctx, (*sample).kernel_stack.as_mut_ptr(), false)
        } else {
            (0, 0)
        };
        let tgid = (pid_tgid >> 32) as u32;
        // The user frames follow the kernel ones at once (the record's
        // compact layout, `hostprof_common::Sample`): only the frames a stack
        // has go to the ring. Masked for the verifier: at most
        // MAX_STACK_DEPTH kernel frames, then MAX_USER_STACK_DEPTH user
        // ones end exactly at the end of the `Sample`.
        let user = (*sample)
            .kernel_stack
            .as_mut_ptr()
            .add(kernel_len as usize & KERNEL_FRAMES_MASK);
        let dwarf = read_volatile(&UNWIND_MODE) == UNWIND_DWARF;
        let slot = if kind == SAMPLE_KIND_CPU {
            SLOT_CPU
        } else {
            SLOT_OFF_CPU
        };
        // Runtime frames: the unwinder's (Java) now, CPython's after it.
        (*sample).runtime.len = 0;
        (*sample).runtime.reason = hostprof_common::python::reason::NONE;
        let tables = if dwarf {
            K::unwind_user(slot, tgid, user, &raw mut (*sample).runtime)
        } else {
            None
        };
        let (user_len, user_flags) = match tables {
            Some(unwound) => unwound,
            None => {
                let (len, flags) = read_stack(ctx, user, true);
                // Kernel threads have no user stack: nothing to load.
                if dwarf && len > 0 {
                    bump(Counter::UnwindUnknownProcess);
                    let why = unwind::reason::UNKNOWN_PROCESS << SAMPLE_UNWIND_SHIFT;
                    (len, flags | why)
                } else {
                    (len, flags)
                }
            }
        };
        // Interpreter frames: added after this by CPython's walk, a program
        // the callers jump to (`python::jump`).
        (*sample).kernel_stack_len = kernel_len;
        (*sample).user_stack_len = user_len;
        // The thread's trace context: CPU, off-CPU and early-copy records
        // alike are filled here.
        let started = trace::clock();
        let trace = trace::read_context::<K>(tgid, sample);
        // A Go goroutine's pprof labels, in the same room, when the
        // thread has no OpenTelemetry context (a cgo program's C library
        // publishing one wins: its record is the richer).
        let trace = if trace == 0
            && K::RUNTIMES
            && read_volatile(&GO_LABELS) != 0
            && present(tgid, hostprof_common::present::GO)
        {
            golang::read_labels::<K>(
                slot,
                tgid,
                &raw mut (*sample).trace,
                (&raw mut (*sample).attrs).cast(),
            )
        } else {
            trace
        };
        trace::timed(started, trace != 0, true);
        (*sample).flags = kernel_flags | user_flags | trace;
    }
}

/// A value of the current task's user memory.
///
/// Zeroed first: with an uninitialized buffer (as in
/// `helpers::bpf_probe_read_user`), LLVM may let a failed read's value be
/// whatever its stack slot held before. In the Python walk it merged two
/// reads' failure checks into one and left the `ctx` pointer in a failed
/// read's place; Linux 6.1's verifier, which cannot tell that the merged
/// check fails whenever the first read did, followed that pointer and
/// rejected the program ("bitwise operator &= on pointer prohibited").
#[inline(always)]
fn read_user<T: Default>(address: u64) -> Option<T> {
    let mut value = T::default();
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            (&mut value as *mut T).cast(),
            size_of::<T>() as u32,
            address as *const c_void,
        )
    };
    (read == 0).then_some(value)
}

/// Copies the used part of a filled `sample` to the ring (compact layout:
/// header, kernel frames, user frames; with runtime frames, every native
/// slot and then only the runtime frames it has), batching wakeups: the
/// reader also drains on a timer, so a quiet ring never strands samples.
/// A record of a few hundred bytes instead of a fixed 2 KiB: less to copy
/// here, to read there, and the ring holds more samples.
#[inline(always)]
fn output(sample: *mut Sample) {
    let (kernel, user, flags, runtime) = unsafe {
        (
            (*sample).kernel_stack_len as usize,
            (*sample).user_stack_len as usize,
            (*sample).flags,
            (*sample).runtime.len as usize,
        )
    };
    let frames = (kernel & KERNEL_FRAMES_MASK) + (user & (2 * MAX_USER_STACK_DEPTH - 1));
    let mut len = SAMPLE_HEADER_BYTES + frames * size_of::<u64>();
    if len > RUNTIME_FRAMES_AT {
        len = RUNTIME_FRAMES_AT;
    }
    // Runtime frames sit after the native slots, at a fixed place.
    if runtime != 0 {
        let runtime = if runtime > runtime::MAX_FRAMES {
            runtime::MAX_FRAMES
        } else {
            runtime
        };
        len = RUNTIME_FRAMES_AT + runtime * size_of::<runtime::Frame>();
    }
    if len > SAMPLE_TRACE_AT {
        len = SAMPLE_TRACE_AT;
    }
    // The thread's trace context, only in the records that have one.
    let started = trace::clock();
    let len = trace::append_link(sample, len, flags);
    trace::timed(started, flags & SAMPLE_FLAG_TRACE != 0, false);
    if len > size_of::<Sample>() {
        return;
    }
    // SAFETY: `sample` is a whole `Sample` (a map value) and len fits in it.
    let bytes = unsafe { core::slice::from_raw_parts(sample.cast::<u8>(), len) };
    match SAMPLES.output::<[u8]>(bytes, wakeup_flags(flags)) {
        Ok(()) => bump(Counter::Submitted),
        Err(_) => bump(Counter::RingFull),
    }
}

/// Where a record's runtime frames start.
const RUNTIME_FRAMES_AT: usize =
    core::mem::offset_of!(Sample, runtime) + core::mem::offset_of!(runtime::Stack, frames);

/// The ring's wakeup flag for a sample with these `flags`.
#[inline(always)]
fn wakeup_flags(flags: u32) -> u64 {
    // A selected process the unwinder does not know yet (just started or
    // exec'd), or a walk that stopped at a function not loaded yet: wake
    // the agent now, so its tables load within a few
    // samples rather than a drain interval. Host-wide, where unknown
    // processes are many, the usual batching stays.
    let why = (flags >> SAMPLE_UNWIND_SHIFT) & 0xff;
    let filtering = unsafe { read_volatile(&FILTER_BY_TGID) } != 0;
    // A function not loaded yet, host-wide too: each is a round trip to
    // the agent before stacks through it are whole, and there are only a
    // few dozen per process, once.
    let urgent = (filtering
        && (why == unwind::reason::UNKNOWN_PROCESS || why == unwind::reason::NO_MAPPING))
        || why == unwind::reason::NOT_LOADED;
    let wakeup = if urgent || SAMPLES.query(BPF_RB_AVAIL_DATA as u64) >= RING_WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    wakeup as u64
}

/// Copies the user registers and the top `bytes` of the user stack into
/// a stack sample (`--stack-copy`), or as much of it as is mapped.
#[inline(always)]
unsafe fn copy_stack<K: Kernel>(dst: *mut StackSample, bytes: u32) {
    unsafe {
        (*dst).regs_valid = 0;
        (*dst).stack_len = 0;
        let Some(regs) = read_user_regs::<K>() else {
            return;
        };
        let sp = regs[1];
        (*dst).regs = regs;
        (*dst).regs_valid = 1;
        // Near the top of the stack the whole read faults: then try up to
        // the end of sp's page and 3, 2, 1 or 0 pages past it.
        let to_page_end = 4096 - (sp & 4095) as u32;
        let mut len = bytes;
        for attempt in 0..5u32 {
            if attempt > 0 {
                let fit = to_page_end + (4 - attempt) * 4096;
                if fit >= len {
                    continue;
                }
                len = fit;
            }
            if len == 0 || len > MAX_STACK_COPY as u32 {
                return;
            }
            let read = aya_ebpf::helpers::generated::bpf_probe_read_user(
                (*dst).stack.as_mut_ptr().cast(),
                len,
                sp as *const c_void,
            );
            if read == 0 {
                (*dst).stack_len = len;
                return;
            }
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
