//! The OpenTelemetry thread context (OTEP 4947) of the sampled thread,
//! for processes the agent registered (see `hostprof_common::trace`):
//! three reads (thread pointer, thread-local, record), three more for a
//! variable in dynamic TLS (the DTV, its length, the module's block), one
//! more for a record with attributes (a single read of their size, capped),
//! no loop, so both variants carry it.
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

/// `TASK_TP_OFFSET` as the loader set it (0: no thread pointer to read).
#[inline(always)]
pub(super) fn task_tp_offset() -> usize {
    unsafe { read_volatile(&TASK_TP_OFFSET) as usize }
}

/// Where `append_link` assembles a record's attributes and link (a
/// `Sample`'s own bytes would overlap: its used part may end anywhere
/// before them).
#[map(name = "TRACE_TAIL")]
static TRACE_TAIL: PerCpuArray<Tail> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
pub(super) struct Tail {
    bytes: [u8; tc::ATTRS_ROOM + tc::LINK_BYTES],
}

/// Reads the current thread's context record into `link` (its attributes,
/// if any, into `attrs`, a `Sample::attrs`) when its process is
/// registered and the record is valid; returns the flag to set on the
/// sample (`SAMPLE_FLAG_TRACE` or 0). Counts every outcome.
///
/// The attributes are read here, not when the record goes to the ring:
/// an off-CPU record is written when its thread comes back, while
/// another task (maybe another process) is current.
#[inline(always)]
pub(super) fn read_context(tgid: u32, link: *mut tc::Link, attrs: *mut u8) -> u32 {
    let offset = unsafe { read_volatile(&TASK_TP_OFFSET) } as usize;
    if offset == 0 || !present(hostprof_common::present::TRACE) {
        return 0;
    }
    let Some(process) = (unsafe { TRACE_PROCS.get(&tgid) }) else {
        return 0;
    };
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let Ok(thread_pointer) =
        (unsafe { bpf_probe_read_kernel(task.wrapping_add(offset).cast::<u64>()) })
    else {
        bump(Counter::TraceReadFault);
        return 0;
    };
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
                user_read_failed(task);
                return 0;
            }
        }
    };
    let Some(pointer) = read_user::<u64>(variable) else {
        user_read_failed(task);
        return 0;
    };
    if pointer == 0 {
        bump(Counter::TraceDetached);
        return 0;
    }
    let Some(record) = read_user::<tc::Record>(pointer) else {
        user_read_failed(task);
        return 0;
    };
    if record.valid != 1 {
        bump(Counter::TraceDetached);
        return 0;
    }
    let size = record.attrs_size as usize;
    let (attrs_len, attrs_refused) = if size == 0 {
        (0, 0)
    } else if size > tc::MAX_ATTRS {
        (0, tc::attrs::OVER_CAP)
    } else if read_attrs(attrs, pointer.wrapping_add(tc::RECORD_BYTES as u64), size) {
        (size as u16, 0)
    } else {
        (0, tc::attrs::UNREADABLE)
    };
    unsafe {
        (*link).trace_id = record.trace_id;
        (*link).span_id = record.span_id;
        (*link).trace_flags = record.trace_flags;
        (*link).attrs_refused = attrs_refused;
        (*link).attrs_len = attrs_len;
        (*link)._pad = [0; 4];
    }
    bump(Counter::TraceLinked);
    SAMPLE_FLAG_TRACE
}

/// Counts a failed read of the thread's memory: a thread past `exit_mm`
/// in `do_exit` (its `mm` gone, its user memory with it) is still sampled
/// while it exits, and is told apart from a read that should have worked.
/// Read only here, so a sample that reads its context pays nothing.
#[inline(always)]
fn user_read_failed(task: *const u8) {
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
/// `attrs`, zeroing the rest of their last word first: the ring record
/// carries whole words, and the scratch may hold an earlier sample's
/// bytes, maybe another process's.
#[inline(always)]
fn read_attrs(attrs: *mut u8, from: u64, size: usize) -> bool {
    if size == 0 || size > tc::MAX_ATTRS {
        return false;
    }
    let last = size & !7;
    if last < size && last + 8 <= tc::ATTRS_ROOM {
        unsafe { write_volatile(attrs.add(last).cast::<u64>(), 0) };
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
/// has those too; returns the record's length with them. Without
/// attributes the used part ends at or before `Sample::trace`, so the
/// copy, word by word from the start, never overwrites a word it has yet
/// to read; with them, attributes and link are put together in
/// `TRACE_TAIL` first, then copied after the used part.
#[inline(always)]
pub(super) fn append_link(sample: *mut Sample, len: usize, flags: u32) -> usize {
    if flags & SAMPLE_FLAG_TRACE == 0 || len > SAMPLE_TRACE_AT {
        return len;
    }
    let attrs = unsafe { (*sample).trace.attrs_len } as usize;
    if attrs != 0 {
        return append_tail(sample, len, attrs);
    }
    unsafe {
        let from = sample.cast::<u8>().add(SAMPLE_TRACE_AT).cast::<u64>();
        let to = sample.cast::<u8>().add(len).cast::<u64>();
        for word in 0..tc::LINK_BYTES / 8 {
            let value = read_volatile(from.add(word));
            write_volatile(to.add(word), value);
        }
    }
    len + tc::LINK_BYTES
}

/// `append_link` for a record with `attrs` bytes of attributes.
#[inline(always)]
fn append_tail(sample: *mut Sample, len: usize, attrs: usize) -> usize {
    let padded = (attrs + 7) & !7;
    if padded > tc::ATTRS_ROOM || len > SAMPLE_TRACE_AT {
        return len;
    }
    let Some(tail) = TRACE_TAIL.get_ptr_mut(0) else {
        return len;
    };
    unsafe {
        let tail = (&raw mut (*tail).bytes).cast::<u8>();
        let base = sample.cast::<u8>();
        if aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            tail.cast(),
            padded as u32,
            base.add(SAMPLE_ATTRS_AT).cast(),
        ) != 0
        {
            return len;
        }
        let from = base.add(SAMPLE_TRACE_AT).cast::<u64>();
        let to = tail.add(padded).cast::<u64>();
        for word in 0..tc::LINK_BYTES / 8 {
            write_volatile(to.add(word), read_volatile(from.add(word)));
        }
        let total = padded + tc::LINK_BYTES;
        if aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            base.add(len).cast(),
            total as u32,
            tail.cast(),
        ) != 0
        {
            return len;
        }
        len + total
    }
}
