//! The thread map: each Python process's thread states, read on the host
//! from its interpreter's thread list and handed to the kernel
//! (`hostprof_common::MAP_PYTHON_THREADS`), so that the sampler finds a
//! thread's state at once however many threads the process has. Its own
//! search looks only at the newest `python::MAX_THREADS` states (new threads
//! are at the head of the list): a thread older than those, in a pool of 200
//! workers, was found by nothing before.
//!
//! The map is filled when a process is registered and again when one of its
//! samples says the kernel's search gave up (`reason::THREAD_LIMIT`); the
//! kernel checks each entry against the state's own thread id, so an entry
//! of a thread that exited is never used for another.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use hostprof_common::python::{self as py, ThreadKey};

use crate::procs::memory;

/// The kernel map of thread states.
pub type ThreadMap = BpfHashMap<MapData, ThreadKey, u64>;

/// Thread states read from one process's list at most: bounds the work a
/// process (or a corrupt, cyclic list) can cause per refresh.
const MAX_LISTED: usize = 4096;

/// How soon a process's list may be read again. Doubled, up to
/// [`MAX_INTERVAL`], each time a refresh finds no thread it did not know:
/// a thread that is not Python's (a native library's) misses for good,
/// and must not have the list read ten times a second.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const MAX_INTERVAL: Duration = Duration::from_secs(5);

/// What the map holds of one process.
struct Listed {
    tids: HashSet<u32>,
    at: Instant,
    interval: Duration,
}

/// The thread map and what the agent put in it (the attribution thread's
/// `Python` owns one).
#[derive(Default)]
pub struct Threads {
    map: Option<ThreadMap>,
    processes: HashMap<u32, Listed>,
    /// The map was found full once (logged once).
    full: bool,
}

impl Threads {
    pub fn new(map: Option<ThreadMap>) -> Self {
        Threads {
            map,
            ..Default::default()
        }
    }

    /// Reads `pid`'s thread list (unless read too recently) and puts its
    /// thread states in the map; threads gone since leave it.
    pub fn refresh(&mut self, pid: u32, layout: &py::Process) {
        let Some(map) = &mut self.map else { return };
        let previous = self.processes.get(&pid);
        if previous.is_some_and(|listed| listed.at.elapsed() < listed.interval) {
            return;
        }
        let states = list(
            &mut |address| memory::read_u64(pid, address),
            layout,
            MAX_LISTED,
        );
        let tids: HashSet<u32> = states.iter().map(|&(tid, _)| tid).collect();
        let interval = match previous {
            Some(listed) if tids.is_subset(&listed.tids) => (listed.interval * 2).min(MAX_INTERVAL),
            _ => MIN_INTERVAL,
        };
        if let Some(listed) = previous {
            for &tid in listed.tids.difference(&tids) {
                let _ = map.remove(&ThreadKey { tgid: pid, tid });
            }
        }
        for &(tid, state) in &states {
            if let Err(err) = map.insert(ThreadKey { tgid: pid, tid }, state, 0)
                && !self.full
            {
                // The kernel's own search still finds the newest threads.
                tracing::info!(
                    "pid {pid}: the kernel's map of Python threads is full ({} threads; {err}): \
                     threads older than the newest {} of a process may lose their Python frames",
                    py::MAX_THREAD_STATES,
                    py::MAX_THREADS
                );
                self.full = true;
            }
        }
        tracing::debug!("pid {pid}: {} Python thread states", states.len());
        self.processes.insert(
            pid,
            Listed {
                tids,
                at: Instant::now(),
                interval,
            },
        );
    }

    /// Takes `pid`'s thread states out of the map.
    pub fn forget(&mut self, pid: u32) {
        let (Some(listed), Some(map)) = (self.processes.remove(&pid), &mut self.map) else {
            return;
        };
        for tid in listed.tids {
            let _ = map.remove(&ThreadKey { tgid: pid, tid });
        }
    }
}

/// The thread states of the runtime's first interpreter (the one the kernel
/// walks) with their threads' ids, at most `max`, read with `read` (a `u64`
/// at an address of the process). Stops at the first unreadable state.
fn list(
    read: &mut impl FnMut(u64) -> Option<u64>,
    layout: &py::Process,
    max: usize,
) -> Vec<(u32, u64)> {
    let mut states = Vec::new();
    for state in states_of(read, layout, max) {
        let Some(tid) = thread_id(read, layout, state) else {
            break;
        };
        // 0 until the thread has started; not an id the kernel looks for.
        if let Ok(tid) = u32::try_from(tid)
            && tid != 0
        {
            states.push((tid, state));
        }
    }
    states
}

/// The addresses of the first interpreter's thread states, at most `max`
/// (a cyclic list ends there).
pub(super) fn states_of(
    read: &mut impl FnMut(u64) -> Option<u64>,
    layout: &py::Process,
    max: usize,
) -> Vec<u64> {
    let mut at = |base: u64, offset: u32| base.checked_add(u64::from(offset)).and_then(&mut *read);
    let Some(mut state) = at(layout.runtime, layout.interpreters_head)
        .and_then(|interpreter| at(interpreter, layout.threads_head))
    else {
        return Vec::new();
    };
    let mut states = Vec::new();
    while state != 0 && states.len() < max {
        states.push(state);
        let Some(next) = at(state, layout.thread_next) else {
            break;
        };
        state = next;
    }
    states
}

