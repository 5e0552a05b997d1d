//! Process metadata from `/proc`: who a pid is, which container it runs in,
//! and what it has mapped.
//!
//! [`ProcessTable`] keeps, per pid, the images it ran: a new one starts at
//! each fork or exec the kernel reports ([`ProcessEvent`]s), so a reused pid
//! is told from the old process without reading `/proc` per sample. Each
//! image is read from `/proc` once, at its first sample (a forked child
//! starts as a copy of its parent and is not read at all), and again only
//! when an address misses every mapping (a `dlopen`), with backoff, or
//! when a search of its maps (for its process context, or for a library
//! loaded since it published one) finds a library its own do not hold
//! (`dlopen`ed, see [`identity::Recheck`]). Samples
//! go to the image that ran at their kernel time, so samples taken before an
//! exec or a pid reuse keep their old names. What a process says it is
//! (`service.name`, …: its OpenTelemetry process context or environment)
//! is read with it and re-checked while it runs ([`identity`]). [`memory`]
//! reads a process's memory, for that and for the language runtimes.
mod cgroup;
mod environment;
mod events;
pub mod go_labels;
mod identity;
mod maps;
pub mod memory;
pub mod otel_ctx;
pub mod thread_attrs;

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

pub use cgroup::{CgroupIdentity, parse_cgroup};
pub use events::{EventSource, decode_event};
use hostprof_common::{PROCESS_EVENT_EXEC, PROCESS_EVENT_EXIT, PROCESS_EVENT_FORK, ProcessEvent};
use identity::Identity;
pub use maps::{ExecutableMaps, MapsError, parse_maps};

use crate::model::{Frame, Mapping, ProcessInfo};
use thread_attrs::KeyMap;

/// Re-read a process's maps at most this often when addresses miss; the
/// interval doubles, up to [`MAX_REFRESH_INTERVAL`], while re-reading finds
/// nothing new (JIT code, anonymous memory).
const MIN_REFRESH_INTERVAL: Duration = Duration::from_millis(50);
const MAX_REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// Images kept per pid: enough for samples still in flight across a few
/// quick execs.
const MAX_IMAGES: usize = 4;

/// How long an exited process is kept for its samples still in flight.
const EXIT_LINGER: Duration = Duration::from_secs(2);

#[derive(Clone)]
struct Process {
    info: Arc<ProcessInfo>,
    maps: ExecutableMaps,
    refreshed_at: Instant,
    /// Wait at least this long before the next re-read on a miss.
    refresh_after: Duration,
    /// False when /proc had nothing (exited, or caught mid-fork).
    readable: bool,
    /// Where `info.service` came from, and when to look again.
    identity: Identity,
}

impl Process {
    /// Looks at the identity again when due. Samples already attributed
    /// keep the identity they ran under (a new `info`); maps read for it
    /// replace the process's when they hold a file's code its own do not
    /// (see [`identity::Recheck::maps`]).
    fn recheck_identity(&mut self, pid: u32, reads: &mut u64) {
        if !self.identity.due() {
            return;
        }
        let recheck = self.identity.recheck(pid, reads);
        if let Some(text) = recheck.maps
            && let Ok(maps) = parse_maps(&text)
            && maps.maps_files_beyond(&self.maps)
        {
            self.maps = maps;
        }
        if recheck.changed {
            self.info = Arc::new(ProcessInfo {
                service: self.identity.service(),
                thread_keys: self.identity.thread_keys(),
                ..(*self.info).clone()
            });
        }
    }
}

/// What one pid ran from kernel time `since` on.
struct Image {
    since: u64,
    /// `None` until its first sample.
    process: Option<Process>,
}

struct Entry {
    /// By `since`, at most [`MAX_IMAGES`].
    images: Vec<Image>,
    /// Kernel time the main thread exited, and when we heard of it.
    exited: Option<(u64, Instant)>,
    /// A sample used this entry since the last sweep.
    used: bool,
}

impl Entry {
    fn new(since: u64, process: Option<Process>) -> Self {
        Entry {
            images: vec![Image { since, process }],
            exited: None,
            used: true,
        }
    }

