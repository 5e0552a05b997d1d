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
/// name and, for a local symbol, the source file its `STT_FILE` symbol
/// names (all borrowed from the file).
type Symbol<'a> = (u64, u64, &'a str, Option<&'a str>);

/// The symbol found at an address: its raw name and, for a local symbol,
/// the source file the symbol table puts it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found<'a> {
    pub name: &'a str,
    pub file: Option<&'a str>,
}

/// The code symbols of one ELF file, and how its file offsets map to addresses.
///
/// Nine bytes a symbol, in three columns: every process of a node's
/// distinct binaries keeps one per function (with 40 binaries of 20,000
/// functions, a third of a host-wide record's memory at 24 bytes a
/// symbol, a fifth at 12).
#[derive(Debug, Default)]
pub struct ElfSymbols {
    /// Each symbol's start, from [`ElfSymbols::base`], sorted. Large
    /// binaries (a compiler's shared library) have hundreds of thousands.
    starts: Vec<u32>,
    /// Each symbol's name.
    name_at: Vec<NameAt>,
    /// How far each symbol reaches, in a byte ([`Extent`]): compiled
    /// functions end at most a few bytes of padding before the next one
    /// starts.
    extents: Vec<u8>,
    /// (index, size) of the symbols whose extent is [`Extent::WIDE`], by index.
    wide: Vec<(u32, u32)>,
    /// The lowest symbol's address, which starts count from.
    base: u64,
    /// (index in `starts`, file name) of the local symbols that have a
    /// source file, by index: few symbols have one, so it is not a column.
    files: Vec<(u32, NameAt)>,
    names: Names,
    /// PT_LOAD segments as (file offset, file size, virtual address).
    segments: Vec<(u64, u64, u64)>,
}

/// The values of [`ElfSymbols::extents`]: up to [`Extent::MAX_GAP`], the
/// bytes between the symbol's end and the next symbol's start.
struct Extent;

impl Extent {
    const MAX_GAP: u8 = 0xfd;
    /// No size (hand-written assembly): up to the next symbol.
    const UNSIZED: u8 = 0xfe;
    /// Its size is in [`ElfSymbols::wide`] (the last symbol, one that
    /// overlaps the next, one followed by a wide gap).
    const WIDE: u8 = 0xff;

