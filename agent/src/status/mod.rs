//! The agent's view of itself: a [`Snapshot`] of its counters, logged as one
//! status line at intervals and served as Prometheus text by [`server`] when
//! `--metrics-addr` is given.
pub mod server;

use std::fmt::Write as _;

use hostprof_common::{Counter, runtime::Runtime};

use crate::{export::ExportStats, sampler::Counters, sampler::ReaderStats};

/// Everything the agent reports about itself at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The eBPF programs' per-CPU counters, summed.
    pub kernel: Counters,
    pub reader: ReaderStats,
    pub export: ExportStats,
    /// Resident memory of the agent, bytes.
    pub rss_bytes: u64,
    /// Kernel memory of the agent's BPF maps, bytes (their fdinfo's
    /// `memlock`; charged to the agent's cgroup, not in `rss_bytes`).
    pub bpf_map_bytes: u64,
    /// User + system CPU time of the agent, in clock ticks' worth of nanoseconds.
    pub cpu_ns: u64,
    /// Processes whose metadata the pipeline caches.
    pub tracked_processes: u64,
    /// Sweeps of exited processes out of that cache so far.
    pub process_sweeps: u64,
    /// Estimated bytes of the symbolizer's caches.
    pub symbol_cache_bytes: u64,
    /// Samples passed on without names (symbolization behind, or stopping).
    pub unsymbolized: u64,
    /// Reads of processes' `/proc` files (once per process image).
    pub proc_reads: u64,
    /// Samples taken before their tables were loaded: unwound on the host
    /// from their stack copies, sent on with frame pointers, copies dropped.
    pub early: (u64, u64, u64),
}

impl Snapshot {
    /// Samples that never reached a profile: ring buffer full or pipeline backlog.
    pub fn lost(&self) -> u64 {
        self.kernel.lost() + self.reader.dropped_backlog
    }

    /// Samples whose stacks were damaged or cut.
    pub fn stack_errors(&self) -> u64 {
        self.kernel.get(Counter::KernelStackError)
            + self.kernel.get(Counter::UserStackError)
            + self.kernel.get(Counter::Truncated)
    }

    /// The periodic status line (logfmt-style, so it reads and greps well).
    pub fn status_line(&self) -> String {
        format!(
            "samples={} lost={} unsymbolized={} stack_errors={} exported={} export_failures={} export_dropped={} \
             queue_bytes={} processes={} symbol_cache_mib={:.1} rss_mib={:.1} bpf_map_mib={:.1} cpu_s={:.2}",
            self.reader.samples,
            self.lost(),
            self.unsymbolized,
            self.stack_errors(),
            self.export.sent,
            self.export.failed_calls,
            self.export.dropped,
            self.export.queue_bytes,
            self.tracked_processes,
            self.symbol_cache_bytes as f64 / (1 << 20) as f64,
            self.rss_bytes as f64 / (1 << 20) as f64,
            self.bpf_map_bytes as f64 / (1 << 20) as f64,
            self.cpu_ns as f64 / 1e9,
        )
    }

