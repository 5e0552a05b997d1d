//! The userspace pipeline: a raw kernel [`Sample`] becomes a [`ResolvedSample`]
//! (procs → unwind → symbolize) and goes, in batches, to the sinks of
//! [`crate::output`]. See [`spawn`].
//!
//! The kernel already walked the stacks (frame pointers), so "unwind" here is
//! turning each instruction pointer into a [`Frame`] with its mapping.
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{self, Receiver},
    },
    time::{Duration, Instant},
};

use hostprof_common::{Sample, runtime::FRAME_MARK};

mod naming;
pub use naming::Naming;

use crate::{
    sampler::{EarlyCopy, Records},
    unwind::early::EarlyStacks,
};

use crate::{
    model::{Frame, FrameKind, Line, OffCpu, ProcessInfo, ResolvedSample, ThreadState, TraceLink},
    procs::{EventSource, ProcessTable, thread_attrs},
    runtime::Runtime,
    symbolize::Symbolizer,
    unwind,
};

/// Converts kernel CLOCK_MONOTONIC timestamps to Unix time.
#[derive(Clone, Copy, Debug)]
pub struct KernelClock {
    /// realtime - monotonic, in nanoseconds.
    offset_ns: i128,
}

impl KernelClock {
    /// Measures the offset now. Two clock reads that an interrupt or a
    /// preemption falls between are off by that gap (milliseconds on a
    /// loaded VM), which shifts every sample's timestamp alike: of a few
    /// brackets (monotonic, realtime, monotonic), the narrowest is kept.
    pub fn now() -> Self {
        let brackets = (0..CLOCK_BRACKETS).map(|_| {
            let before = clock_ns(libc::CLOCK_MONOTONIC);
            let realtime = clock_ns(libc::CLOCK_REALTIME);
            (before, realtime, clock_ns(libc::CLOCK_MONOTONIC))
        });
        KernelClock {
            offset_ns: narrowest_offset(brackets).unwrap_or(0),
        }
    }

    /// Unix time in nanoseconds of a `bpf_ktime_get_ns()` value.
    pub fn to_unix_nanos(&self, ktime_ns: u64) -> u64 {
        (ktime_ns as i128 + self.offset_ns).max(0) as u64
    }
}

/// Brackets read by [`KernelClock::now`].
const CLOCK_BRACKETS: usize = 8;