    /// The extent of a symbol at `start` of `size` bytes followed by one
    /// at `next`.
    fn of(start: u32, size: u32, next: Option<u32>) -> u8 {
        if size == 0 {
            return Self::UNSIZED;
        }
        let end = u64::from(start) + u64::from(size);
        match next {
            Some(next)
                if end <= u64::from(next) && u64::from(next) - end <= u64::from(Self::MAX_GAP) =>
            {
                (u64::from(next) - end) as u8
            }
            _ => Self::WIDE,
        }
    }
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
                    .map(|(start, size, name)| (*start, *size, &**name, None)),
            );
        }
        Self::build(symbols, segments)
    }

    /// The table of `symbols`, preferred names first: at one address the
    /// largest entry wins, then the first listed (stable sort).
    fn build(mut symbols: Vec<Symbol>, segments: Vec<(u64, u64, u64)>) -> Self {
        symbols.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        symbols.dedup_by_key(|(start, ..)| *start);
        let base = symbols.first().map_or(0, |(start, ..)| *start);
        // Room for every name and each run's file name, exactly: a growth
        // doubles the text, and with 40 binaries of 20,000 functions the
        // unused half of each doubled buffer showed in a record's peak.
        let (mut bytes, mut count) = (0, 0);
        let mut last: Option<&str> = None;
        for (_, _, name, file) in &symbols {
            bytes += name.len();
            count += 1;
            if let Some(file) = file
                && last != Some(*file)
            {
                bytes += file.len();
                count += 1;
                last = Some(*file);
            }
        }
        let mut names = Names::with_capacity(bytes, count);
        let mut starts = Vec::with_capacity(symbols.len());
        let mut name_at = Vec::with_capacity(symbols.len());
        // Until the extents are known (they need the next start).
        let mut sizes: Vec<u32> = Vec::with_capacity(symbols.len());
        let mut files: Vec<(u32, NameAt)> = Vec::new();
        // The last file pushed: a file's local symbols sit together, so one
        // copy of its name serves them all.
        let mut last_file: Option<(&str, NameAt)> = None;
        for (start, size, name, file) in symbols {
            // Sorted: past 4 GiB from the first, the rest are too (a
            // hostile file's; no binary's code is that large).
            let Ok(start) = u32::try_from(start - base) else {
                break;
            };
            let (Some(name), Ok(index)) = (names.push(&[name]), u32::try_from(starts.len())) else {
                break;
            };
            starts.push(start);
            name_at.push(name);
            sizes.push(u32::try_from(size).unwrap_or(u32::MAX));
            let Some(file) = file else { continue };
            let at = match last_file {
                Some((last, at)) if last == file => at,
                _ => {
                    let Some(at) = names.push(&[file]) else {
                        continue;
                    };
                    last_file = Some((file, at));
                    at
                }
            };
            files.push((index, at));
        }
        starts.shrink_to_fit();
        name_at.shrink_to_fit();
        let mut wide = Vec::new();
        let extents = sizes
            .iter()
            .enumerate()
            .map(|(index, &size)| {
                let extent = Extent::of(starts[index], size, starts.get(index + 1).copied());
                if extent == Extent::WIDE {
                    wide.push((index as u32, size));
                }
                extent
            })
            .collect();
        ElfSymbols {
            starts,
            name_at,
            extents,
            wide,
            base,
            files,
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
        (0..self.starts.len()).map(|index| {
            let found = self.found(index);
            (
                self.base + u64::from(self.starts[index]),
                u64::from(self.size(index)),
                found.name,
                found.file,
            )
        })
    }

    /// Symbol `index`'s size (0: unsized).
    fn size(&self, index: usize) -> u32 {
        match self.extents[index] {
            Extent::UNSIZED => 0,
            Extent::WIDE => self
                .wide
                .binary_search_by_key(&index, |&(at, _)| at as usize)
                .map_or(0, |found| self.wide[found].1),
            // A gap is coded only where a next symbol is.
            gap => self.starts[index + 1] - u32::from(gap) - self.starts[index],
        }
    }

    /// Symbol `index`'s name and file.
    fn found(&self, index: usize) -> Found<'_> {
        let file = self
            .files
            .binary_search_by_key(&index, |(at, _)| *at as usize)
            .ok()
            .map(|found| self.names.get(self.files[found].1));
        Found {
            name: self.names.get(self.name_at[index]),
            file,
        }
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

    /// The function symbol at ELF address `address`.
    pub fn lookup_symbol(&self, address: u64) -> Option<Found<'_>> {
        let offset = address.checked_sub(self.base)?;
        let clamped = u32::try_from(offset).unwrap_or(u32::MAX);
        let index = self
            .starts
            .partition_point(|&start| start <= clamped)
            .checked_sub(1)?;
        // A sized symbol must contain the address; an unsized one (hand-written
        // assembly) covers up to the next symbol.
        let size = self.size(index);
        if size != 0 && offset - u64::from(self.starts[index]) >= u64::from(size) {
            return None;
        }
        Some(self.found(index))
    }

    /// The raw name of the function at ELF address `address`.
    pub fn lookup_name(&self, address: u64) -> Option<&str> {
        self.lookup_symbol(address).map(|found| found.name)
    }

    /// The function at ELF address `address` (with the symbol table's
    /// source file for a local symbol, as llvm-symbolizer gives it).
    pub fn lookup(&self, address: u64) -> Option<Line> {
        let found = self.lookup_symbol(address)?;
        Some(Line {
            file: found.file.map(Arc::from),
            ..Line::named(demangle(found.name), Arc::from(found.name))
        })
    }

    /// Number of code symbols (0 for a fully stripped file).
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// True for a file without code symbols (fully stripped).
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Rough heap size, for the cache's memory budget.
    pub fn estimated_size(&self) -> usize {
        self.starts.len() * (size_of::<u32>() + size_of::<NameAt>() + 1)
            + self.wide.len() * size_of::<(u32, u32)>()
            + self.files.len() * size_of::<(u32, NameAt)>()
            + self.names.bytes()
            + self.segments.len() * 24
    }
}

/// The file's code symbols as llvm-symbolizer reads them: `.symtab`, or
/// `.dynsym` where it has none (a `.symtab` left with only file and
/// section symbols counts as none). At an address with several names
/// (`uselocale` and `__uselocale`, a C++ constructor's `C1` and `C2`, code
/// folded into one copy) llvm-symbolizer keeps the largest, then the last
/// the table lists: so the table is returned backwards, and [`ElfSymbols`]
/// keeps the first. A local symbol's source file is the `STT_FILE` symbol
/// before it (ELF lists each file's locals after it).
fn code_symbols<'a>(file: &object::File<'a>) -> Vec<Symbol<'a>> {
    let mut symbols = table_code_symbols(file.symbols());
    if symbols.is_empty() {
        symbols = table_code_symbols(file.dynamic_symbols());
    }
    symbols.reverse();
    symbols
}

