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
// `#[inline(always)]` on closures (the eBPF object is built with nightly).
#![cfg_attr(target_arch = "bpf", feature(stmt_expr_attributes))]

#[cfg(target_arch = "bpf")]
mod sampler {
    use core::{
        ffi::c_void,
        mem::size_of,
        ptr::{read_volatile, write_volatile},
    };

    use agent_ebpf::{
        COMM_LEN, Counter, DEFAULT_RING_BYTES, DEFAULT_THREAD_SIZE, DEFAULT_UNWIND_CHUNKS,
        MAX_FILTER_TGIDS, MAX_OFF_CPU_THREADS, MAX_STACK_COPY, MAX_STACK_DEPTH,
        MAX_UNWIND_PROCESSES, MAX_USER_STACK_DEPTH, RING_WAKEUP_BYTES, RowChunk,
        SAMPLE_FLAG_KERNEL_ERROR, SAMPLE_FLAG_KERNEL_TRUNCATED, SAMPLE_FLAG_USER_ERROR,
        SAMPLE_FLAG_USER_TABLES, SAMPLE_FLAG_USER_TRUNCATED, SAMPLE_KIND_CPU, SAMPLE_KIND_OFF_CPU,
        SAMPLE_UNWIND_SHIFT, Sample, StackSample, UNWIND_DWARF, UnwindState,
        unwind::{
            self, Arch, Lookup, ProcessMappings, ROW_CHUNK, Regs, Search, Sorted, Step, UnwindRow,
        },
    };
    use aya_ebpf::{
        EbpfContext,
        bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
        helpers::{
            bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
            generated::{
                bpf_get_current_task, bpf_get_current_task_btf, bpf_get_prandom_u32,
                bpf_get_smp_processor_id, bpf_get_stack, bpf_ktime_get_ns, bpf_loop,
                bpf_task_pt_regs,
            },
        },
        macros::{map, perf_event, raw_tracepoint},
        maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
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

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_TASK_STACK_OFFSET`).
    #[unsafe(no_mangle)]
    static TASK_STACK_OFFSET: u32 = 0;

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_PT_REGS_SIZE`).
    #[unsafe(no_mangle)]
    static PT_REGS_SIZE: u32 = 0;

    /// Set by the agent at load time (`agent_ebpf::GLOBAL_THREAD_SIZE`).
    #[unsafe(no_mangle)]
    static THREAD_SIZE: u32 = DEFAULT_THREAD_SIZE;

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

    /// What differs between the kernels the sampler runs on: how it finds
    /// the user registers and how it loops. Each program exists in two
    /// variants, `Modern` (Linux 5.17+: `bpf_loop`, `bpf_task_pt_regs`) and
    /// `Legacy` (5.10+: loops bounded in the program itself, registers read
    /// from the top of the task's kernel stack); the agent probes the kernel
    /// and loads one. The verifier of a kernel without `bpf_loop` rejects a
    /// program that merely mentions a loop callback, so the variants must be
    /// separate programs.
    trait Kernel {
        /// The current task's user registers (`struct pt_regs`, saved on
        /// kernel entry: right whether the sample hit user or kernel code),
        /// or null.
        fn user_regs() -> *const u8;
        /// The current task's user stack, unwound with the tables into `dst`
        /// (see [`unwind_user`]).
        fn unwind_user(slot: u32, tgid: u32, dst: *mut u64) -> Option<(u32, u32)>;
        /// The last element `<= target` of a sorted run: the process's
        /// mappings or a table's rows.
        fn search(
            process: &KernelProcess<Self>,
            what: Sorted,
            len: u32,
            target: u64,
        ) -> Option<u32>
        where
            Self: Sized;
    }

    /// Linux 5.17 and later.
    struct Modern;

    impl Kernel for Modern {
        #[inline(always)]
        fn user_regs() -> *const u8 {
            unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8 }
        }

