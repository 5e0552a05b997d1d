//! Local outputs of `hostprof record`: folded stacks, flame graph SVG, pprof,
//! and the end-of-run summary (OTLP files come from [`crate::profile`] and
//! [`otlp_json`]).
//!
//! Every output is a [`SampleSink`](crate::pipeline::SampleSink); they share the
//! frame naming below so a function reads the same everywhere.
mod flamegraph;
mod folded;
pub mod otlp_json;
mod pprof;
mod summary;

pub use flamegraph::write_flamegraph;
pub use folded::FoldedStacks;
pub use pprof::PprofProfile;
pub use summary::Summary;

use crate::model::{Frame, FrameKind, ResolvedSample};

/// Names for one frame, outermost inlined function first: `name` for user code,
/// `name_[k]` for kernel code, `[module+0xOFFSET]` when unsymbolized.
pub fn frame_labels(frame: &Frame) -> impl Iterator<Item = String> + '_ {
    let unsymbolized = frame.lines.is_empty().then(|| frame.unsymbolized_label());
    let named = frame.lines.iter().rev().map(move |line| match frame.kind {
        FrameKind::Kernel => format!("{}_[k]", line.function),
        _ => line.function.to_string(),
    });
    unsymbolized.into_iter().chain(named)
}

/// Every frame label of a sample, root first.
pub fn stack_labels(sample: &ResolvedSample) -> Vec<String> {
    sample.frames.iter().rev().flat_map(frame_labels).collect()
}
