//! The kernel side of the table-driven unwinder: the process view it
//! walks, and its `bpf_loop` callbacks (modern; the legacy tail-call
//! chain is in `legacy`).
use super::*;

use super::kernel::*;

/// The unwinder's view of the current process: user memory and the
/// tables the agent loaded.
pub(super) struct KernelProcess<'a, K> {
    pub(super) mappings: &'a ProcessMappings,
    /// Legacy only: the address of the rows map's first row, as a plain
    /// number (see [`rows_base`]); 0 when unknown.
    pub(super) rows_base: u64,
    /// Frames found so far: which of the CPU's mapping hints to check.
    pub(super) depth: u32,
    /// The unwind's copy of the user stack.
    pub(super) window: *mut unwind::StackWindow,
    /// Where the mark of the mapping the last lookup found goes (see
    /// `unwind::TABLE_MARK_SHIFT`; the unwind state's `mark`): copied
    /// into the frame's entry.
    pub(super) mark: *mut u32,
    /// The unwind state's row search (see `UnwindState::search`).
    pub(super) search: *mut Search,
    pub(super) kernel: core::marker::PhantomData<K>,
}

/// The address of the rows map's first row, as a number the verifier
/// does not track as a pointer: an array map's values are one flat
/// block, so row `i` is at `base + 8 * i`, which legacy searches read
/// with `bpf_probe_read_kernel` (a pointer into the map could not be
/// moved that far).
#[inline(always)]
pub(super) fn rows_base() -> u64 {
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
        // SAFETY: the UNWIND_STATE value this walk runs in (or null).
        match unsafe { self.window.as_mut() } {
            Some(window) if address & 7 == 0 => window_read(window, address),
            _ => read_user(address),
        }
    }

    #[inline(always)]
    fn read_u64_seldom(&mut self, address: u64) -> Option<u64> {
        read_user(address)
    }

    #[inline(always)]
    fn lookup(&mut self, pc: u64) -> Lookup {
        let this = &*self;
        // Forced inline: a closure called twice is otherwise a BPF
        // subprogram, which old verifiers check less kindly.
        let search = #[inline(always)]
        |what: Sorted, len: u32, target: u64| K::search(this, what, len, target);
        let row =
            #[inline(always)]
            |start: u32, len: u32, found: u32| unwind::packed_row(start, len, found, word, rule);
        let mark = self.mark;
        // SAFETY: the UNWIND_STATE value this walk runs in.
        unsafe { write_volatile(mark, 0) };
        unwind::lookup_marked(self.mappings, pc, search, row, |found| unsafe {
            write_volatile(mark, found)
        })
    }
}

/// The aligned word of user memory at `address`, from `window`, which is
/// refilled from `address` on when it does not hold it.
#[inline(always)]
fn window_read(window: &mut unwind::StackWindow, address: u64) -> Option<u64> {
    let slot = match window.slot(address) {
        Some(slot) => slot,
        None => {
            let len = unwind::window_fill_len(address);
            let read = unsafe {
                aya_ebpf::helpers::generated::bpf_probe_read_user(
                    window.words.as_mut_ptr().cast(),
                    len,
                    address as *const c_void,
                )
            };
            if read != 0 {
                window.len = 0;
                return None;
            }
            window.base = address;
            window.len = len;
            0
        }
    };
    Some(window.words[slot])
}

/// Word `index` of the rows map (a row: its pc in the low half).
#[inline(always)]
pub(super) fn word(index: u32) -> Option<u64> {
    let chunk = UNWIND_ROWS.get(index / ROW_CHUNK as u32)?;
    let slot = unwind::opaque(u64::from(index % ROW_CHUNK as u32)) as usize & (ROW_CHUNK - 1);
    Some(chunk.0[slot])
}

/// The rule at word `index` of the rows map (even: both of its words are
/// in one chunk, read with one lookup).
#[inline(always)]
pub(super) fn rule(index: u32) -> Option<[u64; 2]> {
    let chunk = UNWIND_ROWS.get(index / ROW_CHUNK as u32)?;
    // Masked to an even slot for the verifier: the second word is in bounds.
    let slot = unwind::opaque(u64::from(index % ROW_CHUNK as u32)) as usize & (ROW_CHUNK - 2);
    Some([chunk.0[slot], chunk.0[slot | 1]])
}

