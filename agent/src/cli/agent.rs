//! `hostprof agent`: sample the whole host continuously and export one OTLP
//! profile window per report interval, until SIGTERM/SIGINT or `--duration`;
//! the window in progress is sent before exiting.
//!
//! The resolver thread cuts windows (it owns the [`ProfileBuilder`]) and hands
//! each request to the exporter task over an unbounded channel; the exporter
//! owns the byte-bounded retry queue, so a slow or absent collector never
//! holds up sampling.
use std::{
    sync::mpsc::{Receiver, RecvTimeoutError},
    time::{Duration, Instant},
};

use anyhow::Context;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

use super::{AgentArgs, record::unix_nanos_now, session::Session};
use crate::{
    export::{ExportConfig, run_exporter},
    model::ResolvedSample,
    profile::{ProfileBuilder, ResourceConfig},
    sampler::SamplerOptions,
};

/// What the resolver thread did.
#[derive(Debug, Default)]
struct Windows {
    cut: u64,
    samples: u64,
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let resource = ResourceConfig::from_env(args.service_name.as_deref())?;
    let queue_bytes =
        usize::try_from(args.export_queue_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    let config = ExportConfig::from_env(
        args.otlp_endpoint.as_deref(),
        args.otlp_ca.clone(),
        args.export_timeout,
        queue_bytes,
    )?;
    let endpoint = config.endpoint.clone();
    let (requests_tx, requests_rx) = unbounded_channel();
    let exporter = tokio::spawn(run_exporter(config, requests_rx));

    let options = SamplerOptions {
        frequency_hz: args.frequency,
        pids: None,
        off_cpu: args.off_cpu.options(),
        ..Default::default()
    };
    let (frequency, interval) = (args.frequency, args.report_interval);
    let session = Session::start(
        &options,
        args.symbols.options(super::AGENT_SYMBOL_CACHE_MIB),
        move |batches| {
            let builder = ProfileBuilder::new(resource, frequency, unix_nanos_now());
            cut_windows(batches, builder, interval, requests_tx)
        },
    )?;
    tracing::info!("hostprof agent sampling at {frequency} Hz, exporting to {endpoint}");

    let why = wait_for_end(args.duration).await?;
    let finished = session.stop().await?;
    let stats = exporter
        .await
        .context("the exporter task panicked")?
        .context("cannot start the OTLP exporter")?;
    let windows = finished.output;
    eprintln!(
        "hostprof: agent stopped ({why}): {} samples in {} windows; exported {} requests \
         ({} KiB before gzip) to {endpoint}, dropped {}; lost {} samples",
        windows.samples,
        windows.cut,
        stats.sent,
        stats.sent_bytes / 1024,
        stats.dropped,
        finished.counters.lost() + finished.reader.dropped_backlog,
    );
    Ok(())
}

/// Resolves batches into `builder` and sends a request every `interval`, and
/// once more when the batches end.
fn cut_windows(
    batches: Receiver<Vec<ResolvedSample>>,
    mut builder: ProfileBuilder,
    interval: Duration,
    requests: UnboundedSender<hostprof_proto::collector::ExportProfilesServiceRequest>,
) -> Windows {
    let mut windows = Windows::default();
    let mut deadline = Instant::now() + interval;
    let cut = |builder: &mut ProfileBuilder, windows: &mut Windows| {
        windows.samples += builder.samples();
        let request = builder.finish(unix_nanos_now());
        windows.cut += 1;
        if !request.resource_profiles.is_empty() {
            // Fails only when the exporter is gone, which ends the agent anyway.
            let _ = requests.send(request);
        }
    };
    loop {
        // Batches may arrive faster than the timeout, so check the clock first.
        let now = Instant::now();
        if now >= deadline {
            cut(&mut builder, &mut windows);
            deadline += interval;
            if deadline <= now {
                deadline = now + interval;
            }
        }
        match batches.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(batch) => {
                for sample in &batch {
                    builder.add(sample);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                cut(&mut builder, &mut windows);
                return windows;
            }
        }
    }
}

async fn wait_for_end(duration: Option<Duration>) -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let duration = async {
        match duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    Ok(tokio::select! {
        _ = duration => "duration reached",
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
    })
}
