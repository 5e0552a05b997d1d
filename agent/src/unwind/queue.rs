//! What the unwind service is asked: tables to load, functions to add,
//! processes to forget; served busiest first.
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Condvar, Mutex, MutexGuard},
};

use super::{SharedStats, early::StackCopy};

/// Requests waiting for the service at most; past it a new process's
/// request is dropped and counted (its next sample asks again).
pub(super) const MAX_PENDING: usize = 1024;

/// What the unwind service has been asked and not yet done: tables to load
/// (one entry per process, with how many samples asked since), processes
/// to forget. The loads are served busiest first: on a host where a build
/// starts hundreds of processes, the one burning CPU gets its tables before
/// short-lived compilers queued ahead of it.
#[derive(Debug, Default)]
pub(super) struct Queue {
    /// pid → (samples that asked, order of its first ask).
    pub(super) loads: HashMap<u32, (u64, u64)>,
    forgets: Vec<u32>,
    /// pid → addresses its walks stopped at for want of their functions'
    /// rows (see `loader::sparse`), at most
    /// [`MAX_PCS_PER_REQUEST`](super::loader::MAX_PCS_PER_REQUEST) each.
    functions: HashMap<u32, Wanted>,
    /// Processes to load even if loaded a moment ago: a large file's
    /// table they wanted is ready (see `slow`).
    pub(super) forced: HashSet<u32>,
    asked: u64,
    /// Every [`Requests`] is gone: the service ends.
    pub(super) closed: bool,
}

/// What the service does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Job {
    /// Load (or reload) the tables of a process's mappings.
    Load(u32),
    /// The process exited: drop its mappings from the kernel now.
    Forget(u32),
    /// Add the functions its walks stopped at to its tables, and those
    /// the copies' walks need on from there.
    Functions(u32, Vec<u64>, Vec<StackCopy>),
}

/// What one process asked for: addresses its walks stopped at, and copies
/// of stacks that stopped so (at most
/// [`MAX_STACKS_PER_REQUEST`](super::loader::MAX_STACKS_PER_REQUEST), one
/// per address), walked on by the service.
#[derive(Debug, Default)]
struct Wanted {
    pcs: Vec<u64>,
    stacks: Vec<(u64, StackCopy)>,
}

impl Queue {
    /// One more sample asks for `pid`'s tables; false when the queue is
    /// full and `pid` was not in it.
    pub(super) fn ask(&mut self, pid: u32) -> bool {
        if let Some((samples, _)) = self.loads.get_mut(&pid) {
            *samples += 1;
            return true;
        }
        if self.loads.len() >= MAX_PENDING {
            return false;
        }
        self.asked += 1;
        self.loads.insert(pid, (1, self.asked));
        true
    }

    pub(super) fn forget(&mut self, pid: u32) {
        if self.forgets.len() < MAX_PENDING {
            self.forgets.push(pid);
        }
    }

    /// One more sample of `pid` stopped at `pc` for want of its function's
    /// rows; false when the queue is full.
    /// `stack`: a copy of that sample's stack, if there is one.
    pub(super) fn ask_function(&mut self, pid: u32, pc: u64, stack: Option<&StackCopy>) -> bool {
        if !self.functions.contains_key(&pid) && self.functions.len() >= MAX_PENDING {
            return false;
        }
        let wanted = self.functions.entry(pid).or_default();
        if !wanted.pcs.contains(&pc) {
            if wanted.pcs.len() < super::loader::MAX_PCS_PER_REQUEST {
                wanted.pcs.push(pc);
            } else {
                super::loader::defer_functions(1);
            }
        }
        // One copy per function asked for: the other samples that stopped
        // there most likely share its callers.
        if let Some(stack) = stack {
            let stacks = &mut wanted.stacks;
            if !stacks.iter().any(|(asked, _)| *asked == pc) {
                if stacks.len() < super::loader::MAX_STACKS_PER_REQUEST {
                    stacks.push((pc, stack.clone()));
                } else {
                    super::loader::defer_functions(1);
                }
            }
        }
        true
    }