        /// Unwinds right here, one `bpf_loop` call per frame.
        #[inline(always)]
        fn unwind_user(slot: u32, tgid: u32, dst: *mut u64) -> Option<(u32, u32)> {
            unsafe { PROCESS_MAPPINGS.get(&tgid) }?;
            let state = unsafe { &mut *UNWIND_STATE.get_ptr_mut(slot)? };
            start_unwind::<Modern>(state, tgid)?;
            let mut ctx_slot = slot;
            unsafe {
                bpf_loop(
                    MAX_USER_STACK_DEPTH as u32,
                    unwind_frame as *mut c_void,
                    (&mut ctx_slot as *mut u32).cast(),
                    0,
                )
            };
            Some(finish_unwind(state, dst))
        }

        #[inline(always)]
        fn search(
            process: &KernelProcess<Self>,
            what: Sorted,
            len: u32,
            target: u64,
        ) -> Option<u32> {
            let mut ctx = SearchCtx {
                search: Search::new(len, target),
                tgid: process.tgid,
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
        }
    }

    /// Linux 5.10 to 5.16.
    struct Legacy;

    /// Probes of a legacy search over a process's mappings: enough for
    /// `MAX_PROCESS_MAPPINGS` (64) of them.
    const LEGACY_MAPPING_PROBES: u32 = 7;
    const _: () = assert!(1 << LEGACY_MAPPING_PROBES > unwind::MAX_PROCESS_MAPPINGS);
    /// Probes of a legacy search over a table's rows: tables of up to 4 M rows
    /// (64 MiB); a longer table's addresses past that count as not covered.
    /// Fewer probes than `bpf_loop`'s 32 keep the verifier's work in bounds.
    const LEGACY_ROW_PROBES: u32 = 22;

    impl Kernel for Legacy {
        #[inline(always)]
        fn user_regs() -> *const u8 {
            let task = unsafe { bpf_get_current_task() } as *const u8;
            let offset = unsafe { read_volatile(&TASK_STACK_OFFSET) } as usize;
            let size = unsafe { read_volatile(&PT_REGS_SIZE) } as u64;
            let thread_size = unsafe { read_volatile(&THREAD_SIZE) } as u64;
            if offset == 0 || size == 0 || task.is_null() {
                return core::ptr::null();
            }
            match unsafe { bpf_probe_read_kernel(task.add(offset).cast::<u64>()) } {
                // task_pt_regs(): the registers sit at the very top of the stack.
                Ok(stack) if stack != 0 => (stack + thread_size - size) as *const u8,
                _ => core::ptr::null(),
            }
        }

        /// Hands over the unwind that [`legacy_start`] and the tail calls
        /// of [`legacy_continue`] did before this program run reached here.
        #[inline(always)]
        fn unwind_user(slot: u32, tgid: u32, dst: *mut u64) -> Option<(u32, u32)> {
            let state = unsafe { &mut *UNWIND_STATE.get_ptr_mut(slot)? };
            if state.reason == IDLE || state.tgid != tgid {
                return None;
            }
            let unwound = finish_unwind(state, dst);
            state.reason = IDLE;
            Some(unwound)
        }