/// A binary search over a table's rows run by `bpf_loop`, one probe per
/// call (rows are array-map elements: each probe is an address
/// computation, no hash lookup).
#[repr(C)]
pub(super) struct SearchCtx {
    /// The search, in the unwind state (map memory: see
    /// `UnwindState::search`).
    pub(super) search: *mut Search,
    /// First row of the table searched.
    pub(super) table_start: u32,
    pub(super) _pad: u32,
}

pub(super) extern "C" fn search_probe(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the SearchCtx on the caller's stack.
    let ctx = unsafe { &*(ctx as *const SearchCtx) };
    // SAFETY: the UNWIND_STATE value the walk runs in.
    let Some(search) = (unsafe { ctx.search.as_mut() }) else {
        return 1;
    };
    let start = ctx.table_start;
    let more =
        search.probe(|index| word(start.wrapping_add(index)).map(|word| u64::from(word as u32)));
    if more { 0 } else { 1 }
}

/// What `unwind_frame` gets from `bpf_loop`: the UNWIND_STATE slot and
/// the process's mappings, looked up once per stack rather than once
/// per frame (a hash lookup is the costliest thing a frame did).
#[repr(C)]
pub(super) struct FrameCtx {
    pub(super) slot: u32,
    pub(super) _pad: u32,
    pub(super) mappings: *const ProcessMappings,
}

/// One frame per call, from `bpf_loop`; `ctx` points at a [`FrameCtx`].
/// Returns 1 to stop.
pub(super) extern "C" fn unwind_frame<K: Kernel>(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the FrameCtx on the caller's stack.
    let ctx = unsafe { &*(ctx as *const FrameCtx) };
    let Some(state) = UNWIND_STATE.get_ptr_mut(ctx.slot) else {
        return 1;
    };
    // SAFETY: a per-CPU map value; nothing else runs on this CPU's slot.
    let state = unsafe { &mut *state };
    // SAFETY: a PROCESS_MAPPINGS value, valid for the whole program run
    // (map values outlive an RCU read section even if the agent deletes
    // the entry meanwhile).
    let Some(mappings) = (unsafe { ctx.mappings.as_ref() }) else {
        state.reason = unwind::reason::UNKNOWN_PROCESS;
        return 1;
    };
    i64::from(frame::<K>(state, mappings, 0))
}

/// Walks one frame of the unwind in `state`; true when the unwind is over
/// (`state.reason` says why).
#[inline(always)]
pub(super) fn frame<K: Kernel>(
    state: &mut UnwindState,
    mappings: &ProcessMappings,
    rows_base: u64,
) -> bool {
    let mut process = KernelProcess::<K> {
        mappings,
        rows_base,
        depth: unsafe { read_volatile(&state.len) },
        window: &raw mut state.window,
        mark: &raw mut state.mark,
        search: &raw mut state.search,
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
            // Masked for the verifier (the depth is a power of two). The
            // frame just left takes its mapping's mark, without a branch
            // (0 for most): an interpreter loop's frame says so to the host.
            let mark = unsafe { read_volatile(&state.mark) } & 7;
            state.frames[len.wrapping_sub(1) & (MAX_USER_STACK_DEPTH - 1)] |=
                u64::from(mark) << unwind::STACK_MARK_SHIFT;
            state.marks |= mark;
            state.frames[len & (MAX_USER_STACK_DEPTH - 1)] = regs.pc;
            unsafe { write_volatile(&mut state.len, len as u32 + 1) };
            false
        }
        Step::Stop(reason) => {
            unsafe { write_volatile(&mut state.reason, reason) };
            true
        }
        // The runtime the agent marked the mapping with.
        Step::Runtime(runtime) if K::RUNTIMES && unsafe { read_volatile(&RUNTIME_WALK) } != 0 => {
            K::runtime_step(state, runtime)
        }
        Step::Runtime(_) => {
            unsafe { write_volatile(&mut state.reason, unwind::reason::NO_TABLE) };
            true
        }
    }
}

/// How a runtime's step into its caller went.
pub(super) enum Entered {
    Caller,
    /// No room for another frame.
    DepthLimit,
    /// The caller is not above the frame, or has no return address.
    BadFrame,
}

