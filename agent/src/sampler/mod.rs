//! The kernel side, seen from userspace: loads the eBPF sampler, attaches it to
//! every online CPU, and hands out its ring buffer and counters.
//!
//! [`Sampler`] is the only owner of the `aya::Ebpf` handle. Dropping it detaches
//! every perf event and unloads the program.
pub mod btf;
mod error;
mod kernel;
mod memory;
mod reader;
mod record;
mod sampling;
mod sizes;

use std::{os::fd::OwnedFd, time::Duration};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, ProgramArray, RingBuf},
    programs::{RawTracePoint, perf_event::PerfEventLinkId},
};
pub use error::SamplerError;
use hostprof_common::{
    Counter,
    runtime::{self, Runtime},
};
pub use kernel::{VARIANT_ENV, Variant, kernel_release};
pub use memory::MapMemory;
pub use reader::{AskTables, CopySinks, ReaderStats, read_ring, read_ring_with_copies};
pub use record::{
    EarlyCopy, Records, StackCopy, decode_early_copy, decode_sample, decode_sample_into,
    decode_stack_copy, encode_sample, function_wanted, needs_tables, stopped_not_loaded,
};
pub use sampling::ProgramStats;

/// The eBPF object built by `build.rs` from the agent-ebpf crate.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/hostprof"));

/// What to sample and how often.
#[derive(Clone, Debug)]
pub struct SamplerOptions {
    /// Samples per second per CPU.
    pub frequency_hz: u64,
    /// Only these processes (tgids) when set; the whole host otherwise.
    pub pids: Option<Vec<u32>>,
    /// Ring buffer size in bytes (a power of two multiple of the page size).
    pub ring_bytes: u32,
    /// Turn on the kernel's BPF run-time statistics (for overhead reports).
    pub bpf_stats: bool,
    /// With `pids`: also profile processes they fork from now on.
    pub follow_children: bool,
    /// Also record off-CPU events (threads blocked or waiting).
    pub off_cpu: Option<OffCpuOptions>,
    /// How user stacks are walked.
    pub unwind: UnwindMode,
    /// Chunks of the unwind rows map ([`UnwindMode::Tables`]).
    pub unwind_chunks: u32,
    /// Bytes of user stack (and the user registers) to copy out of the
    /// kernel with each CPU sample, at most [`hostprof_common::MAX_STACK_COPY`];
    /// 0 (the default) copies none (but see `early_copy_bytes`).
    pub stack_copy_bytes: u32,
    /// With [`UnwindMode::Tables`]: bytes of user stack copied with the
    /// samples of a process whose tables are not loaded yet, which the agent
    /// unwinds once they are and then frees (`crate::unwind::early`); 0
    /// turns that off.
    pub early_copy_bytes: u32,
    /// Name processes without a process context from `OTEL_SERVICE_NAME` /
    /// `OTEL_RESOURCE_ATTRIBUTES` in their environment (`crate::procs`).
    pub process_environment: bool,
    /// Start with the lean sampling program (`sampler/sampling.rs`), for
    /// a caller that upgrades it when a process needs more.
    pub lean_start: bool,
}

/// Bytes of stack the kernel copies for a sample taken before its
/// process's tables are loaded (`crate::unwind::early` unwinds them):
/// enough for the frames of most programs up to `main`, half the record's
/// room, half its cost.
pub const EARLY_COPY_BYTES: u32 = 8192;

/// The kernel's unwind maps ([`Sampler::take_unwind_maps`]), which the
/// unwind tables are written to.
pub struct UnwindMaps {
    pub rows: Array<MapData, hostprof_common::RowChunk>,
    /// The rows map again, for reading (the host's unwinding of early
    /// samples reads the rows where the kernel does); for whoever takes it.
    pub rows_reader: Option<Array<MapData, hostprof_common::RowChunk>>,
    pub processes: HashMap<MapData, u32, hostprof_common::unwind::ProcessMappings>,
}

