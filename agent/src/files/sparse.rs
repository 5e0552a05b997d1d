//! Reading only the parts of an ELF file a job uses (its headers, symbol
//! tables, unwind or debug sections), in an image where every other byte is
//! a zero page that never becomes resident.
//!
//! Why: code and data are most of a binary, and nothing here reads them. A
//! 300 MB browser or a `rustc` driver read whole made the agent's peak RSS
//! the size of the largest file it met; read this way it is the size of the
//! sections kept (a few MB of symbols and `.eh_frame` for unwinding).
//!
//! The content identity stays that of every byte: the file is streamed once,
//! each chunk hashed and, where it overlaps a kept range, copied from that
//! same read. So the kept bytes are exactly bytes that were hashed, as with
//! a whole read. The headers the ranges were chosen from are checked against
//! the streamed copy: a file rewritten in between is refused, not misread.
//!
//! A file streamed once is not hashed again while it stays the same file:
//! the symbolizer and the unwinder both read every binary a profile meets,
//! and hashing was most of what that cost. The id is remembered with what
//! `fstat` said before and after the stream (device, inode, size, mtime and
//! ctime, which the kernel sets on every write and no owner can set back:
//! [`super::memo`]); a later read of a file that `fstat` says the same of, before and after,
//! reads only its kept ranges under that id.
use std::{ops::Range, os::unix::fs::FileExt, ptr::NonNull, sync::Arc};

use object::{
    Endianness, Object, ObjectSection, SectionFlags,
    elf::{
        PT_INTERP, SHF_ALLOC, SHT_DYNSYM, SHT_NOBITS, SHT_NOTE, SHT_REL, SHT_RELA, SHT_STRTAB,
        SHT_SYMTAB,
    },
    read::{ReadCache, elf::ElfFile64},
};
use sha2::{Digest, Sha256};

use super::{FileError, OpenFile, Stat, read::FileData};

thread_local! {
    /// Bytes sparse reads hashed on this thread (a read runs on its
    /// caller's thread), for tests.
    static HASHED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Bytes [`read_parts`] has hashed on this thread.
#[cfg(test)]
pub fn hashed_bytes() -> u64 {
    HASHED.get()
}

/// Files smaller than this are read whole: the saving would be small.
pub const SPARSE_FROM: u64 = 4 << 20;
/// Bytes per read while streaming.
const CHUNK: usize = 1 << 20;
/// Bytes kept at each end of the file (htlhash reads 4 KiB of each).
const EDGE: u64 = 4096;

/// The sections a job reads.
#[derive(Clone, Copy, Debug)]
pub enum Parts {
    /// Unwind tables: `.eh_frame`, `.eh_frame_hdr`, `.debug_frame`, notes.
    Unwind,
    /// Names: every section not loaded at run time (symbol tables, DWARF,
    /// debug links, MiniDebugInfo), the dynamic symbols, notes,
    /// `.gopclntab` and `.eh_frame` (function extents), `.go.buildinfo`
    /// (a Go binary's version, for its pprof labels); DWARF only if it
    /// may fit `dwarf`'s limit.
    Names { dwarf: DwarfLimit },
    /// What the dynamic linker reads: the program headers and what they
    /// point at (interpreter), the dynamic symbols, their names and the
    /// dynamic relocations; plus the section headers and their names.
    Dynamic,
}

/// DWARF the reader of names would refuse anyway is not read: when the
/// sections it needs hold more than half of `limit` bytes on disk (it
/// estimates twice their uncompressed size, never less than on disk).
#[derive(Clone, Copy, Debug)]
pub struct DwarfLimit {
    pub is_needed: fn(&str) -> bool,
    pub limit: u64,
}

impl DwarfLimit {
    /// Every DWARF section is read.
    pub const NONE: DwarfLimit = DwarfLimit {
        is_needed: |_| true,
        limit: u64::MAX,
    };
    /// No DWARF section is read (a file that has any).
    pub const SKIP: DwarfLimit = DwarfLimit {
        is_needed: |_| true,
        limit: 0,
    };
}

fn is_debug(name: &[u8]) -> bool {
    name.starts_with(b".debug_") || name.starts_with(b".zdebug_")
}

impl Parts {
    fn keeps(self, name: &[u8], sh_type: u32, flags: u64, dwarf_fits: bool) -> bool {
        if let Parts::Dynamic = self {
            // Loaded: not `.symtab`/`.strtab`, which may be megabytes.
            return flags & u64::from(SHF_ALLOC) != 0
                && matches!(sh_type, SHT_DYNSYM | SHT_STRTAB | SHT_REL | SHT_RELA);
        }
        // String and symbol tables (section names among them) and notes
        // (build ids) serve every job and are small.
        if matches!(sh_type, SHT_STRTAB | SHT_SYMTAB | SHT_DYNSYM | SHT_NOTE) {
            return true;
        }
        match self {
            Parts::Unwind => matches!(name, b".eh_frame" | b".eh_frame_hdr" | b".debug_frame"),
            Parts::Names { .. } if is_debug(name) => dwarf_fits,
            Parts::Names { .. } => {
                flags & u64::from(SHF_ALLOC) == 0
                    || matches!(name, b".eh_frame" | b".gopclntab" | b".go.buildinfo")
            }
            Parts::Dynamic => false,
        }
    }
}

/// Reads `file`'s headers and the sections `parts` names into an image of
/// the whole file; other bytes read as zero. Files that are small, not
/// 64-bit ELF, or unparsable are read whole.
pub(super) fn read_parts(file: OpenFile, parts: Parts) -> Result<FileData, FileError> {
    let size = file.stat.size;
    if size < SPARSE_FROM {
        return super::read::read_all(file);
    }
    let Some((ranges, headers)) = kept_ranges(&file, parts) else {
        return super::read::read_all(file);
    };
    let read_error = |source| FileError::Read {
        path: file.path.clone(),
        source,
    };
    let len =
        usize::try_from(size).map_err(|_| read_error(std::io::ErrorKind::InvalidData.into()))?;
    let mut image = ZeroImage::new(len).map_err(read_error)?;
    if let Some(content) = super::memo::known(&file.stat) {
        // Unchanged since it was hashed (ctime), and while it was read.
        if read_ranges(&file, &ranges, &headers, &mut image).map_err(read_error)? {
            return Ok(FileData::sparse(image, content, file.stat));
        }
        image = ZeroImage::new(len).map_err(read_error)?;
    }
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; CHUNK];
    let mut offset = 0u64;
    let limit = file.kind.max_bytes();
    loop {
        let n = file.file.read_at(&mut chunk, offset).map_err(read_error)?;
        if n == 0 {
            break;
        }
        hasher.update(&chunk[..n]);
        HASHED.set(HASHED.get() + n as u64);
        let read = offset..offset + n as u64;
        for range in &ranges {
            let (start, end) = (range.start.max(read.start), range.end.min(read.end));
            if start < end && end <= size {
                let from = (start - offset) as usize..(end - offset) as usize;
                image.as_mut()[start as usize..end as usize].copy_from_slice(&chunk[from]);
            }
        }
        offset = read.end;
        if offset > limit {
            return Err(super::refused(FileError::TooLarge {
                path: file.path,
                size: offset,
                limit,
                kind: file.kind.name(),
            }));
        }
    }
    // The headers the ranges came from must be the ones streamed.
    if !headers_match(&image, &headers) {
        return Err(read_error(std::io::Error::other(
            "the file changed while it was read",
        )));
    }
    let content: Arc<str> = Arc::from(format!(
        "sha256:{}",
        crate::symbolize::hex(&hasher.finalize())
    ));
    if Stat::now(&file.file) == Some(file.stat) {
        super::memo::remember(file.stat, content.clone());
    }
    Ok(FileData::sparse(image, content, file.stat))
}

