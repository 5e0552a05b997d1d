//! JIT symbols from perf map files (`/tmp/perf-PID.map`): one `START SIZE
//! name` line (hex) per function, written by runtimes such as the JVM
//! (with an agent), V8 (`--perf-basic-prof`) or .NET.
//!
//! The file is read through `/proc/PID/root` ([`crate::files`]), so a
//! containerized JIT's map is found in its own `/tmp`, under its own
//! (namespaced) pid; a FIFO, a device or a map over 64 MiB is refused.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::Symbolizer;
use crate::files::{self, Kind};

/// How often a process's perf map is checked for new JIT entries.
const PERF_MAP_RECHECK: Duration = Duration::from_secs(1);

/// A process's perf map as last read (the symbolizer's cache holds these).
#[derive(Clone)]
pub(super) struct PerfEntry {
    map: Arc<PerfMap>,
    checked_at: Instant,
}

/// A parsed perf map.
#[derive(Debug, Default)]
pub struct PerfMap {
    /// (start, size, name), sorted by start.
    symbols: Vec<(u64, u64, Arc<str>)>,
    /// Modification time (ns) and length of the file it was read from: a
    /// JIT appends as it compiles, so a changed file is read again.
    pub(crate) stamp: Option<(i128, u64)>,
}

impl PerfMap {
    /// Parses perf map text; malformed lines are skipped.
    pub fn parse(text: &str) -> Self {
        let mut symbols: Vec<(u64, u64, Arc<str>)> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.trim_start().splitn(3, ' ');
                let start = parse_hex(fields.next()?)?;
                let size = parse_hex(fields.next()?)?;
                let name = fields.next()?.trim_end();
                (!name.is_empty()).then(|| (start, size, Arc::from(name)))
            })
            .collect();
        // Later lines win: a JIT that reuses memory writes the new code last.
        symbols.reverse();
        symbols.sort_by_key(|(start, _, _)| *start);
        symbols.dedup_by_key(|(start, _, _)| *start);
        PerfMap {
            symbols,
            stamp: None,
        }
    }

    /// The JIT function holding `address`.
    pub fn lookup(&self, address: u64) -> Option<Arc<str>> {
        let index = self
            .symbols
            .partition_point(|(start, _, _)| *start <= address);
        let (start, size, name) = self.symbols.get(index.checked_sub(1)?)?;
        (address - start < (*size).max(1)).then(|| name.clone())
    }

    /// Rough heap size, for the cache's memory budget.
    pub fn estimated_size(&self) -> usize {
        self.symbols
            .iter()
            .map(|(_, _, name)| 48 + name.len())
            .sum::<usize>()
            + 64
    }
}

fn parse_hex(field: &str) -> Option<u64> {
    let digits = field.strip_prefix("0x").unwrap_or(field);
    u64::from_str_radix(digits, 16).ok()
}

/// The pid `pid` has inside its own pid namespace (last `NSpid` entry of
/// `/proc/PID/status`): the number a containerized JIT puts in its file name.
pub fn namespaced_pid(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("NSpid:"))?;
            line.split_ascii_whitespace().last()?.parse().ok()
        })
        .unwrap_or(pid)
}

impl Symbolizer {
    /// Names JIT code at `address` of `pid` from its perf map.
    pub(super) fn jit_symbol(&self, pid: u32, address: u64) -> Option<Arc<str>> {
        let cached = self.lock().perf_maps.get(&pid);
        if let Some(entry) = &cached
            && entry.checked_at.elapsed() < PERF_MAP_RECHECK
        {
            return entry.map.lookup(address);
        }
        let map = read_perf_map(pid, cached.map(|entry| entry.map));
        let weight = map.estimated_size();
        let lookup = map.lookup(address);
        self.lock().perf_maps.insert(
            pid,
            PerfEntry {
                map,
                checked_at: Instant::now(),
            },
            weight,
        );
        lookup
    }
}

/// Reads `pid`'s perf map unless `previous` is still current.
fn read_perf_map(pid: u32, previous: Option<Arc<PerfMap>>) -> Arc<PerfMap> {
    let path = format!("/tmp/perf-{}.map", namespaced_pid(pid));
    let file = match files::open_in_process(pid, &path, Kind::PerfMap) {
        Ok(file) => file,
        Err(err) => {
            if !err.is_refusal() {
                tracing::trace!("pid {pid}: {err}");
            }
            return Arc::default();
        }
    };
    let stamp = Some((file.stat().mtime_ns, file.stat().size));
    if let Some(previous) = previous
        && previous.stamp == stamp
    {
        return previous;
    }
    let mut map = match file.read() {
        Ok(data) => PerfMap::parse(&String::from_utf8_lossy(&data)),
        Err(err) => {
            tracing::debug!("pid {pid}: {err}");
            PerfMap::default()
        }
    };
    map.stamp = stamp;
    Arc::new(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_functions_by_address() {
        let map = PerfMap::parse(
            "7f0000001000 40 LazyCompile:~add /app/x.js:1\n\
             0x7f0000002000 0x100 Interpreter\n\
             garbage line\n\
             7f0000001000 20 replaced\n",
        );
        assert_eq!(&*map.lookup(0x7f0000001010).unwrap(), "replaced");
        assert_eq!(&*map.lookup(0x7f00000020ff).unwrap(), "Interpreter");
        assert!(map.lookup(0x7f0000001040).is_none());
        assert!(map.lookup(0x7f0000002100).is_none());
        assert!(map.lookup(0x10).is_none());
    }

    #[test]
    fn our_namespaced_pid_is_known() {
        // Tests run in the host pid namespace or in a container's; either way
        // the result is a real pid, not the fallback for an unreadable file.
        assert!(namespaced_pid(std::process::id()) > 0);
    }
}
