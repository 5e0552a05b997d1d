//! The ELF file behind one of a process's mappings, as a runtime needs it:
//! read safely through `crate::files`, its symbols found by name, and the
//! load bias that turns their link-time addresses into the process's;
//! and what each runtime found in a file, remembered by what the file is
//! ([`FileKey`], [`ByFile`]).
use std::{collections::HashMap, sync::Arc};

use crate::{
    files::{self, FileData, FileError, Kind, MappedRange, OpenFile, Stat},
    model::Mapping,
};

/// What [`read`] keeps of a file: its symbol tables, no DWARF.
const NAMES: files::Parts = files::Parts::Names {
    dwarf: files::DwarfLimit::SKIP,
};

/// Reads the file `mapping` maps, with its symbol tables but no DWARF.
pub fn read(pid: u32, mapping: &Mapping) -> Result<FileData, FileError> {
    open(pid, mapping).and_then(|file| file.read_parts(NAMES))
}

/// What a runtime's cache of files is keyed by: what the file is, never
/// where a process maps it from. A mapping's device and inode are neither
/// the bytes (an inode is reused once its file is replaced, by a package
/// upgrade or a new image layer) nor shared by the same bytes elsewhere
/// (each container's overlay has its own device and inodes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FileKey {
    /// [`files::content_id`] of every byte: the same bytes, wherever.
    Content(Arc<str>),
    /// What `fstat` said of a file only probed (a few KiB read) and not
    /// hashed yet by anyone: device, inode, size, mtime and ctime, which
    /// the kernel sets on every write or replacement (see
    /// [`files::memo`]), so a rewritten file is a new key. The same bytes
    /// in another container are probed again, until something hashes them.
    Stat(Stat),
}

impl FileKey {
    /// `file`'s content id if it was hashed while it was the file `fstat`
    /// says it is now (by the unwinder, the symbolizer, a runtime: in this
    /// run or, through the memo file, an earlier one), else its [`Stat`].
    /// Costs no read.
    ///
    /// Why a probe does not hash the file to get an id: its bytes would
    /// all be streamed (what [`files::Parts`] costs, even for a sparse
    /// image) on the attribution thread, where a probe reads a few KiB
    /// (`files::DynamicImage`); a large file, which the unwinder hashes
    /// on a lane of its own for that reason, would hold up every sample.
    pub fn of(file: &OpenFile) -> FileKey {
        match files::memo::known(file.stat()) {
            Some(id) => FileKey::Content(id),
            None => FileKey::Stat(*file.stat()),
        }
    }
}

/// What a runtime found in each file it read, by [`FileKey`]; at most
/// `max` files before it starts over.
#[derive(Debug)]
pub struct ByFile<V> {
    found: HashMap<FileKey, V>,
    max: usize,
}

impl<V: Clone> ByFile<V> {
    pub fn new(max: usize) -> Self {
        ByFile {
            found: HashMap::new(),
            max,
        }
    }

    pub fn get(&self, key: &FileKey) -> Option<V> {
        self.found.get(key).cloned()
    }

    pub fn insert(&mut self, key: FileKey, value: V) {
        if self.found.len() >= self.max && !self.found.contains_key(&key) {
            self.found.clear();
        }
        self.found.insert(key, value);
    }

    /// Files remembered.
    pub fn len(&self) -> usize {
        self.found.len()
    }

    pub fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// What `derive` finds in the file `mapping` maps, read as [`read`]
    /// does, once per content: a file hashed before is looked up without
    /// a read; else it is read (every byte hashed, its id remembered),
    /// and the same bytes found at another path or in another container
    /// are not parsed again. Errors (`unreadable`, or `derive`'s) are not
    /// remembered: a file may be readable later.
    pub fn read<E>(
        &mut self,
        pid: u32,
        mapping: &Mapping,
        unreadable: impl FnOnce(FileError) -> E,
        derive: impl FnOnce(&FileData) -> Result<V, E>,
    ) -> Result<V, E> {
        let data = match open(pid, mapping) {
            Ok(file) => {
                if let Some(known) = self.get(&FileKey::of(&file)) {
                    return Ok(known);
                }
                file.read_parts(NAMES)
            }
            Err(err) => Err(err),
        };
        let data = data.map_err(unreadable)?;
        let key = FileKey::Content(data.content_id());
        if let Some(known) = self.get(&key) {
            return Ok(known);
        }
        let value = derive(&data)?;
        self.insert(key, value.clone());
        Ok(value)
    }
}

