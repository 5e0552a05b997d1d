//! A process's mappings as the kernel sees them: cut where a language
//! runtime's code lies (see [`CodeRange`]), and those its map has room for.
use crate::model::{CodeRange, CodeUse, Mapping};

/// A process's mapping as the kernel keeps it: the whole mapping, or the
/// part of it that some runtime's code is in, or is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Piece {
    /// Where the piece is (its file offset too).
    pub mapping: Mapping,
    /// What the runtime whose code it is has the kernel do with it.
    pub by: Option<CodeUse>,
    /// The mapping it is part of, by its index in those given: its file
    /// is opened through it (`/proc/PID/map_files` names whole mappings).
    pub whole: usize,
}

/// `mappings` cut where `code` says (each piece: the mapping, or part of
/// it, and what the runtime whose code it is has done with it, if any): an
/// anonymous mapping is a runtime's whole when a range overlaps it; a file
/// mapping is cut at the edges of the ranges `in_files` (a runtime's code
/// inside a binary).
pub(super) fn runtime_pieces(mappings: &[Mapping], code: &[CodeRange]) -> Vec<Piece> {
    let mut pieces = Vec::with_capacity(mappings.len());
    for (whole, mapping) in mappings.iter().enumerate() {
        if mapping.inode == 0 {
            let runtime = code
                .iter()
                .find(|range| {
                    !range.in_files && mapping.start < range.high && range.low < mapping.end
                })
                .filter(|_| &*mapping.path != "[vdso]")
                .map(|range| range.by);
            pieces.push(Piece {
                mapping: mapping.clone(),
                by: runtime,
                whole,
            });
            continue;
        }
        let mut cuts = vec![mapping.start, mapping.end];
        for range in code.iter().filter(|range| range.in_files) {
            for edge in [range.low, range.high] {
                if mapping.start < edge && edge < mapping.end {
                    cuts.push(edge);
                }
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        for pair in cuts.windows(2) {
            let (start, end) = (pair[0], pair[1]);
            let runtime = code
                .iter()
                .find(|range| range.in_files && range.low <= start && end <= range.high)
                .map(|range| range.by);
            let mut piece = mapping.clone();
            piece.start = start;
            piece.end = end;
            piece.file_offset = mapping.file_offset + (start - mapping.start);
            pieces.push(Piece {
                mapping: piece,
                by: runtime,
                whole,
            });
        }
    }
    pieces
}

/// The `pieces` the kernel keeps, by address, when it holds at most `max`
/// of a process's, and how many are left out: file-backed code and a
/// runtime's code first, since other anonymous code (JIT without a walker)
/// has no table anyway. The rest's addresses read as "no mapping"; their
/// samples asking again wait out a backoff.
pub(super) fn fitting(pieces: &[Piece], max: usize) -> (Vec<&Piece>, usize) {
    let mut sorted: Vec<&Piece> = pieces.iter().collect();
    let dropped = sorted.len().saturating_sub(max);
    if dropped > 0 {
        sorted.sort_by_key(|piece| {
            let mapping = &piece.mapping;
            (
                mapping.inode == 0 && &*mapping.path != "[vdso]" && piece.by.is_none(),
                mapping.start,
            )
        });
        sorted.truncate(max);
    }
    sorted.sort_by_key(|piece| piece.mapping.start);
    (sorted, dropped)
}
