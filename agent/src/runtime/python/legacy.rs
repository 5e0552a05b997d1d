//! CPython 3.8, 3.9 and 3.10: frame objects instead of interpreter frames,
//! no `native_thread_id`, and line tables of their own.
//!
//! - Frames are `PyFrameObject`s linked by `f_back`, each run by a call of
//!   its own of the evaluation loop; the kernel keeps `f_code` and
//!   `f_lasti` (the last instruction: a byte offset in 3.8 and 3.9, an
//!   index of 2-byte code units in 3.10; -1 before the first).
//! - A thread state names its thread by `pthread_t` only; the kernel reads
//!   the thread's id from the C library's `struct pthread` it points at, at
//!   an offset [`pthread_tid_offset`] finds per process.
//! - Lines: `co_lnotab` (3.8, 3.9) and 3.10's `co_linetable`, both pairs of
//!   bytes.
//!
//! Offsets measured with gdb on pyenv's builds (`offsetof` through their
//! DWARF) and the same in Debian's; every field is pointer-sized or follows
//! pointer-sized ones, so x86_64 and aarch64 agree.
use std::collections::HashSet;

use hostprof_common::python::{ABSENT, Process};

use super::{
    layout::{CodeLayout, Layout, LineTable},
    lines::Entry,
};

/// The layout of 3.8, 3.9 or 3.10; `pthread_tid` is left for the caller.
pub fn layout(minor: u8) -> Option<Layout> {
    let (f_lasti, line_table) = match minor {
        8 | 9 => (104, LineTable::Lnotab),
        10 => (96, LineTable::Pairs),
        _ => return None,
    };
    Some(Layout {
        kernel: Process {
            // _PyRuntimeState.interpreters.head, PyInterpreterState.tstate_head.
            interpreters_head: 32,
            threads_head: 8,
            thread_next: 8,
            thread_native_id: ABSENT,
            thread_pthread: 176,
            // PyThreadState.frame, the frame itself.
            thread_frame: 24,
            cframe_frame: ABSENT,
            frame_previous: 24,
            frame_code: 32,
            frame_instr: f_lasti,
            frame_owner: ABSENT,
            frame_is_entry: ABSENT,
            owner_cstack: u16::MAX,
            owner_skip: u16::MAX,
            ..Process::default()
        },
        code: CodeLayout {
            filename: 104,
            // No co_qualname before 3.11: the function's own name.
            qualname: 112,
            firstlineno: 40,
            // co_lnotab, co_linetable.
            linetable: 120,
            code_adaptive: 0,
            // PyASCIIObject and PyCompactUnicodeObject, with their wstr.
            ascii_size: 48,
            compact_size: 72,
            line_table,
        },
    })
}

/// The byte offset in the bytecode of the instruction a frame was at, from
/// the `f_lasti` the kernel read (an `int`: the low half of the word);
/// `None` before the frame's first instruction.
pub fn lasti_offset(table: LineTable, instr: u64) -> Option<u64> {
    let lasti = u64::try_from(instr as u32 as i32).ok()?;
    Some(match table {
        LineTable::Pairs => lasti * 2,
        _ => lasti,
    })
}

/// Code units past the end of 3.8's and 3.9's tables that keep the last
/// line (their last line runs to the end of the code).
const LNOTAB_TAIL_UNITS: u64 = 1 << 30;

/// The runs of lines (in 2-byte code units) of 3.8's and 3.9's `co_lnotab`:
/// pairs of (byte offset increment, signed line increment), the line
/// changing at each pair's offset.
pub fn lnotab(table: &[u8], first_line: u32) -> Vec<Entry> {
    let mut line = i64::from(first_line);
    let mut entries = Vec::with_capacity(table.len() / 2 + 1);
    for pair in table.chunks_exact(2) {
        entries.push((u64::from(pair[0]) / 2, line_number(line)));
        line = line.saturating_add(i64::from(pair[1] as i8));
    }
    entries.push((LNOTAB_TAIL_UNITS, line_number(line)));
    entries
}

/// The runs of lines of 3.10's `co_linetable`: pairs of (bytes covered,
/// signed line change; -128: no line) laid end to end.
pub fn pairs(table: &[u8], first_line: u32) -> Vec<Entry> {
    let mut line = i64::from(first_line);
    table
        .chunks_exact(2)
        .map(|pair| {
            let delta = pair[1] as i8;
            let known = (delta != -128).then(|| {
                line = line.saturating_add(i64::from(delta));
                line
            });
            (u64::from(pair[0]) / 2, known.and_then(line_number))
        })
        .collect()
}

/// A line read from a table (the tenant's: out of range is line 0).
fn line_number(line: i64) -> Option<u32> {
    Some(u32::try_from(line).unwrap_or(0))
}

/// [`pthread_tid_offset`] for process `pid` whose thread states `layout`
/// describes (its runtime's address set).
pub fn find_pthread_tid(pid: u32, layout: &Process) -> Option<u32> {
    let mut read = |address: u64| crate::procs::memory::read_u64(pid, address);
    let pthreads: Vec<u64> = super::threads::states_of(&mut read, layout, MAX_CALIBRATION_STATES)
        .into_iter()
        .filter_map(|state| read(state.checked_add(u64::from(layout.thread_pthread))?))
        .filter(|&pthread| pthread != 0)
        .collect();
    pthread_tid_offset(&pthreads, &namespace_tids(pid), &mut |address| {
        crate::procs::memory::read_u32(pid, address)
    })
}