/// How the kernel walks user stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnwindMode {
    /// Frame pointers (`bpf_get_stack`).
    FramePointers,
    /// Unwind tables from `.eh_frame`, frame pointers where there are none.
    #[default]
    Tables,
}

/// Which off-CPU periods become events.
#[derive(Clone, Copy, Debug)]
pub struct OffCpuOptions {
    /// Periods shorter than this are not reported.
    pub threshold: Duration,
    /// Share (0..=1) of switch-outs tracked at all; bounds the cost on busy hosts.
    pub probability: f64,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            frequency_hz: 99,
            pids: None,
            ring_bytes: hostprof_common::DEFAULT_RING_BYTES,
            bpf_stats: false,
            follow_children: false,
            off_cpu: None,
            unwind: UnwindMode::default(),
            unwind_chunks: hostprof_common::DEFAULT_UNWIND_CHUNKS,
            stack_copy_bytes: 0,
            early_copy_bytes: EARLY_COPY_BYTES,
            process_environment: true,
            lean_start: false,
        }
    }
}

/// Totals of the per-CPU counters: the [`Counter`]s, then each runtime's
/// events (`hostprof_common::runtime::Runtime::counter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters(pub [u64; runtime::COUNTERS as usize]);

// By hand: arrays of more than 32 elements have no derived `Default`.
impl Default for Counters {
    fn default() -> Self {
        Counters([0; runtime::COUNTERS as usize])
    }
}

impl Counters {
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize]
    }

    /// How often `runtime`'s walks counted `event` (one of its `reason`s
    /// or `event`s in `hostprof_common`).
    pub fn runtime(&self, runtime: Runtime, event: u32) -> u64 {
        self.0[runtime.counter(event) as usize]
    }

    /// `runtime`'s walks stopped short, by any of its reasons.
    pub fn runtime_stops(&self, runtime: Runtime) -> u64 {
        runtime
            .stops()
            .iter()
            .map(|&reason| self.runtime(runtime, reason))
            .sum()
    }

    /// Samples that fired for a wanted process but never reached userspace.
    pub fn lost(&self) -> u64 {
        self.get(Counter::RingFull)
    }
}

/// The loaded and attached eBPF sampler.
pub struct Sampler {
    ebpf: Ebpf,
    variant: Variant,
    links: Vec<PerfEventLinkId>,
    /// The off-CPU program is loaded, to attach with the perf events.
    off_cpu: bool,
    /// Kernel memory of each map, largest first, read at the load (the
    /// maps never grow; others take some of them later).
    map_memory: Vec<MapMemory>,
    /// The kernel walks JIT runtimes' frames on this kernel (V8's; HotSpot's
    /// too on the modern variant).
    runtime_walks: bool,
    /// CPython's walk is on: its programs go into the tails maps.
    python_walk: bool,
    /// A lean start: the sampling program's CPython walk waits for
    /// [`Sampler::load_deferred_python_walk`] (a Python process found).
    python_deferred: bool,
    /// The sampling program's CPython walk was loaded (or tried).
    python_sampling_loaded: bool,
    /// The sampling program is the lean one (`SamplerOptions::lean_start`),
    /// until [`Sampler::upgrade`].
    lean: bool,
    /// An upgrade failed: the lean program samples on, never tried again.
    upgrade_failed: bool,
    /// The sampling program (and its tails) are loaded.
    sampling_loaded: bool,
    /// The perf events' rate, once sampling started.
    frequency_hz: u64,
    /// Keeps BPF run-time stats on while it lives.
    _stats: Option<OwnedFd>,
}

impl Sampler {
    /// Loads the program and attaches it to every online CPU.
    pub fn start(options: &SamplerOptions) -> Result<Self, SamplerError> {
        let mut sampler = Self::load(options)?;
        sampler.start_sampling(options.frequency_hz)?;
        Ok(sampler)
    }