/// realtime - monotonic from the narrowest of `(monotonic, realtime,
/// monotonic)` brackets, the realtime reading set against the middle of
/// its bracket.
fn narrowest_offset(brackets: impl Iterator<Item = (i128, i128, i128)>) -> Option<i128> {
    brackets
        .min_by_key(|(before, _, after)| after - before)
        .map(|(before, realtime, after)| realtime - (before + after) / 2)
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// Batches of attributed samples waiting for symbolization: seconds of
/// backlog, so a slow first parse of a large binary never holds up reading
/// /proc for processes that may exit soon.
const SYMBOLIZE_BACKLOG_BATCHES: usize = 128;

/// Starts the userspace pipeline: attribution (procs → frames) and
/// symbolization, each on a thread of its own. Finished batches come out of
/// the returned channel, which closes after `batches` closes and the stages
/// have drained.
///
/// Two stages because they have different deadlines: attribution must read
/// /proc while the process still exists; symbolization may take its time
/// (its first look at a large binary can take a second).
///
/// Once `state.hurry` is set, the rest is passed on unsymbolized (addresses
/// and mappings only, which OTLP backends can symbolize): a bounded shutdown
/// that loses no sample.
pub fn spawn(
    batches: Receiver<Records>,
    symbolizer: Arc<Symbolizer>,
    unwind: Option<unwind::Requests>,
    events: Option<EventSource>,
    early: Option<(Receiver<EarlyCopy>, EarlyStacks)>,
    runtimes: Vec<Box<dyn Runtime>>,
    state: Arc<PipelineState>,
) -> std::io::Result<Receiver<Vec<ResolvedSample>>> {
    let symbols_state = state.clone();
    let (attributed_tx, attributed_rx) = mpsc::sync_channel(SYMBOLIZE_BACKLOG_BATCHES);
    let (done_tx, done_rx) = mpsc::sync_channel(SYMBOLIZE_BACKLOG_BATCHES);
    std::thread::Builder::new()
        .name("hostprof-procs".into())
        .spawn(move || {
            let mut attributor = Attributor::new();
            attributor.read_environment(!state.no_process_environment);
            attributor.unwind = unwind;
            attributor.runtimes = runtimes;
            if let Some(events) = events {
                attributor.follow_events(events);
            }
            attributor.early = early;
            let mut batches = batches.into_iter();
            loop {
                let batch = batches.next();
                let ended = batch.is_none();
                // Every event before these samples is in the ring by now.
                attributor.apply_events();
                let attributed = attributor.attribute_batch(&batch.unwrap_or_default(), ended);
                if let Some((_, early)) = &attributor.early {
                    let figures = early.stats();
                    for (to, figure) in [
                        (&state.early_unwound, figures.unwound),
                        (&state.early_complete, figures.complete),
                        (&state.early_timed_out, figures.timed_out),
                        (&state.early_dropped, figures.dropped),
                        (&state.early_orphaned, figures.orphaned),
                    ] {
                        to.store(figure, Ordering::Relaxed);
                    }
                }
                if attributed.is_empty() {
                    if ended {
                        break;
                    }
                    continue;
                }
                state
                    .tracked_processes
                    .store(attributor.cached_processes() as u64, Ordering::Relaxed);
                state
                    .process_sweeps
                    .store(attributor.sweeps, Ordering::Relaxed);
                let procs = attributor.procs.stats();
                state.proc_reads.store(procs.proc_reads, Ordering::Relaxed);
                state.process_events.store(procs.events, Ordering::Relaxed);
                if attributed_tx.send((Instant::now(), attributed)).is_err() || ended {
                    break;
                }
            }
        })?;
    std::thread::Builder::new()
        .name("hostprof-symbols".into())
        .spawn(move || {
            let mut naming = Naming::default();
            for (attributed_at, mut batch) in attributed_rx {
                for sample in &mut batch {
                    // Behind (a first look at huge binaries, a CPU-starved
                    // host): pass samples on with addresses rather than
                    // delay every window, or let the reader drop them.
                    let behind = symbols_state
                        .max_symbolize_lag
                        .is_some_and(|lag| attributed_at.elapsed() > lag);
                    if behind || symbols_state.hurry.load(Ordering::Relaxed) {
                        symbols_state
                            .unsymbolized_samples
                            .fetch_add(1, Ordering::Relaxed);
                        naming.enrich_from_cache(&symbolizer, sample);
                    } else {
                        naming.symbolize_sample(&symbolizer, sample);
                    }
                }
                symbolizer.release_idle(crate::symbolize::IDLE_PERIOD);
                let (modules, results) = symbolizer.cache_usage();
                symbols_state
                    .symbol_cache_bytes
                    .store((modules + results) as u64, Ordering::Relaxed);
                if done_tx.send(batch).is_err() {
                    break;
                }
            }
        })?;
    Ok(done_rx)
}

/// Shared with the pipeline's threads: a shutdown request, and gauges for
/// status lines and metrics.
#[derive(Debug, Default)]
pub struct PipelineState {
    /// Stop symbolizing (see [`spawn`]).
    pub hurry: AtomicBool,
    /// Processes whose metadata is cached.
    pub tracked_processes: AtomicU64,
    /// Sweeps of exited processes out of that cache so far.
    pub process_sweeps: AtomicU64,
    /// Reads of processes' `/proc` files so far (per process image, not
    /// per sample).
    pub proc_reads: AtomicU64,
    /// Forks, execs and exits heard from the kernel so far.
    pub process_events: AtomicU64,
    /// Samples taken before their tables were loaded, unwound on the host
    /// from their stack copies ([`unwind::early`]).
    pub early_unwound: AtomicU64,
    /// Of those, the stacks walked to their end.
    pub early_complete: AtomicU64,
    /// Such samples that went on with frame pointers (tables too late).
    pub early_timed_out: AtomicU64,
    /// Stack copies dropped because the early queue was full.
    pub early_dropped: AtomicU64,
    /// Stack copies whose sample never came.
    pub early_orphaned: AtomicU64,
    /// Estimated bytes of the symbolizer's caches.
    pub symbol_cache_bytes: AtomicU64,
    /// Samples attributed longer ago than this go on without names; `None`:
    /// always symbolize.
    pub max_symbolize_lag: Option<Duration>,
    /// Samples passed on without names because symbolization was behind or
    /// the agent was stopping.
    pub unsymbolized_samples: AtomicU64,
    /// Leave processes' environments unread (`--no-process-environment`).
    pub no_process_environment: bool,
}

/// Attributes raw samples to processes and mappings (the fast stage).
pub struct Attributor {
    procs: ProcessTable,
    clock: KernelClock,
    last_sweep: Instant,
    sweep_interval: Duration,
    /// Sweeps so far.
    sweeps: u64,
    /// Where to ask for a process's unwind tables again (a runtime found in
    /// it; an exec). The samples the kernel could not unwind ask from the
    /// ring's reader (`crate::sampler::CopySinks::tables`).
    unwind: Option<unwind::Requests>,
    /// The kernel's forks, execs and exits.
    events: Option<EventSource>,
    /// Stack copies of samples taken before their tables were loaded, and
    /// the samples waiting for them.
    early: Option<(Receiver<EarlyCopy>, EarlyStacks)>,
    /// Language runtimes (CPython, Java): their frames.
    runtimes: Vec<Box<dyn Runtime>>,
    /// Processes whose exit the last events said: the runtimes forget them
    /// at the next events, once the batch that holds their last samples
    /// (taken before the exit) has been named with what they knew.
    exited: Vec<u32>,
    /// Read processes' `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`.
    read_environment: bool,
}

impl Default for Attributor {
    fn default() -> Self {
        Self::new()
    }
}

impl Attributor {
    pub fn new() -> Self {
        Attributor {
            procs: ProcessTable::new(),
            clock: KernelClock::now(),
            last_sweep: Instant::now(),
            sweep_interval: sweep_interval(),
            sweeps: 0,
            unwind: None,
            events: None,
            early: None,
            runtimes: Vec::new(),
            exited: Vec::new(),
            read_environment: true,
        }
    }

    /// Attributes a batch; samples with an early stack copy wait (in
    /// `early`) for their tables and come out of a later call, unwound.
    /// `ended`: the last call, every sample still waiting comes out.
    fn attribute_batch(&mut self, batch: &Records, ended: bool) -> Vec<ResolvedSample> {
        let mut attributed = Vec::with_capacity(batch.len());
        let Some((copies, mut early)) = self.early.take() else {
            batch.for_each(|sample| attributed.push(self.attribute(sample)));
            return attributed;
        };
        // The reader sent a batch's copies before the batch.
        for copy in copies.try_iter() {
            early.add_copy(copy);
        }
        batch.for_each(|sample| {
            if early.hold(sample) {
                // Its process read while it still exists (the reader asked
                // for its tables).
                self.procs
                    .info(sample.tgid, &comm_str(&sample.comm), sample.ktime_ns);
                return;
            }
            attributed.push(self.attribute(sample));
        });
        for sample in early.ready(ended) {
            attributed.push(self.attribute(&sample));
        }
        self.early = Some((copies, early));
        attributed
    }

    /// Whether processes' environments are read (on by default).
    pub fn read_environment(&mut self, on: bool) {
        self.read_environment = on;
        self.procs.read_environment(on);
    }

    /// Tracks processes from the kernel's events from now on.
    pub fn follow_events(&mut self, events: EventSource) {
        self.procs = ProcessTable::with_events();
        self.procs.read_environment(self.read_environment);
        self.events = Some(events);
    }

    /// Applies the process events waiting; call before each batch.
    pub fn apply_events(&mut self) {
        let Some(events) = &mut self.events else {
            return;
        };
        let mut drained = Vec::new();
        events.drain(|event| drained.push(*event));
        self.apply(&drained);
    }

    /// Applies `events` (oldest first), and the runtimes' forgetting of the
    /// processes whose exit the previous ones said.
    fn apply(&mut self, events: &[hostprof_common::ProcessEvent]) {
        for pid in self.exited.drain(..) {
            for runtime in &mut self.runtimes {
                runtime.forget(pid);
            }
        }
        for event in events {
            self.procs.apply(event);
            if let Some(requests) = &self.unwind {
                requests.on_event(event);
            }
            // A new image: what a runtime knew of the pid is void now. No
            // image: after this batch, whose samples of it came before.
            match event.kind {
                hostprof_common::PROCESS_EVENT_EXEC => {
                    for runtime in &mut self.runtimes {
                        runtime.forget(event.tgid);
                    }
                }
                hostprof_common::PROCESS_EVENT_EXIT => self.exited.push(event.tgid),
                _ => {}
            }
        }
    }

    /// Processes currently cached.
    pub fn cached_processes(&self) -> usize {
        self.procs.len()
    }

    /// The sample with its process, wall-clock time, and one frame per
    /// address (mapping and file offset for user frames); no names yet.
    pub fn attribute(&mut self, sample: &Sample) -> ResolvedSample {
        let comm = comm_str(&sample.comm);
        let process = self.procs.info(sample.tgid, &comm, sample.ktime_ns);
        let kernel = &sample.kernel_stack
            [..(sample.kernel_stack_len as usize).min(sample.kernel_stack.len())];
        let user =
            &sample.user_stack[..(sample.user_stack_len as usize).min(sample.user_stack.len())];
        let mut frames = Vec::with_capacity(kernel.len() + user.len());
        frames.extend(kernel.iter().map(|&address| Frame {
            kind: FrameKind::Kernel,
            address,
            mapping: None,
            file_offset: 0,
            lines: crate::model::no_lines(),
        }));
        // A runtime frame's place (`FRAME_MARK`) stays unmapped: the
        // runtime names it below.
        frames.extend(user.iter().map(|&address| Frame {
            kind: FrameKind::Native,
            address,
            mapping: None,
            file_offset: 0,
            lines: crate::model::no_lines(),
        }));
        self.procs.map_frames(
            sample.tgid,
            &comm,
            sample.ktime_ns,
            &mut frames[kernel.len()..],
            |frame| frame.address & FRAME_MARK != FRAME_MARK,
        );
        // CPU and off-CPU samples alike: a thread waiting in `time.sleep`
        // or on a lock shows the Python function that waits.
        self.add_runtime_frames(sample, &comm, &process, &mut frames);
        if self.last_sweep.elapsed() >= self.sweep_interval {
            self.procs.forget_exited();
            for runtime in &mut self.runtimes {
                runtime.retain(&mut crate::procs::is_alive);
            }
            self.last_sweep = Instant::now();
            self.sweeps += 1;
        }
        let attributes = self.thread_attributes(sample, &process);
        let record_used = sample.flags & hostprof_common::SAMPLE_FLAG_TRACE != 0
            && sample.flags & hostprof_common::SAMPLE_FLAG_GO_LABELS == 0
            && !foreign_schema(&process);
        ResolvedSample {
            process,
            tid: sample.tid,
            thread_name: comm.into(),
            cpu: sample.cpu,
            time_unix_nano: self.clock.to_unix_nanos(sample.ktime_ns),
            frames,
            off_cpu: (sample.kind == hostprof_common::SAMPLE_KIND_OFF_CPU).then(|| OffCpu {
                blocked_ns: sample.off_cpu_ns,
                state: ThreadState::from_kernel(sample.thread_state),
            }),
            // Go labels come in a link with no trace: no link then.
            trace: record_used
                .then(|| TraceLink::from_kernel(&sample.trace))
                .flatten(),
            attributes,
        }
    }

    /// The sample's thread-context attributes, named by its process's key
    /// map (a key index past the map has the map read again soon), or its
    /// goroutine's pprof labels.
    fn thread_attributes(
        &mut self,
        sample: &Sample,
        process: &ProcessInfo,
    ) -> Vec<(Arc<str>, Arc<str>)> {
        if sample.flags & hostprof_common::SAMPLE_FLAG_TRACE == 0 {
            return Vec::new();
        }
        let len = usize::from(sample.trace.attrs_len).min(sample.attrs.len());
        let attrs = &sample.attrs[..len];
        if sample.flags & hostprof_common::SAMPLE_FLAG_GO_LABELS != 0 {
            return crate::procs::go_labels::decode(attrs);
        }
        if foreign_schema(process) {
            thread_attrs::count_foreign_record();
            return Vec::new();
        }
        thread_attrs::count_kernel_refusal(sample.trace.attrs_refused);
        if attrs.is_empty() {
            return Vec::new();
        }
        let mut keys = process.thread_keys.clone().unwrap_or_default();
        // The writer appends to its map before its records use the new
        // index: read the map again now, not after these samples went by
        // unnamed.
        if thread_attrs::names_unknown_key(attrs, &keys)
            && let Some(fresh) = self.procs.key_map_stale(sample.tgid)
        {
            keys = fresh;
        }
        thread_attrs::decode(attrs, &keys).pairs
    }
}

impl Attributor {
    /// Lets each runtime find itself in the sample's process and put its
    /// frames, named, among the native ones; a runtime found just now has
    /// the process's unwind mappings loaded again, for the kernel's walk.
    fn add_runtime_frames(
        &mut self,
        sample: &Sample,
        comm: &str,
        process: &ProcessInfo,
        frames: &mut Vec<Frame>,
    ) {
        let maps = self
            .procs
            .executable_maps(sample.tgid, comm, sample.ktime_ns);
        for runtime in &mut self.runtimes {
            runtime.identity(sample.tgid, process);
            if runtime.attach(sample.tgid, maps.as_slice())
                && let Some(requests) = &self.unwind
            {
                requests.request(sample.tgid);
            }
            runtime.add_frames(sample.tgid, &sample.runtime, frames);
        }
        // A runtime frame none of them could name (its runtime forgotten),
        // and the marks of native frames no runtime took the place of.
        for frame in frames.iter_mut() {
            if frame.kind == FrameKind::Native {
                frame.address = hostprof_unwind::without_mark(frame.address);
            }
            if frame.kind == FrameKind::Native && frame.address & FRAME_MARK == FRAME_MARK {
                frame.lines = Arc::new([Line::named(
                    UNNAMED_RUNTIME_FRAME.into(),
                    UNNAMED_RUNTIME_FRAME.into(),
                )]);
            }
        }
    }
}

/// Whether `process`'s context names a thread-context schema other than
/// the OTEP's: the kernel read its thread's record (before the thread
/// context runtime heard of the schema and stopped it, or it cannot tell),
/// but neither the link nor the attributes are taken from it.
fn foreign_schema(process: &ProcessInfo) -> bool {
    process
        .thread_keys
        .as_deref()
        .is_some_and(thread_attrs::KeyMap::foreign_schema)
}

/// How a runtime frame shows that no runtime could name.
const UNNAMED_RUNTIME_FRAME: &str = "[unknown runtime frame]";

/// How often exited processes leave the process cache: 10 s, or what
/// `HOSTPROF_SWEEP_INTERVAL_MS` says. That variable is for tests, which
/// cannot wait 10 s for each sweep; it is not a setting.
fn sweep_interval() -> Duration {
    std::env::var("HOSTPROF_SWEEP_INTERVAL_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// The NUL-padded kernel comm as text.
pub fn comm_str(comm: &[u8]) -> String {
    let end = comm
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_time_converts_to_now() {
        let clock = KernelClock::now();
        let unix = clock.to_unix_nanos(clock_ns(libc::CLOCK_MONOTONIC) as u64);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(now.abs_diff(unix) < 1_000_000_000, "{now} vs {unix}");
    }

    #[test]
    fn the_offset_comes_from_the_narrowest_bracket() {
        // True offset 1,000; the first bracket was preempted between its
        // first two reads (realtime read 5,000 ns late).
        let brackets = [
            (100, 6_100, 5_200),
            (6_000, 7_010, 6_020),
            (7_000, 8_030, 7_040),
        ];
        assert_eq!(narrowest_offset(brackets.into_iter()), Some(1_000));
        assert_eq!(narrowest_offset(std::iter::empty()), None);
    }

    /// A runtime that notes which pids it was told to forget.
    struct Forgetful(Arc<std::sync::Mutex<Vec<u32>>>);

    impl Runtime for Forgetful {
        fn attach(&mut self, _pid: u32, _mappings: &[Arc<crate::model::Mapping>]) -> bool {
            false
        }
        fn pids(&self) -> Vec<u32> {
            Vec::new()
        }
        fn forget(&mut self, pid: u32) {
            self.0.lock().unwrap().push(pid);
        }
    }

    #[test]
    fn runtimes_forget_an_exited_process_after_the_batch_with_its_last_samples() {
        let forgotten = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut attributor = Attributor::new();
        attributor.runtimes = vec![Box::new(Forgetful(forgotten.clone()))];
        let event = |kind, tgid| hostprof_common::ProcessEvent {
            kind,
            tgid,
            ..Default::default()
        };
        attributor.apply(&[
            event(hostprof_common::PROCESS_EVENT_EXIT, 7),
            event(hostprof_common::PROCESS_EVENT_EXEC, 8),
        ]);
        // An exec voids what was known at once; an exit, not yet: the
        // batch these events came before holds samples taken before it.
        assert_eq!(*forgotten.lock().unwrap(), [8]);
        attributor.apply(&[]);
        assert_eq!(*forgotten.lock().unwrap(), [8, 7]);
        attributor.apply(&[]);
        assert_eq!(*forgotten.lock().unwrap(), [8, 7]);
    }

    #[test]
    fn comm_stops_at_nul() {
        assert_eq!(comm_str(b"bash\0\0\0\0\0\0\0\0\0\0\0\0"), "bash");
        assert_eq!(comm_str(b"0123456789abcdef"), "0123456789abcdef");
    }
}
