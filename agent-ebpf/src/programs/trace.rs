//! The OpenTelemetry thread context (OTEP 4947) of the sampled thread,
//! for processes the agent registered (see `hostprof_common::trace`):
//! three reads (thread pointer, thread-local, record), three more for a
//! variable in dynamic TLS (the DTV, its length, the module's block), no
//! loop, so both variants carry it.
use super::*;

use hostprof_common::trace::{self as tc};

#[map(name = "TRACE_PROCS")]
static TRACE_PROCS: HashMap<u32, tc::Process> = HashMap::with_max_entries(tc::MAX_PROCESSES, 0);

/// Set by the agent at load time (`hostprof_common::GLOBAL_TASK_TP_OFFSET`).
#[unsafe(no_mangle)]
static TASK_TP_OFFSET: u32 = 0;

/// Reads the current thread's context record into `link` when its
/// process is registered and the record is valid; returns the flag to
/// set on the sample (`SAMPLE_FLAG_TRACE` or 0). Counts every outcome.
#[inline(always)]
pub(super) fn read_context(tgid: u32, link: *mut tc::Link) -> u32 {
    let offset = unsafe { read_volatile(&TASK_TP_OFFSET) } as usize;
    if offset == 0 {
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
        match dynamic_block(thread_pointer, module, process.dtv_at) {
            Block::At(block) => block.wrapping_add(tls_offset),
            Block::NotYet => {
                bump(Counter::TraceDetached);
                return 0;
            }
            Block::Fault => {
                bump(Counter::TraceReadFault);
                return 0;
            }
        }
    };
    let Some(pointer) = read_user::<u64>(variable) else {
        bump(Counter::TraceReadFault);
        return 0;
    };
    if pointer == 0 {
        bump(Counter::TraceDetached);
        return 0;
    }
    let Some(record) = read_user::<tc::Record>(pointer) else {
        bump(Counter::TraceReadFault);
        return 0;
    };
    if record.valid != 1 {
        bump(Counter::TraceDetached);
        return 0;
    }
    unsafe {
        (*link).trace_id = record.trace_id;
        (*link).span_id = record.span_id;
        (*link).trace_flags = record.trace_flags;
        (*link)._pad = [0; 7];
    }
    bump(Counter::TraceLinked);
    SAMPLE_FLAG_TRACE
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
/// (glibc's layout, see `hostprof_common::trace::Process`).
#[inline(always)]
fn dynamic_block(thread_pointer: u64, module: u32, dtv_at: u32) -> Block {
    let Some(dtv) = read_user::<u64>(thread_pointer.wrapping_add(u64::from(dtv_at))) else {
        return Block::Fault;
    };
    // The vector's length, in entry -1: a module past it was loaded after
    // the thread last grew its vector.
    let Some(length) = read_user::<u64>(dtv.wrapping_sub(tc::DTV_ENTRY_BYTES)) else {
        return Block::Fault;
    };
    if u64::from(module) > length {
        return Block::NotYet;
    }
    let entry = dtv.wrapping_add(u64::from(module) * tc::DTV_ENTRY_BYTES);
    match read_user::<u64>(entry) {
        None => Block::Fault,
        // glibc's TLS_DTV_UNALLOCATED is -1; a zeroed entry is unallocated too.
        Some(0 | u64::MAX) => Block::NotYet,
        Some(block) => Block::At(block),
    }
}

/// Appends `sample`'s link right after its used part (`len` bytes) when
/// it has one; returns the record's length with it. The used part ends
/// at or before `Sample::trace`, so the copy, word by word from the
/// start, never overwrites a word it has yet to read.
#[inline(always)]
pub(super) fn append_link(sample: *mut Sample, len: usize, flags: u32) -> usize {
    if flags & SAMPLE_FLAG_TRACE == 0 || len > SAMPLE_TRACE_AT {
        return len;
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