/// Opens the file `mapping` maps, for reads of a few of its bytes (what
/// [`read`] leaves out of a large file, such as code: [`code_at`]).
pub fn open(pid: u32, mapping: &Mapping) -> Result<OpenFile, FileError> {
    files::open_mapping(pid, &MappedRange::from(mapping), Kind::Binary)
}

/// Code bytes read at a time: more than any function a runtime decodes.
const MAX_CODE: u64 = 1 << 20;

/// The bytes of `file`'s code at link-time addresses `[start, end)`, read
/// from `opened` (the same file: its image from [`read`] holds no code);
/// `None` when no section holds them whole, or past [`MAX_CODE`].
pub fn code_at(
    file: &object::File,
    opened: &files::OpenFile,
    start: u64,
    end: u64,
) -> Option<Vec<u8>> {
    use object::{Object, ObjectSection};
    let size = end.checked_sub(start).filter(|&size| size <= MAX_CODE)?;
    let offset = file.sections().find_map(|section| {
        let (offset, len) = section.file_range()?;
        let within = start.checked_sub(section.address())?;
        (within.checked_add(size)? <= len).then_some(offset + within)
    })?;
    let mut bytes = vec![0; size as usize];
    opened.read_at(&mut bytes, offset).ok()?;
    Some(bytes)
}

/// Reads the headers, dynamic symbols and dynamic relocations of the file
/// `mapping` maps, and nothing else (see [`files::DynamicImage`]).
pub fn read_dynamic(pid: u32, mapping: &Mapping) -> Result<files::DynamicImage, FileError> {
    open(pid, mapping).and_then(OpenFile::read_dynamic)
}

/// (file offset, file size, link-time address) of each segment of `file`.
pub fn segments(file: &object::File) -> Vec<(u64, u64, u64)> {
    use object::{Object, ObjectSegment};
    file.segments()
        .map(|segment| {
            let (offset, size) = segment.file_range();
            (offset, size, segment.address())
        })
        .collect()
}

