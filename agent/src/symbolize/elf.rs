//! Function names from an ELF file's symbol tables: `.symtab`, `.dynsym`,
//! MiniDebugInfo (`.gnu_debugdata`, an xz-compressed ELF holding the local
//! function symbols that `strip` removed, as Fedora ships) and, for Go
//! binaries without symbols, `.gopclntab`.
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use super::{SymbolizeError, demangle::demangle, gopclntab};
use crate::model::Line;

/// Limit on MiniDebugInfo's decompressed size: it is a symbol table, so
/// anything bigger is corrupt or hostile.
const MAX_MINIDEBUGINFO: usize = 256 << 20;

/// A code symbol: start, size (0 when unknown), raw name.
type Symbol = (u64, u64, Arc<str>);

/// The code symbols of one ELF file, and how its file offsets map to addresses.
#[derive(Debug, Default)]
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
        Ok(Self::from_object(&file))
    }

    /// Reads the symbols of a parsed file, from every source it has.
    pub fn from_object(file: &object::File) -> Self {
        let segments = file
            .segments()
            .map(|segment| {
                let (offset, size) = segment.file_range();
                (offset, size, segment.address())
            })
            .collect();
        let mut symbols = code_symbols(file);
        if let Some(mini) = minidebuginfo(file)
            && let Ok(mini) = object::File::parse(&*mini)
        {
            symbols.extend(code_symbols(&mini));
        }
        if file.section_by_name(".symtab").is_none()
            && let Some(functions) = gopclntab::functions(file)
        {
            symbols.extend(functions);
        }
        // Prefer the sized entry when several tables name an address, then
        // the first listed (stable sort).
        symbols.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        symbols.dedup_by_key(|(start, _, _)| *start);
        ElfSymbols { symbols, segments }
    }

    /// Adds symbols from another file of the same build (a debug file).
    pub fn merge(&mut self, other: ElfSymbols) {
        // Stable: at one address, the file's own names win.
        self.symbols.extend(other.symbols);
        self.symbols
            .sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        self.symbols.dedup_by_key(|(start, _, _)| *start);
    }

    /// Translates a file offset to the address the ELF's symbols use.
    pub fn offset_to_address(&self, file_offset: u64) -> Option<u64> {
        // Wrapping and saturating: segment fields come from the file, and a
        // hostile one must not panic (found by fuzzing).
        self.segments.iter().find_map(|&(offset, size, address)| {
            (offset..offset.saturating_add(size))
                .contains(&file_offset)
                .then(|| address.wrapping_add(file_offset - offset))
        })
    }

    /// The raw name of the function at ELF address `address`.
    pub fn lookup_name(&self, address: u64) -> Option<&Arc<str>> {
        let index = self
            .symbols
            .partition_point(|(start, _, _)| *start <= address);
        let (start, size, name) = self.symbols.get(index.checked_sub(1)?)?;
        // A sized symbol must contain the address; an unsized one (hand-written
        // assembly) covers up to the next symbol.
        if *size != 0 && address - start >= *size {
            return None;
        }
        Some(name)
    }

    /// The function at ELF address `address`.
    pub fn lookup(&self, address: u64) -> Option<Line> {
        let name = self.lookup_name(address)?;
        Some(Line::named(demangle(name), name.clone()))
    }

    /// Number of code symbols (0 for a fully stripped file).
    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    /// True for a file without code symbols (fully stripped).
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// Rough heap size, for the cache's memory budget.
    pub fn estimated_size(&self) -> usize {
        self.symbols
            .iter()
            .map(|(_, _, name)| 40 + name.len())
            .sum::<usize>()
            + self.segments.len() * 24
    }
}

/// The file's code symbols, the preferred names of an address first (the
/// table sorts stably and keeps the first): the fewest leading underscores
/// (public names: `abort` over glibc's `__GI_abort`, `isalnum_l` over
/// `__isalnum_l`), then global, weak, local symbols.
fn code_symbols(file: &object::File) -> Vec<Symbol> {
    let mut symbols: Vec<((usize, u8), Symbol)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.address() != 0)
        .filter_map(|symbol| {
            let name = symbol.name().ok().filter(|name| !name.is_empty())?;
            let binding = if symbol.is_weak() {
                1
            } else if symbol.is_global() {
                0
            } else {
                2
            };
            let underscores = name.bytes().take_while(|byte| *byte == b'_').count();
            Some((
                (underscores, binding),
                (symbol.address(), symbol.size(), Arc::from(name)),
            ))
        })
        .collect();
    symbols.sort_by_key(|(preference, _)| *preference);
    symbols.into_iter().map(|(_, symbol)| symbol).collect()
}

/// The decompressed MiniDebugInfo ELF, if the file has one.
fn minidebuginfo(file: &object::File) -> Option<Vec<u8>> {
    let data = file.section_by_name(".gnu_debugdata")?.data().ok()?;
    match super::xz::decompress(data, MAX_MINIDEBUGINFO) {
        Ok(elf) => Some(elf),
        Err(err) => {
            tracing::debug!("ignoring unreadable .gnu_debugdata: {err}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing: segment and symbol extents from the file that
    /// overflow when added.
    #[test]
    fn extents_at_the_end_of_the_address_space() {
        let symbols = ElfSymbols {
            symbols: vec![(u64::MAX - 1, u64::MAX, Arc::from("f"))],
            segments: vec![(u64::MAX - 4, u64::MAX, u64::MAX - 2)],
        };
        assert_eq!(symbols.offset_to_address(u64::MAX - 1), Some(0));
        assert_eq!(symbols.offset_to_address(1), None);
        assert_eq!(symbols.lookup_name(u64::MAX).map(|name| &**name), Some("f"));
    }
}
