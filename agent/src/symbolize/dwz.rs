//! dwz supplementary files (`.gnu_debugaltlink`): DWARF that `dwz -m` moved
//! out of several debug files into one shared file, as Fedora, RHEL and
//! Debian ship their debug packages (`/usr/lib/debug/.dwz/…`).
//!
//! The link holds a path and the supplementary file's build id. The path is
//! tried as written (relative to the file holding the link), then by its
//! name in the `.dwz/` directory of each debug directory, then by build id
//! (`.build-id/xx/rest.debug`); only a file with the demanded build id is
//! used.
use object::Object;

use super::debuginfo::{Candidate, DebugDirs, DebugFile, same_build_id};
use crate::files::{Kind, Root};

/// Reads the supplementary file `file` links to; `file` was read from `at`.
/// `None` when it has no link or no candidate has the linked build id.
pub fn find(
    file: &object::File,
    at: &Candidate,
    root: Option<&Root>,
    dirs: &DebugDirs,
) -> Option<DebugFile> {
    let (name, build_id) = file.gnu_debugaltlink().ok().flatten()?;
    let name = std::str::from_utf8(name).ok()?;
    if build_id.is_empty() {
        return None;
    }
    candidates(name, build_id, at, dirs)
        .into_iter()
        .find_map(|candidate| {
            let data = candidate.read(root, Kind::DebugFile)?;
            if !same_build_id(&data, build_id) {
                return None;
            }
            Some(DebugFile {
                data,
                in_root: matches!(candidate, Candidate::InRoot(_)),
                location: candidate,
            })
        })
}

/// Where the supplementary file may be, in order.
fn candidates(name: &str, build_id: &[u8], at: &Candidate, dirs: &DebugDirs) -> Vec<Candidate> {
    let mut candidates = Vec::new();
    if !name.is_empty() {
        candidates.push(at.sibling(name));
        // An absolute name seen from the host too (a debug directory
        // passed with --debug-dir keeps the distribution's layout).
        if name.starts_with('/') && matches!(at, Candidate::InRoot(_)) {
            candidates.push(Candidate::Host(name.into()));
        }
        // The part from `.dwz/` on (Debian: `.dwz/x86_64-linux-gnu/pkg.debug`;
        // Fedora: `../../.dwz/pkg-1.0.x86_64`), then the bare file name,
        // under each debug directory's `.dwz/`.
        let tail = name
            .find(".dwz/")
            .map(|at| &name[at..])
            .filter(|tail| !tail.contains("/../"));
        let base = name.rsplit('/').next().filter(|base| !base.is_empty());
        for relative in tail
            .map(str::to_string)
            .into_iter()
            .chain(base.map(|base| format!(".dwz/{base}")))
        {
            candidates.extend(dirs.candidates_for_build_id(&relative));
        }
    }
    let hex = super::buildid::hex(build_id);
    if hex.len() > 2 {
        let relative = format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..]);
        candidates.extend(dirs.candidates_for_build_id(&relative));
    }
    // Keep the first of repeated places (the link and a `.dwz/` guess may
    // name the same file).
    let mut seen = std::collections::HashSet::new();
    candidates.retain(|candidate| seen.insert(candidate.clone()));
    candidates
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn candidates_follow_the_link_then_dwz_dirs_then_the_build_id() {
        let dirs = DebugDirs {
            extra: vec![PathBuf::from("/srv/debug")],
        };
        let at = Candidate::InRoot("/usr/lib/debug/.build-id/ab/cdef.debug".into());
        let found = candidates(
            "/usr/lib/debug/.dwz/x86_64-linux-gnu/libfoo1.debug",
            &[0x12, 0x34, 0x56],
            &at,
            &dirs,
        );
        let shown: Vec<String> = found.iter().map(|c| format!("{c:?}")).collect();
        assert_eq!(
            shown[..3],
            [
                "InRoot(\"/usr/lib/debug/.dwz/x86_64-linux-gnu/libfoo1.debug\")",
                "Host(\"/usr/lib/debug/.dwz/x86_64-linux-gnu/libfoo1.debug\")",
                "Host(\"/srv/debug/.dwz/x86_64-linux-gnu/libfoo1.debug\")",
            ]
        );
        let unique: std::collections::HashSet<_> = found.iter().collect();
        assert_eq!(
            unique.len(),
            found.len(),
            "a place listed twice: {shown:#?}"
        );
        assert!(shown.contains(&"Host(\"/srv/debug/.dwz/libfoo1.debug\")".to_string()));
        assert_eq!(
            shown.last().unwrap(),
            "Host(\"/usr/lib/debug/.build-id/12/3456.debug\")"
        );
        // A relative link is taken from the linking file's directory.
        let relative = candidates("../../.dwz/foo-1.0", &[1, 2, 3], &at, &dirs);
        assert_eq!(
            relative[0],
            Candidate::InRoot("/usr/lib/debug/.build-id/ab/../../.dwz/foo-1.0".into())
        );
        assert!(relative.contains(&Candidate::Host("/srv/debug/.dwz/foo-1.0".into())));
    }
}
