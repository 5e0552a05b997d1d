//! The pprof labels of the goroutine the sampled thread runs, for the Go
//! processes the agent registered (see `hostprof_common::golang`): four
//! reads to the labels (`g`, `g.m`, `m.curg`, `curg.labels`), then one
//! step per map slot or slice entry (at most `MAX_BUCKETS × BUCKET_SLOTS`),
//! each with at most five reads: a `bpf_loop` call each on the modern
//! variant, a loop bounded in the program on the legacy one (Linux 5.10
//! to 5.16), whose verifier walks every step.
use super::*;

use hostprof_common::{
    SAMPLE_FLAG_GO_LABELS,
    golang::{self as go, GoString},
    trace as tc,
};

#[map(name = "GO_PROCS")]
static GO_PROCS: HashMap<u32, go::Process> = HashMap::with_max_entries(tc::MAX_PROCESSES, 0);

/// How far a read has got, one per unwind slot (a CPU sample may
/// interrupt an off-CPU record's read on the same CPU).
///
/// In a map rather than on the stack: the verifier does not follow what a
/// map holds, so each step starts from the same state, whatever the steps
/// before it did. The legacy variant's verifier walks every step of the
/// loop; with the progress on the stack, known exactly, each step's paths
/// (a label kept, skipped, cut) would multiply the next one's.
#[repr(C)]
struct Progress {
    /// The map's buckets, or the slice's first entry.
    from: u64,
    /// Bytes of `attrs` written.
    pos: u32,
    /// Labels kept.
    kept: u32,
    /// Map layout: buckets to read (1 or [`go::MAX_BUCKETS`]).
    buckets: u32,
    /// Some labels were left out.
    cut: u32,
    /// A read failed.
    fault: u32,
    /// Map layout: occupied slots seen.
    seen: u32,
}

#[map(name = "GO_PROGRESS")]
static GO_PROGRESS: PerCpuArray<Progress> = PerCpuArray::with_max_entries(2, 0);

/// The state of one read, on the program's stack, handed to each step.
#[repr(C)]
struct Labels {
    /// The sample's `attrs` (a map value).
    attrs: *mut u8,
    /// Its progress, in [`GO_PROGRESS`].
    progress: *mut Progress,
}

/// Steps of the legacy variant's loop: a map's slots, or (fewer) a
/// slice's entries.
const LEGACY_STEPS: u32 = go::MAX_BUCKETS * go::BUCKET_SLOTS as u32;
const _: () = assert!(go::MAX_LABELS as u32 <= LEGACY_STEPS);

