//! The running parts every command shares: the eBPF sampler, the ring reader
//! task, the pipeline's threads and a worker thread, started and stopped
//! together.
//!
//! Commands differ only in what the worker does with the resolved batches
//! (`work`): `record` feeds its outputs, `agent` also cuts export windows.
use std::{
    sync::{Arc, atomic::Ordering, mpsc},
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context;
use tokio::sync::watch;

use crate::{
    model::ResolvedSample,
    pipeline::{self, PipelineState},
    runtime::Runtime,
    sampler::{
        Counters, ReaderStats, Sampler, SamplerOptions, StackCopy, UnwindMode,
        read_ring_with_copies,
    },
    symbolize::{Symbolizer, SymbolizerOptions},
    unwind::{LoaderStats, SharedStats},
};

/// Batches of samples waiting for the resolver; beyond this the reader drops
/// (and counts) rather than letting memory grow.
const BACKLOG_BATCHES: usize = 256;
/// How often the agent drains the sample ring when the kernel does not
/// wake it: each drain wakes the pipeline's four threads, the bulk of an
/// idle agent's CPU; its profiles are cut by the minute, so a quarter of a
/// second of delay costs nothing. The process-event ring holds 32,000
/// events a second at this interval.
const AGENT_RING_DRAIN: Duration = Duration::from_millis(250);
/// How far behind the agent's symbolization may fall before it sends
/// addresses instead of names.
const AGENT_MAX_SYMBOLIZE_LAG: Duration = Duration::from_secs(2);

/// What the session serves, which decides two trade-offs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// `record`: every sample gets names however long that takes, and the
    /// command it starts keeps its user's privileges.
    Record,
    /// `agent`: windows go out on time (samples more than 2 s behind go
    /// without names), and only [`crate::privileges::KEPT`] capabilities
    /// remain after setup.
    Agent,
    /// `top`: samples on time as for `agent` (a live view must not lag
    /// behind a first parse of a huge binary), privileges as for `record`.
    Live,
}

/// A started sampler with its reader and resolver thread.
pub(super) struct Session<T> {
    pub sampler: Sampler,
    stop_tx: watch::Sender<bool>,
    /// The reader's stats so far.
    pub reader_progress: watch::Receiver<ReaderStats>,
    reader: tokio::task::JoinHandle<std::io::Result<ReaderStats>>,
    worker: JoinHandle<T>,
    /// The pipeline's gauges and shutdown flag.
    pub pipeline: Arc<PipelineState>,
    unwind: Option<SharedStats>,
}

/// What a session left when it stopped.
pub(super) struct Finished<T> {
    /// What the resolver thread returned.
    pub output: T,
    pub reader: ReaderStats,
    pub counters: Counters,
    /// The sampling program's run time and verification.
    pub program_stats: crate::sampler::ProgramStats,
    /// Kernel memory of the BPF maps, bytes.
    pub map_bytes: u64,
    /// Unwind tables in the kernel at the end (with `UnwindMode::Tables`).
    pub unwind: Option<LoaderStats>,
    /// Samples taken before their tables were loaded: (unwound on the host
    /// from their stack copies, sent on with frame pointers, copies dropped,
    /// copies whose sample never came).
    pub early: (u64, u64, u64, u64),
    /// Of the samples unwound from their copies, those walked to the end.
    pub early_complete: u64,
}

/// Longest wait for the unwind tables of `-p` processes before sampling.
const PRELOAD_WAIT: Duration = Duration::from_secs(10);