    fn push(&mut self, since: u64, process: Option<Process>) {
        let at = self.images.partition_point(|image| image.since <= since);
        self.images.insert(at, Image { since, process });
        if self.images.len() > MAX_IMAGES {
            self.images.remove(0);
        }
        self.exited = None;
    }
}

/// Figures for status lines and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Reads of a process's `/proc` files (stat, exe, maps, cgroup).
    pub proc_reads: u64,
    /// Process events applied.
    pub events: u64,
}

/// Cache of per-process metadata.
pub struct ProcessTable {
    entries: HashMap<u32, Entry>,
    /// The kernel reports forks: a sample after an exit with no fork since
    /// is late work of the exited process, not a new one.
    fork_events: bool,
    /// Read `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` from processes'
    /// environments (setting `read-process-environment`).
    read_environment: bool,
    stats: TableStats,
}

impl Default for ProcessTable {
    fn default() -> Self {
        ProcessTable {
            entries: HashMap::new(),
            fork_events: false,
            read_environment: true,
            stats: TableStats::default(),
        }
    }
}

impl ProcessTable {
    /// A table without process events: a pid is one process until it exits.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table fed with the kernel's forks, execs and exits
    /// ([`ProcessTable::apply`]).
    pub fn with_events() -> Self {
        ProcessTable {
            fork_events: true,
            ..Self::default()
        }
    }

    /// Whether processes' environments are read (on by default).
    pub fn read_environment(&mut self, on: bool) {
        self.read_environment = on;
    }

