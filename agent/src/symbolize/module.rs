//! One loaded executable or library: its identity, symbols and DWARF, merged
//! from the file itself and its separate debug file.
use std::{path::PathBuf, sync::Arc};

use object::Object;

use super::{
    SymbolizeError, buildid,
    debuginfo::{Candidate, DebugDirs},
    demangle::demangle,
    dwarf::{Companions, Dwarf},
    dwz,
    elf::ElfSymbols,
    gopclntab,
};
use crate::{
    files::{self, Root},
    model::{BuildIds, Line},
};

/// Everything needed to name addresses of one file.
pub struct Module {
    symbols: ElfSymbols,
    dwarf: Option<Dwarf>,
    /// Go's own line tables, for Go binaries without DWARF.
    go_lines: Option<gopclntab::Lines>,
    build_ids: BuildIds,
    is_go: bool,
    debug_file: Option<DebugFileId>,
}

/// The separate debug file a module's names came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugFileId {
    /// [`files::content_id`] of the debug file.
    pub content: Arc<str>,
    /// Found inside the process's root, so other processes (other roots)
    /// may find another file there.
    pub in_root: bool,
}

impl Module {
    /// Loads `data` (a whole file), which a process whose root is `root` maps
    /// at `path`; separate debug files are looked up in `dirs`. DWARF whose
    /// estimated size exceeds `dwarf_limit` bytes is left out.
    pub fn load(
        data: &[u8],
        path: &str,
        root: Option<&Root>,
        dirs: &DebugDirs,
        dwarf_limit: usize,
    ) -> Result<Self, SymbolizeError> {
        let htlhash = Some(Arc::from(buildid::htlhash_of_bytes(data)));
        Self::from_data(data, htlhash, path, root, dirs, dwarf_limit)
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
        // Where the binary is, as its process sees it (host paths for
        // tools); unknown for bytes without a file.
        let binary = (!path.is_empty()).then(|| Candidate::InRoot(path.to_string()));
        let own = binary
            .clone()
            .unwrap_or_else(|| Candidate::InRoot(String::new()));
        let mut extra = Extra::default();
        let mut dwarf = load_dwarf(
            &object,
            &own,
            binary.as_ref(),
            root,
            dirs,
            path,
            dwarf_limit,
            &mut extra,
        );
        if dwarf.is_none()
            && let Some(found) = dirs.find(&object, path, root)
            && let Ok(debug) = object::File::parse(&*found.data)
        {
            symbols.merge(ElfSymbols::from_object(&debug));
            extra.add(&found.data, found.in_root);
            dwarf = load_dwarf(
                &debug,
                &found.location,
                binary.as_ref(),
                root,
                dirs,
                path,
                dwarf_limit,
                &mut extra,
            );
        }
        let go_lines = if dwarf.is_none() && is_go {
            gopclntab::Lines::of(&object)
        } else {
            None
        };
        Ok(Module {
            symbols,
            dwarf,
            go_lines,
            build_ids,
            is_go,
            debug_file: extra.id(),
        })
    }

    /// The separate debug file merged in, if any.
    pub fn debug_file(&self) -> Option<&DebugFileId> {
        self.debug_file.as_ref()
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
    ///
    /// The outermost (not inlined) function takes the name of the symbol
    /// holding the address, as llvm-symbolizer does: DWARF without linkage
    /// names (Rust's `line-tables-only`, clang's `-gmlt`) says `hot_path`
    /// where the symbol says `rswork::hot_path`, glibc's says `__GI_abort`
    /// where the symbol says `abort`, and GCC's clones keep their suffix
    /// (`f.isra.0`, `f.cold`) as perf shows them. Where no line row covers
    /// the address, a local symbol's source file (`STT_FILE`) stands in, as
    /// in llvm-symbolizer. Inlined functions have no symbol and keep DWARF's
    /// names.
    pub fn lookup_address(&self, address: u64) -> Vec<Line> {
        let mut lines = self
            .dwarf
            .as_ref()
            .map(|dwarf| dwarf.lookup(address))
            .unwrap_or_default();
        if let Some(outermost) = lines.pop() {
            // A location without a function (assembly, or a unit built
            // without debug info for functions) still gives the line.
            lines.retain(|line| !line.system_name.is_empty());
            match self.symbols.lookup_symbol(address) {
                Some(symbol) => lines.push(Line {
                    function: demangle(symbol.name),
                    system_name: Arc::from(symbol.name),
                    file: outermost.file.or_else(|| symbol.file.map(Arc::from)),
                    ..outermost
                }),
                None if !outermost.system_name.is_empty() => lines.push(outermost),
                None => {}
            }
        }
        if lines.is_empty() {
            lines.extend(self.symbols.lookup(address).map(|line| {
                match self.go_lines.as_ref().and_then(|go| go.lookup(address)) {
                    Some(go) => Line {
                        file: Some(go.file),
                        line: go.line,
                        start_line: go.start_line,
                        ..line
                    },
                    None => line,
                }
            }));
        }
        lines
    }

    /// Rough memory held, for the cache's budget.
    pub fn estimated_size(&self) -> usize {
        self.symbols.estimated_size()
            + self.dwarf.as_ref().map_or(0, Dwarf::estimated_size)
            + self
                .go_lines
                .as_ref()
                .map_or(0, gopclntab::Lines::estimated_size)
            + 256
    }
}

/// Files read besides the binary (debug, supplementary, split DWARF
/// files): what the module's identity must include.
#[derive(Default)]
struct Extra {
    contents: Vec<Arc<str>>,
    in_root: bool,
}

impl Extra {
    fn add(&mut self, data: &[u8], in_root: bool) {
        self.contents.push(files::content_id(data));
        self.in_root |= in_root;
    }

    fn id(self) -> Option<DebugFileId> {
        let content = match &self.contents[..] {
            [] => return None,
            [one] => one.clone(),
            many => files::content_id(many.join("+").as_bytes()),
        };
        Some(DebugFileId {
            content,
            in_root: self.in_root,
        })
    }
}

/// The DWARF of `object`, read from `at`, with its dwz supplementary file
/// and split units; the files read are added to `extra`.
#[allow(clippy::too_many_arguments)]
fn load_dwarf(
    object: &object::File,
    at: &Candidate,
    binary: Option<&Candidate>,
    root: Option<&Root>,
    dirs: &DebugDirs,
    path: &str,
    limit: usize,
    extra: &mut Extra,
) -> Option<Dwarf> {
    object.section_by_name(".debug_info")?;
    let sup_file = dwz::find(object, at, root, dirs);
    let sup = sup_file
        .as_ref()
        .and_then(|found| object::File::parse(&*found.data).ok());
    if let Some(found) = &sup_file {
        extra.add(&found.data, found.in_root);
    } else if object.gnu_debugaltlink().ok().flatten().is_some() {
        tracing::debug!("{path}: dwz supplementary file not found: some names will be missing");
    }
    let companions = Companions {
        sup: sup.as_ref(),
        binary: binary.map(|binary| (binary, root)),
    };
    match Dwarf::load_with(object, &companions, limit) {
        Ok(Some(dwarf)) => {
            for content in dwarf.split_contents() {
                extra.contents.push(content.clone());
                extra.in_root = true;
            }
            Some(dwarf)
        }
        Ok(None) => None,
        Err(err) => {
            tracing::debug!("{path}: ignoring DWARF: {err}");
            None
        }
    }
}
