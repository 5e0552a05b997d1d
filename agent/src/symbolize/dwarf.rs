//! Source lines and inlined functions from DWARF, through `addr2line`.
//!
//! Sections are copied (and decompressed: zlib or zstd, `SHF_COMPRESSED` or
//! `.zdebug_*`) into shared buffers so the context owns its data and can be
//! cached independently of the file it came from.
use std::{borrow::Cow, sync::Arc};

use gimli::{EndianArcSlice, RunTimeEndian};
use object::{Object, ObjectSection};

use super::{SymbolizeError, debuginfo::Candidate, demangle::demangle, split::Split};
use crate::files::Root;
use crate::model::Line;

pub type Reader = EndianArcSlice<RunTimeEndian>;

/// Largest believable expansion of a compressed debug section: real DWARF
/// compresses 3-10x, and zlib cannot exceed ~1032x. The header's size is
/// allocated (and zeroed) up front, so a few KB claiming gigabytes would
/// otherwise exhaust memory (found by fuzzing).
const MAX_EXPANSION: u64 = 1024;
/// Largest uncompressed debug section accepted, whatever its compressed size.
const MAX_SECTION_BYTES: u64 = 2 << 30;

/// Whether addr2line needs a section to name functions and lines: location
/// lists (where variables live) and macros, often a third of optimized
/// code's DWARF, are never read, so they are not kept. Split DWARF's
/// sections (`.debug_info.dwo`) are judged by the same rule.
pub fn is_needed(name: &str) -> bool {
    let name = name.strip_suffix(".dwo").unwrap_or(name);
    let name = name
        .strip_prefix(".zdebug_")
        .or_else(|| name.strip_prefix(".debug_"));
    name.is_some_and(|name| !matches!(name, "loc" | "loclists" | "macinfo" | "macro"))
}

/// Which debug sections to keep.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Those addr2line reads ([`is_needed`]).
    Needed,
    /// All (a DWARF package's index refers into each).
    All,
}

/// The section `name` of `file` as a reader (empty when absent or not
/// kept), its size added to `bytes`; fails once `bytes` would exceed
/// half of `limit` (what [`Dwarf::estimated_size`] counts).
pub fn load_sections(
    file: &object::File,
    name: Option<&'static str>,
    keep: Keep,
    bytes: &mut usize,
    limit: usize,
) -> Result<Reader, SymbolizeError> {
    let endian = if file.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let data = match name.and_then(|name| Some((name, file.section_by_name(name)?))) {
        Some((name, section)) if keep == Keep::All || is_needed(name) => {
            section_data(&section, name)?
        }
        _ => Arc::from(&[][..]),
    };
    *bytes += data.len();
    let estimate = bytes.saturating_mul(2);
    if estimate > limit {
        return Err(SymbolizeError::DwarfTooLarge { estimate, limit });
    }
    Ok(EndianArcSlice::new(data, endian))
}

/// The bytes of a debug section, decompressed; a compressed section whose
/// header claims an implausible size is refused before anything is allocated.
fn section_data(
    section: &object::Section,
    name: &'static str,
) -> Result<Arc<[u8]>, SymbolizeError> {
    let section_error = |source| SymbolizeError::Section { name, source };
    let compressed = section.compressed_data().map_err(section_error)?;
    if compressed.format != object::CompressionFormat::None {
        let limit = (compressed.data.len() as u64)
            .saturating_mul(MAX_EXPANSION)
            .min(MAX_SECTION_BYTES);
        if compressed.uncompressed_size > limit {
            return Err(SymbolizeError::SectionTooLarge {
                name,
                claimed: compressed.uncompressed_size,
                compressed: compressed.data.len(),
            });
        }
    }
    // A stream that does not inflate cleanly goes through object's
    // decompression below, for its error.
    if compressed.format == object::CompressionFormat::Zlib
        && let Some(data) = inflate_shared(compressed.data, compressed.uncompressed_size)
    {
        return Ok(data);
    }
    Ok(match compressed.decompress().map_err(section_error)? {
        Cow::Borrowed(data) => Arc::from(data),
        Cow::Owned(data) => Arc::from(data),
    })
}

/// Inflates a zlib stream straight into the shared buffer the readers
/// keep. Through a `Vec` first, the largest sections (libc's `.debug_info`:
/// 6 MB) were held twice while copied.
fn inflate_shared(data: &[u8], size: u64) -> Option<Arc<[u8]>> {
    let size = usize::try_from(size).ok()?;
    // SAFETY: zeroed bytes are initialized `u8`s.
    let mut out = unsafe { Arc::<[u8]>::new_zeroed_slice(size).assume_init() };
    let buffer = Arc::get_mut(&mut out).expect("a new Arc has no other owner");
    let mut inflate = flate2::Decompress::new(true);
    let status = inflate.decompress(data, buffer, flate2::FlushDecompress::Finish);
    match status {
        Ok(flate2::Status::StreamEnd) if inflate.total_out() == size as u64 => Some(out),
        _ => None,
    }
}