    /// Number of processes cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn stats(&self) -> TableStats {
        self.stats
    }

    /// Takes in a fork, exec or exit.
    pub fn apply(&mut self, event: &ProcessEvent) {
        self.stats.events += 1;
        let (pid, at) = (event.tgid, event.ktime_ns);
        match event.kind {
            PROCESS_EVENT_FORK => {
                // The child runs its parent's image until it execs: a copy
                // under its own pid, no /proc read.
                let template = self
                    .entries
                    .get(&event.parent_tgid)
                    .and_then(|parent| parent.images.last())
                    .and_then(|image| image.process.as_ref())
                    .filter(|parent| parent.readable)
                    .map(|parent| {
                        let identity = parent.identity.forked();
                        Process {
                            info: Arc::new(ProcessInfo {
                                pid,
                                service: identity.service(),
                                thread_keys: identity.thread_keys(),
                                ..(*parent.info).clone()
                            }),
                            identity,
                            ..parent.clone()
                        }
                    });
                match self.entries.get_mut(&pid) {
                    Some(entry) => entry.push(at, template),
                    None => {
                        self.entries.insert(pid, Entry::new(at, template));
                    }
                }
            }
            PROCESS_EVENT_EXEC => match self.entries.get_mut(&pid) {
                Some(entry) => entry.push(at, None),
                None => {
                    self.entries.insert(pid, Entry::new(at, None));
                }
            },
            PROCESS_EVENT_EXIT => {
                if let Some(entry) = self.entries.get_mut(&pid) {
                    entry.exited = Some((at, Instant::now()));
                }
            }
            _ => {}
        }
    }

    /// Metadata for `pid` at kernel time `ktime_ns`; `comm` names the
    /// process if /proc no longer has it.
    pub fn info(&mut self, pid: u32, comm: &str, ktime_ns: u64) -> Arc<ProcessInfo> {
        self.image(pid, comm, ktime_ns).0.info.clone()
    }

    /// A thread record of `pid` named a key index past its key map: reads
    /// its process context again unless it was just read (see
    /// `Identity::hurry`), and returns the key map known now (the caller's
    /// may be older: a look at the process while its sample was attributed
    /// may have found it).
    pub fn key_map_stale(&mut self, pid: u32) -> Option<Arc<KeyMap>> {
        let process = self
            .entries
            .get_mut(&pid)
            .and_then(|entry| entry.images.last_mut())
            .and_then(|image| image.process.as_mut())
            .filter(|process| process.readable)?;
        process.identity.hurry();
        process.recheck_identity(pid, &mut self.stats.proc_reads);
        process.info.thread_keys.clone()
    }

    /// The executable mapping holding user address `address` of `pid` at
    /// kernel time `ktime_ns`, and the address's offset in the mapped file.
    pub fn mapping_of(
        &mut self,
        pid: u32,
        comm: &str,
        ktime_ns: u64,
        address: u64,
    ) -> Option<(Arc<Mapping>, u64)> {
        let reads = &mut self.stats.proc_reads;
        let read_environment = self.read_environment;
        let (process, latest) = image_of(
            &mut self.entries,
            (self.fork_events, read_environment),
            reads,
            pid,
            comm,
            ktime_ns,
        );
        if let Some(hit) = process.maps.find(address) {
            return Some(hit);
        }
        // A miss in the running image means its maps changed (dlopen, JIT);
        // /proc now says nothing about an image replaced since.
        if !latest || process.refreshed_at.elapsed() < process.refresh_after {
            return None;
        }
        *reads += 1;
        let previous = process.readable.then_some(&process.identity);
        let fresh = read_process(pid, comm, previous, read_environment);
        // Gone, or no memory left (a zombie's maps are empty): the process
        // exited, and /proc has nothing newer than what was read while it
        // ran, which its samples still being attributed need (replacing it
        // left them without their maps, and their thread context's keys).
        if !fresh.readable || fresh.maps.is_empty() {
            process.refreshed_at = Instant::now();
            process.refresh_after = (process.refresh_after * 2).min(MAX_REFRESH_INTERVAL);
            return None;
        }
        let hit = fresh.maps.find(address);
        let backoff = if hit.is_some() {
            MIN_REFRESH_INTERVAL
        } else {
            (process.refresh_after * 2).min(MAX_REFRESH_INTERVAL)
        };
        *process = Process {
            refresh_after: backoff,
            ..fresh
        };
        hit
    }

    /// Fills in the mapping and file offset of `frames`' user addresses (as
    /// [`ProcessTable::mapping_of`], those `wanted` only), with the
    /// process looked up once per sample rather than once per frame.
    pub fn map_frames(
        &mut self,
        pid: u32,
        comm: &str,
        ktime_ns: u64,
        frames: &mut [Frame],
        wanted: impl Fn(&Frame) -> bool,
    ) {
        // Misses (dlopen, JIT) go the slow way, which may read /proc again.
        let mut missed = Vec::new();
        let (process, _) = self.image(pid, comm, ktime_ns);
        for (at, frame) in frames.iter_mut().enumerate() {
            if !wanted(frame) {
                continue;
            }
            // A frame the kernel marked as a runtime's (see
            // `hostprof_unwind::STACK_MARK_SHIFT`) keeps its mark for the
            // runtime, its mapping found by its address.
            match process
                .maps
                .find(hostprof_unwind::without_mark(frame.address))
            {
                Some((mapping, offset)) => {
                    frame.mapping = Some(mapping);
                    frame.file_offset = offset;
                }
                None => missed.push(at),
            }
        }
        for at in missed {
            let frame = &mut frames[at];
            let address = hostprof_unwind::without_mark(frame.address);
            if let Some((mapping, offset)) = self.mapping_of(pid, comm, ktime_ns, address) {
                frame.mapping = Some(mapping);
                frame.file_offset = offset;
            }
        }
    }

    /// The executable mappings of `pid`'s image at kernel time `ktime_ns`
    /// (`u64::MAX`: the latest), as last read.
    pub fn executable_maps(&mut self, pid: u32, comm: &str, ktime_ns: u64) -> &ExecutableMaps {
        &self.image(pid, comm, ktime_ns).0.maps
    }

    /// Drops processes that have exited: those the kernel said exited a
    /// while ago, and, without an exit event, those unused since the last
    /// sweep that /proc no longer has. Call periodically.
    pub fn forget_exited(&mut self) {
        self.entries.retain(|pid, entry| {
            let used = std::mem::replace(&mut entry.used, false);
            match entry.exited {
                Some((_, heard)) => heard.elapsed() < EXIT_LINGER,
                None => used || is_alive(*pid),
            }
        });
    }

    fn image(&mut self, pid: u32, comm: &str, ktime_ns: u64) -> (&mut Process, bool) {
        image_of(
            &mut self.entries,
            (self.fork_events, self.read_environment),
            &mut self.stats.proc_reads,
            pid,
            comm,
            ktime_ns,
        )
    }
}

