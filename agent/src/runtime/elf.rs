//! The ELF file behind one of a process's mappings, as a runtime needs it:
//! read safely through `crate::files`, its symbols found by name, and the
//! load bias that turns their link-time addresses into the process's.
use crate::{
    files::{self, Kind, MappedRange},
    model::Mapping,
};

/// Reads the file `mapping` maps, with its symbol tables but no DWARF.
pub fn read(pid: u32, mapping: &Mapping) -> Result<files::FileData, files::FileError> {
    let range = MappedRange {
        start: mapping.start,
        end: mapping.end,
        path: &mapping.path,
        dev: mapping.dev,
        inode: mapping.inode,
    };
    files::open_mapping(pid, &range, Kind::Binary).and_then(|file| {
        file.read_parts(files::Parts::Names {
            dwarf: files::DwarfLimit::SKIP,
        })
    })
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
pub fn load_bias(segments: &[(u64, u64, u64)], mapping: &Mapping) -> Option<u64> {
    segments
        .iter()
        .find(|(offset, size, _)| {
            (*offset..offset.saturating_add(*size)).contains(&mapping.file_offset)
        })
        .map(|(offset, _, address)| {
            mapping
                .start
                .wrapping_sub(address.wrapping_add(mapping.file_offset - offset))
        })
}
