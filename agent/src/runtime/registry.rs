//! What a runtime knows of each process, and the kernel map of the ones it
//! registered: one owner for both, so a process forgotten on the host
//! leaves the kernel's map too, and a full map is counted the same way for
//! every runtime.
use std::collections::HashMap;

use aya::{
    Pod,
    maps::{HashMap as BpfHashMap, MapData},
};

/// Per pid, a runtime's state `S`; per registered pid, its kernel record `V`.
pub struct Registry<S, V: Pod> {
    states: HashMap<u32, S>,
    /// None: nothing is registered (tests, or a kernel without the walk).
    map: Option<BpfHashMap<MapData, u32, V>>,
    /// Names what is registered in a failure's log line ("its JVM").
    what: &'static str,
    /// Whether a state is one with a record in the kernel's map.
    registered: fn(&S) -> bool,
    /// A record here is read only by the whole sampling program, not the
    /// lean one: registering one asks for it (`super::want_walks`).
    whole_program: bool,
    /// The `hostprof_common::present` bit a record here sets, or 0.
    present: u8,
}

impl<S, V: Pod> Registry<S, V> {
    pub fn new(
        map: Option<BpfHashMap<MapData, u32, V>>,
        what: &'static str,
        registered: fn(&S) -> bool,
    ) -> Self {
        Registry {
            states: HashMap::new(),
            map,
            what,
            registered,
            whole_program: false,
            present: 0,
        }
    }

    /// The kernel looks a process's record here up only when one was
    /// registered in its tgid's slot: registering one sets `bit` there
    /// (`super::present`), forgetting it clears it.
    pub fn marks_present(mut self, bit: u8) -> Self {
        self.present = bit;
        self
    }

    /// Records registered here are read by the whole sampling program only
    /// (a JIT runtime's walk, Go's labels): the first one asks for it.
    pub fn read_by_the_whole_program(mut self) -> Self {
        self.whole_program = true;
        self
    }

    /// Whether registrations reach a kernel map.
    pub fn has_map(&self) -> bool {
        self.map.is_some()
    }

    pub fn get(&self, pid: u32) -> Option<&S> {
        self.states.get(&pid)
    }

    pub fn get_mut(&mut self, pid: u32) -> Option<&mut S> {
        self.states.get_mut(&pid)
    }

    pub fn set(&mut self, pid: u32, state: S) {
        self.states.insert(pid, state);
    }

    /// Tells the kernel `pid`'s `record` (kept or replaced); whether it
    /// is there now. A failure is logged, and counted when the map is full
    /// (the process is then sampled without this runtime's part).
    pub fn register(&mut self, pid: u32, record: V) -> bool {
        let Some(map) = &mut self.map else {
            return false;
        };
        if self.present != 0 {
            super::present::mark(self.present, pid);
        }
        match map.insert(pid, record, 0) {
            Ok(()) => {
                if self.whole_program {
                    super::want_walks();
                }
                true
            }
            Err(err) => {
                if self.present != 0 {
                    super::present::unmark(self.present, pid);
                }
                super::count_if_full(&err);
                tracing::info!(
                    "pid {pid}: cannot register {} with the kernel: {err}",
                    self.what
                );
                false
            }
        }
    }

    /// Forgets `pid` (exec'd or exited), out of the kernel map too.
    pub fn forget(&mut self, pid: u32) {
        if let Some(state) = self.states.remove(&pid)
            && (self.registered)(&state)
            && let Some(map) = &mut self.map
        {
            let _ = map.remove(&pid);
            if self.present != 0 {
                super::present::unmark(self.present, pid);
            }
        }
    }

    /// The pids known.
    pub fn pids(&self) -> Vec<u32> {
        self.states.keys().copied().collect()
    }

    /// The pids known for which `alive` is false.
    pub fn gone(&self, alive: impl FnMut(u32) -> bool) -> Vec<u32> {
        super::gone(&self.states, alive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_what_it_knows_of_a_process() {
        // No kernel map: states only (what the tests of each runtime see).
        let mut registry: Registry<bool, u64> = Registry::new(None, "its test", |state| *state);
        assert!(!registry.has_map());
        registry.set(1, true);
        registry.set(2, false);
        assert!(!registry.register(1, 7), "no map to register in");
        let mut pids = registry.pids();
        pids.sort_unstable();
        assert_eq!(pids, [1, 2]);
        registry.forget(1);
        assert_eq!(registry.get(1), None);
        assert_eq!(registry.get(2), Some(&false));
        assert_eq!(registry.pids(), [2]);
        assert_eq!(registry.gone(|pid| pid == 2), Vec::<u32>::new());
        assert_eq!(registry.gone(|_| false), [2]);
    }
}
