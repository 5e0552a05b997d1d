//! The OpenTelemetry thread context (OTEP 4947) of the sampled thread,
//! for processes the agent registered (see `hostprof_common::trace`):
//! the thread pointer (a load through the task's BTF pointer on modern
//! kernels, a read on legacy ones), then two reads of the thread's memory
//! (the thread-local; the record with its first attribute bytes), three
//! more for a variable in dynamic TLS (the DTV, its length, the module's
//! block), one more for longer attributes; no loop, so both variants
//! carry it. A read of the thread's memory costs about as much as a frame
//! of the unwind (~65 ns): issue 30 allows the context 300 ns.
use super::*;

use hostprof_common::trace::{self as tc};

#[map(name = "TRACE_PROCS")]
static TRACE_PROCS: HashMap<u32, tc::Process> = HashMap::with_max_entries(tc::MAX_PROCESSES, 0);

/// Set by the agent at load time (`hostprof_common::GLOBAL_TASK_TP_OFFSET`).
#[unsafe(no_mangle)]
static TASK_TP_OFFSET: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_TASK_MM_OFFSET`).
#[unsafe(no_mangle)]
static TASK_MM_OFFSET: u32 = 0;

/// Set by the agent at load time (`hostprof_common::GLOBAL_TIME_CONTEXT`).
#[unsafe(no_mangle)]
static TIME_CONTEXT: u32 = 0;

/// The clock, when the context code is timed; else 0 (no helper call).
#[inline(always)]
pub(super) fn clock() -> u64 {
    if unsafe { read_volatile(&TIME_CONTEXT) } == 0 {
        return 0;
    }
    unsafe { bpf_ktime_get_ns() }
}

/// Adds the time since `started` (a [`clock`]) to the context code's (and
/// to the linked samples' when the sample has a link); counts the sample
/// at the first of its two timed parts (`first`).
#[inline(always)]
pub(super) fn timed(started: u64, linked: bool, first: bool) {
    if started == 0 {
        return;
    }
    let spent = unsafe { bpf_ktime_get_ns() }.wrapping_sub(started);
    add_slot(Counter::TraceContextNs as u32, spent);
    if first {
        bump(Counter::TraceContextTimed);
    }
    if linked {
        add_slot(Counter::TraceLinkedNs as u32, spent);
        if first {
            bump(Counter::TraceLinkedTimed);
        }
    }
}

/// `TASK_TP_OFFSET` as the loader set it (0: no thread pointer to read).
#[inline(always)]
pub(super) fn task_tp_offset() -> usize {
    unsafe { read_volatile(&TASK_TP_OFFSET) as usize }
}

/// Where `append_link` moves a record's attributes when they would
/// overlap themselves (a `Sample`'s used part may end anywhere before
/// them).
#[map(name = "TRACE_TAIL")]
static TRACE_TAIL: PerCpuArray<Tail> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
pub(super) struct Tail {
    bytes: [u8; tc::ATTRS_ROOM],
}

/// Reads the current thread's context record into `sample.trace` (its
/// attributes, if any, into `sample.attrs`) when its process is
/// registered and the record is valid; returns the flag to set on the
/// sample (`SAMPLE_FLAG_TRACE` or 0). Counts every outcome.
///
/// The attributes are read here, not when the record goes to the ring:
/// an off-CPU record is written when its thread comes back, while
/// another task (maybe another process) is current.
#[inline(always)]
pub(super) fn read_context<K: Kernel>(tgid: u32, sample: *mut Sample) -> u32 {
    let offset = unsafe { read_volatile(&TASK_TP_OFFSET) } as usize;
    if offset == 0 || !present(tgid, hostprof_common::present::TRACE) {
        return 0;
    }
    let Some(process) = (unsafe { TRACE_PROCS.get(&tgid) }) else {
        return 0;
    };
    let Some(thread_pointer) = K::thread_pointer(offset) else {
        bump(Counter::TraceReadFault);
        return 0;
    };
    // A process just executed runs its loader before the loader sets the
    // thread pointer up, and the agent may register it by then (seen
    // under load in `record -- CMD`): its thread has no TLS, so no
    // context attached, and no read that should have worked.
    if thread_pointer == 0 {
        bump(Counter::TraceDetached);
        return 0;
    }
    let (module, tls_offset) = (process.module, process.tls_offset as u64);
    let variable = if module == 0 {
        thread_pointer.wrapping_add(tls_offset)
    } else {
        match dynamic_block(thread_pointer, module, process.dtv) {
            Block::At(block) => block.wrapping_add(tls_offset),
            Block::NotYet => {
                bump(Counter::TraceDetached);
                return 0;
            }
            Block::Fault => {
                user_read_failed();
                return 0;
            }
        }
    };
    let Some(pointer) = read_user::<u64>(variable) else {
        user_read_failed();
        return 0;
    };
    if pointer == 0 {
        bump(Counter::TraceDetached);
        return 0;
    }
    let link = unsafe { &raw mut (*sample).trace };
    let Some((record, eager)) = read_record(link, pointer) else {
        user_read_failed();
        return 0;
    };
    if record.valid != 1 {
        bump(Counter::TraceDetached);
        return 0;
    }
    let attrs = unsafe { (&raw mut (*sample).attrs).cast::<u8>() };
    let size = record.attrs_size as usize;
    let (attrs_len, attrs_refused) = if size == 0 {
        (0, 0)
    } else if size > tc::MAX_ATTRS {
        (0, tc::attrs::OVER_CAP)
    } else if size <= eager || read_attrs(attrs, pointer.wrapping_add(RECORD), size) {
        clear_past(attrs, size);
        (size as u16, 0)
    } else {
        (0, tc::attrs::UNREADABLE)
    };
    unsafe {
        (*link).trace_flags = record.trace_flags;
        (*link).attrs_refused = attrs_refused;
        (*link).attrs_len = attrs_len;
        (*link)._pad = [0; 4];
    }
    bump(Counter::TraceLinked);
    SAMPLE_FLAG_TRACE
}

/// Attribute bytes read with the record, in its one read: a record's
/// attributes are a few dozen bytes (a route, a user id), and a read of
/// the thread's memory costs about as much as a frame of the unwind.
const EAGER_ATTRS: usize = 100;

const RECORD: u64 = tc::RECORD_BYTES as u64;
const PAGE: u64 = 4096;

/// Reads the record at `pointer` to the end of `link`, so that up to
/// [`EAGER_ATTRS`] bytes after it land where a sample keeps its
/// attributes (`Sample::attrs` follows `Sample::trace`), then moves its
/// ids to their place in `link`; returns the record's fixed part and how
/// many attribute bytes came with it. The eager bytes stop at the end of
/// the record's page: the next one may be unmapped where the record's
/// own is not, and a record that ends its page (its attributes with it)
/// is still read in one go.
#[inline(always)]
fn read_record(link: *mut tc::Link, pointer: u64) -> Option<(tc::Record, usize)> {
    const HEAD: usize = tc::LINK_BYTES - tc::RECORD_BYTES;
    let head = link.cast::<u8>().wrapping_add(HEAD);
    let room = PAGE - (pointer & (PAGE - 1));
    let size = if room >= RECORD + EAGER_ATTRS as u64 {
        tc::RECORD_BYTES + EAGER_ATTRS
    } else if room > RECORD {
        // Masked so the verifier sees the bound (LLVM may drop a
        // compare it proved redundant).
        (unwind::opaque(room) as usize & 0x7f).max(tc::RECORD_BYTES)
    } else {
        tc::RECORD_BYTES
    };
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            head.cast(),
            size as u32,
            pointer as *const c_void,
        )
    };
    if read != 0 {
        return None;
    }
    unsafe {
        // Loaded one by one: with the three from one word, LLVM checked
        // the size's bound on the word, which the verifier cannot carry
        // over to the size.
        let record = tc::Record {
            valid: read_volatile(head.add(24)),
            trace_flags: read_volatile(head.add(25)),
            attrs_size: read_volatile(head.add(26).cast::<u16>()),
            ..Default::default()
        };
        // Trace and span ids (24 bytes) to the start of the link, in
        // words upwards: each word is read before the one copy that
        // overwrites it.
        let words = link.cast::<u32>();
        for word in 0..6 {
            write_volatile(words.add(word), read_volatile(words.add(word + 1)));
        }
        Some((record, size - tc::RECORD_BYTES))
    }
}

/// Zeroes the bytes of the attributes' last word past their `size`: the
/// ring record carries whole words, and the eager read may have put the
/// thread's other memory there.
#[inline(always)]
fn clear_past(attrs: *mut u8, size: usize) {
    let last = size & !7;
    let used = size & 7;
    if used == 0 || last + 8 > tc::ATTRS_ROOM {
        return;
    }
    unsafe {
        let word = attrs.add(last).cast::<u64>();
        let kept = read_volatile(word) & ((1u64 << (used * 8)) - 1);
        write_volatile(word, kept);
    }
}

/// Counts a failed read of the thread's memory: a thread past `exit_mm`
/// in `do_exit` (its `mm` gone, its user memory with it) is still sampled
/// while it exits, and is told apart from a read that should have worked.
/// Read only here, so a sample that reads its context pays nothing.
#[inline(always)]
fn user_read_failed() {
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let offset = unsafe { read_volatile(&TASK_MM_OFFSET) } as usize;
    let exited = offset != 0
        && unsafe { bpf_probe_read_kernel(task.wrapping_add(offset).cast::<u64>()) } == Ok(0);
    bump(if exited {
        Counter::TraceExited
    } else {
        Counter::TraceReadFault
    });
}

/// Reads `size` bytes (1..=`MAX_ATTRS`) of attributes at `from` into
/// `attrs` (the caller clears the rest of their last word: the ring
/// record carries whole words, and the scratch may hold an earlier
/// sample's bytes, maybe another process's).
#[inline(always)]
fn read_attrs(attrs: *mut u8, from: u64, size: usize) -> bool {
    if size == 0 || size > tc::MAX_ATTRS {
        return false;
    }
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            attrs.cast(),
            size as u32,
            from as *const c_void,
        )
    };
    read == 0
}

/// What the thread's DTV holds for a module.
enum Block {
    At(u64),
    /// The thread has no block for it yet (its vector is shorter, or the
    /// entry is unallocated): it has not touched the variable, so it has
    /// no context.
    NotYet,
    Fault,
}

/// The start of `module`'s TLS block in the current thread, from its DTV
/// (laid out as `dtv` says, see `hostprof_common::trace::Dtv`).
#[inline(always)]
fn dynamic_block(thread_pointer: u64, module: u32, dtv: tc::Dtv) -> Block {
    let Some(vector) = read_user::<u64>(thread_pointer.wrapping_add(dtv.at as i64 as u64)) else {
        return Block::Fault;
    };
    let shift = if dtv.entry_shift == tc::DTV_ENTRY_SHIFT_MUSL {
        tc::DTV_ENTRY_SHIFT_MUSL
    } else {
        tc::DTV_ENTRY_SHIFT_GLIBC
    };
    // The vector's length (glibc: entry -1; musl: entry 0, its module
    // count): a module past it was loaded after the thread last grew its
    // vector.
    let length_at = if dtv.length_entry == 0 {
        vector
    } else {
        vector.wrapping_sub(1 << shift)
    };
    let Some(length) = read_user::<u64>(length_at) else {
        return Block::Fault;
    };
    if u64::from(module) > length {
        return Block::NotYet;
    }
    let entry = vector.wrapping_add(u64::from(module) << shift);
    match read_user::<u64>(entry) {
        None => Block::Fault,
        // glibc's TLS_DTV_UNALLOCATED is -1; a zeroed entry is unallocated too.
        Some(0 | u64::MAX) => Block::NotYet,
        Some(block) => Block::At(block),
    }
}

/// Appends `sample`'s link right after its used part (`len` bytes) when
/// it has one, its attributes (padded to words) before the link when it
/// has those too; returns the record's length with them. The link's
/// words are loaded before anything is written: the attributes' copy
/// may land on them.
#[inline(always)]
pub(super) fn append_link(sample: *mut Sample, len: usize, flags: u32) -> usize {
    if flags & SAMPLE_FLAG_TRACE == 0 || len > SAMPLE_TRACE_AT {
        return len;
    }
    let base = sample.cast::<u8>();
    let link = unsafe {
        let from = base.add(SAMPLE_TRACE_AT).cast::<u64>();
        [
            read_volatile(from),
            read_volatile(from.add(1)),
            read_volatile(from.add(2)),
            read_volatile(from.add(3)),
        ]
    };
    let attrs = unsafe { (*sample).trace.attrs_len } as usize;
    let padded = (attrs + 7) & !7;
    if padded > tc::ATTRS_ROOM {
        return len;
    }
    let at = if padded == 0 {
        len
    } else if len + padded <= SAMPLE_ATTRS_AT {
        // Apart from where they are: one copy.
        if unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                base.add(len).cast(),
                padded as u32,
                base.add(SAMPLE_ATTRS_AT).cast(),
            )
        } != 0
        {
            return len;
        }
        len + padded
    } else {
        match move_through_tail(base, len, padded) {
            Some(at) => at,
            None => return len,
        }
    };
    // Masked, through `opaque` so that LLVM keeps the mask: on a path that
    // cannot happen (attributes short enough for the one copy taken as
    // too long) Linux 6.1's verifier kept contradictory bounds for `at`,
    // its lowest above its highest, and refused the store; an AND makes it
    // compute them afresh.
    let at = unwind::opaque(at as u64) as usize & AT_MASK;
    if at > SAMPLE_TRACE_AT + tc::ATTRS_ROOM {
        return len;
    }
    unsafe {
        let to = base.add(at).cast::<u64>();
        for (word, value) in link.into_iter().enumerate() {
            write_volatile(to.add(word), value);
        }
    }
    at + tc::LINK_BYTES
}

/// Above any offset in a `Sample`.
const AT_MASK: usize = 0x1fff;
const _: () = assert!(size_of::<Sample>() <= AT_MASK);

/// The attributes' copy when they would overlap where they go (a record
/// whose used part ends less than their size before them): through
/// `TRACE_TAIL`. Returns where the link goes.
#[inline(always)]
fn move_through_tail(base: *mut u8, len: usize, padded: usize) -> Option<usize> {
    let tail = TRACE_TAIL.get_ptr_mut(0)?;
    unsafe {
        let tail = (&raw mut (*tail).bytes).cast::<u8>();
        for (to, from) in [(tail, base.add(SAMPLE_ATTRS_AT)), (base.add(len), tail)] {
            if aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                to.cast(),
                padded as u32,
                from.cast(),
            ) != 0
            {
                return None;
            }
        }
    }
    Some(len + padded)
}
