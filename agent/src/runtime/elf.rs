//! The ELF file behind one of a process's mappings, as a runtime needs it:
//! read safely through `crate::files`, its symbols found by name, and the
//! load bias that turns their link-time addresses into the process's.
use crate::{
    files::{self, Kind, MappedRange},
    model::Mapping,
};

/// Reads the file `mapping` maps, with its symbol tables but no DWARF.
pub fn read(pid: u32, mapping: &Mapping) -> Result<files::FileData, files::FileError> {
    let range = MappedRange::from(mapping);
    files::open_mapping(pid, &range, Kind::Binary).and_then(|file| {
        file.read_parts(files::Parts::Names {
            dwarf: files::DwarfLimit::SKIP,
        })
    })
}

/// Opens the file `mapping` maps, for reads of a few of its bytes (what
/// [`read`] leaves out of a large file, such as code: [`code_at`]).
pub fn open(pid: u32, mapping: &Mapping) -> Result<files::OpenFile, files::FileError> {
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
pub fn read_dynamic(pid: u32, mapping: &Mapping) -> Result<files::DynamicImage, files::FileError> {
    let range = MappedRange::from(mapping);
    files::open_mapping(pid, &range, Kind::Binary).and_then(files::OpenFile::read_dynamic)
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