/// What to add to a link-time address of the file to get its address in
/// the process, from the segment `mapping` maps; `None` when no segment
/// holds the mapping's offset.
///
/// The kernel maps a segment from its page-aligned file offset to its
/// page-aligned address, so the first page of a mapping may also lie in
/// the previous segment's file range (lld leaves segments sharing a page
/// at different address deltas): the segment starting last at or before
/// the mapping's offset is the one mapped.
pub fn load_bias(segments: &[(u64, u64, u64)], mapping: &Mapping) -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .ok()
        .filter(|page| page.is_power_of_two())
        .unwrap_or(4096);
    segments
        .iter()
        .filter_map(|&(offset, size, address)| {
            let start = offset & !(page - 1);
            let end = offset.saturating_add(size).max(start + 1);
            (start..end)
                .contains(&mapping.file_offset)
                .then_some((start, address & !(page - 1)))
        })
        .max_by_key(|(start, _)| *start)
        .map(|(start, address)| {
            mapping
                .start
                .wrapping_sub(address.wrapping_add(mapping.file_offset - start))
        })
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSymbol};

    /// A symbol of this test binary, to find by name.
    #[unsafe(no_mangle)]
    pub extern "C" fn hostprof_elf_probe() -> u32 {
        7
    }

    use super::{ByFile, FileKey};

    /// A file of the test's own, mapped into this process (what a runtime
    /// finds in another's), unmapped when dropped.
    struct Mapped {
        address: *mut libc::c_void,
        len: usize,
        mapping: crate::model::Mapping,
    }

    impl Mapped {
        fn new(path: &std::path::Path) -> Mapped {
            use std::os::fd::AsRawFd;
            let file = std::fs::File::open(path).unwrap();
            let len = file.metadata().unwrap().len() as usize;
            // SAFETY: a fresh private mapping of a file we opened, never written.
            let address = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    // Executable: the mappings a runtime is given.
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE,
                    file.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(address, libc::MAP_FAILED);
            let maps = std::fs::read("/proc/self/maps").unwrap();
            let maps = crate::procs::parse_maps(&maps).unwrap();
            let (mapping, _) = maps.find(address as u64).expect("mapped");
            Mapped {
                address,
                len,
                mapping: (*mapping).clone(),
            }
        }
    }

    impl Drop for Mapped {
        fn drop(&mut self) {
            // SAFETY: mapped by new() with this length, never borrowed.
            unsafe { libc::munmap(self.address, self.len) };
        }
    }

    /// The new key: two files of the same bytes (at two paths, two
    /// inodes: two containers' copies) share one entry and one parse; a
    /// file rewritten in place (the same inode, so the same key by device
    /// and inode) is read again; a file only probed and never hashed is
    /// known by what `fstat` says, which its rewrite changes too.
    #[test]
    fn files_are_read_once_per_content_and_again_when_rewritten() {
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("hostprof-by-file-{pid}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let bytes = format!("hostprof by-file test of {pid}\n").repeat(100);
        let (a, b, c) = (dir.join("a"), dir.join("b"), dir.join("c"));
        for path in [&a, &b, &c] {
            std::fs::write(path, &bytes).unwrap();
        }
        let (in_a, in_b) = (Mapped::new(&a), Mapped::new(&b));
        assert_ne!(in_a.mapping.inode, in_b.mapping.inode);

        let mut cache = ByFile::new(16);
        let parses = std::cell::Cell::new(0);
        let read = |cache: &mut ByFile<Vec<u8>>, mapped: &Mapped| {
            cache
                .read(
                    pid,
                    &mapped.mapping,
                    |err| panic!("{err}"),
                    |data| {
                        parses.set(parses.get() + 1);
                        Ok::<_, ()>(data.to_vec())
                    },
                )
                .unwrap()
        };
        assert_eq!(read(&mut cache, &in_a), bytes.as_bytes());
        assert_eq!(read(&mut cache, &in_b), bytes.as_bytes());
        assert_eq!(read(&mut cache, &in_a), bytes.as_bytes());
        assert_eq!(cache.len(), 1, "one entry for the same bytes");
        // Both were hashed: a probe of either finds their one content id.
        let key = |mapped: &Mapped| FileKey::of(&super::open(pid, &mapped.mapping).unwrap());
        let id = crate::files::content_id(bytes.as_bytes());
        assert_eq!(key(&in_a), FileKey::Content(id.clone()));
        assert_eq!(key(&in_b), FileKey::Content(id.clone()));

        // Rewritten in place: same device and inode, other bytes.
        let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&a).unwrap());
        let rewritten = format!("{bytes}and more\n");
        std::fs::write(&a, &rewritten).unwrap();
        let now = std::fs::metadata(&a).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&now), inode);
        assert_eq!(read(&mut cache, &in_a), rewritten.as_bytes());
        assert_eq!(read(&mut cache, &in_b), bytes.as_bytes());
        assert_ne!(key(&in_a), FileKey::Content(id));
        assert_eq!(parses.get(), 2);

        // Never hashed: its stat, not yet its content, until it changes.
        let in_c = Mapped::new(&c);
        let probed = key(&in_c);
        assert!(matches!(probed, FileKey::Stat(stat) if stat.inode == in_c.mapping.inode));
        std::fs::write(&c, &rewritten).unwrap();
        assert_ne!(key(&in_c), probed);
        drop((in_a, in_b, in_c));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn picks_the_segment_a_shared_page_starts() {
        // lld: the text segment starts in the read-only one's last page,
        // one page further in the address space.
        let segments = [(0, 0x2c4abc, 0), (0x2c4ac0, 0x10_0000, 0x2c5ac0)];
        let mapping = crate::model::Mapping {
            start: 0x5555_0000_0000,
            end: 0x5555_0010_0000,
            file_offset: 0x2c4000,
            path: "/bin/x".into(),
            dev: 0,
            inode: 0,
            build_ids: Default::default(),
        };
        assert_eq!(
            super::load_bias(&segments, &mapping),
            Some(0x5555_0000_0000 - 0x2c5000)
        );
        let first = crate::model::Mapping {
            file_offset: 0,
            ..mapping.clone()
        };
        assert_eq!(super::load_bias(&segments, &first), Some(0x5555_0000_0000));
        let beyond = crate::model::Mapping {
            file_offset: 0x50_0000,
            ..mapping
        };
        assert_eq!(super::load_bias(&segments, &beyond), None);
    }

    #[test]
    fn biases_symbols_to_where_they_run() {
        let pid = std::process::id();
        let here = hostprof_elf_probe as *const () as u64;
        let maps = std::fs::read(format!("/proc/{pid}/maps")).expect("maps");
        let maps = crate::procs::parse_maps(&maps).expect("parses");
        let (mapping, _) = maps.find(here).expect("mapped");
        let data = super::read(pid, &mapping).expect("reads the test binary");
        let file = object::File::parse(&*data).expect("an ELF file");
        let bias = super::load_bias(&super::segments(&file), &mapping).expect("a bias");
        let symbol = file
            .symbols()
            .chain(file.dynamic_symbols())
            .find(|symbol| symbol.name() == Ok("hostprof_elf_probe"))
            .expect("the probe's symbol");
        assert_eq!(symbol.address().wrapping_add(bias), here);
        assert_eq!(hostprof_elf_probe(), 7);
    }
}
