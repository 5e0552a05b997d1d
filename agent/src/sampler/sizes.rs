//! How many entries each fixed-size map gets at load (aya's
//! `map_max_entries`: the object's sizes are the upper bounds): what the
//! recording can use, not the most it ever could. Every map here is
//! allocated whole when it is created (arrays, rings, and hash maps,
//! preallocated: perf_event programs before Linux 6.1 accept no other), and
//! `sampler::memory` reports what they cost.
//!
//! What each map costs host-wide with the defaults (Linux 6.18, x86_64,
//! 2 CPUs; `hostprof record -d 3`; the table before sizing in
//! ARCHITECTURE.md):
//!
//! | map | entries × value | memlock | sized by |
//! |---|---|---|---|
//! | `UNWIND_ROWS` | 8,192 × 4 KiB | 32 MiB | `--unwind-table-mib` (8-byte rows and each table's rules: 150 to 220 MiB of code) |
//! | `PROCESS_MAPPINGS` | 1,024 × 8,200 B | 8.1 MiB | the processes that can sample |
//! | `SAMPLES` (ring) | 2 MiB | 2 MiB | CPUs × rate ([`ring_bytes`]) |
//! | `PROCESS_EVENTS` (ring) | 256 KiB | 269 KiB | fixed |
//! | `PYTHON_PROCS` | 1,024 × 72 B | 145 KiB | as `PROCESS_MAPPINGS` (was 4,096: 577 KiB) |
//! | `GO_PROCS` | 1,024 × 24 B | 97 KiB | as `PROCESS_MAPPINGS` (added after the total below) |
//! | `HOTSPOT_PROCS` | 256 × 176 B | 63 KiB | fixed |
//! | `V8_PROCS` | 256 × 168 B | 60 KiB | fixed |
//! | `FILTER_TGIDS` | 1 × 1 B | 1 KiB | only with `-p` / a command (was 4,096: 321 KiB) |
//! | per-CPU scratch, hints, counters | | about 28 KiB per CPU | the possible CPUs |
//!
//! In all 42.6 MiB (43.4 before); `record -p PID` 34.4 MiB, `--unwind fp`
//! 2.6 MiB.
use aya::util::online_cpus;
use hostprof_common::{
    MAP_FILTER_TGIDS, MAP_GO_PROCESSES, MAP_OFF_CPU_START, MAP_PROCESS_MAPPINGS,
    MAP_PYTHON_PROCESSES, MAP_SAMPLES, MAP_TRACE_PROCESSES, MAP_UNWIND_ROWS, MAX_FILTER_TGIDS,
    MAX_OFF_CPU_THREADS, MAX_UNWIND_PROCESSES,
};

use super::{SamplerOptions, UnwindMode};

/// `(map, max_entries)` for every map sized at load.
///
/// - `FILTER_TGIDS`: one entry when sampling the whole host (the programs
///   never read it then: `FILTER_BY_TGID` is 0); the named processes when
///   not following children (nothing else is ever added); the whole
///   4,096 when following (a full filter fails `add_pid` with an error,
///   and exited pids are swept once a second).
/// - `PROCESS_MAPPINGS`: the named processes, and our own (the unwind
///   service loads our libraries' tables first), when not following
///   children: only they are loaded (an exec keeps the key); else 1,024 (past it, processes are unwound with frame pointers,
///   counted in `hostprof_unwind_processes_degraded_total`, and retried).
/// - `PYTHON_PROCS`: as many as `PROCESS_MAPPINGS` (4,096 before): the
///   processes that sample at once on a node are what both count; past it
///   a Python process is sampled without its Python frames, counted in
///   `hostprof_runtime_processes_unregistered_total`.
/// - `TRACE_PROCS`: as `PYTHON_PROCS` (the processes that publish a
///   thread context; past it they are sampled without trace links).
/// - `GO_PROCS`: as `TRACE_PROCS` (past it a Go process is sampled
///   without its goroutines' labels).
/// - `OFF_CPU_START`: a whole `Sample` per blocked thread (17 MiB for
///   4,096), wanted only with `--off-cpu`.
/// - `UNWIND_ROWS`: `--unwind-table-mib`. A table takes 8 bytes a row
///   and 16 a distinct rule (`hostprof_unwind::packed`), about 0.14 to
///   0.22 MiB per MiB of code (16-byte rows took twice that).
/// - `UNWIND_ROWS` and `PROCESS_MAPPINGS` with `--unwind fp`: one entry
///   each, never read or written (40 MiB less).
/// - `SAMPLES`: [`ring_bytes`].
pub(super) fn max_entries(options: &SamplerOptions) -> Vec<(&'static str, u32)> {
    let following = options.follow_children;
    let named = |most: u32| match &options.pids {
        Some(pids) if !following => (pids.len() as u32).clamp(1, most),
        _ => most,
    };
    let filter = match &options.pids {
        None => 1,
        Some(_) => named(MAX_FILTER_TGIDS),
    };
    let processes = named(MAX_UNWIND_PROCESSES);
    // The unwind service also loads our own process's libraries, first
    // (`crate::unwind::spawn_service`).
    let unwound = named(MAX_UNWIND_PROCESSES - 1) + 1;
    // Frame pointers only: the programs read no table, nothing writes one.
    let (tables, unwound) = match options.unwind {
        UnwindMode::Tables => (options.unwind_chunks.max(1), unwound),
        UnwindMode::FramePointers => (1, 1),
    };
    vec![
        (MAP_FILTER_TGIDS, filter),
        (MAP_PROCESS_MAPPINGS, unwound),
        (MAP_PYTHON_PROCESSES, processes),
        (MAP_TRACE_PROCESSES, processes),
        (MAP_GO_PROCESSES, processes),
        (
            MAP_OFF_CPU_START,
            if options.off_cpu.is_some() {
                MAX_OFF_CPU_THREADS
            } else {
                1
            },
        ),
        (MAP_UNWIND_ROWS, tables),
        (MAP_SAMPLES, ring_bytes(options)),
    ]
}

