//! Brendan Gregg's folded stacks: `comm;root;...;leaf COUNT`, one line per
//! distinct stack (the input of flamegraph.pl and inferno).
use std::{collections::HashMap, io};

use crate::{
    model::ResolvedSample,
    output::{Sink, StackLabels},
};

/// Counts of distinct folded stacks.
#[derive(Debug, Default)]
pub struct FoldedStacks {
    counts: HashMap<String, u64>,
    /// The stack being folded: buffers kept from sample to sample.
    labels: StackLabels,
    line: String,
    /// `None`: values count CPU samples. `Some(period)`: values are
    /// microseconds, CPU samples weighing one sampling period each, so CPU
    /// and off-CPU stacks share one unit.
    cpu_period_ns: Option<u64>,
}

impl FoldedStacks {
    /// Values are sample counts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Values are microseconds (for profiles with off-CPU stacks).
    pub fn in_microseconds(cpu_period_ns: u64) -> Self {
        FoldedStacks {
            cpu_period_ns: Some(cpu_period_ns),
            ..Self::default()
        }
    }

    /// The folded line (without count) of one sample; off-CPU stacks start
    /// with their state (`[off-cpu: interruptible]`) after the comm.
    pub fn fold(sample: &ResolvedSample) -> String {
        let mut line = String::new();
        Self::fold_into(&mut StackLabels::default(), sample, &mut line);
        line
    }

    /// [`FoldedStacks::fold`] into `line`, naming with `labels`.
    fn fold_into(labels: &mut StackLabels, sample: &ResolvedSample, line: &mut String) {
        line.clear();
        push_sanitized(line, &sample.thread_name);
        if let Some(off_cpu) = &sample.off_cpu {
            line.push_str(";[off-cpu: ");
            line.push_str(off_cpu.state.name());
            line.push(']');
        }
        for label in labels.name(sample).iter() {
            line.push(';');
            push_sanitized(line, label);
        }
    }

    /// Writes the stacks sorted, so equal profiles give equal files.
    pub fn write(&self, mut out: impl io::Write) -> io::Result<()> {
        let mut lines: Vec<_> = self.counts.iter().collect();
        lines.sort_unstable();
        for (stack, count) in lines {
            writeln!(out, "{stack} {count}")?;
        }
        out.flush()
    }
}

impl Sink for FoldedStacks {
    fn push(&mut self, sample: &ResolvedSample) {
        self.push_count(sample, 1);
    }

    fn push_count(&mut self, sample: &ResolvedSample, count: u64) {
        let value = match (self.cpu_period_ns, &sample.off_cpu) {
            (None, _) => 1,
            (Some(_), Some(off_cpu)) => off_cpu.blocked_ns / 1000,
            (Some(period_ns), None) => period_ns / 1000,
        };
        Self::fold_into(&mut self.labels, sample, &mut self.line);
        let add = value.saturating_mul(count);
        // Looked up by reference: a stack seen before costs no allocation.
        match self.counts.get_mut(self.line.as_str()) {
            Some(total) => *total = total.saturating_add(add),
            None => {
                self.counts.insert(self.line.clone(), add);
            }
        }
    }
}

/// Appends `name` to `line`. `;` separates frames and the last space
/// separates the count: neither may appear inside a name (C++ and Rust
/// names have spaces, comm can have both).
fn push_sanitized(line: &mut String, name: &str) {
    if !name.contains([';', '\n', '\r']) {
        line.push_str(name);
        return;
    }
    line.extend(name.chars().map(|c| match c {
        ';' => ':',
        '\n' | '\r' => ' ',
        c => c,
    }));
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::{Frame, FrameKind, Line, Mapping, OffCpu, ThreadState};

    fn frame(kind: FrameKind, names: &[&str]) -> Frame {
        Frame {
            kind,
            address: 0x1000,
            mapping: None,
            file_offset: 0,
            lines: names
                .iter()
                .map(|name| Line::named((*name).into(), (*name).into()))
                .collect(),
        }
    }

    #[test]
    fn folds_root_first_with_kernel_suffix_inlines_and_addresses() {
        let mapping = Arc::new(Mapping {
            start: 0x1000,
            end: 0x2000,
            file_offset: 0,
            path: "/usr/lib/libfoo.so".into(),
            dev: 0,
            inode: 0,
            build_ids: Default::default(),
        });
        let mut unnamed = frame(FrameKind::Native, &[]);
        unnamed.mapping = Some(mapping);
        unnamed.file_offset = 0x42;
        let sample = ResolvedSample {
            thread_name: "app;worker".into(),
            ..ResolvedSample::of_app(vec![
                frame(FrameKind::Kernel, &["do_sys_poll"]),
                // Inlined: `inner` was inlined into `outer`; innermost first.
                frame(FrameKind::Native, &["inner", "outer"]),
                unnamed,
                frame(FrameKind::Native, &["main"]),
            ])
        };
        assert_eq!(
            FoldedStacks::fold(&sample),
            "app:worker;main;[libfoo.so+0x42];outer;inner;do_sys_poll_[k]"
        );
        let mut folded = FoldedStacks::new();
        folded.push(&sample);
        folded.push(&sample);
        let mut out = Vec::new();
        folded.write(&mut out).unwrap();
        assert!(
            String::from_utf8(out)
                .unwrap()
                .ends_with("do_sys_poll_[k] 2\n")
        );

        // Off-CPU: the state is a frame, values are microseconds.
        let mut blocked = sample.clone();
        blocked.off_cpu = Some(OffCpu {
            blocked_ns: 5_000_000,
            state: ThreadState::Uninterruptible,
        });
        let mut timed = FoldedStacks::in_microseconds(10_000_000);
        timed.push(&sample);
        timed.push(&blocked);
        let mut out = Vec::new();
        timed.write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("app:worker;[off-cpu: uninterruptible];main;"),
            "{text}"
        );
        assert!(
            text.contains("do_sys_poll_[k] 5000\n") && text.contains("do_sys_poll_[k] 10000\n"),
            "{text}"
        );
    }
}