impl<T: Send + 'static> Session<T> {
    /// Loads and attaches the sampler, then runs `work` on a thread of its own
    /// with the resolved batches; they end when the session stops. The
    /// stack copies of `options.stack_copy_bytes` go to `copies`.
    pub fn start(
        options: &SamplerOptions,
        symbolizer: SymbolizerOptions,
        table_cache: Option<crate::unwind::cache::CacheOptions>,
        mode: Mode,
        copies: Option<mpsc::SyncSender<StackCopy>>,
        work: impl FnOnce(mpsc::Receiver<Vec<ResolvedSample>>) -> T + Send + 'static,
    ) -> anyhow::Result<Self> {
        if mode != Mode::Agent {
            // Before the programs load (seconds of verifier work when
            // the CPUs are busy) and before any thread of the session.
            super::priority::raise();
        }
        let mut sampler = Sampler::load(options)?;
        if mode == Mode::Agent {
            // Perf events need CAP_PERFMON, dropped below.
            sampler.start_sampling(options.frequency_hz)?;
            // Before any thread below exists: capabilities are per thread,
            // and new threads inherit the creator's reduced set.
            // Linux 5.10 checks CAP_BPF on every bpf() call: keep it there,
            // or no unwind table could be written after this point.
            let keep_bpf = crate::privileges::map_access_needs_cap_bpf();
            match crate::privileges::drop_after_setup(keep_bpf) {
                Ok(kept) => tracing::info!(
                    "setup done; capabilities kept: {}",
                    kept.iter()
                        .map(|cap| cap.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Err(err) => tracing::warn!(
                    "cannot drop capabilities after setup ({err}); running with all of them"
                ),
            }
        }
        let ring = sampler.take_ring()?;
        let events = crate::procs::EventSource::new(sampler.take_process_events()?);
        // Language runtimes, before the named processes' tables load: a
        // JVM found now has its code cache handed to the kernel's walk
        // from the first load on.
        let runtime_code = crate::runtime::RuntimeCode::default();
        crate::runtime::present::use_map(sampler.take_array(hostprof_common::MAP_PRESENT)?);
        let mut runtimes: Vec<Box<dyn Runtime>> = vec![
            Box::new(crate::runtime::python::Python::new(
                Some(sampler.take_hash_map(hostprof_common::MAP_PYTHON_PROCESSES)?),
                Some(sampler.take_hash_map(hostprof_common::MAP_PYTHON_THREADS)?),
                runtime_code.clone(),
            )),
            Box::new(crate::runtime::java::Java::new(
                Some(sampler.take_hash_map(hostprof_common::MAP_HOTSPOT_PROCESSES)?),
                runtime_code.clone(),
            )),
            // Without the kernel's runtime walks, V8's code is left to the
            // frame-pointer walk (anonymous frames, but whole stacks).
            Box::new(crate::runtime::v8::V8::new(
                sampler
                    .runtime_walks()
                    .then(|| sampler.take_hash_map(hostprof_common::MAP_V8_PROCESSES))
                    .transpose()?,
                runtime_code.clone(),
            )),
            Box::new(crate::runtime::thread_ctx::ThreadContext::new(Some(
                sampler.take_hash_map(hostprof_common::MAP_TRACE_PROCESSES)?,
            ))),
            Box::new(crate::runtime::go_labels::GoLabels::new(Some(
                sampler.take_hash_map(hostprof_common::MAP_GO_PROCESSES)?,
            ))),
        ];
        {
            let mut procs = crate::procs::ProcessTable::new();
            for &pid in options.pids.iter().flatten() {
                let maps = procs.executable_maps(pid, "", u64::MAX);
                for runtime in &mut runtimes {
                    runtime.attach(pid, maps.as_slice());
                }
            }
        }
        // A named JVM, Node.js or Go program: walked from its first sample,
        // by the whole program, loaded now instead of the lean one.
        upgrade_when_wanted(&mut sampler);
        sampler.load_sampling_program()?;
        let (requests, unwind, mirror) = match options.unwind {
            UnwindMode::Tables => {
                let maps = sampler.take_unwind_maps()?;
                let preload = options.pids.clone().unwrap_or_default();
                let (requests, stats, preloaded, mirror) = crate::unwind::spawn_service(
                    maps,
                    options.unwind_chunks,
                    table_cache,
                    preload,
                    mode == Mode::Agent,
                    options.pids.is_some(),
                    runtime_code,
                )
                .context("cannot start the unwind table thread")?;
                // The named processes' tables before their first sample, so
                // their stacks are complete from the start; bounded, for a
                // process with huge binaries on a slow machine.
                if options.pids.is_some() && preloaded.recv_timeout(PRELOAD_WAIT).is_err() {
                    tracing::info!(
                        "unwind tables still loading after {PRELOAD_WAIT:?}: sampling starts anyway"
                    );
                }
                (Some(requests), Some(stats), Some(mirror))
            }
            UnwindMode::FramePointers => (None, None, None),
        };
        if mode == Mode::Agent {
            // The table thread has raised its priority: the only use of
            // CAP_SYS_NICE after setup.
            crate::privileges::drop_nice();
        }
        // Samples taken before their process's tables were loaded: their
        // stack copies wait in a bounded queue, in memory only.
        let (early_tx, early) = match mirror {
            Some(mirror) if options.early_copy_bytes > 0 => {
                let (tx, rx) = mpsc::sync_channel(crate::unwind::early::MAX_QUEUED);
                (
                    Some(tx),
                    Some((rx, {
                        let early = crate::unwind::early::EarlyStacks::new(mirror);
                        match requests.clone() {
                            Some(requests) => {
                                early.wanting_functions(Box::new(move |pid, pc, stack| {
                                    requests.request_function(pid, pc, Some(stack))
                                }))
                            }
                            None => early,
                        }
                    })),
                )
            }
            _ => (None, None),
        };
        // Before sampling starts, so that reading kallsyms (tens of ms, most
        // of it the kernel printing) is not in the profile; every program
        // of ours is loaded by now, so kallsyms lists them.
        let symbolizer = Arc::new(Symbolizer::with_options(symbolizer));
        sampler.start_sampling(options.frequency_hz)?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let (batch_tx, batch_rx) = mpsc::sync_channel(BACKLOG_BATCHES);
        let (progress_tx, reader_progress) = watch::channel(ReaderStats::default());
        let reader = tokio::spawn(read_ring_with_copies(
            ring,
            batch_tx,
            crate::sampler::CopySinks {
                all: copies,
                early: early_tx,
                tables: requests.clone().map(|requests| {
                    Box::new(move |pid, pc: Option<u64>| match pc {
                        Some(pc) => requests.request_function(pid, pc, None),
                        None => requests.request(pid),
                    }) as crate::sampler::AskTables
                }),
            },
            match mode {
                Mode::Agent => AGENT_RING_DRAIN,
                // Interactive: an exec's tables are asked for within 100 ms.
                Mode::Record | Mode::Live => {
                    Duration::from_millis(hostprof_common::RING_DRAIN_INTERVAL_MS)
                }
            },
            stop_rx,
            progress_tx,
        ));
        let pipeline_state = Arc::new(PipelineState {
            max_symbolize_lag: matches!(mode, Mode::Agent | Mode::Live)
                .then_some(AGENT_MAX_SYMBOLIZE_LAG),
            no_process_environment: !options.process_environment,
            ..Default::default()
        });
        let resolved = pipeline::spawn(
            batch_rx,
            symbolizer,
            requests,
            Some(events),
            early,
            runtimes,
            pipeline_state.clone(),
        )
        .context("cannot start the pipeline threads")?;
        let worker = std::thread::Builder::new()
            .name("hostprof-work".into())
            .spawn(move || work(resolved))
            .context("cannot start the worker thread")?;
        Ok(Session {
            sampler,
            stop_tx,
            reader_progress,
            reader,
            worker,
            pipeline: pipeline_state,
            unwind,
        })
    }

    /// Stops sampling, lets the reader drain the ring and the resolver finish.
    /// With a `deadline`, samples still waiting after it go on unsymbolized,
    /// so stopping takes a bounded time and loses nothing.
    pub async fn stop(mut self, deadline: Option<Duration>) -> anyhow::Result<Finished<T>> {
        self.sampler.stop();
        let _ = self.stop_tx.send(true);
        let reader = self.reader.await.context("the ring reader panicked")??;
        let worker = self.worker;
        let mut join = tokio::task::spawn_blocking(move || worker.join());
        let joined = match deadline {
            Some(deadline) => match tokio::time::timeout(deadline, &mut join).await {
                Ok(joined) => joined,
                Err(_) => {
                    tracing::info!(
                        "stopping: the samples still queued go out without symbols (addresses and build ids only)"
                    );
                    self.pipeline.hurry.store(true, Ordering::Relaxed);
                    join.await
                }
            },
            None => join.await,
        };
        let output = joined
            .context("cannot wait for the resolver thread")?
            .map_err(|_| anyhow::anyhow!("the resolver thread panicked"))?;
        let counters = self.sampler.counters()?;
        let program_stats = self.sampler.program_stats()?;
        let unwind = self
            .unwind
            .as_ref()
            .map(|stats| *stats.lock().unwrap_or_else(|e| e.into_inner()));
        let early = (
            self.pipeline.early_unwound.load(Ordering::Relaxed),
            self.pipeline.early_timed_out.load(Ordering::Relaxed),
            self.pipeline.early_dropped.load(Ordering::Relaxed) + reader.early_copies_dropped,
            self.pipeline.early_orphaned.load(Ordering::Relaxed),
        );
        Ok(Finished {
            early,
            early_complete: self.pipeline.early_complete.load(Ordering::Relaxed),
            output,
            reader,
            counters,
            program_stats,
            map_bytes: self.sampler.map_bytes(),
            unwind,
        })
    }
}

/// Replaces a lean sampling program with the whole one once a process
/// needs the JIT runtimes' walks or Go's labels (`crate::runtime`), and
/// loads CPython's walk once a Python process was found; a failure is said
/// once, and the lean program samples on.
pub fn upgrade_when_wanted(sampler: &mut Sampler) {
    if crate::runtime::python_walk_wanted() {
        sampler.load_deferred_python_walk();
    }
    if !sampler.can_upgrade() || !crate::runtime::walks_wanted() {
        return;
    }
    if let Err(err) = sampler.upgrade() {
        tracing::warn!(
            "Java and JavaScript frames and Go labels stay unread: the whole sampling program \
             did not load ({err})"
        );
    }
}