/// An ELF file's [`Parts::Dynamic`] in an image of the whole file, other
/// bytes zero, and no content id: what a runtime probe reads to look up a
/// symbol it keys by device and inode (a few KiB, where reading whole for
/// the id would copy, and for a large file hash, every byte).
#[derive(Debug)]
pub struct DynamicImage(ZeroImage);

impl std::ops::Deref for DynamicImage {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.0.as_ref()
    }
}

/// Reads `file`'s [`Parts::Dynamic`] (its size within its kind's cap, as
/// opening checked); refuses one that is not a well-formed 64-bit ELF
/// object (whose tables lie within it) or that changed while read.
pub(super) fn read_dynamic(file: OpenFile) -> Result<DynamicImage, FileError> {
    let size = file.stat.size;
    let read_error = |source| FileError::Read {
        path: file.path.clone(),
        source,
    };
    let (ranges, headers) = kept_ranges(&file, Parts::Dynamic).ok_or_else(|| {
        read_error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a 64-bit ELF object, or a malformed one",
        ))
    })?;
    let len =
        usize::try_from(size).map_err(|_| read_error(std::io::ErrorKind::InvalidData.into()))?;
    let mut image = ZeroImage::new(len).map_err(read_error)?;
    if !read_ranges(&file, &ranges, &headers, &mut image).map_err(read_error)? {
        return Err(read_error(std::io::Error::other(
            "the file changed while it was read",
        )));
    }
    Ok(DynamicImage(image))
}

/// Reads `ranges` of `file` into `image`, where they lie in the file;
/// false when the file changed meanwhile (`fstat`, or the `headers` the
/// ranges were chosen from).
fn read_ranges(
    file: &OpenFile,
    ranges: &[Range<u64>],
    headers: &[(u64, Vec<u8>)],
    image: &mut ZeroImage,
) -> std::io::Result<bool> {
    for range in ranges {
        let at = range.start as usize..range.end as usize;
        file.file
            .read_exact_at(&mut image.as_mut()[at], range.start)?;
    }
    Ok(Stat::now(&file.file) == Some(file.stat) && headers_match(image, headers))
}