/// Thread states whose `pthread_t` the calibration reads at most.
const MAX_CALIBRATION_STATES: usize = 64;

/// The ids of `pid`'s threads as its own pid namespace numbers them (the
/// last field of `NSpid:` in each thread's status).
fn namespace_tids(pid: u32) -> HashSet<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashSet::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .filter_map(|status| {
            let line = status.lines().find(|line| line.starts_with("NSpid:"))?;
            line.split_whitespace().last()?.parse().ok()
        })
        .collect()
}

/// Offsets at which glibc (x86_64, aarch64) and musl keep a thread's id in
/// their `struct pthread`, tried before any other.
const KNOWN_TID_OFFSETS: [u32; 3] = [0x2d0, 0xd0, 48];

/// Bytes of a `struct pthread` searched when no known offset fits.
const TID_SEARCH_BYTES: u32 = 0x800;

/// Where the thread id is in the C library's `struct pthread`, given the
/// thread states' `pthread_t`s and the ids of the process's threads (in its
/// pid namespace): the first offset at which every state reads a distinct
/// id of the process. `read` reads a `u32` of the process.
pub fn pthread_tid_offset(
    pthreads: &[u64],
    tids: &HashSet<u32>,
    read: &mut impl FnMut(u64) -> Option<u32>,
) -> Option<u32> {
    if pthreads.is_empty() {
        return None;
    }
    let mut fits = |offset: u32| {
        let mut seen = HashSet::new();
        pthreads.iter().all(|&pthread| {
            pthread
                .checked_add(u64::from(offset))
                .and_then(&mut *read)
                .is_some_and(|tid| tids.contains(&tid) && seen.insert(tid))
        })
    };
    KNOWN_TID_OFFSETS
        .into_iter()
        .chain((0..TID_SEARCH_BYTES).step_by(4))
        .find(|&offset| fits(offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::runtime::python::Lines;

    #[test]
    fn lnotab_lines() {
        // Bytes 0..6 on line 10, 6..20 on 12, 20.. on 9 (a loop's
        // condition moved before its body); lines by code unit.
        let table = [6, 2, 14, (-3i8) as u8];
        let lines = Lines::from_entries(lnotab(&table, 10).into_iter());
        for (unit, line) in [(0, 10), (2, 10), (3, 12), (9, 12), (10, 9), (5000, 9)] {
            assert_eq!(lines.line(unit), line, "unit {unit}");
        }
        // An odd byte at the end is not a pair.
        let lines = Lines::from_entries(lnotab(&[6, 2, 1], 10).into_iter());
        assert_eq!(lines.line(100), 12);
    }

    #[test]
    fn pairs_310_lines() {
        // Bytes 0..4 on line 5 (+0 is still a range), 4..10 on 7, 10..12
        // none, a zero-length entry moving the line to 9 before 12..16.
        let table = [4, 0, 6, 2, 2, (-128i8) as u8, 0, 2, 4, 0];
        let lines = Lines::from_entries(pairs(&table, 5).into_iter());
        for (unit, line) in [(0, 5), (2, 7), (4, 7), (5, 0), (6, 9), (7, 9), (8, 0)] {
            assert_eq!(lines.line(unit), line, "unit {unit}");
        }
    }

    #[test]
    fn lasti_is_a_signed_int_in_the_low_half() {
        assert_eq!(
            lasti_offset(LineTable::Lnotab, 0xdead_beef_0000_0010),
            Some(16)
        );
        assert_eq!(lasti_offset(LineTable::Pairs, 8), Some(16));
        assert_eq!(lasti_offset(LineTable::Pairs, 0xffff_ffff), None);
    }

    #[test]
    fn the_thread_id_offset_is_where_every_state_reads_its_own_id() {
        let memory = std::collections::HashMap::from([
            // glibc's offset on x86_64 holds each thread's id...
            (0x1_02d0, 40),
            (0x2_02d0, 41),
            // ...and 0x100 one id for both: not the field.
            (0x1_0100, 40),
            (0x2_0100, 40),
            // Another C library: 0x8 is not it (same id), 0x10 is.
            (0x3_0008, 40),
            (0x4_0008, 40),
            (0x3_0010, 41),
            (0x4_0010, 40),
        ]);
        let mut read = |address: u64| memory.get(&address).copied();
        let tids = HashSet::from([40, 41]);
        assert_eq!(
            pthread_tid_offset(&[0x1_0000, 0x2_0000], &tids, &mut read),
            Some(0x2d0)
        );
        assert_eq!(
            pthread_tid_offset(&[0x3_0000, 0x4_0000], &tids, &mut read),
            Some(0x10)
        );
        // Ids that are not the process's threads', and no threads.
        let others = HashSet::from([7]);
        assert_eq!(pthread_tid_offset(&[0x1_0000], &others, &mut read), None);
        assert_eq!(pthread_tid_offset(&[], &tids, &mut read), None);
    }
}
