//! Process metadata from `/proc`: who a pid is, which container it runs in,
//! and what it has mapped.
//!
//! [`ProcessTable`] caches one entry per process and refreshes it when the
//! process is new, when an address falls outside every known mapping (an
//! exec or a `dlopen` happened since), or when the pid was reused. Lookups
//! happen as samples arrive, so a process started after the agent is read on
//! its first sample.
mod cgroup;
mod maps;

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

pub use cgroup::{CgroupIdentity, parse_cgroup};
pub use maps::{ExecutableMaps, MapsError, parse_maps};

use crate::model::{Mapping, ProcessInfo};

/// Re-read a process's maps at most this often when addresses miss.
const MIN_REFRESH_INTERVAL: Duration = Duration::from_millis(50);

/// Check at most this often whether a cached pid now belongs to another
/// process. The check reads /proc/PID/stat: done per sample it was most of
/// the agent's CPU on a busy host.
const REUSE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

struct Process {
    info: Arc<ProcessInfo>,
    /// `starttime` from /proc/PID/stat: tells a reused pid from the old process.
    start_time: u64,
    maps: ExecutableMaps,
    refreshed_at: Instant,
    /// When the pid was last checked for reuse.
    checked_at: Instant,
    /// False when /proc had nothing (exited, or caught mid-fork).
    readable: bool,
}

/// Cache of per-process metadata.
#[derive(Default)]
pub struct ProcessTable {
    processes: HashMap<u32, Process>,
}

impl ProcessTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of processes cached.
    pub fn len(&self) -> usize {
        self.processes.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }

    /// Metadata for `pid`; `comm` names the process if /proc no longer has it.
    pub fn info(&mut self, pid: u32, comm: &str) -> Arc<ProcessInfo> {
        self.entry(pid, comm).info.clone()
    }

    /// The executable mapping holding user address `address` of `pid`, and the
    /// address's offset in the mapped file.
    pub fn mapping_of(
        &mut self,
        pid: u32,
        comm: &str,
        address: u64,
    ) -> Option<(Arc<Mapping>, u64)> {
        let process = self.entry(pid, comm);
        if let Some(hit) = process.maps.find(address) {
            return Some(hit);
        }
        // A miss on a live process means its maps changed (exec, dlopen, JIT).
        if process.refreshed_at.elapsed() < MIN_REFRESH_INTERVAL {
            return None;
        }
        let fresh = read_process(pid, comm);
        let hit = fresh.maps.find(address);
        self.processes.insert(pid, fresh);
        hit
    }

    /// Drops processes that have exited. Call periodically.
    pub fn forget_exited(&mut self) {
        self.processes.retain(|pid, _| is_alive(*pid));
    }

    fn entry(&mut self, pid: u32, comm: &str) -> &mut Process {
        let stale = match self.processes.get_mut(&pid) {
            None => true,
            // A first look can miss a process caught mid-fork or mid-exec:
            // look again, rate-limited, while samples of it keep coming.
            Some(cached) if !cached.readable => {
                cached.refreshed_at.elapsed() >= MIN_REFRESH_INTERVAL
            }
            // Pid reuse: same number, another process. Only worth checking when
            // the cached entry is old enough to have been reused.
            Some(cached) => {
                let now = Instant::now();
                if now.duration_since(cached.checked_at) > REUSE_CHECK_INTERVAL {
                    cached.checked_at = now;
                    start_time(pid).is_some_and(|start| start != cached.start_time)
                } else {
                    false
                }
            }
        };
        if stale {
            self.processes.insert(pid, read_process(pid, comm));
        }
        self.processes.get_mut(&pid).expect("inserted above")
    }
}

/// Whether a process with this pid exists now (in our pid namespace).
pub fn is_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn start_time(pid: u32) -> Option<u64> {
    procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()
        .map(|stat| stat.starttime)
}

fn read_process(pid: u32, comm: &str) -> Process {
    let now = Instant::now();
    let stat = procfs::process::Process::new(pid as i32).and_then(|proc| Ok((proc.stat()?, proc)));
    let (stat, proc) = match stat {
        Ok(found) => found,
        Err(err) => {
            tracing::debug!("pid {pid}: not readable in /proc: {err}");
            return unreadable(pid, comm, now);
        }
    };
    let exe_path = proc
        .exe()
        .map(|path| strip_deleted(&path.to_string_lossy()).into());
    let maps = match std::fs::read(format!("/proc/{pid}/maps")).map(|text| parse_maps(&text)) {
        Ok(Ok(maps)) => maps,
        Ok(Err(err)) => {
            tracing::debug!("pid {pid}: {err}");
            ExecutableMaps::default()
        }
        Err(err) => {
            tracing::debug!("pid {pid}: cannot read its maps: {err}");
            ExecutableMaps::default()
        }
    };
    // A process whose cgroup file cannot be read counts as a host process.
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|text| parse_cgroup(&text))
        .unwrap_or_default();
    let info = ProcessInfo {
        pid,
        comm: stat.comm.as_str().into(),
        exe_path: exe_path.unwrap_or_else(|_| "".into()),
        container_id: cgroup.container_id.map(Into::into),
        pod_uid: cgroup.pod_uid.map(Into::into),
    };
    Process {
        info: Arc::new(info),
        start_time: stat.starttime,
        maps,
        refreshed_at: now,
        checked_at: now,
        readable: true,
    }
}

fn unreadable(pid: u32, comm: &str, now: Instant) -> Process {
    let info = ProcessInfo {
        pid,
        comm: comm.into(),
        exe_path: "".into(),
        container_id: None,
        pod_uid: None,
    };
    Process {
        info: Arc::new(info),
        start_time: 0,
        maps: ExecutableMaps::default(),
        refreshed_at: now,
        checked_at: now,
        readable: false,
    }
}

/// `/proc` appends " (deleted)" to files removed after they were mapped.
pub(crate) fn strip_deleted(path: &str) -> &str {
    path.strip_suffix(" (deleted)").unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_process() {
        let mut table = ProcessTable::new();
        let pid = std::process::id();
        let info = table.info(pid, "ignored");
        assert_eq!(info.pid, pid);
        assert_eq!(
            &*info.exe_path,
            std::env::current_exe().unwrap().to_str().unwrap()
        );
        // The address of this very function lies in our executable's mapping.
        let here = reads_our_own_process as *const () as u64;
        let (mapping, offset) = table
            .mapping_of(pid, "ignored", here)
            .expect("text is mapped");
        assert_eq!(&*mapping.path, &*info.exe_path);
        assert!(offset >= mapping.file_offset);
    }

    #[test]
    fn an_exited_process_keeps_its_comm() {
        let mut table = ProcessTable::new();
        // Pids above pid_max are never valid.
        let info = table.info(u32::MAX - 1, "gone");
        assert_eq!(&*info.comm, "gone");
        assert_eq!(info.exe_name(), "gone");
        assert!(table.mapping_of(u32::MAX - 1, "gone", 0x1000).is_none());
    }
}