        /// Branch-free probes (see `Search::probe_branchless`); rows are
        /// read with `bpf_probe_read_kernel` from the rows map's flat memory,
        /// because a map lookup per probe is a branch (its NULL check) too.
        #[inline(always)]
        fn search(
            process: &KernelProcess<Self>,
            what: Sorted,
            len: u32,
            target: u64,
        ) -> Option<u32> {
            match what {
                Sorted::Mappings => {
                    let key = |index: u32| {
                        let index = index as usize & (unwind::MAX_PROCESS_MAPPINGS - 1);
                        Some(process.mappings.mappings[index].start)
                    };
                    unwind::search_last_le_branchless(len, target, LEGACY_MAPPING_PROBES, key)
                }
                Sorted::Rows { start } => {
                    let base = process.rows_base;
                    if base == 0 {
                        return None;
                    }
                    let key = |index: u32| {
                        let at = base
                            + u64::from(start.wrapping_add(index)) * size_of::<UnwindRow>() as u64;
                        // A failed read (past the map's end, only for the probes after
                        // the search is over) leaves "greater than any target".
                        let mut pc = u32::MAX;
                        unsafe {
                            aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                                (&mut pc as *mut u32).cast(),
                                size_of::<u32>() as u32,
                                at as *const c_void,
                            )
                        };
                        Some(u64::from(pc))
                    };
                    unwind::search_last_le_branchless(len, target, LEGACY_ROW_PROBES, key)
                }
            }
        }
    }

    /// The current task's user pc, sp, frame pointer and link register.
    #[inline(always)]
    fn read_user_regs<K: Kernel>() -> Option<[u64; 4]> {
        let regs = K::user_regs();
        if regs.is_null() {
            return None;
        }
        // One read into a zeroed array: nothing undefined for old verifiers
        // to trip on (see `unwind::frame_pointer_step`).
        let mut values = [0u64; 4];
        for (value, offset) in values.iter_mut().zip(PT_REGS) {
            let read = unsafe {
                aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                    (value as *mut u64).cast(),
                    size_of::<u64>() as u32,
                    regs.add(offset).cast(),
                )
            };
            if read != 0 {
                return None;
            }
        }
        Some(values)
    }

    /// The unwinder's view of the current process: user memory and the
    /// tables the agent loaded.
    struct KernelProcess<'a, K> {
        mappings: &'a ProcessMappings,
        tgid: u32,
        /// Legacy only: the address of the rows map's first row, as a plain
        /// number (see [`rows_base`]); 0 when unknown.
        rows_base: u64,
        kernel: core::marker::PhantomData<K>,
    }

    /// The address of the rows map's first row, as a number the verifier
    /// does not track as a pointer: an array map's values are one flat
    /// block, so row `i` is at `base + 16 * i`, which legacy searches read
    /// with `bpf_probe_read_kernel` (a pointer into the map could not be
    /// moved that far).
    #[inline(always)]
    fn rows_base() -> u64 {
        let Some(first) = UNWIND_ROWS.get_ptr(0) else {
            return 0;
        };
        let pointer = first as u64;
        let mut base = 0u64;
        unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                (&mut base as *mut u64).cast(),
                size_of::<u64>() as u32,
                (&pointer as *const u64).cast(),
            )
        };
        base
    }

    impl<K: Kernel> unwind::Process for KernelProcess<'_, K> {
        #[inline(always)]
        fn read_u64(&mut self, address: u64) -> Option<u64> {
            // Zeroed first: a failed read leaves nothing undefined behind.
            let mut value = 0u64;
            let read = unsafe {
                aya_ebpf::helpers::generated::bpf_probe_read_user(
                    (&mut value as *mut u64).cast(),
                    size_of::<u64>() as u32,
                    address as *const c_void,
                )
            };
            (read == 0).then_some(value)
        }

        #[inline(always)]
        fn lookup(&mut self, pc: u64) -> Lookup {
            let this = &*self;
            // Forced inline: a closure called twice is otherwise a BPF
            // subprogram, which old verifiers check less kindly.
            let search = #[inline(always)]
            |what: Sorted, len: u32, target: u64| K::search(this, what, len, target);
            unwind::lookup_in(self.mappings, pc, search, row)
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
        i64::from(frame::<Modern>(state, mappings, 0))
    }

    /// Walks one frame of the unwind in `state`; true when the unwind is over
    /// (`state.reason` says why).
    #[inline(always)]
    fn frame<K: Kernel>(
        state: &mut UnwindState,
        mappings: &ProcessMappings,
        rows_base: u64,
    ) -> bool {
        let mut process = KernelProcess::<K> {
            mappings,
            tgid: unsafe { read_volatile(&state.tgid) },
            rows_base,
            kernel: core::marker::PhantomData,
        };
        // Through memory, not registers, from one frame to the next: what
        // a frame leaves in registers (which rule it took, constants such
        // as `interrupted`) would keep the verifier from seeing that the
        // next frame starts the same way whatever the path, and the paths
        // would multiply frame after frame.
        let mut regs = unsafe { read_volatile(&state.regs) };
        let step = unwind::step(ARCH, &mut regs, &mut process);
        unsafe { write_volatile(&mut state.regs, regs) };
        match step {
            Step::Caller => {
                let len = unsafe { read_volatile(&state.len) } as usize;
                if len >= MAX_USER_STACK_DEPTH {
                    state.reason = unwind::reason::DEPTH_LIMIT;
                    return true;
                }
                // Masked for the verifier (the depth is a power of two).
                state.frames[len & (MAX_USER_STACK_DEPTH - 1)] = regs.pc;
                unsafe { write_volatile(&mut state.len, len as u32 + 1) };
                false
            }
            Step::Stop(reason) => {
                unsafe { write_volatile(&mut state.reason, reason) };
                true
            }
        }
    }

    /// Starts an unwind of the current task in `state`; `None` when its
    /// registers cannot be read.
    #[inline(always)]
    fn start_unwind<K: Kernel>(state: &mut UnwindState, tgid: u32) -> Option<()> {
        let [pc, sp, fp, lr] = read_user_regs::<K>()?;
        state.regs = Regs::interrupted(pc, sp, fp, lr);
        state.tgid = tgid;
        state.frames[0] = pc;
        state.len = 1;
        state.reason = RUNNING;
        Some(())
    }

    /// Copies a finished unwind into `dst`, counts why it stopped; returns
    /// (frames, sample flags).
    #[inline(always)]
    fn finish_unwind(state: &mut UnwindState, dst: *mut u64) -> (u32, u32) {
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
        (state.len, flags)
    }

    /// `UnwindState::reason` of a legacy slot with no unwind waiting to be
    /// handed over (the process has no tables: frame pointers serve).
    const IDLE: u32 = u32::MAX - 1;

    /// The tail-call targets of the legacy sampler
    /// (`agent_ebpf::LEGACY_TAIL_PROGRAMS`): unwinders that walk
    /// [`LEGACY_FRAMES_PER_CALL`] frames and call themselves, and the
    /// programs that then write the record. Tail calls, not a loop, because
    /// the verifiers of those kernels walk every path of a loop: a whole
    /// stack in one program is more than they accept, and so is the record's
    /// code after every way an unwind can end.
    #[map(name = "LEGACY_SAMPLE_TAILS")]
    static LEGACY_SAMPLE_TAILS: ProgramArray = ProgramArray::with_max_entries(2, 0);

    /// The same for the off-CPU tracepoint (a program array serves one
    /// program type).
    #[map(name = "LEGACY_OFFCPU_TAILS")]
    static LEGACY_OFFCPU_TAILS: ProgramArray = ProgramArray::with_max_entries(2, 0);

    /// Frames one legacy unwinder run walks.
    const LEGACY_FRAMES_PER_CALL: usize = 3;
    /// Unwinder runs per stack: the kernel allows 32 tail calls in a row
    /// (33 since 5.16); one starts the unwind and one writes the record.
    const LEGACY_UNWIND_CALLS: u32 = 30;

    /// Tail-call indices in each tails map.
    const TAIL_UNWIND: u32 = agent_ebpf::LEGACY_TAIL_UNWIND;
    const TAIL_EMIT: u32 = agent_ebpf::LEGACY_TAIL_EMIT;

    /// Starts the unwind of the current task in `slot` when its process has
    /// tables, then jumps to the unwinder in `tails`.
    /// Returns when there is nothing to unwind (or the jump failed): the
    /// caller then writes the record itself.
    #[inline(always)]
    fn legacy_start<C: EbpfContext>(ctx: &C, tails: &ProgramArray, slot: u32, tgid: u32) {
        let Some(state) = UNWIND_STATE.get_ptr_mut(slot) else {
            return;
        };
        // SAFETY: a per-CPU map value; nothing else runs on this CPU's slot.
        let state = unsafe { &mut *state };
        state.reason = IDLE;
        state.tail_calls = 0;
        let dwarf = unsafe { read_volatile(&UNWIND_MODE) } == UNWIND_DWARF;
        if !dwarf || unsafe { PROCESS_MAPPINGS.get(&tgid) }.is_none() {
            return;
        }
        if start_unwind::<Legacy>(state, tgid).is_some() {
            unsafe { tails.tail_call(ctx, TAIL_UNWIND) };
        }
    }

    /// Walks the next frames of the unwind in `slot`; jumps to itself while
    /// there are more, then to the program that writes the record. An unwind still going after the last run counts as
    /// cut at the depth limit.
    #[inline(always)]
    fn legacy_continue<C: EbpfContext>(ctx: &C, tails: &ProgramArray, slot: u32) {
        let Some(state) = UNWIND_STATE.get_ptr_mut(slot) else {
            return;
        };
        // SAFETY: as in `legacy_start`.
        let state = unsafe { &mut *state };
        if let Some(mappings) = unsafe { PROCESS_MAPPINGS.get(&state.tgid) } {
            let base = rows_base();
            for _ in 0..LEGACY_FRAMES_PER_CALL {
                let reason = unsafe { read_volatile(&state.reason) };
                if reason != RUNNING || frame::<Legacy>(state, mappings, base) {
                    break;
                }
            }
        } else {
            state.reason = unwind::reason::UNKNOWN_PROCESS;
        }
        if state.reason == RUNNING && state.tail_calls < LEGACY_UNWIND_CALLS {
            state.tail_calls += 1;
            unsafe { tails.tail_call(ctx, TAIL_UNWIND) };
        }
        unsafe { tails.tail_call(ctx, TAIL_EMIT) };
        // Both jumps failed: the record is lost.
        bump(Counter::RingFull);
    }

    #[perf_event]
    pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
        try_sample_cpu::<Modern>(&ctx);
        0
    }

    /// `sample_cpu` for kernels before 5.17 (`agent_ebpf::PROGRAM_SAMPLE_LEGACY`).
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

    /// UNWIND_STATE slots: the sampler and the off-CPU tracepoint never
    /// share one.
    const SLOT_CPU: u32 = 0;
    const SLOT_OFF_CPU: u32 = 1;

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
    unsafe fn fill<K: Kernel, C: EbpfContext>(
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
            let slot = if kind == SAMPLE_KIND_CPU {
                SLOT_CPU
            } else {
                SLOT_OFF_CPU
            };
            let tables = if dwarf {
                K::unwind_user(slot, tgid, user)
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

    /// The current `pid_tgid` when this CPU sample is to be recorded;
    /// counts it either way.
    #[inline(always)]
    fn sample_wanted() -> Option<u64> {
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
    fn try_sample_cpu<K: Kernel>(ctx: &PerfEventContext) {
        if let Some(pid_tgid) = sample_wanted() {
            emit_cpu_sample::<K>(ctx, pid_tgid);
        }
    }

    /// Writes the CPU sample of the current task to the ring.
    #[inline(always)]
    fn emit_cpu_sample<K: Kernel>(ctx: &PerfEventContext, pid_tgid: u64) {
        let copy = unsafe { read_volatile(&STACK_COPY_BYTES) };
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
        let Some(mut entry) = SAMPLES.reserve::<Sample>(0) else {
            bump(Counter::RingFull);
            return;
        };
        unsafe {
            fill::<K, _>(
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
        off_cpu::<Modern>(&ctx)
    }

    #[inline(always)]
    fn off_cpu<K: Kernel>(ctx: &RawTracePointContext) -> i32 {
        let now = unsafe { bpf_ktime_get_ns() };
        off_cpu_back(ctx, now);
        if let Some(state) = off_cpu_leaving(ctx) {
            off_cpu_record::<K>(ctx, now, state);
        }
        0
    }

    /// `off_cpu_switch` for kernels before 5.17
    /// (`agent_ebpf::PROGRAM_OFF_CPU_SWITCH_LEGACY`).
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
        legacy_start(&ctx, &LEGACY_OFFCPU_TAILS, SLOT_OFF_CPU, tgid);
        off_cpu_record::<Legacy>(&ctx, now, state);
        0
    }

    /// The unwinder of `off_cpu_legacy`.
    #[raw_tracepoint(tracepoint = "sched_switch")]
    pub fn off_cpu_legacy_unwind(ctx: RawTracePointContext) -> i32 {
        legacy_continue(&ctx, &LEGACY_OFFCPU_TAILS, SLOT_OFF_CPU);
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

    /// `prev` (the current thread) leaves: its state (`__state`) when it is
    /// to be recorded.
    #[inline(always)]
    fn off_cpu_leaving(ctx: &RawTracePointContext) -> Option<u32> {
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
    fn off_cpu_record<K: Kernel>(ctx: &RawTracePointContext, now: u64, state: u32) {
        let pid_tgid = bpf_get_current_pid_tgid();
        let tid = pid_tgid as u32;
        let Some(scratch) = OFF_CPU_SCRATCH.get_ptr_mut(0) else {
            return;
        };
        unsafe { fill::<K, _>(ctx, scratch, pid_tgid, SAMPLE_KIND_OFF_CPU, now, state) };
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
