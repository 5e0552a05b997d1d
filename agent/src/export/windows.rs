//! The agent's sink: samples go into a [`ProfileBuilder`], and every
//! interval the window is cut into one export request for the exporter.
use std::time::{Duration, Instant};

use hostprof_proto::collector::ExportProfilesServiceRequest;
use tokio::sync::mpsc::UnboundedSender;

use crate::{model::ResolvedSample, output::Sink, profile::ProfileBuilder};

/// Cuts a profile window every `interval` (on [`Sink::tick`]) and once more
/// at [`Windows::finish`], sending each non-empty one to the exporter.
pub struct Windows {
    builder: ProfileBuilder,
    interval: Duration,
    deadline: Instant,
    requests: UnboundedSender<ExportProfilesServiceRequest>,
    /// Windows cut so far.
    pub cut: u64,
    /// Samples in them.
    pub samples: u64,
}

impl Windows {
    pub fn new(
        builder: ProfileBuilder,
        interval: Duration,
        requests: UnboundedSender<ExportProfilesServiceRequest>,
    ) -> Self {
        Windows {
            builder,
            interval,
            deadline: Instant::now() + interval,
            requests,
            cut: 0,
            samples: 0,
        }
    }

    fn cut(&mut self) {
        self.samples += self.builder.samples();
        let request = self.builder.finish(crate::cli::unix_nanos_now());
        self.cut += 1;
        if !request.resource_profiles.is_empty() {
            // Fails only when the exporter is gone, which ends the agent anyway.
            let _ = self.requests.send(request);
        }
    }

    /// The last window, when the samples end. Consumes the sink, so its
    /// sender goes too: the exporter sees the channel close once the last
    /// request is in, and ends.
    pub fn finish(mut self) -> WindowStats {
        self.cut();
        WindowStats {
            cut: self.cut,
            samples: self.samples,
        }
    }
}

/// What [`Windows`] did.
#[derive(Clone, Copy, Debug, Default)]
pub struct WindowStats {
    /// Windows cut.
    pub cut: u64,
    /// Samples in them.
    pub samples: u64,
}

impl Sink for Windows {
    fn push(&mut self, sample: &ResolvedSample) {
        self.builder.add(sample);
    }

    fn next_tick(&self) -> Option<Instant> {
        Some(self.deadline)
    }

    fn tick(&mut self, now: Instant) {
        if now < self.deadline {
            return;
        }
        self.cut();
        self.deadline += self.interval;
        // A stall longer than an interval (a slow first symbolization)
        // starts the schedule over rather than cutting empty windows.
        if self.deadline <= now {
            self.deadline = now + self.interval;
        }
    }
}
