//! `record -p` of a launcher or a shell whose work happens in its children
//! samples (almost) nothing. The CPU time the selected processes and their
//! descendants use over the recording, from `/proc/PID/stat` at its start
//! and end, tells that case apart, and names the descendants to pass
//! instead.
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    time::Duration,
};

/// A descendant that used less CPU than this is not worth naming.
const MIN_BUSY: Duration = Duration::from_millis(100);

/// The selected processes "barely ran" when their descendants used this
/// many times their CPU, and they got this share of the samples that CPU
/// would have given at most.
const BUSIER: u64 = 10;

/// Descendants named at most, busiest first.
const MAX_NAMED: usize = 3;

/// What `/proc/PID/stat` says of one process.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stat {
    comm: String,
    ppid: u32,
    /// utime + stime, in clock ticks.
    ticks: u64,
    /// Clock ticks after boot it started at: tells a reused pid apart.
    start: u64,
}

fn parse_stat(text: &str) -> Option<Stat> {
    // The command may hold spaces and parentheses: it ends at the last ')'.
    let (head, rest) = text.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |index: usize| fields.get(index)?.parse::<u64>().ok();
    Some(Stat {
        comm,
        ppid: u32::try_from(field(1)?).ok()?,
        ticks: field(11)? + field(12)?,
        start: field(19)?,
    })
}

/// A `/proc` to read: the real one, or a fake tree in tests.
pub(super) struct ProcFs {
    root: PathBuf,
    tick_hz: u64,
}

impl ProcFs {
    pub(super) fn new() -> Self {
        // SAFETY: sysconf has no preconditions.
        let tick_hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        ProcFs {
            root: PathBuf::from("/proc"),
            tick_hz: u64::try_from(tick_hz)
                .ok()
                .filter(|hz| *hz > 0)
                .unwrap_or(100),
        }
    }

    fn stat(&self, pid: u32) -> Option<Stat> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("stat")).ok()?;
        parse_stat(&text)
    }

    /// `pid`'s children from `/proc/PID/task/*/children`; `None` when the
    /// kernel has no such files (no CONFIG_PROC_CHILDREN).
    fn children(&self, pid: u32) -> Option<Vec<u32>> {
        let tasks = self.root.join(pid.to_string()).join("task");
        let Ok(entries) = std::fs::read_dir(&tasks) else {
            // Exited.
            return Some(Vec::new());
        };
        let mut children = Vec::new();
        for entry in entries.flatten() {
            match std::fs::read_to_string(entry.path().join("children")) {
                Ok(text) => children.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                ),
                // A live thread without the file: the kernel has none.
                Err(_) if entry.path().exists() => return None,
                // The thread exited meanwhile.
                Err(_) => {}
            }
        }
        Some(children)
    }

    /// Every process's parent, from a scan of `/proc/*/stat`.
    fn parents(&self) -> HashMap<u32, u32> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return HashMap::new();
        };
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| Some((pid, self.stat(pid)?.ppid)))
            .collect()
    }

    /// The processes `pids` and all their descendants, as they are now.
    pub(super) fn snapshot(&self, pids: &[u32]) -> Snapshot {
        let mut parents: Option<HashMap<u32, u32>> = None;
        let mut seen: HashSet<u32> = pids.iter().copied().collect();
        let mut queue: Vec<(u32, u32)> = pids.iter().map(|&pid| (pid, 0)).collect();
        let mut processes = HashMap::new();
        while let Some((pid, depth)) = queue.pop() {
            let Some(stat) = self.stat(pid) else {
                continue;
            };
            processes.insert(pid, (stat, depth));
            let listed = match parents {
                None => self.children(pid),
                Some(_) => None,
            };
            let children = match listed {
                Some(children) => children,
                None => parents
                    .get_or_insert_with(|| self.parents())
                    .iter()
                    .filter(|&(_, &parent)| parent == pid)
                    .map(|(&child, _)| child)
                    .collect(),
            };
            for child in children {
                if seen.insert(child) {
                    queue.push((child, depth + 1));
                }
            }
        }
        Snapshot {
            processes,
            tick_hz: self.tick_hz,
        }
    }
}

