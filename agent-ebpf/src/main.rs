//! hostprof's eBPF side: a perf_event program that samples every CPU.
//!
//! Per sample it records who ran (tgid, tid, comm), where (cpu), when (ktime),
//! and both stacks, straight into a ring-buffer reservation: no stack-id hash
//! map, so nothing is lost to hash collisions and each sample keeps its own
//! timestamp. Every way a sample can be skipped, lost or damaged bumps a
//! per-CPU counter (see `agent_ebpf::Counter`).
//!
//! This binary only exists for the BPF target; on the host the crate is just
//! its library (the shared contract), so the host build has nothing to do here.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod sampler {
    use core::{ffi::c_void, mem::size_of, ptr::read_volatile};

    use agent_ebpf::{
        COMM_LEN, Counter, DEFAULT_RING_BYTES, DEFAULT_UNWIND_CHUNKS, MAX_FILTER_TGIDS,
        MAX_OFF_CPU_THREADS, MAX_STACK_COPY, MAX_STACK_DEPTH, MAX_UNWIND_PROCESSES,
        MAX_USER_STACK_DEPTH, RING_WAKEUP_BYTES, RowChunk, SAMPLE_FLAG_KERNEL_ERROR,
        SAMPLE_FLAG_KERNEL_TRUNCATED, SAMPLE_FLAG_USER_ERROR, SAMPLE_FLAG_USER_TABLES,
        SAMPLE_FLAG_USER_TRUNCATED, SAMPLE_KIND_CPU, SAMPLE_KIND_OFF_CPU, SAMPLE_UNWIND_SHIFT,
        Sample, StackSample, UNWIND_DWARF, UnwindState,
        unwind::{
            self, Arch, Lookup, ProcessMappings, ROW_CHUNK, Regs, Search, Sorted, Step, UnwindRow,
        },
    };
    use aya_ebpf::{
        EbpfContext,
        bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
        helpers::{
            bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
            bpf_probe_read_user,
            generated::{
                bpf_get_current_task_btf, bpf_get_prandom_u32, bpf_get_smp_processor_id,
                bpf_get_stack, bpf_ktime_get_ns, bpf_loop, bpf_task_pt_regs,
            },
        },
        macros::{map, perf_event, raw_tracepoint},
        maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
        programs::{PerfEventContext, RawTracePointContext},
    };

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_FILTER_BY_TGID`).
    #[unsafe(no_mangle)]
    static FILTER_BY_TGID: u8 = 0;

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_TASK_TGID_OFFSET`).
    #[unsafe(no_mangle)]
    static TASK_TGID_OFFSET: u32 = 0;

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_OFF_CPU_THRESHOLD_NS`).
    #[unsafe(no_mangle)]
    static OFF_CPU_THRESHOLD_NS: u64 = 0;

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_OFF_CPU_SAMPLE_PPM`).
    #[unsafe(no_mangle)]
    static OFF_CPU_SAMPLE_PPM: u32 = 1_000_000;

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_TASK_STATE_OFFSET`).
    #[unsafe(no_mangle)]
    static TASK_STATE_OFFSET: u32 = 0;

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_TASK_PID_OFFSET`).
    #[unsafe(no_mangle)]
    static TASK_PID_OFFSET: u32 = 0;

    #[map(name = "OFF_CPU_START")]
    static OFF_CPU_START: LruHashMap<u32, Sample> =
        LruHashMap::with_max_entries(MAX_OFF_CPU_THREADS, 0);

    #[map(name = "OFF_CPU_SCRATCH")]
    static OFF_CPU_SCRATCH: PerCpuArray<Sample> = PerCpuArray::with_max_entries(1, 0);

    #[map(name = "SAMPLES")]
    static SAMPLES: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

    #[map(name = "COUNTERS")]
    static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

    #[map(name = "FILTER_TGIDS")]
    static FILTER_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_FILTER_TGIDS, 0);

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_UNWIND_MODE`).
    #[unsafe(no_mangle)]
    static UNWIND_MODE: u8 = 0;

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_STACK_COPY_BYTES`).
    #[unsafe(no_mangle)]
    static STACK_COPY_BYTES: u32 = 0;

    #[map(name = "UNWIND_ROWS")]
    static UNWIND_ROWS: Array<RowChunk> = Array::with_max_entries(DEFAULT_UNWIND_CHUNKS, 0);

    #[map(name = "PROCESS_MAPPINGS")]
    static PROCESS_MAPPINGS: HashMap<u32, ProcessMappings> =
        HashMap::with_max_entries(MAX_UNWIND_PROCESSES, 0);

    #[map(name = "UNWIND_STATE")]
    static UNWIND_STATE: PerCpuArray<UnwindState> = PerCpuArray::with_max_entries(2, 0);

    const STACK_BYTES: u32 = (MAX_STACK_DEPTH * size_of::<u64>()) as u32;
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

    /// `UnwindState::reason` while the unwind is still going.
    const RUNNING: u32 = u32::MAX;

    /// The unwinder's view of the current process: user memory and the
    /// tables the agent loaded.
    struct KernelProcess {
        mappings: *const ProcessMappings,
        tgid: u32,
    }

    impl unwind::Process for KernelProcess {
        #[inline(always)]
        fn read_u64(&mut self, address: u64) -> Option<u64> {
            unsafe { bpf_probe_read_user(address as *const u64) }.ok()
        }

        #[inline(always)]
        fn lookup(&mut self, pc: u64) -> Lookup {
            // SAFETY: a value of PROCESS_MAPPINGS, valid during this program run.
            let mappings = unsafe { &*self.mappings };
            let tgid = self.tgid;
            let search = |what: Sorted, len: u32, target: u64| {
                let mut ctx = SearchCtx {
                    search: Search::new(len, target),
                    tgid,
                    table_start: match what {
                        Sorted::Mappings => SEARCH_MAPPINGS,
                        Sorted::Rows { start } => start,
                    },
                };
                unsafe {
                    bpf_loop(
                        unwind::MAX_SEARCH_STEPS,
                        search_probe as *mut c_void,
                        (&mut ctx as *mut SearchCtx).cast(),
                        0,
                    )
                };
                ctx.search.result()
            };
            unwind::lookup_in(mappings, pc, search, row)
        }
    }

    /// Row `index` of the rows map.
    #[inline(always)]
    fn row(index: u32) -> Option<UnwindRow> {
        let chunk = UNWIND_ROWS.get(index / ROW_CHUNK as u32)?;
        chunk.0.get((index % ROW_CHUNK as u32) as usize).copied()
    }

    /// `SearchCtx::table_start` of a search over the process's mappings.
    const SEARCH_MAPPINGS: u32 = u32::MAX;

    /// A binary search run by `bpf_loop`, one probe per call.
    #[repr(C)]
    struct SearchCtx {
        search: Search,
        tgid: u32,
        /// First row of the table searched, or SEARCH_MAPPINGS.
        table_start: u32,
    }

    extern "C" fn search_probe(_index: u64, ctx: *mut c_void) -> i64 {
        // SAFETY: bpf_loop passes the SearchCtx on the caller's stack.
        let ctx = unsafe { &mut *(ctx as *mut SearchCtx) };
        let (tgid, start) = (ctx.tgid, ctx.table_start);
        let more = ctx.search.probe(|index| {
            if start == SEARCH_MAPPINGS {
                let mappings = unsafe { PROCESS_MAPPINGS.get(&tgid) }?;
                let index = index as usize & (unwind::MAX_PROCESS_MAPPINGS - 1);
                Some(mappings.mappings[index].start)
            } else {
                row(start.wrapping_add(index)).map(|row| row.pc as u64)
            }
        });
        if more { 0 } else { 1 }
    }

    /// One frame per call, from `bpf_loop`; `ctx` points at the
    /// UNWIND_STATE slot. Returns 1 to stop.
    extern "C" fn unwind_frame(_index: u64, ctx: *mut c_void) -> i64 {
        let slot = unsafe { *(ctx as *const u32) };
        let Some(state) = UNWIND_STATE.get_ptr_mut(slot) else {
            return 1;
        };
        // SAFETY: a per-CPU map value; nothing else runs on this CPU's slot.
        let state = unsafe { &mut *state };
        let Some(mappings) = (unsafe { PROCESS_MAPPINGS.get(&state.tgid) }) else {
            state.reason = unwind::reason::UNKNOWN_PROCESS;
            return 1;
        };
        let mut process = KernelProcess {
            mappings,
            tgid: state.tgid,
        };
        match unwind::step(ARCH, &mut state.regs, &mut process) {
            Step::Caller => {
                let len = state.len as usize;
                if len >= MAX_USER_STACK_DEPTH {
                    state.reason = unwind::reason::DEPTH_LIMIT;
                    return 1;
                }
                // Masked for the verifier (the depth is a power of two).
                state.frames[len & (MAX_USER_STACK_DEPTH - 1)] = state.regs.pc;
                state.len += 1;
                0
            }
            Step::Stop(reason) => {
                state.reason = reason;
                1
            }
        }
    }

    /// Walks the current task's user stack with the unwind tables into
    /// `dst`; `None` when the process has none loaded (the caller then uses
    /// frame pointers).
    #[inline(always)]
    fn unwind_user(slot: u32, tgid: u32, dst: *mut u64) -> Option<(u32, u32)> {
        unsafe { PROCESS_MAPPINGS.get(&tgid) }?;
        let state = unsafe { &mut *UNWIND_STATE.get_ptr_mut(slot)? };
        // The user registers, saved on kernel entry: right whether the
        // sample hit user or kernel code.
        let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
        let read = |offset: usize| unsafe { bpf_probe_read_kernel(regs.add(offset).cast::<u64>()) };
        let (Ok(pc), Ok(sp), Ok(fp), Ok(lr)) = (
            read(PT_REGS[0]),
            read(PT_REGS[1]),
            read(PT_REGS[2]),
            read(PT_REGS[3]),
        ) else {
            return None;
        };
        state.regs = Regs::interrupted(pc, sp, fp, lr);
        state.tgid = tgid;
        state.frames[0] = pc;
        state.len = 1;
        state.reason = RUNNING;
        let mut ctx_slot = slot;
        unsafe {
            bpf_loop(
                MAX_USER_STACK_DEPTH as u32,
                unwind_frame as *mut c_void,
                (&mut ctx_slot as *mut u32).cast(),
                0,
            )
        };
        if state.reason == RUNNING {
            state.reason = unwind::reason::DEPTH_LIMIT;
        }
        let reason = state.reason;
        // SAFETY: both hold MAX_USER_STACK_DEPTH frames.
        unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                dst.cast(),
                USER_STACK_BYTES,
                state.frames.as_ptr().cast(),
            )
        };
        bump(Counter::UnwindTables);
        bump(Counter::for_unwind_reason(reason));
        let mut flags = SAMPLE_FLAG_USER_TABLES | ((reason & 0xff) << SAMPLE_UNWIND_SHIFT);
        if reason == unwind::reason::DEPTH_LIMIT {
            bump(Counter::Truncated);
            flags |= SAMPLE_FLAG_USER_TRUNCATED;
        }
        Some((state.len, flags))
    }

    #[perf_event]
    pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
        try_sample_cpu(&ctx);
        0
    }

    #[inline(always)]
    fn bump(counter: Counter) {
        if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
            // Per-CPU slot and perf_event programs do not nest on one CPU: a
            // plain increment is race-free.
            unsafe { *slot += 1 };
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

    /// True when the process is to be profiled (no filter, or in the filter).
    #[inline(always)]
    fn wanted(tgid: u32) -> bool {
        // Volatile: the loader rewrites this constant, the compiler must not fold it.
        let filtering = unsafe { read_volatile(&FILTER_BY_TGID) } != 0;
        !filtering || unsafe { FILTER_TGIDS.get(&tgid) }.is_some()
    }

    /// Fills `sample` with the current thread and both its stacks.
    #[inline(always)]
    unsafe fn fill<C: EbpfContext>(
        ctx: &C,
        sample: *mut Sample,
        pid_tgid: u64,
        kind: u32,
        ktime_ns: u64,
        state: u32,
    ) {
        unsafe {
            (*sample).tgid = (pid_tgid >> 32) as u32;
            (*sample).tid = pid_tgid as u32;
            (*sample).cpu = bpf_get_smp_processor_id();
            (*sample).ktime_ns = ktime_ns;
            (*sample).off_cpu_ns = 0;
            (*sample).kind = kind;
            (*sample).thread_state = state;
            (*sample).comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
            let (kernel_len, kernel_flags) =
                read_stack(ctx, (*sample).kernel_stack.as_mut_ptr(), false);
            let tgid = (pid_tgid >> 32) as u32;
            let user = (*sample).user_stack.as_mut_ptr();
            let dwarf = read_volatile(&UNWIND_MODE) == UNWIND_DWARF;
            // One scratch slot per program: the sampler and the off-CPU
            // tracepoint never share one.
            let slot = if kind == SAMPLE_KIND_CPU { 0 } else { 1 };
            let tables = if dwarf {
                unwind_user(slot, tgid, user)
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
            (*sample).kernel_stack_len = kernel_len;
            (*sample).user_stack_len = user_len;
            (*sample).flags = kernel_flags | user_flags;
        }
    }

    /// Submits a reserved ring entry, batching wakeups: the reader also
    /// drains on a timer, so a quiet ring never strands samples.
    #[inline(always)]
    fn submit(mut entry: aya_ebpf::maps::ring_buf::RingBufEntry<Sample>) {
        let flags = unsafe { (*entry.as_mut_ptr()).flags };
        entry.submit(wakeup_flags(flags));
        bump(Counter::Submitted);
    }

    /// The ring's wakeup flag for a sample with these `flags`.
    #[inline(always)]
    fn wakeup_flags(flags: u32) -> u64 {
        // A selected process the unwinder does not know yet (just started or
        // exec'd): wake the agent now, so its tables load within a few
        // samples rather than a drain interval. Host-wide, where unknown
        // processes are many, the usual batching stays.
        let why = (flags >> SAMPLE_UNWIND_SHIFT) & 0xff;
        let filtering = unsafe { read_volatile(&FILTER_BY_TGID) } != 0;
        let urgent = filtering
            && (why == unwind::reason::UNKNOWN_PROCESS || why == unwind::reason::NO_MAPPING);
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
    unsafe fn copy_stack(dst: *mut StackSample, bytes: u32) {
        unsafe {
            (*dst).regs_valid = 0;
            (*dst).stack_len = 0;
            let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8;
            let read = |offset: usize| bpf_probe_read_kernel(regs.add(offset).cast::<u64>());
            let (Ok(pc), Ok(sp), Ok(fp), Ok(lr)) = (
                read(PT_REGS[0]),
                read(PT_REGS[1]),
                read(PT_REGS[2]),
                read(PT_REGS[3]),
            ) else {
                return;
            };
            (*dst).regs = [pc, sp, fp, lr];
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

    fn try_sample_cpu(ctx: &PerfEventContext) {
        bump(Counter::Fired);
        let pid_tgid = bpf_get_current_pid_tgid();
        // The per-CPU idle task (swapper) is the only task with pid 0.
        if pid_tgid as u32 == 0 {
            bump(Counter::Idle);
            return;
        }
        if !wanted((pid_tgid >> 32) as u32) {
            bump(Counter::Filtered);
            return;
        }
        let copy = unsafe { read_volatile(&STACK_COPY_BYTES) };
        if copy != 0 {
            let Some(mut entry) = SAMPLES.reserve::<StackSample>(0) else {
                bump(Counter::RingFull);
                return;
            };
            let dst = entry.as_mut_ptr();
            let flags = unsafe {
                fill(
                    ctx,
                    &raw mut (*dst).sample,
                    pid_tgid,
                    SAMPLE_KIND_CPU,
                    bpf_ktime_get_ns(),
                    0,
                );
                copy_stack(dst, copy);
                (*dst).sample.flags
            };
            entry.submit(wakeup_flags(flags));
            bump(Counter::Submitted);
            return;
        }
        let Some(mut entry) = SAMPLES.reserve::<Sample>(0) else {
            bump(Counter::RingFull);
            return;
        };
        unsafe {
            fill(
                ctx,
                entry.as_mut_ptr(),
                pid_tgid,
                SAMPLE_KIND_CPU,
                bpf_ktime_get_ns(),
                0,
            )
        };
        submit(entry);
    }

    /// `TASK_DEAD`: the thread is exiting and will not come back.
    const TASK_DEAD: u32 = 0x80;

    /// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, …)`
    /// runs as `prev`, just before it leaves the CPU.
    #[raw_tracepoint(tracepoint = "sched_switch")]
    pub fn off_cpu_switch(ctx: RawTracePointContext) -> i32 {
        let now = unsafe { bpf_ktime_get_ns() };
        off_cpu_back(&ctx, now);
        off_cpu_leave(&ctx, now);
        0
    }

    /// `next` comes back: emit its record if it was away long enough.
    #[inline(always)]
    fn off_cpu_back(ctx: &RawTracePointContext, now: u64) {
        let next: *const u8 = ctx.arg(2);
        let offset = unsafe { read_volatile(&TASK_PID_OFFSET) } as usize;
        if offset == 0 {
            return;
        }
        let Ok(tid) = (unsafe { bpf_probe_read_kernel(next.add(offset).cast::<u32>()) }) else {
            return;
        };
        let Some(record) = OFF_CPU_START.get_ptr(&tid) else {
            return;
        };
        let away = now.saturating_sub(unsafe { (*record).ktime_ns });
        if away >= unsafe { read_volatile(&OFF_CPU_THRESHOLD_NS) } {
            match SAMPLES.reserve::<Sample>(0) {
                Some(mut entry) => {
                    let dst = entry.as_mut_ptr();
                    // SAFETY: both are whole `Sample`s: a map value and a ring entry.
                    let copied = unsafe {
                        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                            dst.cast(),
                            size_of::<Sample>() as u32,
                            record.cast(),
                        )
                    };
                    if copied == 0 {
                        unsafe { (*dst).off_cpu_ns = away };
                        bump(Counter::OffCpuEmitted);
                        submit(entry);
                    } else {
                        entry.discard(0);
                    }
                }
                None => bump(Counter::RingFull),
            }
        }
        let _ = OFF_CPU_START.remove(&tid);
    }

    /// `prev` (the current thread) leaves: record where and why.
    #[inline(always)]
    fn off_cpu_leave(ctx: &RawTracePointContext, now: u64) {
        let pid_tgid = bpf_get_current_pid_tgid();
        let tid = pid_tgid as u32;
        if tid == 0 || !wanted((pid_tgid >> 32) as u32) {
            return;
        }
        // Probabilistic tracking bounds the cost on hosts that switch a lot.
        let ppm = unsafe { read_volatile(&OFF_CPU_SAMPLE_PPM) };
        if ppm < 1_000_000 && unsafe { bpf_get_prandom_u32() } % 1_000_000 >= ppm {
            return;
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
            return;
        }
        let Some(scratch) = OFF_CPU_SCRATCH.get_ptr_mut(0) else {
            return;
        };
        unsafe { fill(ctx, scratch, pid_tgid, SAMPLE_KIND_OFF_CPU, now, state) };
        if OFF_CPU_START.insert(&tid, unsafe { &*scratch }, 0).is_err() {
            bump(Counter::OffCpuMapFull);
        }
    }

    /// `sched_process_exec`: the process replaced its image, its mappings
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
        let Ok(child_tgid) = (unsafe { bpf_probe_read_kernel(child.add(offset).cast::<u32>()) })
        else {
            return 0;
        };
        // A new thread shares its parent's tgid: nothing to add.
        if child_tgid != parent_tgid && FILTER_TGIDS.insert(&child_tgid, &1, 0).is_err() {
            bump(Counter::FilterFull);
        }
        0
    }

    #[cfg(not(test))]
    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    // Built for the host only by `cargo clippy --workspace`; the real binary is
    // the bpfel-unknown-none object embedded in the agent.
}
