//! Source lines and inlined functions from DWARF, through `addr2line`.
//!
//! Sections are copied (and decompressed: zlib or zstd, `SHF_COMPRESSED` or
//! `.zdebug_*`) into shared buffers so the context owns its data and can be
//! cached independently of the file it came from.
use std::{borrow::Cow, sync::Arc};

use gimli::{EndianArcSlice, RunTimeEndian};
use object::{Object, ObjectSection};

use super::{SymbolizeError, demangle::demangle};
use crate::model::Line;

type Reader = EndianArcSlice<RunTimeEndian>;

/// Largest believable expansion of a compressed debug section: real DWARF
/// compresses 3-10x, and zlib cannot exceed ~1032x. The header's size is
/// allocated (and zeroed) up front, so a few KB claiming gigabytes would
/// otherwise exhaust memory (found by fuzzing).
const MAX_EXPANSION: u64 = 1024;
/// Largest uncompressed debug section accepted, whatever its compressed size.
const MAX_SECTION_BYTES: u64 = 2 << 30;

/// Whether addr2line needs a section to name functions and lines: location
/// lists (where variables live) and macros, often a third of optimized
/// code's DWARF, are never read, so they are not kept.
fn is_needed(name: &str) -> bool {
    let name = name
        .strip_prefix(".zdebug_")
        .or_else(|| name.strip_prefix(".debug_"));
    name.is_some_and(|name| !matches!(name, "loc" | "loclists" | "macinfo" | "macro"))
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
    Ok(match compressed.decompress().map_err(section_error)? {
        Cow::Borrowed(data) => Arc::from(data),
        Cow::Owned(data) => Arc::from(data),
    })
}

/// DWARF of one file, ready for lookups.
pub struct Dwarf {
    /// addr2line parses units lazily through `OnceCell`s, so the context is
    /// not `Sync`; lookups of one file take turns.
    context: std::sync::Mutex<addr2line::Context<Reader>>,
    /// Bytes of the sections held, for the cache's memory budget.
    section_bytes: usize,
}

impl Dwarf {
    /// Loads the DWARF of `file`; `None` when it has no `.debug_info`. Fails
    /// when the sections would hold more than `limit` bytes (the estimate of
    /// [`Dwarf::estimated_size`]), before reading any of them.
    pub fn load(file: &object::File, limit: usize) -> Result<Option<Self>, SymbolizeError> {
        if file.section_by_name(".debug_info").is_none() {
            return Ok(None);
        }
        let needed = file
            .sections()
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
        let endian = if file.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let mut section_bytes = 0;
        let dwarf = gimli::Dwarf::load(|id| -> Result<Reader, SymbolizeError> {
            let data = match file.section_by_name(id.name()) {
                Some(section) if is_needed(id.name()) => section_data(&section, id.name())?,
                _ => Arc::from(&[][..]),
            };
            section_bytes += data.len();
            Ok(EndianArcSlice::new(data, endian))
        })?;
        let context = addr2line::Context::from_dwarf(dwarf).map_err(SymbolizeError::Dwarf)?;
        Ok(Some(Dwarf {
            context: std::sync::Mutex::new(context),
            section_bytes,
        }))
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
        let Ok(mut frames) = context.find_frames(address).skip_all_loads() else {
            return lines;
        };
        // The unit the frames' DIEs belong to, for their declaration lines.
        let unit = context.find_dwarf_and_unit(address).skip_all_loads();
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
/// or the definition (`DW_AT_specification`) of. `None` without one, as in
/// line-tables-only DWARF; links into other units are not followed.
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
            _ => return None,
        };
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
