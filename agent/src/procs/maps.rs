//! Executable mappings of a process, from `/proc/PID/maps`.
//!
//! The format is parsed here rather than by `procfs`, whose parser panics
//! on some paths a process can choose (a file named `/SYSV…` shorter than
//! 13 bytes) and on smaps-style lines, and which fails the whole file when a
//! path is not UTF-8.
use std::sync::Arc;

use crate::model::{BuildIds, Mapping};

/// Why a maps file could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    #[error("line {line} of a maps file is malformed: {text:?}")]
    Malformed { line: usize, text: String },
}

/// A process's executable mappings, sorted by start address.
#[derive(Clone, Debug, Default)]
pub struct ExecutableMaps {
    mappings: Vec<Arc<Mapping>>,
}

impl ExecutableMaps {
    /// The mapping holding `address`, and the address's offset in the file.
    pub fn find(&self, address: u64) -> Option<(Arc<Mapping>, u64)> {
        let index = self
            .mappings
            .partition_point(|mapping| mapping.start <= address);
        let mapping = self.mappings.get(index.checked_sub(1)?)?;
        (address < mapping.end).then(|| {
            (
                mapping.clone(),
                // Wrapping: a malformed offset must not panic; the kernel's
                // own lines never wrap.
                (address - mapping.start).wrapping_add(mapping.file_offset),
            )
        })
    }

    /// Every executable mapping, by start address.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Mapping>> {
        self.mappings.iter()
    }

    /// Every executable mapping, by start address.
    pub fn as_slice(&self) -> &[Arc<Mapping>] {
        &self.mappings
    }

    pub fn len(&self) -> usize {
        self.mappings.len()
    }

    /// Whether these mappings hold a file's code that `earlier` did not
    /// (a library loaded since), at the same place.
    pub fn maps_files_beyond(&self, earlier: &ExecutableMaps) -> bool {
        self.mappings
            .iter()
            .filter(|mapping| mapping.inode != 0)
            .any(|mapping| {
                !earlier.find(mapping.start).is_some_and(|(known, _)| {
                    (known.start, known.dev, known.inode)
                        == (mapping.start, mapping.dev, mapping.inode)
                })
            })
    }

    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty()
    }
}

/// Parses the content of a `/proc/PID/maps` file, keeping the executable
/// mappings; any malformed line makes it an error.
pub fn parse_maps(text: &[u8]) -> Result<ExecutableMaps, MapsError> {
    let mut mappings = Vec::new();
    for (index, line) in text.split(|&byte| byte == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let parsed = parse_line(line).ok_or_else(|| MapsError::Malformed {
            line: index + 1,
            text: String::from_utf8_lossy(line).into_owned(),
        })?;
        if let Some(mapping) = parsed {
            mappings.push(Arc::new(mapping));
        }
    }
    mappings.sort_unstable_by_key(|mapping| mapping.start);
    Ok(ExecutableMaps { mappings })
}

/// One line, `start-end perms offset major:minor inode [path]` (hex but
/// the inode); `None` when malformed, `Some(None)` when not executable.
fn parse_line(line: &[u8]) -> Option<Option<Mapping>> {
    let mut rest = line;
    let range = next_field(&mut rest)?;
    let perms = next_field(&mut rest)?;
    let offset = hex(next_field(&mut rest)?)?;
    let dev = next_field(&mut rest)?;
    let inode = std::str::from_utf8(next_field(&mut rest)?)
        .ok()?
        .parse::<u64>()
        .ok()?;
    let split = range.iter().position(|&byte| byte == b'-')?;
    let (start, end) = (hex(&range[..split])?, hex(&range[split + 1..])?);
    let split = dev.iter().position(|&byte| byte == b':')?;
    let major = u32::try_from(hex(&dev[..split])?).ok()?;
    let minor = u32::try_from(hex(&dev[split + 1..])?).ok()?;
    if perms.len() != 4 {
        return None;
    }
    if perms[2] != b'x' {
        return Some(None);
    }
    // The path is the rest of the line after the padding; it may hold spaces.
    let path = String::from_utf8_lossy(rest.trim_ascii_start());
    Some(Some(Mapping {
        start,
        end,
        file_offset: offset,
        path: mapping_path(&path).into(),
        dev: libc::makedev(major, minor),
        inode,
        build_ids: BuildIds::default(),
    }))
}

/// What a mapping is called: the file's path (without " (deleted)"),
/// `[vdso]`/`[vsyscall]`, the name of a named anonymous mapping (`[anon:x]`
/// gives `anon:x`), or empty for anonymous memory, heap and stacks.
fn mapping_path(path: &str) -> &str {
    match path {
        "[vdso]" | "[vsyscall]" => path,
        "" | "[heap]" | "[stack]" | "[vvar]" | "[vvar_vclock]" => "",
        _ if path.starts_with("[stack:") => "",
        _ => match path
            .strip_prefix('[')
            .and_then(|inner| inner.strip_suffix(']'))
        {
            Some(name) => name,
            None => super::strip_deleted(path),
        },
    }
}