/// DWARF of one file, ready for lookups.
pub struct Dwarf {
    /// addr2line parses units lazily through `OnceCell`s, so the context is
    /// not `Sync`; lookups of one file take turns.
    context: std::sync::Mutex<addr2line::Context<Reader>>,
    /// Split units (`.dwo`, `.dwp`), handed to addr2line as it asks.
    split: Split,
    /// Bytes of the sections held, for the cache's memory budget.
    section_bytes: usize,
}

/// Files beyond the one holding `.debug_info` that its DWARF may need.
#[derive(Default)]
pub struct Companions<'a> {
    /// The dwz supplementary file (`.gnu_debugaltlink`).
    pub sup: Option<&'a object::File<'a>>,
    /// Where the binary is, and the root it is in: split DWARF (`.dwo`,
    /// `.dwp`) is looked for from there.
    pub binary: Option<(&'a Candidate, Option<&'a Root>)>,
}

impl Dwarf {
    /// Loads the DWARF of `file`; `None` when it has no `.debug_info`. Fails
    /// when the sections would hold more than `limit` bytes (the estimate of
    /// [`Dwarf::estimated_size`]), before reading any of them.
    #[cfg(test)]
    pub fn load(file: &object::File, limit: usize) -> Result<Option<Self>, SymbolizeError> {
        Self::load_with(file, &Companions::default(), limit)
    }

    /// Loads the DWARF of `file` as `Dwarf::load` does, with the supplementary and split DWARF of
    /// `companions`.
    pub fn load_with(
        file: &object::File,
        companions: &Companions,
        limit: usize,
    ) -> Result<Option<Self>, SymbolizeError> {
        if file.section_by_name(".debug_info").is_none() {
            return Ok(None);
        }
        let files = std::iter::once(file).chain(companions.sup);
        let needed = files
            .flat_map(|file| file.sections())
            .filter(|section| section.name().is_ok_and(is_needed))
            .map(|section| {
                section
                    .compressed_data()
                    .map_or(section.size(), |data| data.uncompressed_size)
            })
            .fold(0u64, u64::saturating_add);
        let estimate = usize::try_from(needed)
            .unwrap_or(usize::MAX)
            .saturating_mul(2);
        if estimate > limit {
            return Err(SymbolizeError::DwarfTooLarge { estimate, limit });
        }
        let mut section_bytes = 0;
        let mut dwarf = gimli::Dwarf::load(|id| {
            load_sections(
                file,
                Some(id.name()),
                Keep::Needed,
                &mut section_bytes,
                limit,
            )
        })?;
        if let Some(sup) = companions.sup {
            dwarf.load_sup(|id| {
                load_sections(
                    sup,
                    Some(id.name()),
                    Keep::Needed,
                    &mut section_bytes,
                    limit,
                )
            })?;
        }
        let split = match companions.binary {
            Some((binary, root)) => {
                let endian = if file.is_little_endian() {
                    RunTimeEndian::Little
                } else {
                    RunTimeEndian::Big
                };
                let remaining = limit.saturating_sub(section_bytes.saturating_mul(2));
                Split::load(&dwarf, endian, binary, root, remaining)
            }
            None => Split::default(),
        };
        section_bytes += split.bytes;
        let context = addr2line::Context::from_dwarf(dwarf).map_err(SymbolizeError::Dwarf)?;
        Ok(Some(Dwarf {
            context: std::sync::Mutex::new(context),
            split,
            section_bytes,
        }))
    }

    /// Runs an addr2line lookup to its end, giving it the split units it
    /// asks for (those not found are skipped: the skeleton still names the
    /// unit's lines).
    fn finish<L>(&self, mut result: addr2line::LookupResult<L>) -> L::Output
    where
        L: addr2line::LookupContinuation<Buf = Reader>,
    {
        loop {
            match result {
                addr2line::LookupResult::Output(output) => return output,
                addr2line::LookupResult::Load { load, continuation } => {
                    result = continuation.resume(self.split.resolve(&load));
                }
            }
        }
    }

