//! The sampling program: which one, its load, its perf events on every
//! CPU, and what the kernel says of it.
//!
//! The lean sampling program and its replacement. The whole program's
//! verification is most of a start (about 0.1 s of CPU on Linux 6.18,
//! most of it for the JIT runtimes' walks and Go's labels), so
//! `record` and `top` start with the program without them
//! (`SamplerOptions::lean_start`) and load the whole one when a process needs it
//! (a JVM, V8 or a Go program with labels found: `crate::runtime`'s
//! `walks_wanted`). The replacement is attached to each CPU's event
//! before the lean program leaves it, so no sample is missed; a sample
//! taken by both in that instant is counted twice, at most one per CPU.
//! `hostprof agent` keeps no capability to load programs after its start,
//! so it loads the whole program at once; nor does `record -- COMMAND`,
//! whose command's first moments are what its user asked for.
use std::time::Duration;

use aya::{
    programs::{
        PerfEvent,
        perf_event::{
            PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
        },
    },
    util::online_cpus,
};

use super::{Sampler, SamplerError, Variant};

impl Sampler {
    /// The sampling program loaded (or to load): the lean one until
    /// [`Sampler::upgrade`].
    pub(super) fn sample_program(&self) -> &'static str {
        if self.lean {
            hostprof_common::PROGRAM_SAMPLE_LEAN
        } else {
            self.variant.sample_program()
        }
    }

    /// Whether the lean program samples and [`Sampler::upgrade`] may
    /// replace it (it has not failed to).
    pub fn can_upgrade(&self) -> bool {
        self.lean && !self.upgrade_failed
    }

    /// Whether a part of the sampling program waits until a process needs
    /// it: the whole program, or CPython's walk.
    pub fn has_deferred(&self) -> bool {
        self.can_upgrade() || self.python_deferred
    }

    /// Loads the sampling program's CPython walk, deferred by a lean start
    /// (its verification is about 0.01 s, which a `record` or `top` of
    /// processes without Python need not pay). Its tail-call slot is filled whether or
    /// not the sampling program is loaded yet; until then CPython's jump
    /// fails, and samples go without Python frames.
    pub fn load_deferred_python_walk(&mut self) {
        if std::mem::take(&mut self.python_deferred) {
            self.load_sampling_python_walk();
        }
    }

    /// The sampling program's CPython walk, loaded once.
    fn load_sampling_python_walk(&mut self) {
        if !std::mem::replace(&mut self.python_sampling_loaded, true) {
            self.load_python_walk(&hostprof_common::PYTHON_TAIL_PROGRAMS[0]);
        }
    }

    /// Replaces the lean sampling program with the whole one, on every CPU
    /// it samples: loads it (the verifier's walk, ~0.1 s), attaches it,
    /// then detaches the lean one. True when it did; false when there was
    /// nothing to do. After an error the lean program samples on, and this
    /// is not tried again.
    pub fn upgrade(&mut self) -> Result<bool, SamplerError> {
        if !self.can_upgrade() {
            return Ok(false);
        }
        let upgraded = self.replace_lean();
        self.upgrade_failed = upgraded.is_err();
        upgraded.map(|()| true)
    }

    fn replace_lean(&mut self) -> Result<(), SamplerError> {
        if !self.sampling_loaded {
            // Nothing loaded yet: `load_sampling_program` loads the whole one.
            self.lean = false;
            return Ok(());
        }
        debug_assert_eq!(self.variant, Variant::Modern);
        let name = self.variant.sample_program();
        let whole: &mut PerfEvent = self
            .ebpf
            .program_mut(name)
            .ok_or(SamplerError::MissingObject(name))?
            .try_into()
            .map_err(SamplerError::load_program)?;
        whole.load().map_err(SamplerError::load_named(name))?;
        self.lean = false;
        if self.links.is_empty() {
            // Not sampling yet: `start_sampling` attaches the whole one.
            return Ok(());
        }
        let links = match self.attach_perf_events(self.frequency_hz) {
            Ok(links) => links,
            Err(err) => {
                self.lean = true;
                return Err(err);
            }
        };
        let lean_links = std::mem::replace(&mut self.links, links);
        let lean: &mut PerfEvent = self
            .ebpf
            .program_mut(hostprof_common::PROGRAM_SAMPLE_LEAN)
            .ok_or(SamplerError::MissingObject(
                hostprof_common::PROGRAM_SAMPLE_LEAN,
            ))?
            .try_into()
            .map_err(SamplerError::load_program)?;
        for link in lean_links {
            // A link that fails to detach is closed when the program drops.
            let _ = lean.detach(link);
        }
        tracing::debug!("the whole sampling program replaced the lean one");
        Ok(())
    }

    /// Starts sampling every online CPU (once).
    pub fn start_sampling(&mut self, frequency_hz: u64) -> Result<(), SamplerError> {
        self.load_sampling_program()?;
        if self.links.is_empty() {
            self.attach(frequency_hz)?;
        }
        Ok(())
    }

    fn program(&mut self) -> Result<&mut PerfEvent, SamplerError> {
        let name = self.sample_program();
        self.ebpf
            .program_mut(name)
            .ok_or(SamplerError::MissingObject(name))?
            .try_into()
            .map_err(SamplerError::load_program)
    }

    /// Loads the sampling program (once): the lean one, unless
    /// [`Sampler::upgrade`] said the whole one before. [`Sampler::load`]
    /// does, except for a lean start, whose caller first looks at the
    /// processes it names.
    pub fn load_sampling_program(&mut self) -> Result<(), SamplerError> {
        if self.sampling_loaded {
            return Ok(());
        }
        if self.variant == Variant::Legacy {
            self.load_legacy_tails(
                &hostprof_common::LEGACY_TAIL_PROGRAMS[..hostprof_common::LEGACY_TAIL_PERF_EVENT],
            )?;
        }
        if !self.python_deferred {
            self.load_sampling_python_walk();
        }
        let name = self.sample_program();
        self.program()?
            .load()
            .map_err(SamplerError::load_named(name))?;
        self.sampling_loaded = true;
        Ok(())
    }

    fn attach(&mut self, frequency_hz: u64) -> Result<(), SamplerError> {
        if self.off_cpu {
            let name = self.variant.off_cpu_program();
            self.raw_tracepoint(name)?
                .attach("sched_switch")
                .map_err(SamplerError::attach_named(name))?;
        }
        self.links = self.attach_perf_events(frequency_hz)?;
        self.frequency_hz = frequency_hz;
        Ok(())
    }

    /// The sampling program attached to a cpu-clock event on each online
    /// CPU: its links.
    fn attach_perf_events(
        &mut self,
        frequency_hz: u64,
    ) -> Result<Vec<PerfEventLinkId>, SamplerError> {
        let program = self.program()?;
        let cpus = online_cpus().map_err(|(_, err)| SamplerError::OnlineCpus(err))?;
        let mut links = Vec::with_capacity(cpus.len());
        for cpu in cpus {
            let link = program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(frequency_hz),
                    false,
                )
                .map_err(SamplerError::attach)?;
            links.push(link);
        }
        Ok(links)
    }

    /// Stops sampling on every CPU; what is already in the ring buffer stays
    /// readable.
    pub fn stop(&mut self) {
        let links = std::mem::take(&mut self.links);
        if let Ok(program) = self.program() {
            for link in links {
                // A link that fails to detach is closed when the program drops.
                let _ = program.detach(link);
            }
        }
    }

    /// What the kernel says of the sampling program (see [`ProgramStats`]).
    pub fn program_stats(&self) -> Result<ProgramStats, SamplerError> {
        // The lean program and the whole one that replaced it, if so.
        let mut stats = ProgramStats::default();
        for name in [
            self.variant.sample_program(),
            hostprof_common::PROGRAM_SAMPLE_LEAN,
        ] {
            let Some(program) = self.ebpf.program(name) else {
                continue;
            };
            let program: &PerfEvent = program.try_into().map_err(SamplerError::load_program)?;
            let Ok(info) = program.info() else {
                // Not loaded.
                continue;
            };
            stats.run_time += info.run_time();
            stats.runs += info.run_count();
            if let Some(count) = info.verified_instruction_count() {
                stats.verified_instructions =
                    Some(stats.verified_instructions.unwrap_or(0) + count);
            }
        }
        Ok(stats)
    }
}

/// The sampling program as the kernel sees it.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgramStats {
    /// Total run time and run count since it was loaded; zero unless
    /// started with `bpf_stats`.
    pub run_time: Duration,
    pub runs: u64,
    /// Instructions the verifier walked to accept it (Linux 5.16+): what
    /// its load, paid at every start, costs (with the lean program's, when
    /// the whole one replaced it).
    pub verified_instructions: Option<u32>,
}