    /// Prometheus text exposition format (version 0.0.4).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let kernel: Vec<(String, u64)> = Counter::ALL
            .iter()
            .map(|&c| (format!("{{event=\"{}\"}}", c.name()), self.kernel.get(c)))
            .collect();
        let kernel: Vec<(&str, u64)> = kernel.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        metric(
            "hostprof_kernel_events_total",
            "counter",
            "Events counted by the eBPF programs (samples fired, skipped, lost, damaged).",
            &kernel,
        );
        let walks: Vec<(String, u64)> = Runtime::ALL
            .iter()
            .flat_map(|&runtime| {
                let kernel = &self.kernel;
                (0..)
                    .zip(runtime.events())
                    .filter(|(_, name)| !name.is_empty())
                    .map(move |(event, name)| {
                        let labels = format!("{{runtime=\"{}\",event=\"{name}\"}}", runtime.name());
                        (labels, kernel.runtime(runtime, event))
                    })
            })
            .collect();
        let walks: Vec<(&str, u64)> = walks.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        metric(
            "hostprof_runtime_walk_events_total",
            "counter",
            "How the eBPF programs' walks of runtime frames went, by runtime (as \
             profile.frame.type names it) and event: frames walked, and each reason a walk stopped.",
            &walks,
        );
        metric(
            "hostprof_samples_total",
            "counter",
            "Samples read from the ring buffer.",
            &[("", self.reader.samples)],
        );
        metric(
            "hostprof_samples_lost_total",
            "counter",
            "Samples lost before a profile, by where.",
            &[
                ("{where=\"ring_buffer\"}", self.kernel.lost()),
                ("{where=\"pipeline\"}", self.reader.dropped_backlog),
            ],
        );
        metric(
            "hostprof_export_requests_total",
            "counter",
            "OTLP export requests by outcome.",
            &[
                ("{outcome=\"sent\"}", self.export.sent),
                ("{outcome=\"dropped\"}", self.export.dropped),
            ],
        );
        metric(
            "hostprof_export_failed_calls_total",
            "counter",
            "OTLP export calls that failed (each retry counts).",
            &[("", self.export.failed_calls)],
        );
        metric(
            "hostprof_export_sent_bytes_total",
            "counter",
            "Encoded bytes of accepted export requests, before compression.",
            &[("", self.export.sent_bytes)],
        );
        metric(
            "hostprof_export_queue_bytes",
            "gauge",
            "Bytes of export requests waiting for the collector.",
            &[("", self.export.queue_bytes)],
        );
        metric(
            "hostprof_samples_unsymbolized_total",
            "counter",
            "Samples exported with addresses only: symbolization was behind, or the agent stopping.",
            &[("", self.unsymbolized)],
        );
        metric(
            "hostprof_proc_reads_total",
            "counter",
            "Reads of a process's /proc files (once per process image, and at a dlopen).",
            &[("", self.proc_reads)],
        );
        let (unwound, timed_out, dropped) = self.early;
        metric(
            "hostprof_early_stacks_total",
            "counter",
            "Samples taken before their process's unwind tables were loaded, by outcome of their stack copy (never exported).",
            &[
                ("{outcome=\"unwound\"}", unwound),
                ("{outcome=\"frame_pointers\"}", timed_out),
                (
                    "{outcome=\"dropped\"}",
                    dropped + self.reader.early_copies_dropped,
                ),
            ],
        );
        metric(
            "hostprof_tracked_processes",
            "gauge",
            "Processes whose metadata (maps, container) is cached.",
            &[("", self.tracked_processes)],
        );
        metric(
            "hostprof_process_sweeps_total",
            "counter",
            "Sweeps of exited processes out of the process metadata cache.",
            &[("", self.process_sweeps)],
        );
        metric(
            "hostprof_symbol_cache_bytes",
            "gauge",
            "Estimated bytes of parsed symbols and cached results.",
            &[("", self.symbol_cache_bytes)],
        );
        // Process-wide counters of the unwind table loader.
        let (degraded, loads) = crate::unwind::capacity_totals();
        metric(
            "hostprof_unwind_processes_degraded_total",
            "counter",
            "Processes left to frame pointers because the kernel's unwind maps were full (retried after a backoff).",
            &[("", degraded)],
        );
        metric(
            "hostprof_unwind_process_loads_total",
            "counter",
            "Processes whose mappings and unwind tables were (re)loaded into the kernel.",
            &[("", loads)],
        );
        metric(
            "hostprof_unwind_table_growths_total",
            "counter",
            "Times a large file's unwind table, built for the code that runs, grew by the functions stack walks stopped at (unwind_not_loaded).",
            &[("", crate::unwind::sparse_growths())],
        );
        metric(
            "hostprof_unwind_function_asks_deferred_total",
            "counter",
            "Addresses and stack copies a request for a table's functions left out past its caps (64 addresses, 4 copies): asked again by the next walk that stops there.",
            &[("", crate::unwind::functions_deferred())],
        );
        let cache = crate::unwind::cache::totals();
        metric(
            "hostprof_unwind_table_cache_total",
            "counter",
            "Unwind table lookups in the disk cache: hit (not built), miss (built and stored), stale (another format version, built again), corrupt (failed a check, ignored and built again).",
            &[
                ("{result=\"hit\"}", cache.hits),
                ("{result=\"miss\"}", cache.misses),
                ("{result=\"stale\"}", cache.stale),
                ("{result=\"corrupt\"}", cache.corrupt),
            ],
        );
        let (read, read_for_cached, unread) = crate::unwind::file_totals();
        metric(
            "hostprof_unwind_files_total",
            "counter",
            "Files behind unwind tables: read (and hashed unless the file id memo knew them), read only to find their table in the disk cache (content id not known), and tables taken from the cache without reading their file.",
            &[
                ("{result=\"read\"}", read),
                ("{result=\"read_for_cached\"}", read_for_cached),
                ("{result=\"cached_unread\"}", unread),
            ],
        );
        let memo = crate::files::memo::totals();
        metric(
            "hostprof_file_id_memo_total",
            "counter",
            "Content ids remembered by file identity (device, inode, size, mtime, ctime), kept beside the unwind table cache: loaded at start, hit (file not hashed), remembered (hashed), corrupt or stale memo files (ignored), write errors.",
            &[
                ("{result=\"loaded\"}", memo.loaded),
                ("{result=\"hit\"}", memo.hits),
                ("{result=\"remembered\"}", memo.remembered),
                ("{result=\"corrupt\"}", memo.corrupt),
                ("{result=\"stale\"}", memo.stale),
                ("{result=\"write_error\"}", memo.write_errors),
            ],
        );
        metric(
            "hostprof_unwind_table_cache_write_errors_total",
            "counter",
            "Built unwind tables that could not be written to the disk cache.",
            &[("", cache.write_errors)],
        );
        metric(
            "hostprof_runtime_processes_unregistered_total",
            "counter",
            "Python or Java processes sampled without their runtime's frames because the kernel's map of such processes was full.",
            &[("", crate::runtime::unregistered_full())],
        );
        metric(
            "hostprof_go_executables_unreadable_total",
            "counter",
            "Distinct Go executables whose goroutines' pprof labels are not read: their Go version is unreadable or unknown, or where they keep the current goroutine is.",
            &[("", crate::runtime::go_labels::unreadable())],
        );
        // Process-wide counters of the file layer, not part of a snapshot.
        let refused = crate::files::refusals();
        metric(
            "hostprof_files_refused_total",
            "counter",
            "Files of processes the agent refused to read: FIFOs and devices, over the size cap, through magic links.",
            &[
                ("{reason=\"not_regular\"}", refused.not_regular),
                ("{reason=\"too_large\"}", refused.too_large),
                ("{reason=\"escape\"}", refused.escape),
            ],
        );
        // Process-wide counters of the CPython reader.
        let python = crate::runtime::python::refusals();
        metric(
            "hostprof_python_refused_total",
            "counter",
            "Values read from Python processes past a cap: offsets (the process is not walked), over-long strings or location tables, pointers that overflow (the frame is left out), interpreters whose evaluation loop was searched only up to a cap (frames in a part not found go unplaced).",
            &[
                ("{reason=\"offsets\"}", python.offsets),
                ("{reason=\"too_long\"}", python.too_long),
                ("{reason=\"overflow\"}", python.overflow),
                ("{reason=\"loop_capped\"}", python.loop_capped),
            ],
        );
        let refused: Vec<(String, u64)> = crate::procs::otel_ctx::refusals()
            .iter()
            .map(|(reason, count)| (format!("{{reason=\"{reason}\"}}"), *count))
            .collect();
        let refused: Vec<(&str, u64)> = refused.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        metric(
            "hostprof_context_refused_total",
            "counter",
            "Process contexts (OTEL_CTX) and OTEL_RESOURCE_ATTRIBUTES environments refused, by reason: bad signature or version, over the size cap, unreadable, never settled, not protobuf, not UTF-8, malformed environment, a key map that is no array of at most 256 strings; and thread-context attributes (attrs_*): over the 612-byte cap, unreadable, not UTF-8, a key index past the map, an entry cut short.",
            &refused,
        );
        let refused: Vec<(String, u64)> = crate::runtime::refusals::refusals()
            .into_iter()
            .map(|(runtime, reason, count)| {
                (
                    format!("{{runtime=\"{runtime}\",reason=\"{reason}\"}}"),
                    count,
                )
            })
            .collect();
        let refused: Vec<(&str, u64)> = refused.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        metric(
            "hostprof_runtime_refused_total",
            "counter",
            "Data of JIT runtimes' frames (JVM method data, V8 heap objects) past a cap, by runtime and reason: over-long strings or tables, strings nested too deep. The frame keeps a placeholder name.",
            &refused,
        );
        metric(
            "hostprof_bpf_map_bytes",
            "gauge",
            "Kernel memory of the agent's BPF maps (their memlock; charged to its cgroup, not in its resident memory).",
            &[("", self.bpf_map_bytes)],
        );
        metric(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            &[("", self.rss_bytes)],
        );
        let _ = writeln!(
            out,
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
             # TYPE process_cpu_seconds_total counter\n\
             process_cpu_seconds_total {:.3}",
            self.cpu_ns as f64 / 1e9
        );
        out
    }
}