/// The id of the thread of the state at `state`, as the kernel reads it
/// (`agent-ebpf`'s `python::thread_id`): CPython's `native_thread_id`, or
/// the id in the thread's `struct pthread` (3.8 to 3.10).
fn thread_id(
    read: &mut impl FnMut(u64) -> Option<u64>,
    layout: &py::Process,
    state: u64,
) -> Option<u64> {
    let mut at = |base: u64, offset: u32| base.checked_add(u64::from(offset)).and_then(&mut *read);
    if layout.thread_native_id != py::ABSENT {
        return at(state, layout.thread_native_id);
    }
    let pthread = at(state, layout.thread_pthread)?;
    at(pthread, layout.pthread_tid).map(|word| word & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process's memory: `u64`s by address.
    struct Memory(HashMap<u64, u64>);

    const LAYOUT: py::Process = py::Process {
        runtime: 0x1000,
        pidns_dev: 0,
        pidns_ino: 0,
        interpreters_head: 0x10,
        threads_head: 0x20,
        thread_next: 0x8,
        thread_native_id: 0x30,
        thread_frame: 0,
        cframe_frame: 0,
        frame_previous: 0,
        frame_code: 0,
        frame_instr: 0,
        frame_owner: 0,
        frame_is_entry: 0,
        owner_cstack: 0,
        owner_skip: 0,
        thread_pthread: 0,
        pthread_tid: 0,
    };

    /// An interpreter at 0x2000 whose list holds `states` (address, tid),
    /// linked in order; the last one's `next` is `last_next`.
    fn memory(states: &[(u64, u64)], last_next: u64) -> Memory {
        let mut memory = HashMap::from([(0x1010, 0x2000)]);
        memory.insert(0x2020, states.first().map_or(0, |&(address, _)| address));
        for (at, &(address, tid)) in states.iter().enumerate() {
            memory.insert(address + 0x30, tid);
            let next = states.get(at + 1).map_or(last_next, |&(next, _)| next);
            memory.insert(address + 0x8, next);
        }
        Memory(memory)
    }

    fn listed(memory: &Memory, max: usize) -> Vec<(u32, u64)> {
        list(&mut |address| memory.0.get(&address).copied(), &LAYOUT, max)
    }

    #[test]
    fn every_thread_of_a_long_list_is_found() {
        let states: Vec<(u64, u64)> = (0..300)
            .map(|n| (0x10_0000 + n * 0x100, 1000 + n))
            .collect();
        let found = listed(&memory(&states, 0), MAX_LISTED);
        assert_eq!(found.len(), 300);
        assert_eq!(found[299], (1299, 0x10_0000 + 299 * 0x100));
    }

    #[test]
    fn a_cyclic_list_is_read_to_the_bound_and_no_further() {
        let states = [(0x5000, 7), (0x6000, 8)];
        let found = listed(&memory(&states, 0x5000), 10);
        assert_eq!(found.len(), 10);
        assert!(found.iter().all(|&(tid, _)| tid == 7 || tid == 8));
    }

    #[test]
    fn without_native_ids_the_id_comes_from_the_pthread() {
        // 3.8 to 3.10: the state's `pthread_t` (at 0x40) points at the C
        // library's thread, whose id is at 0x2d0 (the word's low half).
        let mut memory = memory(&[(0x5000, 0)], 0);
        memory.0.insert(0x5040, 0x9000);
        memory.0.insert(0x92d0, 0xffff_0000_0000_002a);
        let layout = py::Process {
            thread_native_id: py::ABSENT,
            thread_pthread: 0x40,
            pthread_tid: 0x2d0,
            ..LAYOUT
        };
        let found = list(&mut |address| memory.0.get(&address).copied(), &layout, 10);
        assert_eq!(found, vec![(42, 0x5000)]);
    }

    #[test]
    fn unstarted_threads_and_unreadable_states_are_left_out() {
        // Thread 0x6000 has no id yet; 0x7000's `next` points nowhere.
        let states = [(0x5000, 7), (0x6000, 0), (0x7000, 9)];
        let found = listed(&memory(&states, 0xdead_0000), MAX_LISTED);
        assert_eq!(found, vec![(7, 0x5000), (9, 0x7000)]);
        // Ids that do not fit a pid are not ids.
        let found = listed(&memory(&[(0x5000, u64::MAX)], 0), MAX_LISTED);
        assert!(found.is_empty());
        // Offsets that overflow the address space read nothing.
        let layout = py::Process {
            runtime: u64::MAX,
            ..LAYOUT
        };
        let memory = memory(&states, 0);
        assert!(list(&mut |address| memory.0.get(&address).copied(), &layout, 10).is_empty());
    }
}