/// The image of `pid` that ran at `ktime_ns`, read at its first sample, and
/// whether it is the latest; the latest's identity is re-checked when due.
/// `options`: the table's (fork events, read environments).
fn image_of<'a>(
    entries: &'a mut HashMap<u32, Entry>,
    (fork_events, read_environment): (bool, bool),
    reads: &mut u64,
    pid: u32,
    comm: &str,
    ktime_ns: u64,
) -> (&'a mut Process, bool) {
    let entry = entries.entry(pid).or_insert_with(|| Entry::new(0, None));
    entry.used = true;
    // Without fork events, a sample after the exit is a new process with
    // the same pid (with them, its fork would have said so).
    if !fork_events
        && let Some((exited, _)) = entry.exited
        && ktime_ns > exited
    {
        entry.push(ktime_ns, None);
    }
    let index = entry
        .images
        .partition_point(|image| image.since <= ktime_ns)
        .saturating_sub(1);
    let latest = index + 1 == entry.images.len();
    let image = &mut entry.images[index];
    let retry = match &image.process {
        None => true,
        // A first look can miss a process caught mid-fork or mid-exec:
        // look again, rate-limited, while samples of it keep coming.
        Some(process) => {
            latest && !process.readable && process.refreshed_at.elapsed() >= MIN_REFRESH_INTERVAL
        }
    };
    if retry {
        image.process = Some(if latest {
            *reads += 1;
            read_process(pid, comm, None, read_environment)
        } else {
            // /proc shows a later image now: only the sample's comm is known.
            unreadable(pid, comm, Instant::now())
        });
    }
    let process = image.process.as_mut().expect("set above");
    if latest && process.readable {
        process.recheck_identity(pid, reads);
    }
    (process, latest)
}

/// Whether a process with this pid exists now (in our pid namespace).
pub fn is_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Reads `pid` from `/proc`; `previous`: the identity an earlier read of the
/// same image found (see [`Identity::read`]).
fn read_process(
    pid: u32,
    comm: &str,
    previous: Option<&Identity>,
    read_environment: bool,
) -> Process {
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
    let text = std::fs::read(format!("/proc/{pid}/maps")).unwrap_or_else(|err| {
        tracing::debug!("pid {pid}: cannot read its maps: {err}");
        Vec::new()
    });
    let maps = parse_maps(&text).unwrap_or_else(|err| {
        tracing::debug!("pid {pid}: {err}");
        ExecutableMaps::default()
    });
    let identity = Identity::read(pid, &text, previous, read_environment);
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
        service: identity.service(),
        thread_keys: identity.thread_keys(),
    };
    Process {
        info: Arc::new(info),
        maps,
        refreshed_at: now,
        refresh_after: MIN_REFRESH_INTERVAL,
        readable: true,
        identity,
    }
}

fn unreadable(pid: u32, comm: &str, now: Instant) -> Process {
    let info = ProcessInfo {
        pid,
        comm: comm.into(),
        exe_path: "".into(),
        container_id: None,
        pod_uid: None,
        service: None,
        thread_keys: None,
    };
    Process {
        info: Arc::new(info),
        maps: ExecutableMaps::default(),
        refreshed_at: now,
        refresh_after: MIN_REFRESH_INTERVAL,
        readable: false,
        identity: Identity::unknown(),
    }
}

/// `/proc` appends " (deleted)" to files removed after they were mapped.
pub(crate) fn strip_deleted(path: &str) -> &str {
    path.strip_suffix(" (deleted)").unwrap_or(path)
}

#[cfg(test)]
mod tests;