    /// Functions at ELF address `address`, innermost inlined call first. Each
    /// line is where execution was inside that function. Empty when DWARF
    /// does not cover the address.
    pub fn lookup(&self, address: u64) -> Vec<Line> {
        // addr2line probes [address, address + 1), which overflows (a panic
        // with overflow checks) at the last address; no code lives there.
        if address == u64::MAX {
            return Vec::new();
        }
        let Ok(context) = self.context.lock() else {
            return Vec::new();
        };
        let mut lines = Vec::new();
        let Ok(mut frames) = self.finish(context.find_frames(address)) else {
            return lines;
        };
        // The unit the frames' DIEs belong to, for their declaration lines.
        let unit = self.finish(context.find_dwarf_and_unit(address));
        while let Ok(Some(frame)) = frames.next() {
            let start_line = unit
                .zip(frame.dw_die_offset)
                .and_then(|(unit, offset)| decl_line(unit, offset))
                .unwrap_or(0);
            let system_name: Option<Arc<str>> = frame
                .function
                .as_ref()
                .and_then(|function| function.raw_name().ok())
                .map(|name| Arc::from(&*name));
            let (file, line, column) = match &frame.location {
                Some(location) => (
                    location.file.map(Arc::from),
                    location.line.unwrap_or(0),
                    location.column.unwrap_or(0),
                ),
                None => (None, 0, 0),
            };
            // A location without a function (assembly, or units without
            // subprogram DIEs): the caller names it from the symbol table.
            let system_name = system_name.unwrap_or_else(|| Arc::from(""));
            lines.push(Line {
                function: if system_name.is_empty() {
                    system_name.clone()
                } else {
                    demangle(&system_name)
                },
                system_name,
                file,
                line,
                column,
                start_line,
            });
        }
        lines
    }

    /// [`crate::files::content_id`] of each split DWARF file read.
    pub fn split_contents(&self) -> &[Arc<str>] {
        &self.split.contents
    }

    /// Rough memory held: the sections plus what addr2line builds from them.
    pub fn estimated_size(&self) -> usize {
        self.section_bytes.saturating_mul(2)
    }
}

/// Most `DW_AT_abstract_origin`/`DW_AT_specification` links followed to find
/// a declaration line (real chains are 1-2 long; a cycle must end).
const MAX_ORIGIN_LINKS: usize = 8;

/// The line where the function of the DIE at `offset` begins
/// (`DW_AT_decl_line`), found as llvm-symbolizer does: on the DIE itself, else
/// on the DIE it is a concrete or inlined instance (`DW_AT_abstract_origin`)
/// or the definition (`DW_AT_specification`) of, also in a dwz
/// supplementary file. `None` without one, as in line-tables-only DWARF;
/// links into other units of the same file are not followed.
fn decl_line(unit: gimli::UnitRef<'_, Reader>, offset: gimli::UnitOffset) -> Option<u32> {
    let mut offset = offset;
    for _ in 0..=MAX_ORIGIN_LINKS {
        let entry = unit.entry(offset).ok()?;
        if let Some(line) = entry
            .attr_value(gimli::DW_AT_decl_line)
            .and_then(|value| value.udata_value())
        {
            return u32::try_from(line).ok().filter(|line| *line > 0);
        }
        let next = entry
            .attr_value(gimli::DW_AT_abstract_origin)
            .or_else(|| entry.attr_value(gimli::DW_AT_specification))?;
        offset = match next {
            gimli::AttributeValue::UnitRef(offset) => offset,
            gimli::AttributeValue::DebugInfoRef(offset) => offset.to_unit_offset(&unit.header)?,
            gimli::AttributeValue::DebugInfoRefSup(offset) => {
                return decl_line_in_sup(unit.dwarf.sup()?, offset);
            }
            _ => return None,
        };
    }
    None
}

/// [`decl_line`] of the DIE at `offset` of a dwz supplementary file (its
/// partial units hold the declarations the linking files share).
fn decl_line_in_sup(sup: &gimli::Dwarf<Reader>, offset: gimli::DebugInfoOffset) -> Option<u32> {
    let mut headers = sup.units();
    while let Ok(Some(header)) = headers.next() {
        let Some(unit_offset) = offset.to_unit_offset(&header) else {
            continue;
        };
        let unit = sup.unit(header).ok()?;
        // A supplementary file has no supplementary file of its own, so
        // this recursion ends.
        return decl_line(gimli::UnitRef::new(sup, &unit), unit_offset);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &[u8] = include_bytes!("../../../fuzz/corpus/elf_symbolize/sym_dwarf5.so");

    #[test]
    fn dwarf_over_the_limit_is_not_loaded() {
        let file = object::File::parse(SEED).unwrap();
        let dwarf = Dwarf::load(&file, usize::MAX).unwrap().unwrap();
        let estimate = dwarf.estimated_size();
        assert!(Dwarf::load(&file, estimate).unwrap().is_some());
        assert!(matches!(
            Dwarf::load(&file, estimate - 1),
            Err(SymbolizeError::DwarfTooLarge { .. })
        ));
    }

    #[test]
    fn location_lists_and_macros_are_not_kept() {
        assert!(is_needed(".debug_info") && is_needed(".zdebug_line"));
        assert!(is_needed(".debug_rnglists") && is_needed(".debug_str_offsets"));
        assert!(!is_needed(".debug_loclists") && !is_needed(".debug_loc"));
        assert!(!is_needed(".debug_macro") && !is_needed(".text"));
    }
}
