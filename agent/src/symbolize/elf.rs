//! Function names from an ELF file's `.symtab` and `.dynsym`.
use std::sync::Arc;

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use super::SymbolizeError;
use crate::model::Line;

/// The code symbols of one ELF file, and how its file offsets map to addresses.
#[derive(Debug)]
pub struct ElfSymbols {
    /// (start, size, raw name), sorted by start.
    symbols: Vec<(u64, u64, Arc<str>)>,
    /// PT_LOAD segments as (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
}

impl ElfSymbols {
    /// Parses `data` (the whole file).
    pub fn parse(data: &[u8]) -> Result<Self, SymbolizeError> {
        let file = object::File::parse(data).map_err(SymbolizeError::Parse)?;
        let segments = file
            .segments()
            .map(|segment| {
                let (offset, size) = segment.file_range();
                (offset, size, segment.address())
            })
            .collect();
        let mut symbols: Vec<(u64, u64, Arc<str>)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.address() != 0)
            .filter_map(|symbol| {
                let name = symbol.name().ok().filter(|name| !name.is_empty())?;
                Some((symbol.address(), symbol.size(), Arc::from(name)))
            })
            .collect();
        // Prefer the sized entry when .symtab and .dynsym both name an address.
        symbols.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        symbols.dedup_by_key(|(start, _, _)| *start);
        Ok(ElfSymbols { symbols, segments })
    }

    /// Translates a file offset to the address the ELF's symbols use.
    pub fn offset_to_address(&self, file_offset: u64) -> Option<u64> {
        self.segments.iter().find_map(|&(offset, size, address)| {
            (offset..offset + size)
                .contains(&file_offset)
                .then(|| address + (file_offset - offset))
        })
    }

    /// The function at ELF address `address`.
    pub fn lookup(&self, address: u64) -> Option<Line> {
        let index = self
            .symbols
            .partition_point(|(start, _, _)| *start <= address);
        let (start, size, name) = self.symbols.get(index.checked_sub(1)?)?;
        // A sized symbol must contain the address; an unsized one (hand-written
        // assembly) covers up to the next symbol.
        if *size != 0 && address >= start + size {
            return None;
        }
        Some(Line::named(super::demangle(name), name.clone()))
    }

    /// Number of code symbols (0 for a fully stripped file).
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// True for a file without code symbols (fully stripped).
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }
}
