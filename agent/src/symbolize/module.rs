//! One loaded executable or library: its identity, symbols and DWARF, merged
//! from the file itself and its separate debug file.
use std::{fs::File, path::PathBuf, sync::Arc};

use object::Object;

use super::{
    SymbolizeError, buildid, debuginfo::DebugDirs, demangle::demangle, dwarf::Dwarf,
    elf::ElfSymbols, map_file, rootfs::Root,
};
use crate::model::{BuildIds, Line};

/// Everything needed to name addresses of one file.
pub struct Module {
    symbols: ElfSymbols,
    dwarf: Option<Dwarf>,
    build_ids: BuildIds,
    is_go: bool,
}

impl Module {
    /// Loads `file` (`len` bytes long), which a process whose root is `root`
    /// maps at `path`; separate debug files are looked up in `dirs`. DWARF
    /// whose estimated size exceeds `dwarf_limit` bytes is left out.
    pub fn load(
        file: &File,
        len: u64,
        path: &str,
        root: Option<&Root>,
        dirs: &DebugDirs,
        dwarf_limit: usize,
    ) -> Result<Self, SymbolizeError> {
        let data = map_file(file).map_err(|source| SymbolizeError::Open {
            path: path.to_string(),
            source,
        })?;
        let htlhash = buildid::htlhash(file, len).ok().map(Arc::from);
        Self::from_data(&data, htlhash, path, root, dirs, dwarf_limit)
    }

    /// Parses an ELF image held in memory (`data`, the whole file), with
    /// separate debug files looked up in the host directories `debug_dirs`
    /// and `/usr/lib/debug`. For tools and fuzzing: malformed input gives an
    /// error or fewer names, never a panic.
    pub fn from_bytes(data: &[u8], debug_dirs: &[PathBuf]) -> Result<Self, SymbolizeError> {
        let dirs = DebugDirs {
            extra: debug_dirs.to_vec(),
        };
        let htlhash = Some(Arc::from(buildid::htlhash_of_bytes(data)));
        Self::from_data(data, htlhash, "", None, &dirs, usize::MAX)
    }

    fn from_data(
        data: &[u8],
        htlhash: Option<Arc<str>>,
        path: &str,
        root: Option<&Root>,
        dirs: &DebugDirs,
        dwarf_limit: usize,
    ) -> Result<Self, SymbolizeError> {
        let object = object::File::parse(data).map_err(SymbolizeError::Parse)?;
        let build_ids = BuildIds {
            gnu: buildid::gnu_build_id(&object),
            go: buildid::go_build_id(&object),
            htlhash,
        };
        let is_go = build_ids.go.is_some() || object.section_by_name(".gopclntab").is_some();
        let mut symbols = ElfSymbols::from_object(&object);
        let mut dwarf = load_dwarf(&object, path, dwarf_limit);
        if dwarf.is_none()
            && let Some(debug_data) = dirs.find(&object, path, root)
            && let Ok(debug) = object::File::parse(&*debug_data)
        {
            symbols.merge(ElfSymbols::from_object(&debug));
            dwarf = load_dwarf(&debug, path, dwarf_limit);
        }
        Ok(Module {
            symbols,
            dwarf,
            build_ids,
            is_go,
        })
    }

    /// The file's build ids.
    pub fn build_ids(&self) -> &BuildIds {
        &self.build_ids
    }

    /// True for a Go binary (frames are `FrameKind::Go`).
    pub fn is_go(&self) -> bool {
        self.is_go
    }

    /// True when DWARF (lines, inlined functions) is available.
    pub fn has_dwarf(&self) -> bool {
        self.dwarf.is_some()
    }

    /// Translates a file offset to the ELF address symbols use.
    pub fn offset_to_address(&self, file_offset: u64) -> Option<u64> {
        self.symbols.offset_to_address(file_offset)
    }

    /// Functions at file offset `file_offset`, innermost first.
    pub fn lookup_offset(&self, file_offset: u64) -> Vec<Line> {
        self.offset_to_address(file_offset)
            .map(|address| self.lookup_address(address))
            .unwrap_or_default()
    }

    /// Functions at ELF address `address`, innermost first: every inlined
    /// call from DWARF, else the symbol table's function.
    pub fn lookup_address(&self, address: u64) -> Vec<Line> {
        let mut lines = self
            .dwarf
            .as_ref()
            .map(|dwarf| dwarf.lookup(address))
            .unwrap_or_default();
        // DWARF without a subprogram for the address (assembly, or a unit
        // built without debug info for functions) still gives the line; the
        // symbol table gives the name.
        if let Some(outermost) = lines.pop() {
            lines.retain(|line| !line.system_name.is_empty());
            if outermost.system_name.is_empty() {
                if let Some(name) = self.symbols.lookup_name(address) {
                    lines.push(Line {
                        function: demangle(name),
                        system_name: name.clone(),
                        ..outermost
                    });
                }
            } else {
                lines.push(outermost);
            }
        }
        if lines.is_empty() {
            lines.extend(self.symbols.lookup(address));
        }
        lines
    }

    /// Rough memory held, for the cache's budget.
    pub fn estimated_size(&self) -> usize {
        self.symbols.estimated_size() + self.dwarf.as_ref().map_or(0, Dwarf::estimated_size) + 256
    }
}

fn load_dwarf(object: &object::File, path: &str, limit: usize) -> Option<Dwarf> {
    Dwarf::load(object, limit).unwrap_or_else(|err| {
        tracing::debug!("{path}: ignoring DWARF: {err}");
        None
    })
}