/// The next space-separated field of `rest`, advancing past it.
fn next_field<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let trimmed = rest.trim_ascii_start();
    let end = trimmed
        .iter()
        .position(|&byte| byte == b' ')
        .unwrap_or(trimmed.len());
    let (field, tail) = trimmed.split_at(end);
    *rest = tail;
    (!field.is_empty()).then_some(field)
}

fn hex(field: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(field).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0a0000000-55d0a0001000 r--p 00000000 fd:01 100 /usr/bin/app
55d0a0001000-55d0a0005000 r-xp 00001000 fd:01 100 /usr/bin/app
7f0000000000-7f0000020000 r-xp 00028000 fd:01 200 /usr/lib/libc.so.6 (deleted)
7f0000100000-7f0000101000 rwxp 00000000 00:00 0 
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn keeps_executable_mappings_and_translates_offsets() {
        let maps = parse_maps(MAPS.as_bytes()).unwrap();
        assert_eq!(maps.len(), 4);
        let (mapping, offset) = maps.find(0x55d0a0001234).unwrap();
        assert_eq!(&*mapping.path, "/usr/bin/app");
        assert_eq!(offset, 0x1234);
        let (libc, offset) = maps.find(0x7f0000000010).unwrap();
        assert_eq!(libc.file_name(), "libc.so.6");
        assert_eq!(offset, 0x28010);
        assert_eq!(maps.find(0x7ffd00000010).unwrap().0.file_name(), "[vdso]");
        assert_eq!(maps.find(0x7f0000100010).unwrap().0.file_name(), "[anon]");
        // Read-only data is not code; the gap after the last mapping is nothing.
        assert!(maps.find(0x55d0a0000010).is_none());
        assert!(maps.find(0x7ffd00002000).is_none());
    }

    #[test]
    fn tells_a_library_mapped_since() {
        let before = parse_maps(MAPS.as_bytes()).unwrap();
        assert!(!before.maps_files_beyond(&before));
        // JIT code, anonymous, is not a library.
        let jit = format!("{MAPS}7f0000200000-7f0000201000 rwxp 00000000 00:00 0 \n");
        assert!(
            !parse_maps(jit.as_bytes())
                .unwrap()
                .maps_files_beyond(&before)
        );
        let loaded =
            format!("{MAPS}7f0000300000-7f0000301000 r-xp 00001000 fd:01 300 /x/libsdk.so\n");
        let after = parse_maps(loaded.as_bytes()).unwrap();
        assert!(after.maps_files_beyond(&before));
        assert!(!before.maps_files_beyond(&after));
        // Another file where libc was (unloaded, and a library put there).
        let replaced = MAPS.replace("fd:01 200 /usr/lib/libc.so.6", "fd:01 201 /x/libsdk.so");
        assert!(
            parse_maps(replaced.as_bytes())
                .unwrap()
                .maps_files_beyond(&before)
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_maps(b"not a maps line\n").is_err());
        // Fields missing or out of range.
        assert!(parse_maps(b"1000-2000 r-xp 0 fd:01\n").is_err());
        assert!(parse_maps(b"1000-2000 r-xp 0 100000000:01 5 /x\n").is_err());
        assert!(parse_maps(b"1000-2000 r-x 0 fd:01 5 /x\n").is_err());
    }

    /// Found by fuzzing (procfs's parser): paths a process chooses must not
    /// panic or hide its other mappings.
    #[test]
    fn paths_a_process_chooses() {
        let text = b"\
1000-2000 r-xp 00000000 fd:01 7 /SYSV\n\
3000-4000 r-xp 00000000 fd:01 8 /tmp/caf\xe9 \xff.so\n\
5000-6000 r-xp 00000000 00:00 0 [anon:jit]\n\
7000-8000 r-xp 00000000 fd:01 9 /a file (deleted)\n\
9000-a000 r-xp ffffffffffffffff fd:01 10 /x\n";
        let maps = parse_maps(text).unwrap();
        assert_eq!(maps.len(), 5);
        assert_eq!(&*maps.find(0x1000).unwrap().0.path, "/SYSV");
        assert_eq!(
            &*maps.find(0x3000).unwrap().0.path,
            "/tmp/caf\u{fffd} \u{fffd}.so"
        );
        assert_eq!(&*maps.find(0x5000).unwrap().0.path, "anon:jit");
        assert_eq!(&*maps.find(0x7000).unwrap().0.path, "/a file");
        assert_eq!(maps.find(0x9001).unwrap().1, 0);
        // smaps-style lines are not part of a maps file.
        assert!(
            parse_maps(b"1000-2000 r-xp 0 fd:01 5 /x\nRss: 99999999999999999999 kB\n").is_err()
        );
    }
}
