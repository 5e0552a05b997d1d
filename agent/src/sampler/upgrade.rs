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
use aya::programs::PerfEvent;

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
}
