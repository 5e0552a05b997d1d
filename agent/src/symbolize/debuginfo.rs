//! Finding a stripped file's separate debug file: by GNU build-id
//! (`.build-id/xx/rest.debug`) or by `.gnu_debuglink` (name + CRC32), in the
//! process's own root (`/usr/lib/debug` of a container) and in the extra
//! debug directories the user passed (`--debug-dir`).
use std::path::PathBuf;

use object::Object;

use crate::files::{self, FileData, Kind, Root};

/// The system debug directory, as distributions install debug packages.
const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// Where to look for debug files.
#[derive(Clone, Debug, Default)]
pub struct DebugDirs {
    /// Host directories searched first, laid out like `/usr/lib/debug`
    /// (`.build-id/xx/rest.debug`, or debuglink names).
    pub extra: Vec<PathBuf>,
}

/// A debug file found for a binary.
pub struct DebugFile {
    pub data: FileData,
    /// Found inside the process's root (a container may have put it there),
    /// not in a host directory.
    pub in_root: bool,
    /// Where it was found: supplementary (dwz) files may be named relative
    /// to it.
    pub location: Candidate,
}

/// A place a debug file may be.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Candidate {
    /// Inside the process's root.
    InRoot(String),
    /// A host path.
    Host(PathBuf),
}

impl Candidate {
    /// `path` taken relative to this file's directory (an absolute `path`
    /// stays as it is), in the same root.
    pub fn sibling(&self, path: &str) -> Candidate {
        match self {
            Candidate::InRoot(_) if path.starts_with('/') => Candidate::InRoot(path.to_string()),
            Candidate::InRoot(at) => {
                let dir = at.rsplit_once('/').map_or("", |(dir, _)| dir);
                Candidate::InRoot(format!("{dir}/{path}"))
            }
            Candidate::Host(at) => Candidate::Host(
                at.parent()
                    .map_or_else(|| PathBuf::from(path), |dir| dir.join(path)),
            ),
        }
    }

    /// Opens and reads the file as a `kind` through the file layer.
    pub fn read(&self, root: Option<&Root>, kind: Kind) -> Option<FileData> {
        let file = match self {
            Candidate::InRoot(path) => root?.open(path, kind),
            Candidate::Host(path) => files::open_host(path.to_str()?, kind),
        };
        file.and_then(files::OpenFile::read).ok()
    }
}

impl DebugDirs {
    /// Finds and reads the debug file for `file` (mapped by a process whose
    /// root is `root`, at `path` as that process sees it). The debug file must
    /// match: same build-id, or the CRC32 the debuglink demands.
    pub fn find(&self, file: &object::File, path: &str, root: Option<&Root>) -> Option<DebugFile> {
        let build_id = file.build_id().ok().flatten().filter(|id| id.len() > 1);
        if let Some(id) = build_id {
            let hex = super::buildid::hex(id);
            let relative = format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..]);
            for candidate in self.candidates_for_build_id(&relative) {
                if let Some(data) = open(&candidate, root)
                    && same_build_id(&data.data, id)
                {
                    return Some(data);
                }
            }
        }
        let (name, crc) = file.gnu_debuglink().ok().flatten()?;
        let name = std::str::from_utf8(name).ok()?;
        if name.contains('/') {
            return None;
        }
        let dir = path.rsplit_once('/').map_or("", |(dir, _)| dir);
        self.candidates_for_debuglink(dir, name)
            .into_iter()
            .filter_map(|candidate| open(&candidate, root))
            .find(|found| crc32fast::hash(&found.data) == crc)
    }

    /// Places of `relative` under every debug directory: the extra host
    /// ones, then `/usr/lib/debug` in the process's root and on the host.
    pub fn candidates_for_build_id(&self, relative: &str) -> Vec<Candidate> {
        let mut candidates: Vec<Candidate> = self
            .extra
            .iter()
            .map(|dir| Candidate::Host(dir.join(relative)))
            .collect();
        candidates.push(Candidate::InRoot(format!("{SYSTEM_DEBUG_DIR}/{relative}")));
        candidates.push(Candidate::Host(
            PathBuf::from(SYSTEM_DEBUG_DIR).join(relative),
        ));
        candidates
    }

    /// gdb's search order: next to the binary, in `.debug/` beside it, then
    /// the binary's directory under the debug directories.
    fn candidates_for_debuglink(&self, dir: &str, name: &str) -> Vec<Candidate> {
        let mut candidates = vec![
            Candidate::InRoot(format!("{dir}/{name}")),
            Candidate::InRoot(format!("{dir}/.debug/{name}")),
            Candidate::InRoot(format!("{SYSTEM_DEBUG_DIR}{dir}/{name}")),
        ];
        for extra in &self.extra {
            candidates.push(Candidate::Host(extra.join(name)));
            candidates.push(Candidate::Host(
                extra.join(dir.trim_start_matches('/')).join(name),
            ));
        }
        candidates.push(Candidate::Host(
            PathBuf::from(format!("{SYSTEM_DEBUG_DIR}{dir}")).join(name),
        ));
        candidates
    }
}

fn open(candidate: &Candidate, root: Option<&Root>) -> Option<DebugFile> {
    let data = candidate.read(root, Kind::DebugFile)?;
    Some(DebugFile {
        data,
        in_root: matches!(candidate, Candidate::InRoot(_)),
        location: candidate.clone(),
    })
}

/// Whether the ELF file `data` has GNU build-id `id`.
pub fn same_build_id(data: &[u8], id: &[u8]) -> bool {
    object::File::parse(data)
        .ok()
        .and_then(|file| file.build_id().ok().flatten().map(|found| found == id))
        .unwrap_or(false)
}