/// This process's resident memory (bytes) and CPU time (ns), from /proc/self.
pub fn own_usage() -> (u64, u64) {
    let page = page_size();
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page);
    let cpu = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| cpu_ticks(&stat))
        .map_or(0, |ticks| ticks * 1_000_000_000 / clock_ticks());
    (rss, cpu)
}

/// This process's peak resident memory (`VmHWM`), bytes.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// utime + stime of a `/proc/PID/stat` line (fields 14 and 15, counted after
/// the parenthesised command, which may contain spaces).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&hz| hz > 0)
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_skip_a_command_with_spaces_and_parens() {
        let stat = "42 (my (odd) prog) S 1 42 42 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 1 0";
        assert_eq!(cpu_ticks(stat), Some(22));
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn own_usage_is_measured() {
        let (rss, _cpu) = own_usage();
        assert!(rss > 1 << 20, "rss {rss}");
        // Burn a little CPU so the counter must move.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(own_usage().1 > 0);
    }

    #[test]
    fn prometheus_text_has_help_type_and_every_kernel_counter() {
        let mut snapshot = Snapshot::default();
        snapshot.kernel.0[Counter::RingFull as usize] = 3;
        let no_blob = hostprof_common::hotspot::reason::NO_BLOB;
        snapshot.kernel.0[Runtime::Hotspot.counter(no_blob) as usize] = 4;
        snapshot.reader.samples = 10;
        snapshot.reader.dropped_backlog = 2;
        snapshot.export.queue_bytes = 77;
        snapshot.bpf_map_bytes = 45 << 20;
        let text = snapshot.prometheus();
        assert!(text.contains("hostprof_bpf_map_bytes 47185920\n"));
        assert!(text.contains("hostprof_samples_lost_total{where=\"ring_buffer\"} 3\n"));
        assert!(text.contains("hostprof_samples_lost_total{where=\"pipeline\"} 2\n"));
        assert!(text.contains("hostprof_export_queue_bytes 77\n"));
        for counter in Counter::ALL {
            assert!(text.contains(&format!("{{event=\"{}\"}}", counter.name())));
        }
        // Each runtime's events under its frame type's name; none unnamed.
        assert!(
            text.contains(
                "hostprof_runtime_walk_events_total{runtime=\"jvm\",event=\"no_blob\"} 4\n"
            )
        );
        assert!(text.contains("{runtime=\"cpython\",event=\"thread_limit\"} 0\n"));
        assert!(text.contains("{runtime=\"v8js\",event=\"not_function\"} 0\n"));
        assert!(!text.contains("event=\"\""));
        // Every sample line belongs to a metric announced by # TYPE.
        let typed: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(typed.contains(&name), "{line}");
        }
        assert!(text.contains("hostprof_context_refused_total{reason=\"too_large\"} "));
        assert!(
            text.contains("hostprof_runtime_refused_total{runtime=\"v8js\",reason=\"too_deep\"} ")
        );
        assert_eq!(snapshot.lost(), 5);
        assert!(snapshot.status_line().contains("lost=5 "));
        assert!(snapshot.status_line().contains(" bpf_map_mib=45.0 "));
    }
}