    /// Loads everything and attaches the process-event tracepoints: neither
    /// the perf events nor off-CPU tracing record anything until
    /// [`Sampler::start_sampling`], so the maps can be filled first
    /// (`record -p` loads the processes' unwind tables before its first
    /// sample).
    ///
    /// With `options.lean_start`, the sampling program is the lean one
    /// where there is one (the modern variant): its verification costs a
    /// third of the whole program's, and [`Sampler::upgrade`] replaces it
    /// once a process needs the JIT runtimes' walks or Go's labels.
    pub fn load(options: &SamplerOptions) -> Result<Self, SamplerError> {
        kernel::check_supported()?;
        let stats = if options.bpf_stats {
            Some(aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(SamplerError::stats)?)
        } else {
            None
        };
        let filter_by_tgid = u8::from(options.pids.is_some());
        let follow = options.follow_children && options.pids.is_some();
        // Read once: a few MB that sysfs hands out a page per read.
        let kernel_btf = std::fs::read("/sys/kernel/btf/vmlinux");
        let btf = || {
            kernel_btf.as_deref().map_err(|err| {
                SamplerError::no_btf(std::io::Error::new(err.kind(), err.to_string()))
            })
        };
        // Fork events need the child's tgid; without BTF only following
        // children fails, the agent then learns of new processes from
        // their execs and first samples.
        let tgid_offset = match btf().and_then(|btf| task_member_offset(btf, &["tgid"])) {
            Ok(offset) => offset,
            Err(err) if follow => return Err(err),
            Err(err) => {
                tracing::info!("no fork events ({err}); new processes are read at their exec");
                0
            }
        };
        let (state_offset, pid_offset) = match options.off_cpu {
            // `__state` since Linux 5.14, `state` before.
            Some(_) => (
                task_member_offset(btf()?, &["__state", "state"])?,
                task_member_offset(btf()?, &["pid"])?,
            ),
            None => (0, 0),
        };
        let threshold_ns = options
            .off_cpu
            .map_or(0, |off| off.threshold.as_nanos() as u64);
        let sample_ppm = options.off_cpu.map_or(0, |off| {
            (off.probability.clamp(0.0, 1.0) * 1e6).round() as u32
        });
        let unwind_mode = match options.unwind {
            UnwindMode::FramePointers => hostprof_common::UNWIND_FP,
            UnwindMode::Tables => hostprof_common::UNWIND_DWARF,
        };
        let stack_copy = options
            .stack_copy_bytes
            .min(hostprof_common::MAX_STACK_COPY as u32);
        let variant = Variant::detect()?;
        tracing::info!(
            "linux {}: eBPF programs with {}",
            kernel_release(),
            variant.describe()
        );
        // The legacy programs find the user registers at the top of the
        // task's kernel stack; only needed where user registers are read.
        let needs_regs = options.unwind == UnwindMode::Tables || stack_copy > 0;
        // Where the early-copy path has not been verified (cargo xtask
        // vmtest), samples before their tables keep frame pointers.
        let early_copy = match options.unwind {
            UnwindMode::Tables if kernel::verified_since(kernel::EARLY_COPY_SINCE) => options
                .early_copy_bytes
                .min(hostprof_common::MAX_STACK_COPY as u32),
            _ => 0,
        };
        let (stack_offset, pt_regs_size) = if variant == Variant::Legacy && needs_regs {
            let btf = btf()?;
            (
                btf::member_offset(btf, "task_struct", "stack")
                    .ok_or(SamplerError::MissingKernelType("task_struct.stack"))?,
                btf::struct_size(btf, "pt_regs")
                    .ok_or(SamplerError::MissingKernelType("struct pt_regs"))?,
            )
        } else {
            (0, 0)
        };
        let kernel::Walks {
            python: python_walk,
            runtime: runtime_walk,
            go_labels,
        } = kernel::Walks::verified(variant);
        // The OpenTelemetry thread context's thread pointer: without it
        // (no BTF, an unknown layout) samples carry no trace context.
        let tp_offset = btf()
            .ok()
            .and_then(btf::thread_pointer_offset)
            .unwrap_or_else(|| {
                tracing::info!("no trace context on this kernel (no thread pointer in its BTF)");
                0
            });
        // Tells an exiting thread's failed context reads from others.
        let mm_offset = btf()
            .ok()
            .and_then(|btf| btf::member_offset(btf, "task_struct", "mm"))
            .unwrap_or(0);
        // Only for `--bpf-stats`: the context code's own clock.
        let time_context = u32::from(options.bpf_stats);
        // Freed before aya parses its own copy below (about 25 MB while
        // parsing): both at once were the peak of a quiet `record`.
        drop(kernel_btf);
        // No CO-RE: every kernel offset the programs use is a global set
        // above from our own read of the BTF, so aya needs no target BTF.
        // (Its `EbpfLoader::new` still parses vmlinux's, ~25 ms, before
        // `.btf(None)` can say so; aya 0.14 has no other constructor.) The
        // object carrying no CO-RE relocation is checked by
        // `the_ebpf_object_has_no_core_relocations`.
        let mut loader = EbpfLoader::new();
        loader
            .btf(None)
            .override_global(
                hostprof_common::GLOBAL_TASK_STACK_OFFSET,
                &stack_offset,
                true,
            )
            .override_global(hostprof_common::GLOBAL_PT_REGS_SIZE, &pt_regs_size, true)
            .override_global(hostprof_common::GLOBAL_STACK_COPY_BYTES, &stack_copy, true)
            .override_global(hostprof_common::GLOBAL_EARLY_COPY_BYTES, &early_copy, true)
            .override_global(hostprof_common::GLOBAL_PYTHON_WALK, &python_walk, true)
            .override_global(hostprof_common::GLOBAL_RUNTIME_WALK, &runtime_walk, true)
            .override_global(hostprof_common::GLOBAL_GO_LABELS, &go_labels, true)
            .override_global(hostprof_common::GLOBAL_TIME_CONTEXT, &time_context, true)
            .override_global(
                hostprof_common::GLOBAL_FILTER_BY_TGID,
                &filter_by_tgid,
                true,
            )
            .override_global(hostprof_common::GLOBAL_UNWIND_MODE, &unwind_mode, true)
            .override_global(hostprof_common::GLOBAL_TASK_TGID_OFFSET, &tgid_offset, true)
            .override_global(
                hostprof_common::GLOBAL_TASK_STATE_OFFSET,
                &state_offset,
                true,
            )
            .override_global(hostprof_common::GLOBAL_TASK_PID_OFFSET, &pid_offset, true)
            .override_global(hostprof_common::GLOBAL_TASK_TP_OFFSET, &tp_offset, true)
            .override_global(hostprof_common::GLOBAL_TASK_MM_OFFSET, &mm_offset, true)
            .override_global(
                hostprof_common::GLOBAL_OFF_CPU_THRESHOLD_NS,
                &threshold_ns,
                true,
            )
            .override_global(
                hostprof_common::GLOBAL_OFF_CPU_SAMPLE_PPM,
                &sample_ppm,
                true,
            );
        for (map, entries) in sizes::max_entries(options) {
            loader.map_max_entries(map, entries);
        }
        let ebpf = loader.load(EBPF_OBJECT).map_err(SamplerError::load)?;
        let map_memory = memory::measure(ebpf.maps());
        let mut sampler = Sampler {
            ebpf,
            variant,
            links: Vec::new(),
            off_cpu: false,
            map_memory,
            runtime_walks: runtime_walk != 0,
            python_walk: python_walk != 0,
            lean: options.lean_start && variant == Variant::Modern,
            python_deferred: options.lean_start && variant == Variant::Modern && python_walk != 0,
            python_sampling_loaded: false,
            upgrade_failed: false,
            sampling_loaded: false,
            frequency_hz: 0,
            _stats: stats,
        };
        for pid in options.pids.iter().flatten() {
            sampler.add_pid(*pid)?;
        }
        if follow {
            sampler.follow_forks()?;
        }
        if options.off_cpu.is_some() {
            sampler.load_off_cpu()?;
        }
        // Process events (and, with tables, forgetting exec'd images).
        sampler
            .attach_raw_tracepoint(hostprof_common::PROGRAM_FORGET_EXEC, "sched_process_exec")?;
        sampler
            .attach_raw_tracepoint(hostprof_common::PROGRAM_PROCESS_EXIT, "sched_process_exit")?;
        if tgid_offset != 0 {
            sampler.attach_raw_tracepoint(
                hostprof_common::PROGRAM_PROCESS_FORK,
                "sched_process_fork",
            )?;
        }
        // The sampling program too (its verification is most of a start),
        // so what a caller does between this and `start_sampling` (reading
        // kallsyms, which then lists every program of ours) is not in the
        // profile it records. A lean start waits for its caller to say
        // which program (`load_sampling_program`).
        if !sampler.lean {
            sampler.load_sampling_program()?;
        }
        Ok(sampler)
    }

