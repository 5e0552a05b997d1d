//! `record`'s progress line on a terminal: once a second, on stderr,
//! rewritten in place (`\r`) and erased at the end. Not shown when stderr
//! is not a terminal, so logs and scripts see only the summary.
use std::{
    io::{IsTerminal, Write},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::watch;

use crate::{
    model::ResolvedSample,
    output::{Sink, Summary},
    sampler::{Counters, ReaderStats},
};

/// What the worker thread has done so far.
#[derive(Debug, Default)]
pub(super) struct Live {
    /// Samples (CPU and off-CPU) out of the pipeline, names and all.
    resolved: AtomicU64,
    /// CPU samples, as the summary counts them.
    samples: AtomicU64,
    processes: AtomicU64,
}

impl Live {
    /// On each tick: the samples since the last one and the summary's totals.
    pub fn update(&self, batch: usize, samples: u64, processes: usize) {
        self.resolved.fetch_add(batch as u64, Ordering::Relaxed);
        self.samples.store(samples, Ordering::Relaxed);
        self.processes.store(processes as u64, Ordering::Relaxed);
    }
}

/// `record`'s summary, publishing its totals to the progress line on every
/// tick.
pub(super) struct LiveSummary {
    summary: Summary,
    live: Arc<Live>,
    /// Samples pushed since the last tick.
    pushed: usize,
}

impl LiveSummary {
    pub fn new(live: Arc<Live>) -> Self {
        LiveSummary {
            summary: Summary::new(),
            live,
            pushed: 0,
        }
    }

    pub fn into_summary(self) -> Summary {
        self.summary
    }
}

impl Sink for LiveSummary {
    fn push(&mut self, sample: &ResolvedSample) {
        self.summary.push(sample);
        self.pushed += 1;
    }

    fn tick(&mut self, _now: Instant) {
        self.live.update(
            std::mem::take(&mut self.pushed),
            self.summary.samples(),
            self.summary.processes(),
        );
    }
}

/// The progress line's sources.
pub(super) struct Progress {
    pub live: Arc<Live>,
    reader: watch::Receiver<ReaderStats>,
    started: Instant,
    duration: Option<Duration>,
}

impl Progress {
    /// A progress line when stderr is a terminal, else `None`.
    pub fn on_terminal(
        live: Arc<Live>,
        reader: watch::Receiver<ReaderStats>,
        duration: Option<Duration>,
    ) -> Option<Self> {
        std::io::stderr().is_terminal().then(|| Progress {
            live,
            reader,
            started: Instant::now(),
            duration,
        })
    }

    /// Rewrites the line; `counters`: the kernel's, when they could be read.
    pub fn show(&self, counters: Option<&Counters>) {
        let reader = *self.reader.borrow();
        let line = line(
            self.started.elapsed(),
            self.duration,
            &self.live,
            &reader,
            counters,
        );
        let line = fit(&line, terminal_width());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K{line}");
        let _ = err.flush();
    }

    /// Erases the line, leaving the cursor where it began.
    pub fn clear(&self) {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K");
        let _ = err.flush();
    }
}

/// `hostprof: 3 s / 10 s, 2993 samples, 0 lost, 1 processes, 0 awaiting symbols`.
fn line(
    elapsed: Duration,
    duration: Option<Duration>,
    live: &Live,
    reader: &ReaderStats,
    counters: Option<&Counters>,
) -> String {
    let resolved = live.resolved.load(Ordering::Relaxed);
    let lost = counters.map_or(0, Counters::lost) + reader.dropped_backlog;
    // Read from the ring, not dropped, not out of the pipeline yet.
    let backlog = reader
        .samples
        .saturating_sub(reader.dropped_backlog)
        .saturating_sub(resolved);
    let elapsed = format!("{} s", elapsed.as_secs());
    let time = match duration {
        Some(duration) => format!("{elapsed} / {}", seconds(duration)),
        None => elapsed,
    };
    format!(
        "hostprof: {time}, {} samples, {lost} lost, {} processes, {backlog} awaiting symbols",
        live.samples.load(Ordering::Relaxed),
        live.processes.load(Ordering::Relaxed),
    )
}

/// `3 s`, `2.5 s`: whole seconds unless the duration has a fraction.
fn seconds(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{} s", duration.as_secs())
    } else {
        format!("{:.1} s", duration.as_secs_f64())
    }
}

/// The line cut to the terminal's width (less one column, so it never
/// wraps, which would defeat `\r`).
fn fit(line: &str, width: Option<usize>) -> &str {
    let Some(width) = width.filter(|&width| width > 1) else {
        return line;
    };
    match line.char_indices().nth(width - 1) {
        Some((at, _)) => &line[..at],
        None => line,
    }
}

/// Columns of the terminal on stderr.
fn terminal_width() -> Option<usize> {
    // SAFETY: TIOCGWINSZ fills the winsize it is given; an all-zero one is valid.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: fd 2 is stderr; the pointer is to a live winsize.
    let ok = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_counts_lost_and_backlog() {
        let live = Live::default();
        live.update(90, 80, 2);
        let reader = ReaderStats {
            samples: 120,
            dropped_backlog: 10,
            ..Default::default()
        };
        assert_eq!(
            line(
                Duration::from_millis(3900),
                Some(Duration::from_secs(10)),
                &live,
                &reader,
                None
            ),
            "hostprof: 3 s / 10 s, 80 samples, 10 lost, 2 processes, 20 awaiting symbols"
        );
        assert!(
            line(
                Duration::ZERO,
                Some(Duration::from_millis(2500)),
                &live,
                &reader,
                None
            )
            .starts_with("hostprof: 0 s / 2.5 s, ")
        );
        assert_eq!(
            line(Duration::from_secs(61), None, &live, &reader, None),
            "hostprof: 61 s, 80 samples, 10 lost, 2 processes, 20 awaiting symbols"
        );
    }

    #[test]
    fn long_lines_are_cut_to_the_terminal() {
        assert_eq!(fit("hostprof: 3 s", Some(8)), "hostpro");
        assert_eq!(fit("hostprof: 3 s", Some(80)), "hostprof: 3 s");
        assert_eq!(fit("hostprof: 3 s", None), "hostprof: 3 s");
    }
}
