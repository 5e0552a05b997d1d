//! File identity: GNU build-id, Go build id and OpenTelemetry's htlhash.
//!
//! A backend matches a profile's mappings to symbols by these ids, and the
//! symbolizer's cache shares one parsed file between every process (and
//! container) that maps the same build.
use std::{fs::File, os::unix::fs::FileExt, sync::Arc};

use object::{Object, ObjectSection};
use sha2::{Digest, Sha256};

/// Bytes hashed at each end of a file for the htlhash.
const HTL_CHUNK: u64 = 4096;
/// ELF note type of a GNU build-id (`NT_GNU_BUILD_ID`).
const NT_GNU_BUILD_ID: u32 = 3;
/// ELF note type of a Go build id.
const NT_GO_BUILD_ID: u32 = 4;

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}

/// OpenTelemetry's `htlhash`: the first 16 bytes of SHA-256 over the first
/// 4096 bytes, the last 4096 bytes and the length (big-endian u64), as hex.
/// Cheap for any file size, and defined for files without any build id.
pub fn htlhash(file: &File, len: u64) -> std::io::Result<String> {
    let mut head = vec![0; HTL_CHUNK.min(len) as usize];
    file.read_exact_at(&mut head, 0)?;
    let tail_start = len.saturating_sub(HTL_CHUNK);
    let mut tail = vec![0; (len - tail_start) as usize];
    file.read_exact_at(&mut tail, tail_start)?;
    Ok(htlhash_parts(&head, &tail, len))
}

/// [`htlhash`] of a file held in memory.
pub fn htlhash_of_bytes(data: &[u8]) -> String {
    let chunk = HTL_CHUNK as usize;
    let head = &data[..chunk.min(data.len())];
    let tail = &data[data.len().saturating_sub(chunk)..];
    htlhash_parts(head, tail, data.len() as u64)
}

fn htlhash_parts(head: &[u8], tail: &[u8], len: u64) -> String {
    let mut hasher = Sha256::new();
    hasher.update(head);
    hasher.update(tail);
    hasher.update(len.to_be_bytes());
    hex(&hasher.finalize()[..16])
}

/// The GNU build-id (`.note.gnu.build-id`) of a parsed ELF file, as hex.
pub fn gnu_build_id(file: &object::File) -> Option<Arc<str>> {
    let id = file.build_id().ok()??;
    (!id.is_empty()).then(|| hex(id).into())
}

/// The Go build id (`.note.go.buildid`): Go's own text form
/// (`actionID/contentID`, as `go tool buildid` prints it), which is already
/// printable and is what OpenTelemetry's `build_id.go` expects.
pub fn go_build_id(file: &object::File) -> Option<Arc<str>> {
    let section = file.section_by_name(".note.go.buildid")?;
    let data = section.data().ok()?;
    notes(data)
        .find(|note| note.name == b"Go" && note.kind == NT_GO_BUILD_ID)
        .and_then(|note| std::str::from_utf8(note.desc).ok())
        .map(Arc::from)
}

/// The running kernel's GNU build-id, from `/sys/kernel/notes`.
pub fn kernel_build_id() -> Option<Arc<str>> {
    let data = std::fs::read("/sys/kernel/notes").ok()?;
    notes(&data)
        .find(|note| note.name == b"GNU" && note.kind == NT_GNU_BUILD_ID)
        .map(|note| hex(note.desc).into())
}

/// One ELF note (`Elf64_Nhdr` + name + descriptor).
#[derive(Debug, PartialEq, Eq)]
pub struct Note<'a> {
    /// Owner name without its NUL terminator.
    pub name: &'a [u8],
    pub kind: u32,
    pub desc: &'a [u8],
}

/// Iterates over the little-endian, 4-byte aligned notes in `data`; stops at
/// the first malformed one.
pub fn notes(data: &[u8]) -> impl Iterator<Item = Note<'_>> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let word = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(rest.get(at..at + 4)?.try_into().ok()?))
        };
        let name_size = word(0)? as usize;
        let desc_size = word(4)? as usize;
        let kind = word(8)?;
        let name_end = 12usize.checked_add(name_size)?;
        let desc_start = align4(name_end)?;
        let desc_end = desc_start.checked_add(desc_size)?;
        let name = rest.get(12..name_end)?;
        let desc = rest.get(desc_start..desc_end)?;
        rest = rest.get(align4(desc_end)?.min(rest.len())..)?;
        // Names are NUL-terminated, and Go pads its "Go" with a second NUL.
        let name_len = name.iter().rposition(|&b| b != 0).map_or(0, |at| at + 1);
        let name = &name[..name_len];
        Some(Note { name, kind, desc })
    })
}

fn align4(value: usize) -> Option<usize> {
    Some(value.checked_add(3)? & !3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend((name.len() as u32 + 1).to_le_bytes());
        out.extend((desc.len() as u32).to_le_bytes());
        out.extend(kind.to_le_bytes());
        out.extend(name);
        out.push(0);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out.extend(desc);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    #[test]
    fn parses_consecutive_notes() {
        let mut data = note(b"Xen", 1, b"abc");
        data.extend(note(b"GNU", NT_GNU_BUILD_ID, &[0xde, 0xad, 0xbe, 0xef]));
        let all: Vec<_> = notes(&data).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].name, b"GNU");
        assert_eq!(hex(all[1].desc), "deadbeef");
        // Truncated input ends the iteration instead of reading past it.
        assert_eq!(notes(&data[..data.len() - 2]).count(), 1);
    }

    #[test]
    fn htlhash_matches_its_definition() {
        let dir = std::env::temp_dir().join(format!("hostprof-htl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("blob");
        let content: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let file = File::open(&path).unwrap();
        let mut hasher = Sha256::new();
        hasher.update(&content[..4096]);
        hasher.update(&content[10_000 - 4096..]);
        hasher.update(10_000u64.to_be_bytes());
        let expected = hex(&hasher.finalize()[..16]);
        assert_eq!(htlhash(&file, 10_000).unwrap(), expected);
        assert_eq!(htlhash_of_bytes(&content), expected);
        // Shorter than a chunk: head and tail are the whole file.
        let small = File::open(std::env::current_exe().unwrap()).unwrap();
        let mut head = vec![0; 100];
        small.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(htlhash(&small, 100).unwrap(), htlhash_of_bytes(&head));
        assert_eq!(expected.len(), 32);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_our_own_gnu_build_id() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let file = object::File::parse(&*exe).unwrap();
        // Rust's linker setup on Linux emits a build-id; a missing one would
        // make this test (and backends) blind.
        let id = gnu_build_id(&file).expect("test binary has a build-id");
        assert!(id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