    fn follow_forks(&mut self) -> Result<(), SamplerError> {
        let program = self.raw_tracepoint(hostprof_common::PROGRAM_FOLLOW_FORK)?;
        program.load().map_err(SamplerError::load_program)?;
        program
            .attach("sched_process_fork")
            .map_err(SamplerError::attach)?;
        Ok(())
    }

    fn attach_raw_tracepoint(
        &mut self,
        name: &'static str,
        tracepoint: &str,
    ) -> Result<(), SamplerError> {
        let program = self.raw_tracepoint(name)?;
        program.load().map_err(SamplerError::load_named(name))?;
        program
            .attach(tracepoint)
            .map_err(SamplerError::attach_named(name))?;
        Ok(())
    }

    /// Takes the unwind table maps (for `crate::unwind`); call once.
    pub fn take_unwind_maps(&mut self) -> Result<UnwindMaps, SamplerError> {
        let rows = self.ebpf.take_map(hostprof_common::MAP_UNWIND_ROWS).ok_or(
            SamplerError::MissingObject(hostprof_common::MAP_UNWIND_ROWS),
        )?;
        let processes = self
            .ebpf
            .take_map(hostprof_common::MAP_PROCESS_MAPPINGS)
            .ok_or(SamplerError::MissingObject(
                hostprof_common::MAP_PROCESS_MAPPINGS,
            ))?;
        let reader = match &rows {
            aya::maps::Map::Array(data) => {
                use std::os::fd::AsFd as _;
                let fd = data
                    .fd()
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(SamplerError::dup)?;
                MapData::from_fd(fd).map_err(SamplerError::map)?
            }
            _ => {
                return Err(SamplerError::MissingObject(
                    hostprof_common::MAP_UNWIND_ROWS,
                ));
            }
        };
        Ok(UnwindMaps {
            rows_reader: Some(
                Array::try_from(aya::maps::Map::Array(reader)).map_err(SamplerError::map)?,
            ),
            rows: Array::try_from(rows).map_err(SamplerError::map)?,
            processes: HashMap::try_from(processes).map_err(SamplerError::map)?,
        })
    }

