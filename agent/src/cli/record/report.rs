//! `record`'s closing lines on stderr: what was sampled and lost, what was
//! written, the top functions, and how stacks were unwound.
use std::time::Duration;

use super::End;
use crate::{
    cli::RecordArgs,
    config::SharedSettings,
    output::Summary,
    sampler::{Counters, ReaderStats},
};

pub(super) fn report(
    args: &RecordArgs,
    settings: &SharedSettings,
    elapsed: Duration,
    why: End,
    counters: &Counters,
    reader: &ReaderStats,
    summary: &Summary,
) -> String {
    use hostprof_common::Counter;
    let why = match why {
        End::Duration => "duration reached",
        End::Interrupted => "interrupted",
        End::CommandExited => "command exited",
        End::ProcessesExited => "profiled processes exited",
    };
    let mut text = format!(
        "hostprof: {} samples from {} processes in {:.2} s at {} Hz ({why})\n\
         hostprof: lost {} samples (ring buffer full {}, pipeline backlog {}); \
         stack errors: kernel {}, user {}; truncated stacks {}\n",
        summary.samples(),
        summary.processes(),
        elapsed.as_secs_f64(),
        settings.frequency,
        counters.lost() + reader.dropped_backlog,
        counters.get(Counter::RingFull),
        reader.dropped_backlog,
        counters.get(Counter::KernelStackError),
        counters.get(Counter::UserStackError),
        counters.get(Counter::Truncated),
    );
    let refused = crate::files::refusals();
    if refused.total() > 0 {
        text.push_str(&format!(
            "hostprof: files refused: {} not regular (FIFO, device), {} over their size cap, \
             {} through magic links (--log-level hostprof::files=debug names them)\n",
            refused.not_regular, refused.too_large, refused.escape
        ));
    }
    if let Some(path) = &args.output
        && path.as_os_str() != "-"
    {
        text.push_str(&format!("hostprof: wrote {}\n", path.display()));
    }
    let (off_cpu_events, off_cpu_ns) = summary.off_cpu();
    if settings.off_cpu {
        text.push_str(&format!(
            "hostprof: off-CPU: {off_cpu_events} periods over {}, {:.3} s in all\n",
            humanize(settings.off_cpu_threshold),
            off_cpu_ns as f64 / 1e9
        ));
    }
    if summary.samples() > 0 || off_cpu_events > 0 {
        text.push_str(&summary.top(args.top));
    }
    text
}