/// Moves the unwind from the runtime frame at `regs` (the last native
/// entry, its pc) to its caller (`pc`, `sp`, `fp`). With `frame`, that
/// native entry becomes a [`runtime::FRAME_MARK`] of `frame`, so runtime
/// and native frames stay interleaved as they ran.
#[inline(always)]
pub(super) fn enter_caller(
    state: &mut UnwindState,
    regs: &Regs,
    pc: u64,
    sp: u64,
    fp: u64,
    frame: Option<runtime::Frame>,
) -> Entered {
    let len = unsafe { read_volatile(&state.len) } as usize;
    let runtime_len = unsafe { read_volatile(&state.runtime_len) } as usize;
    if runtime_len >= runtime::MAX_FRAMES || len >= MAX_USER_STACK_DEPTH || len == 0 {
        return Entered::DepthLimit;
    }
    // Stacks grow down; a return address of 0 is no caller.
    let pc = unwind::strip_pointer_auth(ARCH, pc);
    if pc == 0 || sp < regs.sp || (sp == regs.sp && pc == regs.pc) {
        return Entered::BadFrame;
    }
    // The masks, not just the checks, are what the verifier sees; through
    // `opaque`, or LLVM drops them where the checks above imply them.
    let (len_slot, runtime_slot) = (
        unwind::opaque(len as u64),
        unwind::opaque(runtime_len as u64),
    );
    if let Some(frame) = frame {
        state.runtime[runtime_slot as usize & (runtime::MAX_FRAMES - 1)] = frame;
        state.frames[(len_slot as usize).wrapping_sub(1) & (MAX_USER_STACK_DEPTH - 1)] =
            runtime::FRAME_MARK | runtime_len as u64;
        unsafe { write_volatile(&mut state.runtime_len, runtime_len as u32 + 1) };
    }
    state.frames[len_slot as usize & (MAX_USER_STACK_DEPTH - 1)] = pc;
    unsafe { write_volatile(&mut state.len, len as u32 + 1) };
    let next = Regs {
        pc,
        sp,
        fp,
        lr: 0,
        interrupted: 0,
        fp_valid: 1,
    };
    unsafe { write_volatile(&mut state.regs, next) };
    Entered::Caller
}

/// Starts an unwind of the current task in `state`; `None` when its
/// registers cannot be read.
#[inline(always)]
pub(super) fn start_unwind<K: Kernel>(state: &mut UnwindState, tgid: u32) -> Option<()> {
    let [pc, sp, fp, lr] = read_user_regs::<K>()?;
    state.regs = Regs::interrupted(pc, sp, fp, lr);
    state.tgid = tgid;
    state.frames[0] = pc;
    state.len = 1;
    state.runtime_len = 0;
    state.marks = 0;
    state.window.len = 0;
    state.reason = RUNNING;
    Some(())
}

/// Copies a finished unwind into `dst` (its runtime frames into
/// `runtime`), counts why it stopped; returns (frames, sample flags).
#[inline(always)]
pub(super) fn finish_unwind(
    state: &mut UnwindState,
    dst: *mut u64,
    runtime: *mut runtime::Stack,
) -> (u32, u32) {
    if state.reason == RUNNING {
        state.reason = unwind::reason::DEPTH_LIMIT;
    }
    let reason = state.reason;
    // Only the frames the walk found (a few dozen bytes, where all the
    // slots are a kilobyte); bounded for the verifier.
    let len = unwind::opaque(u64::from(state.len)) as u32;
    let len = if len > MAX_USER_STACK_DEPTH as u32 {
        MAX_USER_STACK_DEPTH as u32
    } else {
        len
    };
    // SAFETY: both hold MAX_USER_STACK_DEPTH frames.
    unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            dst.cast(),
            len * size_of::<u64>() as u32,
            state.frames.as_ptr().cast(),
        )
    };
    let runtime_len = state.runtime_len;
    if runtime_len != 0 {
        // SAFETY: both hold runtime::MAX_FRAMES frames.
        unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                (*runtime).frames.as_mut_ptr().cast(),
                size_of::<[runtime::Frame; runtime::MAX_FRAMES]>() as u32,
                state.runtime.as_ptr().cast(),
            );
            (*runtime).len = runtime_len;
        }
    }
    bump(Counter::UnwindTables);
    bump(Counter::for_unwind_reason(reason));
    let mut flags = SAMPLE_FLAG_USER_TABLES | ((reason & 0xff) << SAMPLE_UNWIND_SHIFT);
    if reason == unwind::reason::DEPTH_LIMIT {
        bump(Counter::Truncated);
        flags |= SAMPLE_FLAG_USER_TRUNCATED;
    }
    // Without a branch: 1 for any mark (at most 7), 0 for none.
    let marked = ((unwind::opaque(u64::from(state.marks & 7)) + 7) >> 3) as u32;
    flags |= marked * SAMPLE_FLAG_MARKED;
    (state.len, flags)
}