    /// Loads (verifies) the off-CPU program; [`Sampler::start_sampling`]
    /// attaches it with the perf events, so that it, too, records nothing
    /// before the caller has loaded the named processes' unwind tables.
    fn load_off_cpu(&mut self) -> Result<(), SamplerError> {
        if self.variant == Variant::Legacy {
            self.load_legacy_tails(
                &hostprof_common::LEGACY_TAIL_PROGRAMS[hostprof_common::LEGACY_TAIL_PERF_EVENT..],
            )?;
        }
        self.load_python_walk(&hostprof_common::PYTHON_TAIL_PROGRAMS[1]);
        let name = self.variant.off_cpu_program();
        self.raw_tracepoint(name)?
            .load()
            .map_err(SamplerError::load_named(name))?;
        self.off_cpu = true;
        Ok(())
    }

    fn raw_tracepoint(&mut self, name: &'static str) -> Result<&mut RawTracePoint, SamplerError> {
        self.ebpf
            .program_mut(name)
            .ok_or(SamplerError::MissingObject(name))?
            .try_into()
            .map_err(SamplerError::load_program)
    }

    /// Loads tail-call programs, each into its tails map, before the
    /// program that calls them is loaded.
    fn load_legacy_tails(
        &mut self,
        tails: &[(&'static str, u32, &'static str)],
    ) -> Result<(), SamplerError> {
        for (map, index, name) in tails {
            let program = self
                .ebpf
                .program_mut(name)
                .ok_or(SamplerError::MissingObject(name))?;
            // Tail-called programs are loaded, never attached: only their
            // type differs.
            match program {
                aya::programs::Program::PerfEvent(program) => program.load(),
                aya::programs::Program::RawTracePoint(program) => program.load(),
                _ => Err(aya::programs::ProgramError::UnexpectedProgramType),
            }
            .map_err(SamplerError::load_named(name))?;
            let fd = program.fd().map_err(SamplerError::load_program)?;
            let fd = fd.try_clone().map_err(SamplerError::load_program_io)?;
            self.set_legacy_unwinder(map, *index, &fd)?;
        }
        Ok(())
    }