/// The code symbols of one symbol table, in table order.
fn table_code_symbols<'a: 'file, 'file>(
    table: impl Iterator<Item = object::Symbol<'a, 'file>>,
) -> Vec<Symbol<'a>> {
    let mut source: Option<&'a str> = None;
    let mut symbols: Vec<Symbol<'a>> = Vec::new();
    for symbol in table {
        if symbol.kind() == SymbolKind::File {
            source = symbol.name().ok().filter(|name| !name.is_empty());
            continue;
        }
        if symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
            continue;
        }
        let Some(name) = symbol.name().ok().filter(|name| !name.is_empty()) else {
            continue;
        };
        let file = symbol.is_local().then_some(source).flatten();
        symbols.push((symbol.address(), symbol.size(), name, file));
    }
    symbols
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
            vec![(u64::MAX - 1, u64::MAX, "f", None)],
            vec![(u64::MAX - 4, u64::MAX, u64::MAX - 2)],
        );
        assert_eq!(symbols.offset_to_address(u64::MAX - 1), Some(0));
        assert_eq!(symbols.offset_to_address(1), None);
        assert_eq!(symbols.lookup_name(u64::MAX), Some("f"));
    }

    /// Each kind of extent ends its symbol where its size says: padding
    /// before the next symbol, a gap too wide for a byte, an overlap, none
    /// (up to the next symbol), and the last symbol's.
    #[test]
    fn extents_end_symbols_where_their_sizes_say() {
        let table = vec![
            (0x1000, 0x10, "padded", None),
            (0x1020, 0x20, "flush", None),
            (0x1040, 0x10, "far", None),
            (0x2000, 0x100, "overlapping", None),
            (0x2080, 0, "unsized", None),
            (0x3000, 0x8, "last", None),
        ];
        let symbols = ElfSymbols::build(table.clone(), Vec::new());
        for (address, name) in [
            (0x100f, Some("padded")),
            (0x1010, None),
            (0x103f, Some("flush")),
            (0x104f, Some("far")),
            (0x1050, None),
            (0x207f, Some("overlapping")),
            (0x2fff, Some("unsized")),
            (0x3007, Some("last")),
            (0x3008, None),
        ] {
            assert_eq!(symbols.lookup_name(address), name, "{address:#x}");
        }
        assert_eq!(symbols.extents[0], 0x10);
        assert_eq!(symbols.extents[1], 0);
        assert_eq!(symbols.wide.len(), 3);
        // Sizes come back whole (a merge rebuilds from them).
        let back: Vec<_> = symbols.iter().collect();
        assert_eq!(back, table);
    }

    /// At one address the sized symbol wins, then the first listed; a
    /// debug file's names fill in without replacing the file's own, and
    /// files stay with their symbols through the merge.
    #[test]
    fn one_name_per_address_and_merged_tables_keep_the_first() {
        let mut symbols = ElfSymbols::build(
            vec![
                (0x100, 0, "unsized", None),
                (0x100, 0x10, "sized", Some("a.c")),
                (0x200, 0x10, "own", None),
            ],
            Vec::new(),
        );
        assert_eq!(symbols.lookup_name(0x105), Some("sized"));
        assert_eq!(symbols.lookup_name(0x110), None);
        symbols.merge(ElfSymbols::build(
            vec![
                (0x200, 0x10, "debug", Some("b.c")),
                (0x300, 0, "only_in_debug", Some("b.c")),
            ],
            Vec::new(),
        ));
        assert_eq!(symbols.len(), 3);
        assert_eq!(
            symbols.lookup_symbol(0x208),
            Some(Found {
                name: "own",
                file: None
            })
        );
        assert_eq!(symbols.lookup_symbol(0x100).unwrap().file, Some("a.c"));
        // Names and their files' names fill the text exactly: no growth.
        assert_eq!(symbols.names.capacity(), symbols.names.bytes());
        // Unsized: up to the next symbol, here the end of the table.
        assert_eq!(symbols.lookup_name(0x3ff), Some("only_in_debug"));
        let line = symbols.lookup(0x300).unwrap();
        assert_eq!(&*line.system_name, "only_in_debug");
        assert_eq!(line.file.as_deref(), Some("b.c"));
    }
}