/// The selected processes (depth 0) and their descendants at one moment.
pub(super) struct Snapshot {
    /// Each process's stat and its depth below the selected ones.
    processes: HashMap<u32, (Stat, u32)>,
    tick_hz: u64,
}

impl Snapshot {
    /// The processes, selected and descendants, by pid.
    pub(super) fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        pids
    }

    /// The CPU time `pid` used since `before`: all of it if it started since.
    fn used_since(&self, before: &Snapshot, pid: u32) -> Option<Duration> {
        let (now, _) = self.processes.get(&pid)?;
        let then = match before.processes.get(&pid) {
            Some((then, _)) if then.start == now.start => then.ticks,
            _ => 0,
        };
        let ticks = now.ticks.saturating_sub(then);
        Some(Duration::from_nanos(ticks * 1_000_000_000 / self.tick_hz))
    }
}

/// The line to print when the selected processes barely ran (`samples` of
/// them at `frequency` Hz) while descendants of theirs were busy, between
/// the snapshots `before` and `after`; `None` otherwise.
pub(super) fn idle_note(
    before: &Snapshot,
    after: &Snapshot,
    selected: &[u32],
    samples: u64,
    frequency: u64,
) -> Option<String> {
    let own: Duration = selected
        .iter()
        .filter_map(|&pid| after.used_since(before, pid))
        .sum();
    let mut busy: Vec<(u32, &Stat, u32, Duration)> = after
        .processes
        .iter()
        .filter(|(pid, (_, depth))| *depth > 0 && !selected.contains(pid))
        .filter_map(|(&pid, (stat, depth))| {
            let used = after.used_since(before, pid)?;
            (used >= MIN_BUSY).then_some((pid, stat, *depth, used))
        })
        .collect();
    let total: Duration = busy.iter().map(|(.., used)| *used).sum();
    let expected = total.as_secs_f64() * frequency as f64;
    if busy.is_empty() || own * BUSIER as u32 > total || (samples * BUSIER) as f64 > expected {
        return None;
    }
    busy.sort_by(|a, b| b.3.cmp(&a.3).then(a.0.cmp(&b.0)));
    let more = busy.len().saturating_sub(MAX_NAMED);
    busy.truncate(MAX_NAMED);

    let named = |pid: u32, comm: &str| format!("{pid} ({comm})");
    let subjects: Vec<String> = selected
        .iter()
        .filter_map(|&pid| Some(named(pid, &after.processes.get(&pid)?.0.comm)))
        .collect();
    let (subject, whose) = match subjects.as_slice() {
        [] => return None,
        [one] => (format!("pid {one}"), "its"),
        many => (format!("pids {}", many.join(", ")), "their"),
    };
    let ran = match samples {
        0 => "did not run".to_owned(),
        1 => "barely ran (1 sample)".to_owned(),
        n => format!("barely ran ({n} samples)"),
    };
    let direct = busy.iter().all(|(.., depth, _)| *depth == 1);
    let kin = match (busy.len() + more, direct) {
        (1, true) => "child",
        (1, false) => "descendant",
        (_, true) => "children",
        (_, false) => "descendants",
    };
    let mut names: Vec<String> = busy
        .iter()
        .map(|(pid, stat, ..)| named(*pid, &stat.comm))
        .collect();
    if more > 0 {
        names.push(format!("{more} more"));
    }
    let names = match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => return None,
    };
    let try_pids: Vec<String> = busy.iter().map(|(pid, ..)| format!("-p {pid}")).collect();
    Some(format!(
        "hostprof: {subject} {ran}; {whose} {kin} {names} used {:.1} s of CPU: try {} \
         (or add --children)",
        total.as_secs_f64(),
        try_pids.join(" ")
    ))
}

#[cfg(test)]
mod tests;