/// How user stacks were walked, and why table-driven walks stopped.
pub(in crate::cli) fn unwind_report(
    counters: &Counters,
    tables: Option<crate::unwind::LoaderStats>,
) -> String {
    use hostprof_common::{
        Counter, hotspot, python,
        runtime::Runtime::{self, *},
        v8,
    };
    let Some(tables) = tables else {
        return String::new();
    };
    let reasons = stop_list(counters, &Counter::UNWIND_STOPS, "unwind_");
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let event = |runtime: Runtime, event: u32| counters.runtime(runtime, event);
    let java_frames = event(Hotspot, hotspot::event::FRAME);
    let java = if java_frames + counters.runtime_stops(Hotspot) > 0 {
        format!(
            "hostprof: Java frames: {java_frames} walked in the kernel; walks stopped: {}\n",
            runtime_stops(counters, Hotspot)
        )
    } else {
        String::new()
    };
    let javascript_frames = event(V8, v8::event::FRAME);
    let javascript = if javascript_frames + counters.runtime_stops(V8) > 0 {
        use crate::runtime::v8::{LineSource::*, line_count, line_counts};
        let counts = line_counts();
        let n = |source| line_count(&counts, source);
        format!(
            "hostprof: JavaScript frames: {} walked in the kernel ({} frames of V8 without a \
             function kept as native); walks stopped: {}; interpreted frames at their running \
             line {}, at their function's first line: V8 had no source positions for it {}, \
             its position table unreadable {}, a V8 newer than those checked {}; compiled frames at their running line {} (and {} \
             more in code found from their pc: on-stack replacement, replaced since, or any from V8 13 on), at \
             their function's first line: Sparkplug pc unmapped {}, pc in no code found {}, in \
             inlined code not expanded {}, optimized code without positions (Maglev's, from V8 \
             13 on) {}, code or table unreadable {}, V8's code layout unknown {}; frames of scripts \
             without readable lines {}\n",
            javascript_frames,
            event(V8, v8::event::NOT_FUNCTION),
            runtime_stops(counters, V8),
            n(Interpreted),
            n(NoPositions),
            n(Unreadable),
            n(NewerV8),
            n(Compiled),
            n(CompiledFoundByPc),
            n(CompiledBaseline),
            n(CompiledOtherCode),
            n(CompiledInlined),
            n(CompiledNoPositions),
            n(CompiledUnreadable),
            n(CompiledUnknown),
            n(ScriptWithoutLines),
        )
    } else {
        String::new()
    };
    let outside = event(Cpython, python::event::OUTSIDE_LOOP);
    let python = if event(Cpython, python::event::WALKED) + outside > 0 {
        format!(
            "hostprof: Python stacks: {} walked in the kernel ({} complete, {} threads found \
             in the agent's thread map), {outside} not (their native stacks never entered \
             the evaluation loop); walks stopped: {}\n",
            event(Cpython, python::event::WALKED),
            event(Cpython, python::reason::COMPLETE),
            event(Cpython, python::event::THREAD_CACHED),
            runtime_stops(counters, Cpython)
        )
    } else {
        String::new()
    };
    let linked = counters.get(Counter::TraceLinked);
    let detached = counters.get(Counter::TraceDetached);
    let faults = counters.get(Counter::TraceReadFault);
    let exited = counters.get(Counter::TraceExited);
    let trace = if linked + detached + faults + exited > 0 {
        format!(
            "hostprof: trace context: {linked} samples linked to a span, {detached} with \
             none attached, {faults} reads failed, {exited} unread in exiting threads\n"
        )
    } else {
        String::new()
    };
    // What the OpenTelemetry context readers refused (README: the same
    // reasons as `hostprof_context_refused_total`).
    let context_refused: Vec<String> = crate::procs::otel_ctx::refusals()
        .iter()
        .filter(|(_, count)| *count > 0)
        .map(|(reason, count)| format!("{reason} {count}"))
        .collect();
    let trace = if context_refused.is_empty() {
        trace
    } else {
        trace
            + &format!(
                "hostprof: trace context refused: {}\n",
                context_refused.join(", ")
            )
    };
    let labeled = counters.get(Counter::GoLabeled);
    let unlabeled = counters.get(Counter::GoUnlabeled);
    let go_faults = counters.get(Counter::GoReadFault);
    let go = if labeled + unlabeled + go_faults > 0 {
        format!(
            "hostprof: Go labels: {labeled} samples with their goroutine's pprof labels, \
             {unlabeled} without, {go_faults} reads failed, {} with labels left out\n",
            counters.get(Counter::GoLabelsCut)
        )
    } else {
        String::new()
    };
    // What the CPython reader refused since the start (README, Python).
    let refused = crate::runtime::python::refusals();
    let python_refused = if refused != crate::runtime::python::Refusals::default() {
        format!(
            "hostprof: Python values past hostprof's caps: {} processes not walked (offsets), \
             {} code objects left out (too long {}, overflowing pointers {}), {} interpreters' \
             loop searched only up to a cap\n",
            refused.offsets,
            refused.too_long + refused.overflow,
            refused.too_long,
            refused.overflow,
            refused.loop_capped
        )
    } else {
        String::new()
    };
    // Tables taken from the disk cache rather than built (--unwind-cache-dir).
    let cache = crate::unwind::cache::totals();
    let cache = if cache != crate::unwind::cache::CacheTotals::default() {
        // With the file id memo kept beside it: how many tables came
        // without reading their file at all.
        let memo = crate::files::memo::totals();
        let (read, read_for_cached, unread) = crate::unwind::file_totals();
        format!(
            "hostprof: unwind table cache: {} hits, {} misses (built, stored), {} stale, \
             {} corrupt (ignored), {} not written\n\
             hostprof: unwind files: {} tables from the cache unread, {} files read \
             ({} only to find a cached table); file id memo: {} loaded, {} hits (not hashed), \
             {} hashed and remembered, {} corrupt (ignored), {} stale\n",
            cache.hits,
            cache.misses,
            cache.stale,
            cache.corrupt,
            cache.write_errors,
            unread,
            read,
            read_for_cached,
            memo.loaded,
            memo.hits,
            memo.remembered,
            memo.corrupt,
            memo.stale
        )
    } else {
        String::new()
    };
    trace
        + &go
        + &python
        + &python_refused
        + &java
        + &javascript
        + &format!(
            "hostprof: user stacks: {} unwound with tables ({} complete; stopped: {}), \
         {} with frame pointers before their tables were loaded\n\
         hostprof: unwind tables: {} files ({} idle; {} for the code that runs, grown {} times, \
         {} functions asked for past a request's caps, deferred), {} rows, {:.1} of {:.0} MiB (for {:.1} MiB of code); \
         {} did not fit, {} without CFI\n\
         hostprof: unwind capacity: {} processes left to frame pointers (kernel maps full), \
         {} mappings past the per-process limit, {} process loads\n",
            counters.get(Counter::UnwindTables),
            counters.get(Counter::UnwindComplete),
            reasons,
            counters.get(Counter::UnwindUnknownProcess),
            tables.tables,
            tables.idle_tables,
            tables.sparse_tables,
            tables.sparse_growths,
            crate::unwind::functions_deferred(),
            tables.rows,
            mib(tables.bytes_used),
            mib(tables.bytes_capacity),
            mib(tables.text_bytes),
            tables.table_full,
            tables.build_failures,
            tables.process_full,
            tables.mappings_dropped,
            tables.loads,
        )
        + &cache
}

