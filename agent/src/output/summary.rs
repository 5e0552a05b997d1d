//! The end-of-run summary: how many samples, how many lost, and where the
//! time went (top functions by self and total share).
use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
};

use crate::{
    model::ResolvedSample,
    output::{Sink, StackLabels},
};

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
    /// The sample being counted, named (a buffer kept between samples).
    labels: StackLabels,
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
        let labels = self.labels.name(sample);
        // Recursion must not count a function twice in one sample.
        let mut distinct: Vec<&str> = labels.iter().collect();
        distinct.sort_unstable();
        distinct.dedup();
        if let Some(off_cpu) = &sample.off_cpu {
            let blocked = off_cpu.blocked_ns.saturating_mul(count);
            self.off_cpu_events = self.off_cpu_events.saturating_add(count);
            self.off_cpu_ns = self.off_cpu_ns.saturating_add(blocked);
            for label in distinct {
                add(&mut self.off_cpu_total_ns, label, blocked);
            }
            return;
        }
        self.samples = self.samples.saturating_add(count);
        if let Some(leaf) = labels.leaf() {
            add(&mut self.self_counts, leaf, count);
        }
        for label in distinct {
            add(&mut self.total_counts, label, count);
        }
    }
}

/// Adds `value` to `label`'s total; only a label seen for the first time
/// is copied.
fn add(totals: &mut HashMap<String, u64>, label: &str, value: u64) {
    match totals.get_mut(label) {
        Some(total) => *total = total.saturating_add(value),
        None => {
            totals.insert(label.to_owned(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Frame, FrameKind, Line};

    fn sample(leaf_first: &[&str]) -> ResolvedSample {
        let frame = |name: &&str| Frame {
            kind: FrameKind::Native,
            address: 0x1000,
            mapping: None,
            file_offset: 0,
            lines: vec![Line::named((*name).into(), (*name).into())].into(),
        };
        ResolvedSample::of_app(leaf_first.iter().map(frame).collect())
    }

    #[test]
    fn a_function_counts_once_per_sample_and_the_leaf_is_the_innermost() {
        let deep = sample(&["work", "recurse", "recurse", "main"]);
        let shallow = sample(&["main"]);
        let mut summary = Summary::new();
        // The shorter stack after the longer one: nothing of the first
        // naming is left over in the second.
        for sample in [&deep, &shallow, &deep] {
            summary.push(sample);
        }
        assert_eq!(summary.samples(), 3);
        assert!((summary.self_share("work") - 2.0 / 3.0).abs() < 1e-9);
        assert!((summary.self_share("main") - 1.0 / 3.0).abs() < 1e-9);
        assert!((summary.total_share("recurse") - 2.0 / 3.0).abs() < 1e-9);
        assert!((summary.total_share("main") - 1.0).abs() < 1e-9);
        assert_eq!(summary.self_share("recurse"), 0.0);
    }
}