/// Reads the current goroutine's labels into `attrs` (a `Sample::attrs`)
/// and `link` (its `attrs_len`, zero ids) when its process is a
/// registered Go process and the goroutine has labels; returns the flags
/// to set on the sample (`SAMPLE_FLAG_TRACE | SAMPLE_FLAG_GO_LABELS`, or
/// 0). Counts every outcome.
#[inline(always)]
pub(super) fn read_labels<K: Kernel>(
    slot: u32,
    tgid: u32,
    link: *mut tc::Link,
    attrs: *mut u8,
) -> u32 {
    let Some(process) = (unsafe { GO_PROCS.get(&tgid) }) else {
        return 0;
    };
    let Some(g) = g_of::<K>(process) else {
        bump(Counter::GoReadFault);
        return 0;
    };
    let Some(labels) = labels_of(process, g) else {
        return 0;
    };
    let Some(progress) = GO_PROGRESS.get_ptr_mut(slot) else {
        return 0;
    };
    // SAFETY: a per-CPU map value, this slot's alone on this CPU.
    let state = unsafe { &mut *progress };
    state.from = 0;
    state.pos = 0;
    state.kept = 0;
    state.buckets = 1;
    state.cut = 0;
    state.fault = 0;
    state.seen = 0;
    // Map layout: its count, against the slots the read reaches.
    let mut count = 0;
    let slice = process.layout == go::LAYOUT_SLICE;
    let steps = if slice {
        // `labelMap{list []label}`: the slice's data and length.
        let Some(slice) = read_user::<[u64; 2]>(labels) else {
            bump(Counter::GoReadFault);
            return 0;
        };
        let len = slice[1];
        if len > go::MAX_LABELS as u64 {
            state.cut = 1;
        }
        state.from = slice[0];
        if len > go::MAX_LABELS as u64 {
            go::MAX_LABELS as u32
        } else {
            len as u32
        }
    } else {
        // `*labelMap` is a pointer to the map variable, itself a pointer.
        let Some(hmap) = read_user::<u64>(labels) else {
            bump(Counter::GoReadFault);
            return 0;
        };
        if hmap == 0 {
            bump(Counter::GoUnlabeled);
            return 0;
        }
        let (Some(entries), Some(log2), Some(buckets)) = (
            read_user::<u64>(hmap.wrapping_add(go::HMAP_COUNT)),
            read_user::<u8>(hmap.wrapping_add(go::HMAP_LOG2_BUCKETS)),
            read_user::<u64>(hmap.wrapping_add(go::HMAP_BUCKETS)),
        ) else {
            bump(Counter::GoReadFault);
            return 0;
        };
        count = entries;
        if count == 0 || buckets == 0 {
            bump(Counter::GoUnlabeled);
            return 0;
        }
        if u32::from(log2) > go::MAX_BUCKETS.trailing_zeros() {
            state.cut = 1;
        }
        state.buckets = if log2 == 0 { 1 } else { go::MAX_BUCKETS };
        state.from = buckets;
        go::MAX_BUCKETS * go::BUCKET_SLOTS as u32
    };
    let mut labels = Labels { attrs, progress };
    if K::BPF_LOOP {
        let callback = if slice {
            slice_entry as *mut c_void
        } else {
            map_slot as *mut c_void
        };
        if steps > 0 {
            unsafe { bpf_loop(steps, callback, (&raw mut labels).cast(), 0) };
        }
    } else {
        for index in 0..LEGACY_STEPS {
            if index >= steps {
                break;
            }
            let stop = if slice {
                slice_step(u64::from(index), &labels)
            } else {
                map_step(u64::from(index), &labels)
            };
            if stop != 0 {
                break;
            }
        }
    }
    // SAFETY: as above; the steps are done with it.
    let state = unsafe { &mut *progress };
    if state.fault != 0 {
        bump(Counter::GoReadFault);
    }
    // Labels in buckets past those read, or in overflow buckets.
    if u64::from(state.seen) < count && state.fault == 0 {
        state.cut = 1;
    }
    if state.cut != 0 {
        bump(Counter::GoLabelsCut);
    }
    let len = unsafe { read_volatile(&state.pos) } as usize;
    if len == 0 || len > tc::MAX_ATTRS {
        if state.fault == 0 {
            bump(Counter::GoUnlabeled);
        }
        return 0;
    }
    // The ring record carries whole words: zero the rest of the last one
    // (the scratch may hold an earlier sample's bytes).
    let last = len & !7;
    if len & 7 != 0 && last + 8 <= tc::ATTRS_ROOM {
        unsafe {
            let word = attrs.add(last).cast::<u64>();
            let keep = (1u64 << ((len & 7) * 8)) - 1;
            write_volatile(word, read_volatile(word) & keep);
        }
    }
    unsafe {
        (*link).trace_id = [0; 16];
        (*link).span_id = [0; 8];
        (*link).trace_flags = 0;
        (*link).attrs_refused = 0;
        (*link).attrs_len = len as u16;
        (*link)._pad = [0; 4];
    }
    bump(Counter::GoLabeled);
    SAMPLE_FLAG_TRACE | SAMPLE_FLAG_GO_LABELS
}

/// The current thread's `g`: read at its thread pointer's offset, or
/// from its saved user registers (arm64 without cgo); `None` when a
/// read failed.
#[inline(always)]
fn g_of<K: Kernel>(process: &go::Process) -> Option<u64> {
    if process.g_in == go::G_IN_REGISTER {
        // Only arm64 keeps `g` in a register the agent registers.
        if !cfg!(bpf_target_arch = "aarch64") {
            return None;
        }
        let regs = K::user_regs();
        if regs.is_null() {
            return None;
        }
        return unsafe {
            bpf_probe_read_kernel(regs.wrapping_add(go::G_REGISTER_AT).cast::<u64>())
        }
        .ok();
    }
    let offset = super::trace::task_tp_offset();
    if offset == 0 {
        return None;
    }
    let thread_pointer = K::thread_pointer(offset)?;
    read_user::<u64>(thread_pointer.wrapping_add(process.tls_offset as u64))
}

/// `curg.labels` of the thread whose goroutine is `g`, when it runs a
/// user goroutine with labels; counts why not otherwise.
#[inline(always)]
fn labels_of(process: &go::Process, g: u64) -> Option<u64> {
    // A thread that has not run Go code yet (a C thread of a cgo
    // program), or is leaving.
    if g == 0 {
        bump(Counter::GoUnlabeled);
        return None;
    }
    let m = read_user::<u64>(g.wrapping_add(u64::from(process.m)));
    let curg = m.and_then(|m| read_user::<u64>(m.wrapping_add(u64::from(process.curg))));
    let Some(curg) = curg else {
        bump(Counter::GoReadFault);
        return None;
    };
    // The scheduler, or a signal handler, with no user goroutine.
    if curg == 0 {
        bump(Counter::GoUnlabeled);
        return None;
    }
    let Some(labels) = read_user::<u64>(curg.wrapping_add(u64::from(process.labels))) else {
        bump(Counter::GoReadFault);
        return None;
    };
    if labels == 0 {
        bump(Counter::GoUnlabeled);
        return None;
    }
    Some(labels)
}

