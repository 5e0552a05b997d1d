//! How a frame reads in the text outputs (folded stacks, the summary,
//! `top`): `name` for native code, `name_[k]` for the kernel's,
//! `qualname (file:line)` for Python, `Class.method (File.java:line)` for
//! Java and JavaScript, `[module+0xOFFSET]` when unsymbolized.
//!
//! The folded stacks and the summary name every frame of every sample: a
//! host-wide `record` at 999 Hz on two CPUs, some 2,000 samples a second of
//! 20-odd frames each. [`StackLabels`] writes them into one buffer kept
//! from sample to sample, so naming a stack allocates nothing once warm (a
//! `String` per label was a fifth of `record`'s CPU per sample).
use std::fmt::Write;

use crate::model::{Frame, FrameKind, Line, ResolvedSample};

/// Names for one frame, outermost inlined function first.
pub fn frame_labels(frame: &Frame) -> impl Iterator<Item = String> + '_ {
    let unsymbolized = frame.lines.is_empty().then(|| frame.unsymbolized_label());
    let named = frame.lines.iter().rev().map(move |line| {
        let mut label = String::new();
        write_line_label(frame.kind, line, &mut label);
        label
    });
    unsymbolized.into_iter().chain(named)
}

/// Appends the label of `line` in a frame of `kind` to `out`.
fn write_line_label(kind: FrameKind, line: &Line, out: &mut String) {
    let _ = match kind {
        FrameKind::Kernel => write!(out, "{}_[k]", line.function),
        // `qualname (file:line)`, as py-spy shows Python frames.
        FrameKind::Python => {
            let file = line.file.as_deref().unwrap_or("?");
            write!(out, "{} ({file}:{})", line.function, line.line)
        }
        // As a Java stack trace shows a frame (JavaScript: as Node's do);
        // without a line `(File.java)`, without a file (a stub, a
        // builtin) the name alone.
        FrameKind::Java | FrameKind::JavaScript => match line.file.as_deref() {
            Some(file) if line.line != 0 => {
                write!(out, "{} ({file}:{})", line.function, line.line)
            }
            Some(file) => write!(out, "{} ({file})", line.function),
            None => write!(out, "{}", line.function),
        },
        _ => write!(out, "{}", line.function),
    };
}

/// The labels of one sample's stack, root first, written one after another
/// into a buffer reused for the next sample.
#[derive(Debug, Default)]
pub struct StackLabels {
    text: String,
    /// Where each label ends in `text`.
    ends: Vec<usize>,
}

impl StackLabels {
    /// Names `sample`'s frames, root first (what was named before goes).
    pub fn name(&mut self, sample: &ResolvedSample) -> &Self {
        self.text.clear();
        self.ends.clear();
        for frame in sample.frames.iter().rev() {
            if frame.lines.is_empty() {
                frame.write_unsymbolized_label(&mut self.text);
                self.ends.push(self.text.len());
            }
            for line in frame.lines.iter().rev() {
                write_line_label(frame.kind, line, &mut self.text);
                self.ends.push(self.text.len());
            }
        }
        self
    }

    /// The labels, root first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &str> + '_ {
        (0..self.ends.len()).map(|at| {
            let start = at.checked_sub(1).map_or(0, |before| self.ends[before]);
            &self.text[start..self.ends[at]]
        })
    }

    /// The leaf's label.
    pub fn leaf(&self) -> Option<&str> {
        self.iter().next_back()
    }
}
