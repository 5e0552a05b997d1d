//! Flame graph SVG (`.svg`), drawn by inferno from the folded stacks.
use std::io;

use super::FoldedStacks;

/// Writes `folded` as an interactive flame graph. An empty profile gives an
/// error: inferno cannot draw nothing, and an empty picture would mislead.
pub fn write_flamegraph(folded: &FoldedStacks, title: &str, out: impl io::Write) -> io::Result<()> {
    let mut text = Vec::new();
    folded.write(&mut text)?;
    let text = String::from_utf8_lossy(&text);
    if text.trim().is_empty() {
        return Err(io::Error::other(
            "no samples to draw: profile for longer or check that the target is busy",
        ));
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_owned();
    options.count_name = "samples".to_owned();
    inferno::flamegraph::from_lines(&mut options, text.lines(), out)
}
