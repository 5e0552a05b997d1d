//! A process's mappings as the kernel sees them: cut where a language
//! runtime's code lies (see [`CodeRange`]), and those its map has room for.
use crate::model::{CodeRange, Mapping};

/// `mappings` cut where `code` says (each piece: the mapping, or part of
/// it, and the runtime whose code it is, if any): an anonymous mapping is
/// a runtime's whole when a range overlaps it; a file mapping is cut at
/// the edges of the ranges `in_files` (a runtime's code inside a binary).
pub(super) fn runtime_pieces(
    mappings: &[Mapping],
    code: &[CodeRange],
) -> Vec<(Mapping, Option<u8>)> {
    let mut pieces = Vec::with_capacity(mappings.len());
    for mapping in mappings {
        if mapping.inode == 0 {
            let runtime = code
                .iter()
                .find(|range| {
                    !range.in_files && mapping.start < range.high && range.low < mapping.end
                })
                .filter(|_| &*mapping.path != "[vdso]")
                .map(|range| range.runtime);
            pieces.push((mapping.clone(), runtime));
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
                .map(|range| range.runtime);
            let mut piece = mapping.clone();
            piece.start = start;
            piece.end = end;
            piece.file_offset = mapping.file_offset + (start - mapping.start);
            pieces.push((piece, runtime));
        }
    }
    pieces
}

/// The `pieces` the kernel keeps, by address, when it holds at most `max`
/// of a process's, and how many are left out: file-backed code and a
/// runtime's code first, since other anonymous code (JIT without a walker)
/// has no table anyway. The rest's addresses read as "no mapping"; their
/// samples asking again wait out a backoff.
pub(super) fn fitting(
    pieces: &[(Mapping, Option<u8>)],
    max: usize,
) -> (Vec<&(Mapping, Option<u8>)>, usize) {
    let mut sorted: Vec<&(Mapping, Option<u8>)> = pieces.iter().collect();
    let dropped = sorted.len().saturating_sub(max);
    if dropped > 0 {
        sorted.sort_by_key(|(mapping, runtime)| {
            (
                mapping.inode == 0 && &*mapping.path != "[vdso]" && runtime.is_none(),
                mapping.start,
            )
        });
        sorted.truncate(max);
    }
    sorted.sort_by_key(|(mapping, _)| mapping.start);
    (sorted, dropped)
}