    /// Loads the variant's CPython walk of `walk` (a
    /// [`hostprof_common::PYTHON_TAIL_PROGRAMS`] entry) into its tails map,
    /// when the walk is on. A walk the verifier rejects leaves the slot
    /// empty: the jump to it fails, and samples go without Python frames.
    fn load_python_walk(&mut self, walk: &(&'static str, &'static str, &'static str)) {
        if !self.python_walk {
            return;
        }
        let (map, modern, legacy) = *walk;
        let name = match self.variant {
            Variant::Modern => modern,
            Variant::Legacy => legacy,
        };
        if let Err(err) = self.load_legacy_tails(&[(map, hostprof_common::TAIL_PYTHON, name)]) {
            tracing::warn!(
                "no Python frames on this kernel (the walk's program {name} did not load: {err})"
            );
        }
    }

    /// Puts a loaded tail-call program at `index` of the tails map `map`.
    fn set_legacy_unwinder(
        &mut self,
        map: &'static str,
        index: u32,
        fd: &aya::programs::ProgramFd,
    ) -> Result<(), SamplerError> {
        let map = self
            .ebpf
            .map_mut(map)
            .ok_or(SamplerError::MissingObject(map))?;
        let mut tails = ProgramArray::try_from(map).map_err(SamplerError::map)?;
        tails.set(index, fd, 0).map_err(SamplerError::map)
    }

    /// What each of the maps costs the kernel (see [`MapMemory`]).
    pub fn map_memory(&self) -> &[MapMemory] {
        &self.map_memory
    }

    /// Kernel memory of all the maps, bytes: what `hostprof_bpf_map_bytes`
    /// reports.
    pub fn map_bytes(&self) -> u64 {
        self.map_memory.iter().map(|map| map.bytes).sum()
    }

    /// The program variant this kernel runs.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Removes exited processes from the in-kernel filter, so following a
    /// long-running tree of short-lived children never fills it.
    pub fn forget_exited_pids(&mut self) -> Result<(), SamplerError> {
        let map = self.ebpf.map_mut(hostprof_common::MAP_FILTER_TGIDS).ok_or(
            SamplerError::MissingObject(hostprof_common::MAP_FILTER_TGIDS),
        )?;
        let mut filter: HashMap<_, u32, u8> = HashMap::try_from(map).map_err(SamplerError::map)?;
        let gone: Vec<u32> = filter
            .keys()
            .filter_map(Result::ok)
            .filter(|pid| !crate::procs::is_alive(*pid))
            .collect();
        for pid in gone {
            // Already removed by a concurrent sweep is fine.
            let _ = filter.remove(&pid);
        }
        Ok(())
    }

    /// Adds a process to the in-kernel filter (only meaningful with `pids`).
    pub fn add_pid(&mut self, pid: u32) -> Result<(), SamplerError> {
        let map = self.ebpf.map_mut(hostprof_common::MAP_FILTER_TGIDS).ok_or(
            SamplerError::MissingObject(hostprof_common::MAP_FILTER_TGIDS),
        )?;
        let mut filter: HashMap<_, u32, u8> = HashMap::try_from(map).map_err(SamplerError::map)?;
        filter.insert(pid, 1, 0).map_err(SamplerError::map)
    }

    /// Takes the ring buffer of [`Sample`]s; call once.
    pub fn take_ring(&mut self) -> Result<RingBuf<MapData>, SamplerError> {
        let map = self
            .ebpf
            .take_map(hostprof_common::MAP_SAMPLES)
            .ok_or(SamplerError::MissingObject(hostprof_common::MAP_SAMPLES))?;
        RingBuf::try_from(map).map_err(SamplerError::map)
    }

    /// Takes the ring buffer of [`hostprof_common::ProcessEvent`]s; call once.
    pub fn take_process_events(&mut self) -> Result<RingBuf<MapData>, SamplerError> {
        let map = self
            .ebpf
            .take_map(hostprof_common::MAP_PROCESS_EVENTS)
            .ok_or(SamplerError::MissingObject(
                hostprof_common::MAP_PROCESS_EVENTS,
            ))?;
        RingBuf::try_from(map).map_err(SamplerError::map)
    }

    /// True when the kernel walks JIT runtimes' frames (V8's; HotSpot's
    /// only when the modern variant does too): the kernels and variants
    /// their walks were checked on.
    pub fn runtime_walks(&self) -> bool {
        self.runtime_walks
    }

    /// Takes one of the language runtimes' hash maps (`MAP_PYTHON_*`,
    /// `MAP_HOTSPOT_*`, `MAP_V8_*`, `MAP_TRACE_PROCESSES`: see
    /// [`crate::runtime::python`], [`crate::runtime::java`], [`crate::runtime::v8`],
    /// [`crate::runtime::thread_ctx`]); call once per map.
    pub fn take_hash_map<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &'static str,
    ) -> Result<HashMap<MapData, K, V>, SamplerError> {
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(SamplerError::MissingObject(name))?;
        HashMap::try_from(map).map_err(SamplerError::map)
    }