/// One slot of a label map, from `bpf_loop` (see [`map_step`]).
extern "C" fn map_slot(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the `Labels` on the caller's stack.
    map_step(index, unsafe { &*(ctx as *const Labels) })
}

/// Slot `index % 8` of bucket `index / 8` of a label map. Returns 1 to
/// stop.
#[inline(always)]
fn map_step(index: u64, labels: &Labels) -> i64 {
    // SAFETY: this slot's progress (see `read_labels`).
    let state = unsafe { &mut *labels.progress };
    let bucket = index / go::BUCKET_SLOTS as u64;
    let slot = index % go::BUCKET_SLOTS as u64;
    if bucket >= u64::from(state.buckets) {
        return 1;
    }
    let bucket = state.from.wrapping_add(bucket * go::BUCKET_BYTES);
    let Some(top) = read_user::<u8>(bucket.wrapping_add(slot)) else {
        state.fault = 1;
        return 1;
    };
    if top < go::MIN_TOP_HASH {
        return 0;
    }
    state.seen += 1;
    let key = read_user::<GoString>(bucket.wrapping_add(go::BUCKET_KEYS_AT + slot * 16));
    let value = read_user::<GoString>(bucket.wrapping_add(go::BUCKET_VALUES_AT + slot * 16));
    let (Some(key), Some(value)) = (key, value) else {
        state.fault = 1;
        return 1;
    };
    append(labels.attrs, state, key, value)
}

/// Entry `index` of a label slice, from `bpf_loop` (see [`slice_step`]).
extern "C" fn slice_entry(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the `Labels` on the caller's stack.
    slice_step(index, unsafe { &*(ctx as *const Labels) })
}

/// Entry `index` of a label slice (`[]label`, a key and a value string
/// each). Returns 1 to stop.
#[inline(always)]
fn slice_step(index: u64, labels: &Labels) -> i64 {
    // SAFETY: this slot's progress (see `read_labels`).
    let state = unsafe { &mut *labels.progress };
    let Some(pair) = read_user::<[GoString; 2]>(state.from.wrapping_add(index * 32)) else {
        state.fault = 1;
        return 1;
    };
    append(labels.attrs, state, pair[0], pair[1])
}

/// Appends one label to the sample's attributes `attrs` (see
/// `hostprof_common::golang` for the entry); returns 1 when no more fit.
///
/// Every offset and size is checked right where it is used, on a value
/// loaded just before: Linux 5.10's verifier keeps a check only for the
/// register it was made on (5.11 carries it over to the register's
/// copies), and LLVM, free to keep a copy of a value on the stack from
/// before its check and use that, did so twice (the entry's offset, the
/// value's length: "unbounded memory access", "R2 min value is
/// negative"). The lengths used are the entry's own bytes, read back.
#[inline(always)]
fn append(attrs: *mut u8, state: &mut Progress, key: GoString, value: GoString) -> i64 {
    if unsafe { read_volatile(&state.kept) } as usize >= go::MAX_LABELS {
        state.cut = 1;
        return 1;
    }
    // Each length read once, into a register: LLVM, knowing a length
    // checked, may otherwise load it again from the string's copy on the
    // stack, which the helper that read it left without bounds for the
    // verifier (6.1 rejected the offset `2 + key_len`; 6.12 accepted).
    let key_len = unsafe { read_volatile(&key.len) };
    let value_len = unsafe { read_volatile(&value.len) };
    if key_len > go::MAX_KEY as u64 {
        state.cut = 1;
        return 0;
    }
    let (value_len, cut) = if value_len > go::MAX_VALUE as u64 {
        (go::MAX_VALUE as u8, go::VALUE_CUT)
    } else {
        (value_len as u8, 0)
    };
    let read = aya_ebpf::helpers::generated::bpf_probe_read_user;
    unsafe {
        // The entry's place: its offset loaded, checked and added at once.
        let at = {
            let pos = read_volatile(&state.pos) as usize;
            // `MAX_ATTRS`, not the room: the host refuses a record
            // announcing more.
            if pos > tc::MAX_ATTRS - go::MAX_ENTRY {
                state.cut = 1;
                return 1;
            }
            attrs.add(pos)
        };
        write_volatile(at, key_len as u8);
        write_volatile(at.add(1), value_len | cut);
        let key_len = usize::from(read_volatile(at));
        if key_len > go::MAX_KEY
            || read(at.add(2).cast(), key_len as u32, key.data as *const c_void) != 0
        {
            state.fault = 1;
            return 1;
        }
        let key_len = usize::from(read_volatile(at));
        let value_len = usize::from(read_volatile(at.add(1)) & !go::VALUE_CUT);
        if key_len > go::MAX_KEY
            || value_len > go::MAX_VALUE
            || read(
                at.add(2 + key_len).cast(),
                value_len as u32,
                value.data as *const c_void,
            ) != 0
        {
            state.fault = 1;
            return 1;
        }
        state.pos += (2 + key_len + value_len) as u32;
    }
    state.kept += 1;
    0
}
