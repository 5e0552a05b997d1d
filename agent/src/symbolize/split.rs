//! Split DWARF: the bulk of a unit's DWARF in a `.dwo` file beside the
//! objects (`-gsplit-dwarf`), or all of them packed in `<binary>.dwp`
//! (`dwp`, `llvm-dwp`); the binary keeps skeleton units naming them.
//!
//! Everything is read when the module is loaded, through the file layer:
//! a lookup never opens a file, and no handle on a process's root is kept.
//! A `.dwo` is found as `DW_AT_comp_dir/DW_AT_dwo_name`, then relative to
//! the binary's directory (by that name, then by its file name), and used
//! only if it holds the unit the skeleton names (same DWO id).
use std::{collections::HashMap, sync::Arc};

use gimli::{DwoId, Reader as _, SectionId};

use super::{
    debuginfo::Candidate,
    dwarf::{Keep, Reader, load_sections},
};
use crate::files::{self, Kind, Root};

/// The split units of one binary, ready to hand to addr2line.
#[derive(Default)]
pub struct Split {
    /// Sections of each `.dwo` file, by the DWO id of its unit.
    dwos: HashMap<DwoId, HashMap<SectionId, Reader>>,
    package: Option<gimli::DwarfPackage<Reader>>,
    endian: gimli::RunTimeEndian,
    /// Bytes of the sections held.
    pub bytes: usize,
    /// [`files::content_id`] of each file read.
    pub contents: Vec<Arc<str>>,
}

impl Split {
    /// Reads the split DWARF of the binary at `binary`, whose skeleton units
    /// are in `dwarf`: its `.dwp` if there is one, else each unit's `.dwo`,
    /// stopping before more than `limit` bytes are held.
    pub fn load(
        dwarf: &gimli::Dwarf<Reader>,
        endian: gimli::RunTimeEndian,
        binary: &Candidate,
        root: Option<&Root>,
        limit: usize,
    ) -> Split {
        let mut split = Split {
            endian,
            ..Split::default()
        };
        let skeletons = skeletons(dwarf);
        if skeletons.is_empty() {
            return split;
        }
        let dwp = match binary {
            Candidate::InRoot(path) => Candidate::InRoot(format!("{path}.dwp")),
            Candidate::Host(path) => Candidate::Host(format!("{}.dwp", path.display()).into()),
        };
        if let Some(data) = dwp.read(root, Kind::DebugFile)
            && let Ok(file) = object::File::parse(&*data)
        {
            let mut bytes = 0;
            let empty = Reader::new(Arc::from(&[][..]), split.endian);
            match gimli::DwarfPackage::load(
                // Every section: the package's index slices each of them
                // per unit, an empty one included.
                |id| load_sections(&file, id.dwo_name(), Keep::All, &mut bytes, limit),
                empty,
            ) {
                Ok(package) => {
                    split.package = Some(package);
                    split.contents.push(files::content_id(&data));
                    split.bytes = bytes;
                    return split;
                }
                Err(err) => tracing::debug!("{dwp:?}: ignoring DWARF package: {err}"),
            }
        }
        for skeleton in skeletons {
            let remaining = limit.saturating_sub(split.bytes);
            if let Some((sections, bytes, content)) = read_dwo(&skeleton, binary, root, remaining) {
                split.bytes += bytes;
                split.contents.push(content);
                split.dwos.insert(skeleton.id, sections);
            }
        }
        split
    }

    /// The split unit addr2line asks for, if it was found.
    pub fn resolve(
        &self,
        load: &addr2line::SplitDwarfLoad<Reader>,
    ) -> Option<Arc<gimli::Dwarf<Reader>>> {
        if let Some(package) = &self.package {
            return package
                .find_cu(load.dwo_id, &load.parent)
                .ok()
                .flatten()
                .map(Arc::new);
        }
        let sections = self.dwos.get(&load.dwo_id)?;
        let mut dwarf = gimli::Dwarf::load(|id| -> Result<Reader, ()> {
            Ok(sections
                .get(&id)
                .cloned()
                .unwrap_or_else(|| Reader::new(Arc::from(&[][..]), self.endian)))
        })
        .ok()?;
        dwarf.make_dwo(&load.parent);
        Some(Arc::new(dwarf))
    }
}

/// A skeleton unit: the DWO id of its split unit and where that was built.
struct Skeleton {
    id: DwoId,
    comp_dir: Option<String>,
    name: String,
}

fn skeletons(dwarf: &gimli::Dwarf<Reader>) -> Vec<Skeleton> {
    let mut found = Vec::new();
    let mut headers = dwarf.units();
    while let Ok(Some(header)) = headers.next() {
        // DWARF 5 says so in the header; only a DWARF 4 unit (GNU's split
        // extension, DW_AT_GNU_dwo_id) must be parsed to know. Parsing every
        // unit of a big binary would cost tens of milliseconds for nothing.
        let maybe_skeleton = match header.type_() {
            gimli::UnitType::Skeleton(_) => true,
            gimli::UnitType::Compilation => header.version() < 5,
            _ => false,
        };
        if !maybe_skeleton {
            continue;
        }
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let Some(id) = unit.dwo_id else {
            continue;
        };
        let name = unit
            .dwo_name()
            .ok()
            .flatten()
            .and_then(|value| dwarf.attr_string(&unit, value).ok())
            .map(|name| name.to_string_lossy().map(|name| name.into_owned()));
        let Some(Ok(name)) = name else {
            continue;
        };
        let comp_dir = unit
            .comp_dir
            .as_ref()
            .and_then(|dir| dir.to_string_lossy().ok().map(|dir| dir.into_owned()));
        found.push(Skeleton { id, comp_dir, name });
    }
    found
}

/// Reads the `.dwo` of `skeleton`: its sections and their size.
fn read_dwo(
    skeleton: &Skeleton,
    binary: &Candidate,
    root: Option<&Root>,
    limit: usize,
) -> Option<(HashMap<SectionId, Reader>, usize, Arc<str>)> {
    let mut places = Vec::new();
    if let Some(dir) = &skeleton.comp_dir {
        places.push(binary.sibling(&format!("{dir}/{}", skeleton.name)));
    }
    places.push(binary.sibling(&skeleton.name));
    if let Some(base) = skeleton.name.rsplit('/').next() {
        places.push(binary.sibling(base));
    }
    for place in places {
        let Some(data) = place.read(root, Kind::DebugFile) else {
            continue;
        };
        let Ok(file) = object::File::parse(&*data) else {
            continue;
        };
        let mut bytes = 0;
        let mut sections = HashMap::new();
        let loaded = gimli::Dwarf::load(|id| {
            let section = load_sections(&file, id.dwo_name(), Keep::Needed, &mut bytes, limit)?;
            sections.insert(id, section.clone());
            Ok::<_, super::SymbolizeError>(section)
        });
        let Ok(dwarf) = loaded else {
            continue;
        };
        // The file must hold the very unit the skeleton names: a stale
        // `.dwo` from another build has another id.
        let mut headers = dwarf.units();
        let matches = headers
            .next()
            .ok()
            .flatten()
            .and_then(|header| dwarf.unit(header).ok())
            .is_some_and(|unit| unit.dwo_id == Some(skeleton.id));
        if matches {
            return Some((sections, bytes, files::content_id(&data)));
        }
        tracing::debug!("{place:?}: not the .dwo of unit {:#x}", skeleton.id.0);
    }
    None
}
