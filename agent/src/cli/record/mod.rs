//! `hostprof record`: sample for a while, then write a profile (folded, SVG,
//! pprof, OTLP protobuf or JSON) and a summary. `launch.rs` starts a
//! command to profile, `stack_copies.rs` writes `--stack-copy-dir`
//! snapshots, `report.rs` the closing lines, `idle.rs` the hint when
//! `-p` names a launcher whose children did the work.
mod idle;
mod launch;
mod report;
mod stack_copies;

pub(super) use report::unwind_report;
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use super::{
    RecordArgs,
    progress::{Live, LiveSummary, Progress},
    session::{Mode, Session},
};
use crate::{
    config::SharedSettings,
    output::{self, OutputFormat, ProfileFile, write_output},
    procs,
    profile::ResourceConfig,
    sampler::{Sampler, SamplerOptions},
};
use launch::spawn_profiled;
use report::{context_cost, memory_report, report, runtimes_report};
use stack_copies::keep_stack_copies;

/// Wall-clock time in Unix nanoseconds.
pub(crate) fn unix_nanos_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|time| time.as_nanos() as u64)
        .unwrap_or(0)
}

pub async fn run(args: RecordArgs, settings: SharedSettings) -> anyhow::Result<()> {
    let format = OutputFormat::chosen(args.format, args.output.as_deref())?;
    for pid in &args.pids {
        if !procs::is_alive(*pid) {
            bail!("no process with pid {pid}: check it with `ps -p {pid}`");
        }
    }
    // A command's children are part of it (as with perf); -p means just
    // those, or with --children their descendants too.
    let following = !args.command.is_empty() || args.children;
    let procfs = idle::ProcFs::new();
    let targets = if args.children {
        procfs.snapshot(&args.pids).pids()
    } else {
        args.pids.clone()
    };
    let pids = (!args.pids.is_empty() || !args.command.is_empty()).then(|| targets.clone());
    let (unwind, unwind_chunks) = settings.unwind_options();
    let options = SamplerOptions {
        unwind,
        unwind_chunks,
        frequency_hz: settings.frequency,
        pids,
        bpf_stats: args.bpf_stats,
        follow_children: following,
        off_cpu: settings.off_cpu_options(),
        process_environment: settings.process_environment,
        stack_copy_bytes: args.stack_copy.unwrap_or(0),
        early_copy_bytes: settings.early_copy_bytes(),
        // The whole sampling program once a process needs it; a command's
        // from its start.
        lean_start: args.command.is_empty(),
        ..Default::default()
    };
    let (copies, stack_copies) = match args.stack_copy {
        Some(_) => {
            // Bounded: a slow disk drops copies (counted), never grows us.
            let (tx, rx) = std::sync::mpsc::sync_channel(STACK_COPY_QUEUE);
            let dir = args.stack_copy_dir.clone();
            if let Some(dir) = &dir {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            let thread = std::thread::Builder::new()
                .name("hostprof-stack-copy".into())
                .spawn(move || keep_stack_copies(rx, dir.as_deref()))
                .context("cannot start the stack copy thread")?;
            (Some(tx), Some(thread))
        }
        None => (None, None),
    };
    let start = unix_nanos_now();
    let cpu_period_ns = 1_000_000_000 / settings.frequency;
    let resource = match format {
        Some(OutputFormat::Otlp | OutputFormat::OtlpJson) => ResourceConfig::from_env(None)?,
        _ => ResourceConfig::default(),
    };
    let mut output = ProfileFile::new(
        format,
        settings.frequency,
        start,
        settings.off_cpu.then_some(cpu_period_ns),
        resource,
    );
    let live = Arc::new(Live::default());
    let worker_live = live.clone();
    let mut session = Session::start(
        &options,
        settings.symbolizer_options(),
        settings.table_cache_options(),
        Mode::Record,
        copies,
        move |batches| {
            let mut summary = LiveSummary::new(worker_live);
            output::drain(batches, &mut [&mut output, &mut summary]);
            (output, summary.into_summary())
        },
    )?;
    let progress = Progress::on_terminal(live, session.reader_progress.clone(), args.duration);
    if args.children {
        // Forked after the scan above, before forks were followed.
        for pid in procfs.snapshot(&args.pids).pids() {
            if !targets.contains(&pid) {
                session.sampler.add_pid(pid)?;
            }
        }
    }
    // Without following, a launcher's children are not profiled: measure
    // who works, to say so if the named processes barely ran.
    let before = (!following && !args.pids.is_empty()).then(|| procfs.snapshot(&args.pids));

    let started = Instant::now();
    let mut child = match args.command.as_slice() {
        [] => None,
        command => Some(spawn_profiled(command, &mut session.sampler)?),
    };
    let why = wait_for_end(
        &args,
        settings.frequency,
        child.as_mut(),
        &mut session.sampler,
        progress.as_ref(),
    )
    .await?;
    let after = before.as_ref().map(|_| procfs.snapshot(&args.pids));
    if let Some(progress) = &progress {
        progress.clear();
    }
    let elapsed = started.elapsed();

    let finished = session.stop(None).await?;
    let (output, summary) = finished.output;
    if let (Some(path), Some(format)) = (&args.output, format) {
        let end = unix_nanos_now();
        write_output(path, |out| output.write(format, end, "hostprof", out))?;
    }
    eprint!(
        "{}",
        report(
            &args,
            &settings,
            elapsed,
            why,
            &finished.counters,
            &finished.reader,
            &summary
        )
    );
    eprint!("{}", unwind_report(&finished.counters, finished.unwind));
    eprint!("{}", memory_report(finished.map_bytes));
    eprint!("{}", runtimes_report());
    if finished.reader.early_copies > 0 {
        let (unwound, timed_out, dropped, orphaned) = finished.early;
        let (copies, complete) = (finished.reader.early_copies, finished.early_complete);
        eprintln!(
            "hostprof: early samples (before their tables, or their library's, were loaded): \
             {unwound} unwound on the host from stack copies ({complete} complete), {timed_out} kept their frame-pointer \
             stacks (tables not in time), {dropped} copies dropped (queue full), {orphaned} \
             whose sample was lost, of {copies} copies; the copies were freed, never written"
        );
    }
    if let Some(thread) = stack_copies {
        // The reader, which held the sender, has stopped: the thread ends.
        let kept = thread
            .join()
            .map_err(|_| anyhow::anyhow!("the stack copy thread panicked"))??;
        eprintln!(
            "hostprof: stack copies: {} samples carried {} bytes of user stack each (or less at \
             the top of a stack){}{}",
            finished.reader.stack_copies,
            args.stack_copy.unwrap_or(0),
            match finished.reader.stack_copies_dropped {
                0 => String::new(),
                dropped => format!("; {dropped} dropped (queue full)"),
            },
            match &args.stack_copy_dir {
                Some(dir) => format!("; {kept} snapshots written to {}", dir.display()),
                None => String::new(),
            }
        );
    }
    if args.bpf_stats {
        let stats = finished.program_stats;
        eprintln!(
            "hostprof: eBPF program ran {} times, {:.0} ns per run{}",
            stats.runs,
            stats.run_time.as_nanos() as f64 / stats.runs.max(1) as f64,
            match stats.verified_instructions {
                Some(count) => format!("; the verifier walked {count} instructions to load it"),
                None => String::new(),
            }
        );
        eprint!("{}", context_cost(&finished.counters));
    }
    if let (Some(before), Some(after)) = (&before, &after)
        && let Some(note) = idle::idle_note(
            before,
            after,
            &args.pids,
            summary.samples(),
            settings.frequency,
        )
    {
        eprintln!("{note}");
    }
    if let Some(mut child) = child
        && let Ok(Some(status)) = child.try_wait()
        && !status.success()
    {
        eprintln!("hostprof: the profiled command exited with {status}");
    }
    Ok(())
}

/// Stack copies waiting to be written at most (16 KiB each: 16 MiB).
const STACK_COPY_QUEUE: usize = 1024;

/// How often a recording prunes its process filter and redraws its
/// progress line.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// How often a lean start looks whether a process needs what it deferred
/// (`Sampler::has_deferred`); once nothing is, it no longer looks.
const UPGRADE_POLL: Duration = Duration::from_millis(100);

/// Why the recording ended.
#[derive(Clone, Copy, Debug)]
pub(super) enum End {
    Duration,
    Interrupted,
    CommandExited,
    ProcessesExited,
}

/// The line `record` prints on stderr once it samples and Ctrl-C ends the
/// recording (rather than killing hostprof): scripts and tests wait for it.
pub const RECORDING_LINE: &str = "hostprof: recording";

async fn wait_for_end(
    args: &RecordArgs,
    frequency: u64,
    child: Option<&mut tokio::process::Child>,
    sampler: &mut Sampler,
    progress: Option<&Progress>,
) -> anyhow::Result<End> {
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot handle SIGINT")?;
    eprintln!("{RECORDING_LINE} at {frequency} Hz (Ctrl-C to stop)");
    // A followed tree adds pids to the filter; drop the exited ones.
    let following = child.is_some() || args.children;
    let duration = async {
        match args.duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    let command = async {
        match child {
            Some(child) => {
                let _ = child.wait().await;
            }
            None => std::future::pending().await,
        }
    };
    let targets = async {
        if args.pids.is_empty() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if !args.pids.iter().any(|pid| procs::is_alive(*pid)) {
                return;
            }
        }
    };
    // Every 100 ms while it can happen: the whole sampling program, or
    // CPython's walk, once a process needs it (a JVM found 0.1 s after it
    // starts); once a second:
    // prune the filter, and redraw the progress line.
    let sweep = async {
        if let Some(progress) = progress {
            progress.show(sampler.counters().ok().as_ref());
        }
        let mut swept = Instant::now();
        loop {
            let until_sweep = SWEEP_INTERVAL.saturating_sub(swept.elapsed());
            let wait = if sampler.has_deferred() {
                until_sweep.min(UPGRADE_POLL)
            } else {
                until_sweep
            };
            tokio::time::sleep(wait).await;
            super::session::upgrade_when_wanted(sampler);
            if swept.elapsed() < SWEEP_INTERVAL {
                continue;
            }
            swept = Instant::now();
            if following && let Err(err) = sampler.forget_exited_pids() {
                tracing::warn!("cannot prune the process filter: {err}");
            }
            if let Some(progress) = progress {
                progress.show(sampler.counters().ok().as_ref());
            }
        }
    };
    Ok(tokio::select! {
        _ = duration => End::Duration,
        _ = sweep => End::Duration,
        _ = interrupt.recv() => End::Interrupted,
        _ = command => End::CommandExited,
        _ = targets => End::ProcessesExited,
    })
}
