//! The naming stage: an attributed sample's frames get their functions,
//! files and lines, and its mappings their build ids.
//!
//! A busy thread's samples repeat the same frames: a host-wide `record`
//! at 999 Hz names some 40,000 frames a second, nearly all seen before.
//! [`Naming`] remembers each user frame it named by the mapping the
//! process table handed out and the offset, so a frame seen before costs
//! one hash lookup, not the symbolizer's (two locks, a file check with a
//! clock read, its results cache) and the build-id lookup.
use std::{collections::HashMap, sync::Arc};

use crate::{
    model::{Frame, FrameKind, Line, Mapping, ResolvedSample},
    symbolize::Symbolizer,
};

/// What the naming stage keeps from sample to sample.
#[derive(Default)]
pub struct Naming {
    enricher: MappingEnricher,
    named: HashMap<(usize, u64), Named>,
    /// The symbolizer's [`Symbolizer::generation`] `named` was filled at.
    generation: u64,
}

/// A user frame named before.
struct Named {
    /// The process table's mapping: kept alive so that its address, in the
    /// key, cannot be reused for another mapping.
    _original: Arc<Mapping>,
    kind: FrameKind,
    lines: Arc<[Line]>,
    /// The mapping with its build ids.
    mapping: Arc<Mapping>,
}

impl Naming {
    /// Frames remembered before starting over (processes come and go).
    const MAX_NAMED: usize = 1 << 16;

    /// Names every frame of an attributed sample and gives its mappings
    /// their build ids.
    pub fn symbolize_sample(&mut self, symbolizer: &Symbolizer, sample: &mut ResolvedSample) {
        let generation = symbolizer.generation();
        if generation != self.generation || self.named.len() >= Self::MAX_NAMED {
            self.named.clear();
            self.generation = generation;
        }
        let pid = sample.process.pid;
        let mut previous_kind = None;
        for frame in &mut sample.frames {
            // The first frame of each stack (kernel, then user) is where the
            // CPU was; every other one is a return address.
            let leaf = previous_kind != Some(frame.kind == FrameKind::Kernel);
            previous_kind = Some(frame.kind == FrameKind::Kernel);
            let key = frame.mapping.as_ref().map(|mapping| {
                let back = u64::from(!leaf);
                (
                    Arc::as_ptr(mapping) as usize,
                    frame.file_offset.saturating_sub(back),
                )
            });
            if frame.kind == FrameKind::Native
                && let Some(named) = key.and_then(|key| self.named.get(&key))
            {
                frame.kind = named.kind;
                frame.lines = named.lines.clone();
                frame.mapping = Some(named.mapping.clone());
                continue;
            }
            let native = frame.kind == FrameKind::Native;
            symbolizer.symbolize(pid, frame, !leaf);
            let Some(original) = frame.mapping.clone() else {
                continue;
            };
            let mapping = self
                .enricher
                .enrich(symbolizer, pid, &original, Load::IfNeeded);
            frame.mapping = Some(mapping.clone());
            // Only names from a file, which do not change while it is
            // mapped (a JIT's perf map grows), and only once found (the
            // file may load, or its debug file arrive, later).
            if native && original.inode != 0 && !frame.lines.is_empty() {
                let key = key.expect("a frame with a mapping has a key");
                self.named.insert(
                    key,
                    Named {
                        _original: original,
                        kind: frame.kind,
                        lines: frame.lines.clone(),
                        mapping,
                    },
                );
            }
        }
        if sample.off_cpu.is_some() {
            strip_tracing_frames(&mut sample.frames);
        }
    }

    /// Build ids for the sample's mappings from what is already loaded, no names.
    pub fn enrich_from_cache(&mut self, symbolizer: &Symbolizer, sample: &mut ResolvedSample) {
        let pid = sample.process.pid;
        for frame in &mut sample.frames {
            if let Some(mapping) = &frame.mapping {
                frame.mapping = Some(self.enricher.enrich(symbolizer, pid, mapping, Load::Never));
            }
        }
    }
}

