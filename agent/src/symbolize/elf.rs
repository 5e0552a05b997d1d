//! Function names from an ELF file's symbol tables: `.symtab`, `.dynsym`,
//! MiniDebugInfo (`.gnu_debugdata`, an xz-compressed ELF holding the local
//! function symbols that `strip` removed, as Fedora ships) and, for Go
//! binaries without symbols, `.gopclntab`.
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use super::{
    SymbolizeError,
    demangle::demangle,
    gopclntab,
    names::{NameAt, Names},
};
use crate::model::Line;

/// Limit on MiniDebugInfo's decompressed size: it is a symbol table, so
/// anything bigger is corrupt or hostile.
const MAX_MINIDEBUGINFO: usize = 256 << 20;

/// A code symbol while tables are read: start, size (0 when unknown), raw
/// name (borrowed from the file).
type Symbol<'a> = (u64, u64, &'a str);

/// The code symbols of one ELF file, and how its file offsets map to addresses.
#[derive(Debug, Default)]
pub struct ElfSymbols {
    /// Sorted by start. Large binaries (a compiler's shared library) have
    /// hundreds of thousands of names.
    symbols: Vec<Entry>,
    names: Names,
    /// PT_LOAD segments as (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
}

/// One symbol of [`ElfSymbols`]: its extent and where its name is.
#[derive(Debug, Clone, Copy)]
struct Entry {
    start: u64,
    /// 0 when unknown.
    size: u64,
    name: NameAt,
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
        let mini = minidebuginfo(file);
        let mini = mini
            .as_deref()
            .and_then(|mini| object::File::parse(mini).ok());
        if let Some(mini) = &mini {
            symbols.extend(code_symbols(mini));
        }
        let go = if file.section_by_name(".symtab").is_none() {
            gopclntab::functions(file)
        } else {
            None
        };
        if let Some(functions) = &go {
            symbols.extend(
                functions
                    .iter()
                    .map(|(start, size, name)| (*start, *size, &**name)),
            );
        }
        Self::build(symbols, segments)
    }

    /// The table of `symbols`, preferred names first: at one address the
    /// sized entry wins, then the first listed (stable sort).
    fn build(mut symbols: Vec<Symbol>, segments: Vec<(u64, u64, u64)>) -> Self {
        symbols.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        symbols.dedup_by_key(|(start, _, _)| *start);
        let mut names = Names::with_capacity(symbols.iter().map(|(_, _, name)| name.len()).sum());
        let mut entries = Vec::with_capacity(symbols.len());
        for (start, size, name) in symbols {
            let Some(name) = names.push(&[name]) else {
                break;
            };
            entries.push(Entry { start, size, name });
        }
        ElfSymbols {
            symbols: entries,
            names,
            segments,
        }
    }

    /// Adds symbols from another file of the same build (a debug file).
    pub fn merge(&mut self, other: ElfSymbols) {
        // Stable: at one address, the file's own names win.
        let segments = self.segments.clone();
        let merged = Self::build(self.iter().chain(other.iter()).collect(), segments);
        *self = merged;
    }

    fn iter(&self) -> impl Iterator<Item = Symbol<'_>> {
        self.symbols
            .iter()
            .map(|entry| (entry.start, entry.size, self.names.get(entry.name)))
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
    pub fn lookup_name(&self, address: u64) -> Option<&str> {
        let index = self.symbols.partition_point(|entry| entry.start <= address);
        let entry = self.symbols.get(index.checked_sub(1)?)?;
        // A sized symbol must contain the address; an unsized one (hand-written
        // assembly) covers up to the next symbol.
        if entry.size != 0 && address - entry.start >= entry.size {
            return None;
        }
        Some(self.names.get(entry.name))
    }

    /// The function at ELF address `address`.
    pub fn lookup(&self, address: u64) -> Option<Line> {
        let name = self.lookup_name(address)?;
        Some(Line::named(demangle(name), Arc::from(name)))
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
        self.symbols.len() * size_of::<Entry>() + self.names.bytes() + self.segments.len() * 24
    }
}

/// The file's code symbols, the preferred names of an address first (the
/// table sorts stably and keeps the first): the fewest leading underscores
/// (public names: `abort` over glibc's `__GI_abort`, `isalnum_l` over
/// `__isalnum_l`), then global, weak, local symbols.
fn code_symbols<'a>(file: &object::File<'a>) -> Vec<Symbol<'a>> {
    let mut symbols: Vec<((usize, u8), Symbol<'a>)> = file
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
                (symbol.address(), symbol.size(), name),
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
        let symbols = ElfSymbols::build(
            vec![(u64::MAX - 1, u64::MAX, "f")],
            vec![(u64::MAX - 4, u64::MAX, u64::MAX - 2)],
        );
        assert_eq!(symbols.offset_to_address(u64::MAX - 1), Some(0));
        assert_eq!(symbols.offset_to_address(1), None);
        assert_eq!(symbols.lookup_name(u64::MAX), Some("f"));
    }

    /// At one address the sized symbol wins, then the first listed; a
    /// debug file's names fill in without replacing the file's own.
    #[test]
    fn one_name_per_address_and_merged_tables_keep_the_first() {
        let mut symbols = ElfSymbols::build(
            vec![
                (0x100, 0, "unsized"),
                (0x100, 0x10, "sized"),
                (0x200, 0x10, "own"),
            ],
            Vec::new(),
        );
        assert_eq!(symbols.lookup_name(0x105), Some("sized"));
        assert_eq!(symbols.lookup_name(0x110), None);
        symbols.merge(ElfSymbols::build(
            vec![(0x200, 0x10, "debug"), (0x300, 0, "only_in_debug")],
            Vec::new(),
        ));
        assert_eq!(symbols.len(), 3);
        assert_eq!(symbols.lookup_name(0x208), Some("own"));
        // Unsized: up to the next symbol, here the end of the table.
        assert_eq!(symbols.lookup_name(0x3ff), Some("only_in_debug"));
        let line = symbols.lookup(0x300).unwrap();
        assert_eq!(&*line.system_name, "only_in_debug");
    }
}