/// What the recording cost in memory: hostprof's peak resident memory and
/// the kernel memory of its BPF maps (not part of the former; charged to
/// its cgroup).
pub(super) fn memory_report(map_bytes: u64) -> String {
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    format!(
        "hostprof: memory: peak RSS {:.1} MiB; BPF maps {:.1} MiB of kernel memory\n",
        mib(crate::status::peak_rss()),
        mib(map_bytes)
    )
}

/// With `--bpf-stats`: the thread-context code on its own clock, per
/// sample and per sample that left with a link. Issue 30's cost is judged
/// by these (`cargo xtask bench --only thread-context`): the program's
/// whole run time varies by more than the context costs from one run to
/// the next. Empty when nothing was timed.
pub(super) fn context_cost(counters: &Counters) -> String {
    use hostprof_common::Counter::{
        TraceContextNs, TraceContextTimed, TraceLinkedNs, TraceLinkedTimed,
    };
    let per = |ns, runs| counters.get(ns) as f64 / counters.get(runs).max(1) as f64;
    match counters.get(TraceContextTimed) {
        0 => String::new(),
        timed => format!(
            "hostprof: thread-context code: {timed} samples, {:.0} ns per sample; {} linked, \
             {:.0} ns per linked sample\n",
            per(TraceContextNs, TraceContextTimed),
            counters.get(TraceLinkedTimed),
            per(TraceLinkedNs, TraceLinkedTimed),
        ),
    }
}

/// What language runtimes' processes were sampled without: their frames,
/// because the kernel's map of them (sized at load) was full; a Go
/// executable's goroutine labels, because its layout could not be read.
/// Empty when nothing was.
pub(super) fn runtimes_report() -> String {
    let full = match crate::runtime::unregistered_full() {
        0 => String::new(),
        full => format!(
            "hostprof: runtime capacity: {full} Python or Java processes sampled without their \
             runtime's frames (the kernel's map of them was full)\n"
        ),
    };
    let go = match crate::runtime::go_labels::unreadable() {
        0 => String::new(),
        n => format!(
            "hostprof: go labels: not read for {n} Go executable(s) (`--log-level info` says \
             why)\n"
        ),
    };
    full + &go
}

/// `name count, …` of each of `stops`, named without `prefix`.
fn stop_list(counters: &Counters, stops: &[hostprof_common::Counter], prefix: &str) -> String {
    let names: Vec<String> = stops
        .iter()
        .map(|counter| {
            let name = counter.name().trim_start_matches(prefix).replace('_', " ");
            format!("{name} {}", counters.get(*counter))
        })
        .collect();
    names.join(", ")
}

/// `name count, …` of each way `runtime`'s walks stop short.
fn runtime_stops(counters: &Counters, runtime: hostprof_common::runtime::Runtime) -> String {
    let names: Vec<String> = runtime
        .stops()
        .iter()
        .map(|&reason| {
            let name = runtime.events()[reason as usize].replace('_', " ");
            format!("{name} {}", counters.runtime(runtime, reason))
        })
        .collect();
    names.join(", ")
}

fn humanize(duration: Duration) -> String {
    match duration.as_nanos() {
        ns if ns % 1_000_000 == 0 => format!("{} ms", ns / 1_000_000),
        ns if ns % 1_000 == 0 => format!("{} us", ns / 1_000),
        ns => format!("{ns} ns"),
    }
}