    /// Takes the array map `name` (for a stage that writes it); call once.
    pub fn take_array<V: aya::Pod>(
        &mut self,
        name: &'static str,
    ) -> Result<Array<MapData, V>, SamplerError> {
        let map = self
            .ebpf
            .take_map(name)
            .ok_or(SamplerError::MissingObject(name))?;
        Array::try_from(map).map_err(SamplerError::map)
    }

    /// Sums the per-CPU counters.
    pub fn counters(&self) -> Result<Counters, SamplerError> {
        let map = self
            .ebpf
            .map(hostprof_common::MAP_COUNTERS)
            .ok_or(SamplerError::MissingObject(hostprof_common::MAP_COUNTERS))?;
        let array: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(SamplerError::map)?;
        let mut totals = Counters::default();
        for (index, total) in (0..).zip(totals.0.iter_mut()) {
            let per_cpu = array.get(&index, 0).map_err(SamplerError::map)?;
            *total = per_cpu.iter().sum();
        }
        Ok(totals)
    }
}

/// The offset in the running kernel's `task_struct` (its BTF: `btf`) of the
/// first of `names` it has.
fn task_member_offset(btf: &[u8], names: &[&'static str]) -> Result<u32, SamplerError> {
    names
        .iter()
        .find_map(|name| btf::member_offset(btf, "task_struct", name))
        .ok_or(SamplerError::MissingKernelType(names[0]))
}

#[cfg(test)]
mod tests;