/// Typical size of a ring record: the header and a few dozen frames.
pub(super) const TYPICAL_RECORD_BYTES: u64 = 512;
/// Smallest ring: a few times the wakeup threshold.
pub(super) const MIN_RING_BYTES: u64 = 1 << 20;
const _: () = assert!(MIN_RING_BYTES >= 4 * hostprof_common::RING_WAKEUP_BYTES);
/// Smallest ring with early stack copies: room for about a hundred.
pub(super) const EARLY_COPY_RING_BYTES: u64 = 2 << 20;

/// The ring's size: about a second of samples at full rate on every CPU
/// (the reader drains it ten times a second), at least [`MIN_RING_BYTES`],
/// at most `options.ring_bytes`. Its pages count in the agent's memory once
/// written, and with records only as long as their frames a 2-CPU host at
/// 999 Hz needs 1 MiB, not 8. Early stack copies (18 KiB records, a burst
/// whenever processes start) get [`EARLY_COPY_RING_BYTES`] at least: when
/// the ring cannot take a copy the kernel writes the sample without it.
/// Stack copies asked for (`--stack-copy`, every sample) and off-CPU bursts
/// keep the whole size. A full ring loses samples, counted
/// (`ring_full`).
pub(super) fn ring_bytes(options: &SamplerOptions) -> u32 {
    if options.stack_copy_bytes != 0 || options.off_cpu.is_some() {
        return options.ring_bytes;
    }
    let cpus = online_cpus().map_or(1, |cpus| cpus.len()) as u64;
    let second = cpus * options.frequency_hz * TYPICAL_RECORD_BYTES;
    let least = if options.early_copy_bytes != 0 {
        EARLY_COPY_RING_BYTES
    } else {
        MIN_RING_BYTES
    };
    second
        .next_power_of_two()
        .max(least)
        .min(u64::from(options.ring_bytes)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(options: &SamplerOptions, map: &str) -> u32 {
        max_entries(options)
            .into_iter()
            .find_map(|(name, entries)| (name == map).then_some(entries))
            .unwrap()
    }

    #[test]
    fn the_whole_host_needs_no_filter_and_every_process_slot() {
        let host = SamplerOptions::default();
        assert_eq!(entries(&host, MAP_FILTER_TGIDS), 1);
        assert_eq!(entries(&host, MAP_PROCESS_MAPPINGS), MAX_UNWIND_PROCESSES);
        assert_eq!(entries(&host, MAP_PYTHON_PROCESSES), MAX_UNWIND_PROCESSES);
        assert_eq!(entries(&host, MAP_OFF_CPU_START), 1);
        let frame_pointers = SamplerOptions {
            unwind: UnwindMode::FramePointers,
            ..SamplerOptions::default()
        };
        assert_eq!(entries(&frame_pointers, MAP_UNWIND_ROWS), 1);
        assert_eq!(entries(&frame_pointers, MAP_PROCESS_MAPPINGS), 1);
        assert_eq!(
            entries(&frame_pointers, MAP_PYTHON_PROCESSES),
            MAX_UNWIND_PROCESSES
        );
    }

    #[test]
    fn named_processes_get_their_slots_and_children_every_one() {
        let named = SamplerOptions {
            pids: Some(vec![10, 11, 12]),
            ..SamplerOptions::default()
        };
        for map in [MAP_FILTER_TGIDS, MAP_PYTHON_PROCESSES] {
            assert_eq!(entries(&named, map), 3, "{map}");
        }
        // And our own, whose libraries' tables are loaded first.
        assert_eq!(entries(&named, MAP_PROCESS_MAPPINGS), 4);
        let following = SamplerOptions {
            follow_children: true,
            ..named
        };
        assert_eq!(entries(&following, MAP_FILTER_TGIDS), MAX_FILTER_TGIDS);
        assert_eq!(
            entries(&following, MAP_PROCESS_MAPPINGS),
            MAX_UNWIND_PROCESSES
        );
    }

    #[test]
    fn the_ring_is_sized_by_what_it_carries() {
        let cpus = online_cpus().map_or(1, |cpus| cpus.len()) as u64;
        let second = cpus * 999 * TYPICAL_RECORD_BYTES;
        let plain = SamplerOptions {
            frequency_hz: 999,
            early_copy_bytes: 0,
            ..SamplerOptions::default()
        };
        let expected = second.next_power_of_two().clamp(
            MIN_RING_BYTES,
            u64::from(hostprof_common::DEFAULT_RING_BYTES),
        );
        assert_eq!(u64::from(ring_bytes(&plain)), expected);
        // Early copies: room for bursts of them, not the whole default.
        let early = SamplerOptions {
            early_copy_bytes: 8192,
            ..plain.clone()
        };
        let with_copies = u64::from(ring_bytes(&early));
        assert!(with_copies >= EARLY_COPY_RING_BYTES && with_copies >= expected);
        if second <= EARLY_COPY_RING_BYTES {
            assert_eq!(with_copies, EARLY_COPY_RING_BYTES);
        }
        // Copies of every sample, or off-CPU bursts: the whole size.
        let every = SamplerOptions {
            stack_copy_bytes: 4096,
            ..plain.clone()
        };
        assert_eq!(ring_bytes(&every), hostprof_common::DEFAULT_RING_BYTES);
    }
}