    /// Exits first (cheap, and they free room), then functions to add,
    /// then the process with the
    /// most samples waiting, the longest waiting among equals.
    pub(super) fn next(&mut self) -> Option<Job> {
        if let Some(pid) = self.forgets.pop() {
            return Some(Job::Forget(pid));
        }
        // Cheap, and each completes stacks at once. Before loads: taking
        // turns with them (`cargo xtask bench --only scale --copies 200`,
        // the agent) loaded 114 processes in 80 s where this loads 42, but
        // left 4.8 % of stacks whole where this leaves 14.8 %: a loaded
        // process's stacks are whole only once its functions are in.
        if let Some(&pid) = self.functions.keys().next() {
            let Wanted { pcs, stacks } = self.functions.remove(&pid).unwrap_or_default();
            let stacks = stacks.into_iter().map(|(_, stack)| stack).collect();
            return Some(Job::Functions(pid, pcs, stacks));
        }
        let (&pid, _) = self
            .loads
            .iter()
            .max_by_key(|&(_, &(samples, order))| (samples, std::cmp::Reverse(order)))?;
        self.loads.remove(&pid);
        Some(Job::Load(pid))
    }
}

/// The queue and the service's wakeup.
#[derive(Default)]
pub(super) struct Shared {
    queue: Mutex<Queue>,
    pub(super) ready: Condvar,
}

impl Shared {
    pub(super) fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Closes the queue when the last [`Requests`] goes.
pub(super) struct Closer(pub(super) Arc<Shared>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.queue().closed = true;
        self.0.ready.notify_all();
    }
}

/// Asks the unwind service to load processes' tables; cheap to call per
/// sample (a process already waiting only has its count raised).
#[derive(Clone)]
pub struct Requests {
    pub(super) shared: Arc<Shared>,
    pub(super) _closer: Arc<Closer>,
    /// Ask at every exec, not only at samples the kernel could not
    /// unwind (targeted recordings: every event is of a wanted process).
    pub(super) eager: bool,
    pub(super) stats: SharedStats,
}

impl Requests {
    /// Asks for `pid`'s tables (again).
    pub fn request(&self, pid: u32) {
        let (asked, new) = {
            let mut queue = self.shared.queue();
            let before = queue.loads.len();
            let asked = queue.ask(pid);
            (asked, queue.loads.len() > before)
        };
        if !asked {
            self.count_dropped();
        } else if new {
            self.shared.ready.notify_one();
        }
    }

    /// Asks for the rows of the function at `pc` in `pid`, where one of
    /// its walks stopped (`reason::NOT_LOADED`), and, given that walk's
    /// stack copy, for those of the functions its callers are in.
    pub fn request_function(&self, pid: u32, pc: u64, stack: Option<&StackCopy>) {
        let (asked, new) = {
            let mut queue = self.shared.queue();
            let before = queue.functions.len();
            let asked = queue.ask_function(pid, pc, stack);
            (asked, queue.functions.len() > before)
        };
        if !asked {
            self.count_dropped();
        } else if new {
            self.shared.ready.notify_one();
        }
    }

    /// Acts on a process event: a new image's tables are asked for at once
    /// (eager), an exited process's mappings leave the kernel.
    pub fn on_event(&self, event: &hostprof_common::ProcessEvent) {
        match event.kind {
            // Not at a fork: the child usually execs at once, and its
            // parent's maps read meanwhile would be written over the new
            // image's (a child that does not exec is asked for at its first
            // sample, whose stack copy covers the wait).
            hostprof_common::PROCESS_EVENT_EXEC if self.eager => self.request(event.tgid),
            // Best effort: the periodic sweep catches what does not fit.
            hostprof_common::PROCESS_EVENT_EXIT => {
                self.shared.queue().forget(event.tgid);
                self.shared.ready.notify_one();
            }
            _ => {}
        }
    }

    fn count_dropped(&self) {
        self.stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .requests_dropped += 1;
    }
}
