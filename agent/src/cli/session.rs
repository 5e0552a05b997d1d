//! The running parts every command shares: the eBPF sampler, the ring reader
//! task, the pipeline's threads and a worker thread, started and stopped
//! together.
//!
//! Commands differ only in what the worker does with the resolved batches
//! (`work`): `record` feeds its outputs, `agent` also cuts export windows.
use std::{
    sync::{Arc, mpsc},
    thread::JoinHandle,
};

use anyhow::Context;
use tokio::sync::watch;

use crate::{
    model::ResolvedSample,
    pipeline,
    sampler::{Counters, ReaderStats, Sampler, SamplerOptions, UnwindMode, read_ring},
    symbolize::{Symbolizer, SymbolizerOptions},
    unwind::{LoaderStats, SharedStats},
};

/// Batches of samples waiting for the resolver; beyond this the reader drops
/// (and counts) rather than letting memory grow.
const BACKLOG_BATCHES: usize = 256;

/// A started sampler with its reader and resolver thread.
pub(super) struct Session<T> {
    pub sampler: Sampler,
    stop_tx: watch::Sender<bool>,
    reader: tokio::task::JoinHandle<std::io::Result<ReaderStats>>,
    worker: JoinHandle<T>,
    unwind: Option<SharedStats>,
}

/// What a session left when it stopped.
pub(super) struct Finished<T> {
    /// What the resolver thread returned.
    pub output: T,
    pub reader: ReaderStats,
    pub counters: Counters,
    /// The sampler program's run time and run count (zero without BPF stats).
    pub program_stats: (std::time::Duration, u64),
    /// Unwind tables in the kernel at the end (with `UnwindMode::Tables`).
    pub unwind: Option<LoaderStats>,
}

impl<T: Send + 'static> Session<T> {
    /// Loads and attaches the sampler, then runs `work` on a thread of its own
    /// with the resolved batches; they end when the session stops.
    pub fn start(
        options: &SamplerOptions,
        symbolizer: SymbolizerOptions,
        work: impl FnOnce(mpsc::Receiver<Vec<ResolvedSample>>) -> T + Send + 'static,
    ) -> anyhow::Result<Self> {
        let mut sampler = Sampler::start(options)?;
        let ring = sampler.take_ring()?;
        let (requests, unwind) = match options.unwind {
            UnwindMode::Tables => {
                let maps = sampler.take_unwind_maps()?;
                let preload = options.pids.clone().unwrap_or_default();
                let (requests, stats) = crate::unwind::spawn_service(
                    maps,
                    options.unwind_chunks,
                    preload,
                    options.pids.is_none(),
                )
                .context("cannot start the unwind table thread")?;
                (Some(requests), Some(stats))
            }
            UnwindMode::FramePointers => (None, None),
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let (batch_tx, batch_rx) = mpsc::sync_channel(BACKLOG_BATCHES);
        let reader = tokio::spawn(read_ring(ring, batch_tx, stop_rx));
        // After the sampler: a failure to load says only that, and kallsyms
        // then lists our own programs too.
        let symbolizer = Arc::new(Symbolizer::with_options(symbolizer));
        let resolved = pipeline::spawn(batch_rx, symbolizer, requests)
            .context("cannot start the pipeline threads")?;
        let worker = std::thread::Builder::new()
            .name("hostprof-work".into())
            .spawn(move || work(resolved))
            .context("cannot start the worker thread")?;
        Ok(Session {
            sampler,
            stop_tx,
            reader,
            worker,
            unwind,
        })
    }

    /// Stops sampling, lets the reader drain the ring and the resolver finish.
    pub async fn stop(mut self) -> anyhow::Result<Finished<T>> {
        self.sampler.stop();
        let _ = self.stop_tx.send(true);
        let reader = self.reader.await.context("the ring reader panicked")??;
        let worker = self.worker;
        let output = tokio::task::spawn_blocking(move || worker.join())
            .await
            .context("cannot wait for the resolver thread")?
            .map_err(|_| anyhow::anyhow!("the resolver thread panicked"))?;
        let counters = self.sampler.counters()?;
        let program_stats = self.sampler.program_stats()?;
        let unwind = self
            .unwind
            .as_ref()
            .map(|stats| *stats.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(Finished {
            output,
            reader,
            counters,
            program_stats,
            unwind,
        })
    }
}
