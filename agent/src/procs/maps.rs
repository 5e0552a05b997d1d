//! Executable mappings of a process, from `/proc/PID/maps`.
use std::{io::BufRead, sync::Arc};

use procfs::{
    FromBufRead,
    process::{MMPermissions, MMapPath, MemoryMaps},
};

use crate::model::{BuildIds, Mapping};

/// A process's executable mappings, sorted by start address.
#[derive(Debug, Default)]
pub struct ExecutableMaps {
    mappings: Vec<Arc<Mapping>>,
}

impl ExecutableMaps {
    /// Keeps the executable mappings of a parsed maps file.
    pub fn from_proc(maps: MemoryMaps) -> Self {
        let mut mappings: Vec<Arc<Mapping>> = maps
            .into_iter()
            .filter(|map| map.perms.contains(MMPermissions::EXECUTE))
            .map(|map| {
                let path: Arc<str> = match &map.pathname {
                    MMapPath::Path(path) => super::strip_deleted(&path.to_string_lossy()).into(),
                    MMapPath::Vdso => "[vdso]".into(),
                    MMapPath::Vsyscall => "[vsyscall]".into(),
                    MMapPath::Other(other) => other.as_str().into(),
                    _ => "".into(),
                };
                Arc::new(Mapping {
                    start: map.address.0,
                    end: map.address.1,
                    file_offset: map.offset,
                    path,
                    dev: libc::makedev(map.dev.0 as u32, map.dev.1 as u32),
                    inode: map.inode,
                    build_ids: BuildIds::default(),
                })
            })
            .collect();
        mappings.sort_unstable_by_key(|mapping| mapping.start);
        ExecutableMaps { mappings }
    }

    /// The mapping holding `address`, and the address's offset in the file.
    pub fn find(&self, address: u64) -> Option<(Arc<Mapping>, u64)> {
        let index = self
            .mappings
            .partition_point(|mapping| mapping.start <= address);
        let mapping = self.mappings.get(index.checked_sub(1)?)?;
        (address < mapping.end).then(|| {
            (
                mapping.clone(),
                address - mapping.start + mapping.file_offset,
            )
        })
    }

    pub fn len(&self) -> usize {
        self.mappings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty()
    }
}

/// Parses the text of a `/proc/PID/maps` file (bad lines make it an error).
pub fn parse_maps(text: impl BufRead) -> Result<ExecutableMaps, procfs::ProcError> {
    Ok(ExecutableMaps::from_proc(MemoryMaps::from_buf_read(text)?))
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
    fn rejects_garbage() {
        assert!(parse_maps("not a maps line\n".as_bytes()).is_err());
    }
}
