//! What differs between kernels: how the user registers are found, and how
//! the unwinder loops and searches.
use super::*;

use super::{legacy::IDLE, unwinder::*};

/// What differs between the kernels the sampler runs on: how it finds
/// the user registers and how it loops. Each program exists in two
/// variants, `Modern` (Linux 5.17+: `bpf_loop`, `bpf_task_pt_regs`) and
/// `Legacy` (5.10+: loops bounded in the program itself, registers read
/// from the top of the task's kernel stack); the agent probes the kernel
/// and loads one. The verifier of a kernel without `bpf_loop` rejects a
/// program that merely mentions a loop callback, so the variants must be
/// separate programs.
pub(super) trait Kernel {
    /// `bpf_loop` is there (a constant: a legacy program must not even
    /// name a loop callback).
    const BPF_LOOP: bool;
    /// The program walks JIT runtimes' frames and reads Go's labels, when
    /// the agent's globals say so too. Without (`Modern<false>`, the lean
    /// program), the verifier has a third of the work: what the agent
    /// loads first outside `hostprof agent`, until a process needs more.
    const RUNTIMES: bool;
    /// The current task's user registers (`struct pt_regs`, saved on
    /// kernel entry: right whether the sample hit user or kernel code),
    /// or null.
    fn user_regs() -> *const u8;
    /// The current task's thread pointer (x86_64 `fsbase`, aarch64
    /// `tpidr_el0`), `offset` bytes into its `task_struct`.
    fn thread_pointer(offset: usize) -> Option<u64>;
    /// Steps the frame at `state.regs`, in the code of the runtime tagged
    /// `runtime`; true when the unwind stops here (`state.reason` set, or,
    /// legacy, the reason that hands the unwind to the runtime's walk).
    fn runtime_step(state: &mut UnwindState, runtime: u8) -> bool;
    /// The current task's user stack, unwound with the tables into `dst`,
    /// its runtime frames into `runtime` (see [`unwind_user`]).
    fn unwind_user(
        slot: u32,
        tgid: u32,
        dst: *mut u64,
        runtime: *mut hostprof_common::runtime::Stack,
    ) -> Option<(u32, u32)>;
    /// The last element `<= target` of a sorted run: the process's
    /// mappings or a table's rows.
    fn search(process: &KernelProcess<Self>, what: Sorted, len: u32, target: u64) -> Option<u32>
    where
        Self: Sized;
}

/// Linux 5.17 and later; `FULL`: with the runtimes' walks and Go's
/// labels ([`Kernel::RUNTIMES`]).
pub(super) struct Modern<const FULL: bool = true>;

impl<const FULL: bool> Kernel for Modern<FULL> {
    const BPF_LOOP: bool = true;
    const RUNTIMES: bool = FULL;

    #[inline(always)]
    fn user_regs() -> *const u8 {
        unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8 }
    }

    /// A plain load through the task's BTF pointer, no helper call: the
    /// offset is a constant of the frozen globals, so the verifier
    /// checks it against `task_struct`'s BTF (a load that faults gives 0).
    #[inline(always)]
    fn thread_pointer(offset: usize) -> Option<u64> {
        let task = unsafe { bpf_get_current_task_btf() } as *const u8;
        Some(unsafe { read_volatile(task.add(offset).cast::<u64>()) })
    }

    /// Right here, in the same `bpf_loop` callback as the native frames
    /// (the verifier checks the callback once).
    #[inline(always)]
    fn runtime_step(state: &mut UnwindState, runtime: u8) -> bool {
        if runtime == hostprof_common::runtime::tag::V8 {
            super::v8::step(state)
        } else {
            super::hotspot::step::<Self>(state)
        }
    }

    /// Unwinds right here, one `bpf_loop` call per frame.
    #[inline(always)]
    fn unwind_user(
        slot: u32,
        tgid: u32,
        dst: *mut u64,
        runtime: *mut hostprof_common::runtime::Stack,
    ) -> Option<(u32, u32)> {
        let mappings = PROCESS_MAPPINGS.get_ptr(&tgid)?;
        let state = unsafe { &mut *UNWIND_STATE.get_ptr_mut(slot)? };
        start_unwind::<Self>(state, tgid)?;
        let mut ctx = FrameCtx {
            slot,
            _pad: 0,
            mappings,
        };
        unsafe {
            bpf_loop(
                MAX_USER_STACK_DEPTH as u32,
                unwind_frame::<Self> as *mut c_void,
                (&mut ctx as *mut FrameCtx).cast(),
                0,
            )
        };
        Some(finish_unwind(state, dst, runtime))
    }

    /// Mappings: the CPU's last mapping at this depth, checked with two reads, else
    /// branch-free probes in line (the process's mappings are one map
    /// value already in hand: a few loads and compares, no helper call).
    /// Rows: the CPU's hint for this address, checked the same way, else
    /// one `bpf_loop` call per probe.
    #[inline(always)]
    fn search(process: &KernelProcess<Self>, what: Sorted, len: u32, target: u64) -> Option<u32> {
        let start = match what {
            Sorted::Mappings => {
                let mappings = process.mappings;
                let depth = process.depth & (MAX_USER_STACK_DEPTH as u32 - 1);
                let hint = MAPPING_HINTS.get_ptr_mut(depth);
                if let Some(at) = hinted(hint, len, target, |index| mapping_start(mappings, index))
                {
                    return Some(at);
                }
                return remember(hint, search_mappings(mappings, len, target));
            }
            Sorted::Rows { start } => start,
        };
        let slot = unwind::hint_slot(start, target);
        let hint = ROW_HINTS.get_ptr_mut(slot);
        if let Some(at) = hinted(hint, len, target, row_pc(start)) {
            return Some(at);
        }
        let search = process.search;
        // SAFETY: the UNWIND_STATE value the walk runs in.
        unsafe { write_volatile(search, Search::new(len, target)) };
        let mut ctx = SearchCtx {
            search,
            table_start: start,
            _pad: 0,
        };
        unsafe {
            bpf_loop(
                unwind::MAX_SEARCH_STEPS,
                search_probe as *mut c_void,
                (&mut ctx as *mut SearchCtx).cast(),
                0,
            )
        };
        remember(hint, unsafe { (*search).result() })
    }
}