/// Off-CPU stacks are captured from inside the sched_switch tracepoint: the
/// frames above `__schedule` (tracepoint glue and our BPF program, whose
/// name the symbolizer may not know) are ours, not the thread's.
fn strip_tracing_frames(frames: &mut Vec<Frame>) {
    const SEARCH: usize = 8;
    let scheduler = frames.iter().take(SEARCH).position(|frame| {
        frame.kind == FrameKind::Kernel
            && frame
                .lines
                .first()
                .is_some_and(|line| &*line.function == "__schedule")
    });
    if let Some(at) = scheduler {
        frames.drain(..at);
    }
}

/// Whether finding a mapping's build ids may load its file.
#[derive(Clone, Copy)]
enum Load {
    IfNeeded,
    /// Behind or stopping: only what the symbolizer already holds.
    Never,
}

/// Gives mappings their build ids once per mapping, not once per frame.
#[derive(Default)]
struct MappingEnricher {
    /// Keyed by the original's address; the original is kept alive in the
    /// value so the address cannot be reused for another mapping.
    enriched: HashMap<usize, (Arc<Mapping>, Arc<Mapping>)>,
}

impl MappingEnricher {
    /// Entries kept before starting over (processes come and go).
    const MAX_ENTRIES: usize = 16_384;

    fn enrich(
        &mut self,
        symbolizer: &Symbolizer,
        pid: u32,
        mapping: &Arc<Mapping>,
        load: Load,
    ) -> Arc<Mapping> {
        let key = Arc::as_ptr(mapping) as usize;
        if let Some((_, enriched)) = self.enriched.get(&key) {
            return enriched.clone();
        }
        let build_ids = match load {
            Load::IfNeeded => symbolizer.build_ids(pid, mapping),
            // Not loaded yet: leave the entry for a later full look.
            Load::Never => match symbolizer.cached_build_ids(mapping) {
                Some(build_ids) => Some(build_ids),
                None => return mapping.clone(),
            },
        };
        if self.enriched.len() >= Self::MAX_ENTRIES {
            self.enriched.clear();
        }
        let enriched = match build_ids {
            Some(build_ids) => Arc::new(Mapping {
                build_ids,
                ..(**mapping).clone()
            }),
            None => mapping.clone(),
        };
        self.enriched
            .insert(key, (mapping.clone(), enriched.clone()));
        enriched
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::ProcessTable;

    #[inline(never)]
    fn a_function_to_name(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(3)
    }

    /// Our own process, stopped at `addresses` (leaf first).
    fn sample_at(table: &mut ProcessTable, addresses: &[u64]) -> ResolvedSample {
        let pid = std::process::id();
        let mut frames: Vec<Frame> = addresses
            .iter()
            .map(|&address| Frame {
                kind: FrameKind::Native,
                address,
                mapping: None,
                file_offset: 0,
                lines: crate::model::no_lines(),
            })
            .collect();
        table.map_frames(pid, "test", 0, &mut frames, |_| true);
        ResolvedSample {
            process: table.info(pid, "test", 0),
            tid: pid,
            ..ResolvedSample::of_app(frames)
        }
    }

    fn names(sample: &ResolvedSample) -> Vec<Option<String>> {
        sample
            .frames
            .iter()
            .map(|frame| frame.lines.first().map(|line| line.function.to_string()))
            .collect()
    }

    #[test]
    fn a_frame_named_before_is_named_as_the_symbolizer_names_it() {
        let symbolizer = Symbolizer::new();
        let mut table = ProcessTable::new();
        let mut naming = Naming::default();
        let start = a_function_to_name as *const () as u64;
        assert_eq!(a_function_to_name(2), 6);
        // The same address as the leaf (the function itself) and as a
        // caller's return address (looked up a byte back: what precedes
        // the function), twice: the second time from what was remembered.
        let mut first = sample_at(&mut table, &[start, start]);
        naming.symbolize_sample(&symbolizer, &mut first);
        let named = names(&first);
        assert!(
            named[0]
                .as_deref()
                .is_some_and(|name| name.ends_with("a_function_to_name")),
            "{named:?}"
        );
        assert_ne!(
            named[1], named[0],
            "a return address is looked up a byte back"
        );
        assert!(!naming.named.is_empty(), "the frames were remembered");
        let mut again = sample_at(&mut table, &[start, start]);
        naming.symbolize_sample(&symbolizer, &mut again);
        assert_eq!(names(&again), named);
        assert_eq!(again.frames[0].mapping, first.frames[0].mapping);
    }
}
