//! The end-of-run summary: how many samples, how many lost, and where the
//! time went (top functions by self and total share).
use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
};

use crate::{model::ResolvedSample, output::Sink};

/// Per-function sample counts.
#[derive(Debug, Default)]
pub struct Summary {
    samples: u64,
    /// Samples whose leaf is the function.
    self_counts: HashMap<String, u64>,
    /// Samples with the function anywhere on the stack (counted once each).
    total_counts: HashMap<String, u64>,
    processes: HashSet<u32>,
    off_cpu_events: u64,
    off_cpu_ns: u64,
    /// Off-CPU nanoseconds per function anywhere on the blocked stack.
    off_cpu_total_ns: HashMap<String, u64>,
}

impl Summary {
    pub fn new() -> Self {
        Self::default()
    }

    /// CPU samples seen.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Off-CPU events seen, and their total duration in nanoseconds.
    pub fn off_cpu(&self) -> (u64, u64) {
        (self.off_cpu_events, self.off_cpu_ns)
    }

    /// Share (0..=1) of samples whose leaf is `function`.
    pub fn self_share(&self, function: &str) -> f64 {
        self.share(self.self_counts.get(function))
    }

    /// Share (0..=1) of samples with `function` anywhere on the stack.
    pub fn total_share(&self, function: &str) -> f64 {
        self.share(self.total_counts.get(function))
    }

    fn share(&self, count: Option<&u64>) -> f64 {
        if self.samples == 0 {
            return 0.0;
        }
        *count.unwrap_or(&0) as f64 / self.samples as f64
    }

    /// The `limit` functions with the most self and total samples, as text.
    pub fn top(&self, limit: usize) -> String {
        let mut text = String::new();
        for (title, counts) in [("self", &self.self_counts), ("total", &self.total_counts)] {
            let mut ranked: Vec<_> = counts.iter().collect();
            ranked.sort_unstable_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let _ = writeln!(text, "top functions by {title} share:");
            for (function, count) in ranked.into_iter().take(limit) {
                let percent = 100.0 * *count as f64 / self.samples.max(1) as f64;
                let _ = writeln!(text, "  {percent:6.2}%  {count:>8}  {function}");
            }
        }
        if self.off_cpu_events > 0 {
            let mut ranked: Vec<_> = self.off_cpu_total_ns.iter().collect();
            ranked.sort_unstable_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let _ = writeln!(text, "top functions by off-CPU time (total):");
            for (function, ns) in ranked.into_iter().take(limit) {
                let percent = 100.0 * *ns as f64 / self.off_cpu_ns.max(1) as f64;
                let _ = writeln!(
                    text,
                    "  {percent:6.2}%  {:>9.3} s  {function}",
                    *ns as f64 / 1e9
                );
            }
        }
        text
    }

    /// Distinct processes seen.
    pub fn processes(&self) -> usize {
        self.processes.len()
    }
}

impl Sink for Summary {
    fn push(&mut self, sample: &ResolvedSample) {
        self.push_count(sample, 1);
    }

    fn push_count(&mut self, sample: &ResolvedSample, count: u64) {
        if count == 0 {
            return;
        }
        self.processes.insert(sample.process.pid);
        let mut labels = super::stack_labels(sample);
        if let Some(off_cpu) = &sample.off_cpu {
            let blocked = off_cpu.blocked_ns.saturating_mul(count);
            self.off_cpu_events = self.off_cpu_events.saturating_add(count);
            self.off_cpu_ns = self.off_cpu_ns.saturating_add(blocked);
            labels.sort_unstable();
            labels.dedup();
            for label in labels {
                let total = self.off_cpu_total_ns.entry(label).or_default();
                *total = total.saturating_add(blocked);
            }
            return;
        }
        self.samples = self.samples.saturating_add(count);
        if let Some(leaf) = labels.last() {
            let total = self.self_counts.entry(leaf.clone()).or_default();
            *total = total.saturating_add(count);
        }
        // Recursion must not count a function twice in one sample.
        labels.sort_unstable();
        labels.dedup();
        for label in labels {
            let total = self.total_counts.entry(label).or_default();
            *total = total.saturating_add(count);
        }
    }
}