/// Linux 5.10 to 5.16.
pub(super) struct Legacy;

/// Probes of a search over a process's mappings: enough for
/// `MAX_PROCESS_MAPPINGS` of them.
pub(super) const LEGACY_MAPPING_PROBES: u32 = 9;
const _: () = assert!(1 << LEGACY_MAPPING_PROBES > unwind::MAX_PROCESS_MAPPINGS);
/// Probes of a legacy search over a table's rows: tables of up to 4 M rows
/// (64 MiB); a longer table's addresses past that count as not covered.
/// Fewer probes than `bpf_loop`'s 32 keep the verifier's work in bounds.
pub(super) const LEGACY_ROW_PROBES: u32 = 22;

impl Kernel for Legacy {
    const BPF_LOOP: bool = false;
    /// Its runtimes' walks are programs of their own, tail-called.
    const RUNTIMES: bool = true;

    #[inline(always)]
    fn thread_pointer(offset: usize) -> Option<u64> {
        let task = unsafe { bpf_get_current_task() } as *const u8;
        unsafe { bpf_probe_read_kernel(task.wrapping_add(offset).cast::<u64>()) }.ok()
    }

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

    /// Stops the native unwinder, for `legacy_continue` to jump to the
    /// runtime's walk (V8's or HotSpot's), a program of its own (the old
    /// verifiers walk every path: in line, a runtime step's paths would
    /// multiply the unwinder's).
    #[inline(always)]
    fn runtime_step(state: &mut UnwindState, runtime: u8) -> bool {
        state.reason = if runtime == hostprof_common::runtime::tag::V8 {
            super::legacy::AT_V8
        } else {
            super::legacy::AT_HOTSPOT
        };
        true
    }

    /// Hands over the unwind that `legacy::legacy_start` and the tail
    /// calls after it did before this program run reached here.
    #[inline(always)]
    fn unwind_user(
        slot: u32,
        tgid: u32,
        dst: *mut u64,
        runtime: *mut hostprof_common::runtime::Stack,
    ) -> Option<(u32, u32)> {
        let state = unsafe { &mut *UNWIND_STATE.get_ptr_mut(slot)? };
        if state.reason == IDLE || state.tgid != tgid {
            return None;
        }
        let unwound = finish_unwind(state, dst, runtime);
        state.reason = IDLE;
        Some(unwound)
    }

