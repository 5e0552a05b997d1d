//! `hostprof agent`: sample the whole host continuously and export one OTLP
//! profile window per report interval, until SIGTERM/SIGINT or `--duration`;
//! the window in progress is sent before exiting.
//!
//! The resolver thread cuts windows (it owns the [`ProfileBuilder`]) and hands
//! each request to the exporter task over an unbounded channel; the exporter
//! owns the byte-bounded retry queue, so a slow or absent collector never
//! holds up sampling.
use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio::sync::{mpsc::unbounded_channel, watch};

use super::{
    AgentArgs,
    record::unix_nanos_now,
    session::{Mode, Session},
};
use crate::{
    config::AgentConfig,
    export::{ExportConfig, ExportStats, Windows, run_exporter},
    output,
    profile::{ProfileBuilder, ResourceConfig},
    sampler::SamplerOptions,
    status::{self, Snapshot},
};

/// How often the snapshot behind status lines and metrics is refreshed.
const SNAPSHOT_PERIOD: Duration = Duration::from_secs(2);
/// Time the pipeline may keep symbolizing after a stop is asked for.
const SYMBOLIZE_AT_SHUTDOWN: Duration = Duration::from_secs(3);
/// Time allowed, beyond one export timeout, for the last windows at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let config = AgentConfig::load(args.flags())?;
    if args.print_config {
        print!("{}", config.to_toml());
        return Ok(());
    }
    super::init_logging(config.agent.log_format, &config.shared.log_level);
    let resource = ResourceConfig::from_env(config.agent.service_name.as_deref())?;
    let export = ExportConfig::from_agent(&config.agent);
    let endpoint = export.endpoint.clone();
    // Before loading anything: a taken port fails fast with nothing to undo.
    let metrics = match config.agent.metrics_addr {
        Some(addr) => Some(status::server::bind(addr).await?),
        None => None,
    };
    let (requests_tx, requests_rx) = unbounded_channel();
    let (export_tx, export_progress) = watch::channel(ExportStats::default());
    let exporter = tokio::spawn(run_exporter(export, requests_rx, export_tx));

    let (unwind, unwind_chunks) = config.shared.unwind_options();
    let options = SamplerOptions {
        unwind,
        unwind_chunks,
        early_copy_bytes: config.shared.early_copy_bytes(),
        frequency_hz: config.shared.frequency,
        pids: None,
        off_cpu: config.shared.off_cpu_options(),
        process_environment: config.shared.process_environment,
        ..Default::default()
    };
    let symbolizer = config.shared.symbolizer_options();
    let (frequency, interval) = (config.shared.frequency, config.agent.report_interval);
    let session = Session::start(
        &options,
        symbolizer,
        config.shared.table_cache_options(),
        Mode::Agent,
        None,
        move |batches| {
            let builder = ProfileBuilder::new(resource, frequency, unix_nanos_now());
            let mut windows = Windows::new(builder, interval, requests_tx);
            output::drain(batches, &mut [&mut windows]);
            windows.finish()
        },
    )?;
    let (snapshot_tx, snapshots) = watch::channel(Snapshot::default());
    let server = metrics.map(|listener| {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!("serving Prometheus metrics at http://{addr}/metrics");
        }
        tokio::spawn(status::server::serve(listener, snapshots))
    });
    tracing::info!("hostprof agent sampling at {frequency} Hz, exporting to {endpoint}");

    let why = watch_until_end(
        &session,
        &export_progress,
        &snapshot_tx,
        config.agent.status_interval,
        args.duration,
    )
    .await?;
    if let Some(server) = server {
        server.abort();
    }
    let finished = session.stop(Some(SYMBOLIZE_AT_SHUTDOWN)).await?;
    // The exporter tries what is queued once more; a collector that accepts
    // connections but never answers must not hold up the exit.
    let stats = match tokio::time::timeout(config.agent.export_timeout + SHUTDOWN_GRACE, exporter)
        .await
    {
        Ok(joined) => joined
            .context("the exporter task panicked")?
            .context("cannot start the OTLP exporter")?,
        Err(_) => {
            let stats = *export_progress.borrow();
            tracing::warn!(
                "the collector at {endpoint} did not answer at shutdown; dropping {} KiB of unsent profiles",
                stats.queue_bytes / 1024
            );
            ExportStats {
                dropped: stats.dropped + 1,
                ..stats
            }
        }
    };
    let windows = finished.output;
    tracing::info!(
        "hostprof agent stopped ({why}): {} samples in {} windows; exported {} requests \
         ({} KiB before gzip) to {endpoint}, dropped {}; lost {} samples",
        windows.samples,
        windows.cut,
        stats.sent,
        stats.sent_bytes / 1024,
        stats.dropped,
        finished.counters.lost() + finished.reader.dropped_backlog,
    );
    eprint!(
        "{}",
        super::record::unwind_report(&finished.counters, finished.unwind)
    );
    Ok(())
}

/// Refreshes the snapshot (for metrics) and logs status lines until SIGTERM,
/// SIGINT or `duration`; returns which.
async fn watch_until_end<T: Send + 'static>(
    session: &Session<T>,
    export: &watch::Receiver<ExportStats>,
    snapshots: &watch::Sender<Snapshot>,
    status_interval: Duration,
    duration: Option<Duration>,
) -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let end = async {
        match duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(end);
    // Often enough for short status intervals; no faster when they are off.
    let period = match status_interval {
        Duration::ZERO => SNAPSHOT_PERIOD,
        interval => SNAPSHOT_PERIOD.min(interval.max(Duration::from_millis(100))),
    };
    let mut refresh = tokio::time::interval(period);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_status = Instant::now();
    loop {
        tokio::select! {
            _ = &mut end => return Ok("duration reached"),
            _ = terminate.recv() => return Ok("SIGTERM"),
            _ = interrupt.recv() => return Ok("SIGINT"),
            _ = refresh.tick() => {
                let (rss_bytes, cpu_ns) = status::own_usage();
                let snapshot = Snapshot {
                    kernel: session.sampler.counters().unwrap_or_default(),
                    reader: *session.reader_progress.borrow(),
                    export: *export.borrow(),
                    rss_bytes,
                    bpf_map_bytes: session.sampler.map_bytes(),
                    cpu_ns,
                    tracked_processes: session.pipeline.tracked_processes.load(Ordering::Relaxed),
                    process_sweeps: session.pipeline.process_sweeps.load(Ordering::Relaxed),
                    symbol_cache_bytes: session.pipeline.symbol_cache_bytes.load(Ordering::Relaxed),
                    unsymbolized: session.pipeline.unsymbolized_samples.load(Ordering::Relaxed),
                    proc_reads: session.pipeline.proc_reads.load(Ordering::Relaxed),
                    early: (
                        session.pipeline.early_unwound.load(Ordering::Relaxed),
                        session.pipeline.early_timed_out.load(Ordering::Relaxed),
                        session.pipeline.early_dropped.load(Ordering::Relaxed),
                    ),
                };
                snapshots.send_replace(snapshot);
                if !status_interval.is_zero() && last_status.elapsed() >= status_interval {
                    last_status = Instant::now();
                    tracing::info!(target: "hostprof::status", "status {}", snapshot.status_line());
                }
            }
        }
    }
}