/// Whether `image` holds `headers` (offset, bytes) where they were read.
fn headers_match(image: &ZeroImage, headers: &[(u64, Vec<u8>)]) -> bool {
    headers.iter().all(|(at, bytes)| {
        let at = *at as usize;
        image.as_ref().get(at..at + bytes.len()) == Some(&bytes[..])
    })
}

/// The byte ranges to keep (sorted), and the header bytes they were chosen
/// from, by offset; `None` when the file is not a 64-bit ELF object.
#[allow(clippy::type_complexity)]
fn kept_ranges(file: &OpenFile, parts: Parts) -> Option<(Vec<Range<u64>>, Vec<(u64, Vec<u8>)>)> {
    let size = file.stat.size;
    let cache = ReadCache::new(&file.file);
    let elf = ElfFile64::<Endianness, _>::parse(&cache).ok()?;
    let endian = elf.endian();
    let header = elf.elf_header();
    let table = |offset: u64, count: u16, entry: u16| {
        offset..offset.saturating_add(u64::from(count) * u64::from(entry))
    };
    let elf_header = 0..size_of::<object::elf::FileHeader64<Endianness>>() as u64;
    let section_headers = table(
        header.e_shoff.get(endian),
        header.e_shnum.get(endian),
        header.e_shentsize.get(endian),
    );
    let mut ranges = vec![
        elf_header.clone(),
        table(
            header.e_phoff.get(endian),
            header.e_phnum.get(endian),
            header.e_phentsize.get(endian),
        ),
        section_headers.clone(),
    ];
    if !matches!(parts, Parts::Dynamic) {
        ranges.extend([0..EDGE, size.saturating_sub(EDGE)..size]);
    }
    let dwarf_fits = match parts {
        Parts::Names { dwarf } => {
            let needed = elf
                .sections()
                .filter(|section| section.name().is_ok_and(dwarf.is_needed))
                .filter_map(|section| section.file_range())
                .fold(0u64, |sum, (_, len)| sum.saturating_add(len));
            needed.saturating_mul(2) <= dwarf.limit
        }
        Parts::Unwind | Parts::Dynamic => false,
    };
    for section in elf.sections() {
        let sh_type = section.elf_section_header().sh_type.get(endian);
        let SectionFlags::Elf { sh_flags } = section.flags() else {
            continue;
        };
        if sh_type == SHT_NOBITS {
            continue;
        }
        let name = section.name_bytes().unwrap_or_default();
        if parts.keeps(name, sh_type, sh_flags, dwarf_fits)
            && let Some((offset, len)) = section.file_range()
        {
            ranges.push(offset..offset.saturating_add(len));
        }
    }
    if let Parts::Dynamic = parts {
        use object::read::elf::ProgramHeader;
        ranges.extend(
            elf.elf_program_headers()
                .iter()
                .filter(|header| header.p_type(endian) == PT_INTERP)
                .map(|header| {
                    let (offset, len) = header.file_range(endian);
                    offset..offset.saturating_add(len)
                }),
        );
        // Section names (`.go.buildinfo` tells a Go binary).
        use object::read::elf::SectionHeader;
        let index = object::SectionIndex(header.e_shstrndx.get(endian).into());
        if let Ok(names) = elf.elf_section_table().section(index)
            && let Some((offset, len)) = names.file_range(endian)
        {
            ranges.push(offset..offset.saturating_add(len));
        }
    }
    for range in &mut ranges {
        range.end = range.end.min(size);
    }
    ranges.retain(|range| range.start < range.end);
    ranges.sort_by_key(|range| range.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => merged.push(range),
        }
    }
    let mut headers = Vec::new();
    for range in [elf_header, section_headers] {
        let range = range.start..range.end.min(size);
        let len = usize::try_from(range.end.saturating_sub(range.start)).ok()?;
        let mut bytes = vec![0; len];
        file.file.read_exact_at(&mut bytes, range.start).ok()?;
        headers.push((range.start, bytes));
    }
    Some((merged, headers))
}

/// Private anonymous memory, zero until written: pages never written are
/// never resident. Not file-backed, so nothing a tenant does to its file can
/// fault a read of it.
pub struct ZeroImage {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned memory like a Box<[u8]>; access follows
// Rust's borrow rules through as_ref/as_mut.
unsafe impl Send for ZeroImage {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for ZeroImage {}

impl ZeroImage {
    fn new(len: usize) -> std::io::Result<Self> {
        // SAFETY: a fresh private anonymous mapping aliases nothing.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len.max(1),
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE,
            )
        }?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(std::io::ErrorKind::OutOfMemory)?;
        Ok(ZeroImage { ptr, len })
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live mapping of len bytes, borrowed mutably once.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for ZeroImage {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: ptr is a live mapping of len bytes (zero-filled or written).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ZeroImage {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by new() with this length and is no
        // longer borrowed.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len.max(1)) };
    }
}

impl std::fmt::Debug for ZeroImage {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "ZeroImage({} bytes)", self.len)
    }
}