    /// Branch-free probes (see `Search::probe_branchless`); rows are
    /// read with `bpf_probe_read_kernel` from the rows map's flat memory,
    /// because a map lookup per probe is a branch (its NULL check) too.
    /// A row search first checks the CPU's hint, as the modern variant
    /// does: two map lookups instead of the search's 22 reads, which were
    /// most of a legacy sample's cost.
    #[inline(always)]
    fn search(process: &KernelProcess<Self>, what: Sorted, len: u32, target: u64) -> Option<u32> {
        match what {
            Sorted::Mappings => search_mappings(process.mappings, len, target),
            Sorted::Rows { start } => {
                let base = process.rows_base;
                if base == 0 {
                    return None;
                }
                let hint = ROW_HINTS.get_ptr_mut(unwind::hint_slot(start, target));
                // Map lookups here (inlined by the verifier): the check
                // branches anyway.
                if let Some(at) = hinted(hint, len, target, row_pc(start)) {
                    return Some(at);
                }
                let key = |index: u32| {
                    let at = base + u64::from(start.wrapping_add(index)) * size_of::<u64>() as u64;
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
                let found = unwind::search_last_le_branchless(len, target, LEGACY_ROW_PROBES, key);
                remember(hint, found)
            }
        }
    }
}

/// The index a CPU's hint (`hint`, its slot) gives for `target`, if it
/// still holds there (`key`: the sorted keys); else the search runs, and
/// [`remember`] keeps its answer. Both variants, mappings and rows.
#[inline(always)]
fn hinted(
    hint: Option<*mut u32>,
    len: u32,
    target: u64,
    key: impl FnMut(u32) -> Option<u64>,
) -> Option<u32> {
    let at = unsafe { read_volatile(hint?) };
    unwind::hint_holds(len, target, at, key).then_some(at)
}

/// Makes a search's answer the CPU's next hint; the answer.
#[inline(always)]
fn remember(hint: Option<*mut u32>, found: Option<u32>) -> Option<u32> {
    if let (Some(found), Some(hint)) = (found, hint) {
        unsafe { write_volatile(hint, found) };
    }
    found
}

/// The pc of row `index` of the table at `start` (its low 32 bits).
#[inline(always)]
fn row_pc(start: u32) -> impl Fn(u32) -> Option<u64> {
    move |index| word(start.wrapping_add(index)).map(|word| u64::from(word as u32))
}

/// The last of `mappings` starting at or below `target`: branch-free
/// probes (see `Search::probe_branchless`), the same path for both
/// variants.
#[inline(always)]
pub(super) fn search_mappings(mappings: &ProcessMappings, len: u32, target: u64) -> Option<u32> {
    let key = |index: u32| mapping_start(mappings, index);
    unwind::search_last_le_branchless(len, target, LEGACY_MAPPING_PROBES, key)
}

/// Where mapping `index` starts (masked for the verifier: through
/// `opaque`, or LLVM drops the mask after the hint's `hint < len` check,
/// which Linux 6.1's verifier does not take as a bound).
#[inline(always)]
fn mapping_start(mappings: &ProcessMappings, index: u32) -> Option<u64> {
    let index = unwind::opaque(u64::from(index)) as usize & (unwind::MAX_PROCESS_MAPPINGS - 1);
    Some(mappings.mappings[index].start)
}

/// The current task's user pc, sp, frame pointer and link register.
#[inline(always)]
pub(super) fn read_user_regs<K: Kernel>() -> Option<[u64; 4]> {
    let regs = K::user_regs();
    if regs.is_null() {
        return None;
    }
    let mut values = [0u64; 4];
    if K::BPF_LOOP {
        // `bpf_task_pt_regs` gives a pointer the verifier knows the type
        // of: its fields are loaded directly (exception-handled), not
        // through a helper call each, which had been a tenth of a
        // sample's fixed cost.
        for (value, offset) in values.iter_mut().zip(PT_REGS) {
            // SAFETY: an offset of a field of `struct pt_regs`, checked by
            // the verifier against the kernel's BTF.
            *value = unsafe { read_volatile(regs.add(offset).cast::<u64>()) };
        }
        return Some(values);
    }
    // Reads into zeroed arrays: nothing undefined for old verifiers to
    // trip on (see `unwind::frame_pointer_step`). One for the block the
    // registers sit in, one more for a register outside it: each helper
    // call costs about as much as a frame's table lookup.
    let mut block = [0u64; PT_REGS_BLOCK_WORDS];
    if !read_kernel_words(&mut block, unsafe { regs.add(PT_REGS_BLOCK) }) {
        return None;
    }
    for (value, offset) in values.iter_mut().zip(PT_REGS) {
        match block.get(offset.wrapping_sub(PT_REGS_BLOCK) / size_of::<u64>()) {
            Some(&word) => *value = word,
            None => {
                if !read_kernel_words(core::slice::from_mut(value), unsafe { regs.add(offset) }) {
                    return None;
                }
            }
        }
    }
    Some(values)
}

/// Fills `words` from kernel address `from` (`bpf_probe_read_kernel`).
#[inline(always)]
fn read_kernel_words(words: &mut [u64], from: *const u8) -> bool {
    unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            words.as_mut_ptr().cast(),
            size_of_val(words) as u32,
            from.cast(),
        ) == 0
    }
}
