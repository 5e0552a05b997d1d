//! Where resolved samples go: the [`Sink`] seam, and the local outputs —
//! folded stacks, flame graph SVG, pprof, OTLP files ([`ProfileFile`] picks
//! one by [`OutputFormat`]) and the end-of-run summary.
//!
//! Every consumer of samples is a [`Sink`]: these outputs, the summary,
//! `record`'s progress line and the agent's windowed exporter
//! (`export::Windows`, built on [`crate::profile::ProfileBuilder`], itself a
//! sink). [`drain`] feeds the pipeline's batches to any set of them, so
//! `record`, `report` and `agent` differ only in the sinks they plug in.
//! Outputs share the frame naming below so a function reads the same
//! everywhere.
mod file;
mod flamegraph;
mod folded;
mod labels;
pub mod otlp_json;
mod pprof;
mod summary;

pub use file::{OutputFormat, ProfileFile, write_output};
pub use flamegraph::write_flamegraph;
pub use folded::FoldedStacks;
pub use labels::{StackLabels, frame_labels};
pub use pprof::PprofProfile;
pub use summary::Summary;

use std::{
    sync::mpsc::{Receiver, RecvTimeoutError},
    time::Instant,
};

use crate::{input::Counted, model::ResolvedSample};

/// What every consumer of resolved samples implements.
pub trait Sink: Send {
    fn push(&mut self, sample: &ResolvedSample);

    /// `count` samples like `sample` (profiles read back from files carry
    /// counts rather than one record per sample); sinks that only add up
    /// counts do it in one step.
    fn push_count(&mut self, sample: &ResolvedSample, count: u64) {
        for _ in 0..count {
            self.push(sample);
        }
    }

    /// A sample read back from a file, with its count and, for OTLP, the
    /// times of its occurrences; sinks that keep times override this.
    fn push_counted(&mut self, counted: &Counted) {
        self.push_count(&counted.sample, counted.count);
    }

    /// Called after every batch and when [`Sink::next_tick`] comes: sinks
    /// that act on a schedule (the agent cutting profile windows, the
    /// progress line) do it here.
    fn tick(&mut self, _now: Instant) {}

    /// When this sink next needs a [`Sink::tick`] without a batch; `None`:
    /// only after batches. [`drain`] sleeps until the earliest of these, so
    /// an idle agent's worker wakes for its windows, not on a fixed beat.
    fn next_tick(&self) -> Option<Instant> {
        None
    }
}

/// Feeds every batch to every sink until the batches end (the session
/// stopped), ticking them after each batch and when one asks to be
/// ([`Sink::next_tick`]).
pub fn drain(batches: Receiver<Vec<ResolvedSample>>, sinks: &mut [&mut dyn Sink]) {
    loop {
        let next = sinks.iter().filter_map(|sink| sink.next_tick()).min();
        let received = match next {
            Some(at) => batches.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => batches.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(batch) => {
                for sample in &batch {
                    for sink in sinks.iter_mut() {
                        sink.push(sample);
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        for sink in sinks.iter_mut() {
            sink.tick(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::mpsc::{self, SyncSender},
        time::Duration,
    };

    use super::*;

    /// Asks for one tick soon; at that tick, ends the batches by dropping
    /// their last sender.
    struct Scheduled {
        at: Instant,
        sender: Option<SyncSender<Vec<ResolvedSample>>>,
        ticks: usize,
    }

    impl Sink for Scheduled {
        fn push(&mut self, _sample: &ResolvedSample) {}

        fn next_tick(&self) -> Option<Instant> {
            self.sender.is_some().then_some(self.at)
        }

        fn tick(&mut self, now: Instant) {
            self.ticks += 1;
            if now >= self.at {
                self.sender = None;
            }
        }
    }

    #[test]
    fn a_scheduled_tick_comes_without_a_batch() {
        let (tx, rx) = mpsc::sync_channel(1);
        let (done_tx, done) = mpsc::channel();
        std::thread::spawn(move || {
            let mut sink = Scheduled {
                at: Instant::now() + Duration::from_millis(20),
                sender: Some(tx),
                ticks: 0,
            };
            drain(rx, &mut [&mut sink]);
            let _ = done_tx.send(sink.ticks);
        });
        // No batch is ever sent: only the sink's own schedule can end this.
        let ticks = done
            .recv_timeout(Duration::from_secs(30))
            .expect("drain never ticked the sink on its schedule");
        assert_eq!(ticks, 1);
    }
}
