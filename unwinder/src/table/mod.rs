//! Compact unwind tables from an ELF file's `.eh_frame` (or `.debug_frame`).
//!
//! Each FDE becomes rows of [`UnwindRow`]: how to find the caller's stack
//! pointer (CFA), frame pointer and return address, for every address range
//! of the function. Gaps between FDEs get a [`cfa::NOT_COVERED`] row so a
//! lookup never borrows the previous function's rule. Consecutive identical
//! rules merge into one row.
//!
//! Host only (the `std` feature). It lives here, next to the row format,
//! and is built optimized in dev builds too: gimli's generic CFI evaluation
//! is instantiated in this crate, and unoptimized it is ~8x slower, which
//! delays a new process's tables.
extern crate std;

use std::{boxed::Box, vec, vec::Vec};

use super::{Arch, UnwindRow, cfa, reg};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, Register, RegisterRule,
    RunTimeEndian, UnwindContext, UnwindSection,
};
use object::{Object, ObjectSection, ObjectSegment};

mod sparse;
pub use sparse::{FdeIndex, build_sparse, build_sparse_with, cfi_bytes, fde_index};

/// Why a file has no table.
#[derive(Debug)]
pub enum TableError {
    /// Not an ELF file this crate's `object` can parse.
    Parse(object::Error),
    /// Neither x86_64 nor aarch64.
    UnsupportedArch,
    /// No `.eh_frame` or `.debug_frame` rows.
    NoCfi,
}

impl core::fmt::Display for TableError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TableError::Parse(err) => write!(f, "cannot parse the ELF file: {err}"),
            TableError::UnsupportedArch => f.write_str("unsupported architecture"),
            TableError::NoCfi => f.write_str("no .eh_frame or .debug_frame"),
        }
    }
}

impl std::error::Error for TableError {}

/// How a file's frames are walked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableKind {
    /// Rows from CFI.
    Rows(Vec<UnwindRow>),
    /// Rows as the kernel's rows map holds them ([`crate::pack`]'s words,
    /// checked by [`crate::packed_rows_valid`]), `rows` of them: a table
    /// read back from the disk cache goes to the kernel as it is. Unpacked
    /// to rows and packed again, a large co-tenant's table (qemu's, a
    /// compiler's) cost five times its size in a transient peak.
    Packed { words: Vec<u64>, rows: usize },
    /// No usable CFI, but the code keeps frame pointers (Go).
    FramePointers,
}

/// The unwind table of one executable file.
#[derive(Clone, Debug)]
pub struct UnwindTable {
    pub arch: Arch,
    pub kind: TableKind,
    /// Bytes of executable sections (for memory-per-text figures).
    pub text_bytes: u64,
}

impl UnwindTable {
    /// Rows of a table built from CFI (none for frame-pointer code);
    /// `None` for a packed table, whose rows are only words now (see
    /// [`Self::row_count`] and [`Self::packed`]): an empty slice would
    /// read as a table that covers nothing.
    pub fn rows(&self) -> Option<&[UnwindRow]> {
        match &self.kind {
            TableKind::Rows(rows) => Some(rows),
            TableKind::FramePointers => Some(&[]),
            TableKind::Packed { .. } => None,
        }
    }

    /// Rows of the table, built or packed.
    pub fn row_count(&self) -> usize {
        match &self.kind {
            TableKind::Rows(rows) => rows.len(),
            TableKind::Packed { rows, .. } => *rows,
            TableKind::FramePointers => 0,
        }
    }

    /// The table in the rows map's layout: packed now, or as it was read.
    pub fn packed(&self) -> std::borrow::Cow<'_, [u64]> {
        match &self.kind {
            TableKind::Rows(rows) => std::borrow::Cow::Owned(crate::pack(rows)),
            TableKind::Packed { words, .. } => std::borrow::Cow::Borrowed(words),
            TableKind::FramePointers => std::borrow::Cow::Borrowed(&[]),
        }
    }
}

/// DWARF register numbers of the architecture: (sp, fp, return address).
fn registers(arch: Arch) -> (Register, Register, Register) {
    match arch {
        Arch::X86_64 => (Register(7), Register(6), Register(16)),
        Arch::Aarch64 => (Register(31), Register(29), Register(30)),
    }
}

/// The architecture of an ELF file, when the unwinder supports it.
pub fn arch_of(file: &object::File) -> Option<Arch> {
    match file.architecture() {
        object::Architecture::X86_64 => Some(Arch::X86_64),
        object::Architecture::Aarch64 => Some(Arch::Aarch64),
        _ => None,
    }
}

/// An ELF image's parts every table needs.
struct Image<'a> {
    file: object::File<'a>,
    arch: Arch,
    text_bytes: u64,
    endian: RunTimeEndian,
}

impl<'a> Image<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, TableError> {
        let file = object::File::parse(data).map_err(TableError::Parse)?;
        let arch = arch_of(&file).ok_or(TableError::UnsupportedArch)?;
        let text_bytes = file
            .sections()
            .filter(|section| section.kind() == object::SectionKind::Text)
            .map(|section| section.size())
            // Sizes come from the file: a hostile one may claim anything (fuzzing).
            .fold(0u64, u64::saturating_add);
        let endian = if file.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        Ok(Image {
            file,
            arch,
            text_bytes,
            endian,
        })
    }

    /// Go keeps frame pointers on amd64 and arm64; its CFI (if any) adds nothing.
    fn is_go(&self) -> bool {
        self.file.section_by_name(".gopclntab").is_some()
            || self.file.section_by_name(".note.go.buildid").is_some()
    }

    /// `.eh_frame`, its bytes and base addresses, when not empty.
    fn eh_frame(&self) -> Option<(EhFrame<EndianSlice<'a, RunTimeEndian>>, BaseAddresses)> {
        let section = self.file.section_by_name(".eh_frame")?;
        let bytes = section.data().ok().filter(|bytes| !bytes.is_empty())?;
        let eh_frame = eh_frame_section(bytes, self.endian, self.arch);
        let mut bases = BaseAddresses::default().set_eh_frame(section.address());
        if let Some(text) = self.file.section_by_name(".text") {
            bases = bases.set_text(text.address());
        }
        if let Some(got) = self.file.section_by_name(".got") {
            bases = bases.set_got(got.address());
        }
        Some((eh_frame, bases))
    }

    /// `.debug_frame`'s bytes, decompressed, when not empty.
    fn debug_frame_bytes(&self) -> Option<std::borrow::Cow<'a, [u8]>> {
        let section = self.file.section_by_name(".debug_frame")?;
        plausible_uncompressed(&section).filter(|bytes| !bytes.is_empty())
    }

    /// The rows of `.debug_frame`'s FDEs that `keep` (see [`collect`]);
    /// false when it has none.
    fn debug_frame_rows(
        &self,
        keep: impl FnMut(&gimli::FrameDescriptionEntry<EndianSlice<'_, RunTimeEndian>>) -> bool,
        end: u8,
        rows: &mut Vec<UnwindRow>,
    ) -> bool {
        let Some(bytes) = self.debug_frame_bytes() else {
            return false;
        };
        let mut debug_frame = DebugFrame::new(&bytes, self.endian);
        debug_frame.set_address_size(8);
        debug_frame.set_vendor(vendor(self.arch));
        collect(
            self.arch,
            &debug_frame,
            &BaseAddresses::default(),
            keep,
            end,
            rows,
        );
        true
    }

    fn table(self, rows: Vec<UnwindRow>) -> UnwindTable {
        UnwindTable {
            arch: self.arch,
            kind: TableKind::Rows(finish(rows)),
            text_bytes: self.text_bytes,
        }
    }

    fn frame_pointers(&self) -> UnwindTable {
        UnwindTable {
            arch: self.arch,
            kind: TableKind::FramePointers,
            text_bytes: self.text_bytes,
        }
    }
}

/// `.eh_frame`'s bytes as gimli reads them for `arch`.
fn eh_frame_section(
    bytes: &[u8],
    endian: RunTimeEndian,
    arch: Arch,
) -> EhFrame<EndianSlice<'_, RunTimeEndian>> {
    let mut eh_frame = EhFrame::new(bytes, endian);
    eh_frame.set_address_size(8);
    eh_frame.set_vendor(vendor(arch));
    eh_frame
}

/// The CFI extensions of `arch`'s compilers. aarch64 code built with
/// return address signing (`-mbranch-protection`: Node.js's own builds,
/// distributions' packages) says `DW_CFA_AARCH64_negate_ra_state` after
/// each `paciasp`; read as the SPARC opcode it shares a number with, it
/// is an error that ended the FDE's rows at its first instruction, and
/// the rest of the function fell to frame pointers, whose caller's stack
/// pointer is wrong for any frame with locals (the walk then read garbage
/// one frame further). The signing state itself changes no rule the
/// walk reads: it strips the code from every return address anyway.
fn vendor(arch: Arch) -> gimli::Vendor {
    match arch {
        Arch::Aarch64 => gimli::Vendor::AArch64,
        Arch::X86_64 => gimli::Vendor::Default,
    }
}

/// Builds the unwind table of an ELF image.
pub fn build(data: &[u8]) -> Result<UnwindTable, TableError> {
    let image = Image::parse(data)?;
    let arch = image.arch;
    let mut rows = Vec::new();
    if let Some((eh_frame, bases)) = image.eh_frame() {
        collect(
            arch,
            &eh_frame,
            &bases,
            |_| true,
            cfa::NOT_COVERED,
            &mut rows,
        );
    }
    if rows.is_empty() {
        image.debug_frame_rows(|_| true, cfa::NOT_COVERED, &mut rows);
    }
    if image.is_go() {
        return Ok(image.frame_pointers());
    }
    add_plt_rows(arch, &image.file, cfa::NOT_COVERED, &mut rows);
    if rows.is_empty() {
        return Err(TableError::NoCfi);
    }
    Ok(image.table(rows))
}

/// End markers: [`cfa::NOT_COVERED`] and [`cfa::NOT_LOADED`], which a
/// function's row at the same address replaces.
fn is_marker(row: &UnwindRow) -> bool {
    row.cfa_rule == cfa::NOT_COVERED || row.cfa_rule == cfa::NOT_LOADED
}

/// The section's bytes, decompressed, unless its header claims a size no
/// real `.debug_frame` has (a few KB claiming gigabytes would be allocated
/// up front: found by fuzzing).
fn plausible_uncompressed<'a>(
    section: &object::Section<'a, '_>,
) -> Option<std::borrow::Cow<'a, [u8]>> {
    const MAX_EXPANSION: u64 = 1024;
    const MAX_BYTES: u64 = 512 << 20;
    let compressed = section.compressed_data().ok()?;
    if compressed.format != object::CompressionFormat::None {
        let limit = (compressed.data.len() as u64)
            .saturating_mul(MAX_EXPANSION)
            .min(MAX_BYTES);
        if compressed.uncompressed_size > limit {
            return None;
        }
    }
    compressed.decompress().ok()
}

/// Rows of the FDEs of `section` that `keep`, each followed by an `end`
/// marker row at its end.
fn collect<'a, S: UnwindSection<EndianSlice<'a, RunTimeEndian>>>(
    arch: Arch,
    section: &S,
    bases: &BaseAddresses,
    mut keep: impl FnMut(&gimli::FrameDescriptionEntry<EndianSlice<'a, RunTimeEndian>>) -> bool,
    end: u8,
    rows: &mut Vec<UnwindRow>,
) {
    let mut ctx = Box::new(UnwindContext::new());
    let mut entries = section.entries(bases);
    // Each FDE names its CIE, which `parse` would read again: a file has
    // a handful of CIEs and tens of thousands of FDEs, and a scan that
    // keeps few of them (`build_sparse`) was mostly CIE parsing.
    let mut cies: Vec<(
        usize,
        gimli::CommonInformationEntry<EndianSlice<'a, RunTimeEndian>>,
    )> = Vec::new();
    loop {
        let entry = match entries.next() {
            Ok(Some(entry)) => entry,
            Ok(None) => break,
            // A damaged entry ends the walk; what came before stays useful.
            Err(_) => break,
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let parsed = partial.parse(|section, bases, offset| {
            let at: usize = gimli::UnwindOffset::into(offset);
            if let Some((_, cie)) = cies.iter().find(|(seen, _)| *seen == at) {
                return Ok(cie.clone());
            }
            let cie = S::cie_from_offset(section, bases, offset)?;
            if cies.len() < 64 {
                cies.push((at, cie.clone()));
            }
            Ok(cie)
        });
        let Ok(fde) = parsed else {
            continue;
        };
        if keep(&fde) {
            fde_rows(arch, section, bases, &mut ctx, &fde, end, rows);
        }
    }
}

/// The rows of one FDE, and an `end` marker row at its end.
fn fde_rows<'a, S: UnwindSection<EndianSlice<'a, RunTimeEndian>>>(
    arch: Arch,
    section: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    fde: &gimli::FrameDescriptionEntry<EndianSlice<'a, RunTimeEndian>>,
    end_rule: u8,
    rows: &mut Vec<UnwindRow>,
) {
    let signal = fde.is_signal_trampoline();
    let Ok(mut table) = fde.rows(section, bases, ctx) else {
        return;
    };
    let mut end = fde.initial_address();
    while let Ok(Some(row)) = table.next_row() {
        let Ok(pc) = u32::try_from(row.start_address()) else {
            break;
        };
        let mut out = convert(arch, section, row.cfa(), |reg| row.register(reg));
        if signal {
            out.cfa_rule = cfa::SIGNAL;
        }
        out.pc = pc;
        push_row(rows, out);
        end = row.end_address();
    }
    if let Ok(end) = u32::try_from(end) {
        rows.push(UnwindRow {
            pc: end,
            cfa_rule: end_rule,
            ..Default::default()
        });
    }
}

/// Adds `row` of an FDE. The function before's end marker at its address
/// loses to it (as [`finish`] would decide): replaced here, so the rows of
/// FDEs in address order stay sorted, and sorting them is one scan (two
/// adjacent functions had made every function a run of its own).
fn push_row(rows: &mut Vec<UnwindRow>, row: UnwindRow) {
    match rows.last_mut() {
        Some(last) if last.pc == row.pc && is_marker(last) => *last = row,
        _ => rows.push(row),
    }
}

/// One CFI row as an [`UnwindRow`] (its `pc` left 0).
fn convert<'a, S: UnwindSection<EndianSlice<'a, RunTimeEndian>>>(
    arch: Arch,
    section: &S,
    cfa_rule: &CfaRule<usize>,
    register: impl Fn(Register) -> Option<RegisterRule<usize>>,
) -> UnwindRow {
    let (sp, fp, ra) = registers(arch);
    let mut out = UnwindRow::default();
    match cfa_rule {
        CfaRule::RegisterAndOffset { register, offset } => {
            match i32::try_from(*offset) {
                Ok(offset) => out.cfa_offset = offset,
                Err(_) => out.cfa_rule = cfa::UNSUPPORTED,
            }
            if out.cfa_rule != cfa::UNSUPPORTED {
                out.cfa_rule = if *register == sp {
                    cfa::SP
                } else if *register == fp {
                    cfa::FP
                } else {
                    cfa::UNSUPPORTED
                };
            }
        }
        CfaRule::Expression(expression) => {
            out.cfa_rule = cfa::UNSUPPORTED;
            if arch == Arch::X86_64
                && let Ok(expression) = expression.get(section)
                && let Some((offset, threshold)) = plt_expression(expression.0.slice())
            {
                out.cfa_rule = cfa::PLT;
                out.cfa_offset = offset;
                out.arg = threshold;
            }
        }
    }
    let (ra_rule, ra_offset) = register_rule(register(ra));
    out.ra_rule = ra_rule;
    out.ra_offset = ra_offset;
    if matches!(register(ra), Some(RegisterRule::Undefined)) {
        out.cfa_rule = cfa::END;
    }
    let (fp_rule, fp_offset) = register_rule(register(fp));
    out.fp_rule = fp_rule;
    out.fp_offset = fp_offset;
    out
}

fn register_rule(rule: Option<RegisterRule<usize>>) -> (u8, i16) {
    match rule {
        None | Some(RegisterRule::SameValue) => (reg::SAME, 0),
        Some(RegisterRule::Offset(offset)) => match i16::try_from(offset) {
            Ok(offset) => (reg::AT_CFA, offset),
            Err(_) => (reg::UNKNOWN, 0),
        },
        Some(_) => (reg::UNKNOWN, 0),
    }
}

/// The CFA expression binutils writes for x86_64 `.plt` entries:
/// `rsp + N + ((rip & 15) >= T) << 3`. Returns (N, T).
pub fn plt_expression(bytes: &[u8]) -> Option<(i32, u8)> {
    // DW_OP_breg7 N; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_litT;
    // DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus
    match bytes {
        [0x77, n, 0x80, 0x00, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22]
            if *n < 0x40 && (0x30..0x50).contains(lit) =>
        {
            Some((*n as i32, lit - 0x30))
        }
        _ => None,
    }
}

/// PLT sections without CFI (`.plt.sec`, `.plt.got`, and aarch64's `.plt`)
/// hold only jumps: the return address is where the call left it.
fn add_plt_rows(arch: Arch, file: &object::File, end_rule: u8, rows: &mut Vec<UnwindRow>) {
    for name in [".plt", ".plt.sec", ".plt.got", ".iplt"] {
        let Some(section) = file.section_by_name(name) else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            u32::try_from(section.address()),
            u32::try_from(section.address().saturating_add(section.size())),
        ) else {
            continue;
        };
        if section.size() == 0 || covered(rows, start) {
            continue;
        }
        let row = match arch {
            Arch::X86_64 => UnwindRow {
                pc: start,
                cfa_rule: cfa::SP,
                cfa_offset: 8,
                ra_rule: reg::AT_CFA,
                ra_offset: -8,
                ..Default::default()
            },
            Arch::Aarch64 => UnwindRow {
                pc: start,
                cfa_rule: cfa::SP,
                cfa_offset: 0,
                ra_rule: reg::SAME,
                ..Default::default()
            },
        };
        rows.push(row);
        rows.push(UnwindRow {
            pc: end,
            cfa_rule: end_rule,
            ..Default::default()
        });
    }
}

fn covered(rows: &[UnwindRow], pc: u32) -> bool {
    // Rows are not sorted yet: any FDE row at exactly this address counts.
    rows.iter().any(|row| row.pc == pc && !is_marker(row))
}

/// Sorts rows, lets a function's first row win over the previous function's
/// end marker at the same address, and merges repeated rules.
fn finish(mut rows: Vec<UnwindRow>) -> Vec<UnwindRow> {
    // Stable: within one address, real rows (pushed before or after) must win
    // over end markers; sort those last and keep the first per address.
    rows.sort_by_key(|row| (row.pc, is_marker(row)));
    rows.dedup_by_key(|row| row.pc);
    // A row that says what the one before it says adds nothing. In place:
    // a compiler's shared library has millions of rows, and a second vector
    // of them was a third of the agent's peak memory while building one.
    rows.dedup_by(|row, kept| {
        UnwindRow {
            pc: row.pc,
            ..*kept
        } == *row
    });
    rows.shrink_to_fit();
    rows
}

/// A loadable segment of an ELF file: what [`vaddr_in`] needs to place a
/// mapping, kept with a cached table so that a file need not be read again
/// to place it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    /// `p_offset` and `p_filesz`.
    pub offset: u64,
    pub size: u64,
    /// `p_vaddr`.
    pub address: u64,
    pub executable: bool,
}

/// Most loadable segments kept per file (linkers write 2 to 5; a file with
/// more is placed by its first ones).
pub const MAX_LOAD_SEGMENTS: usize = 64;

/// The loadable segments of the ELF file `data`, in file order.
pub fn load_segments(data: &[u8]) -> Option<Vec<LoadSegment>> {
    let file = object::File::parse(data).ok()?;
    Some(
        file.segments()
            .take(MAX_LOAD_SEGMENTS)
            .map(|segment| {
                let (offset, size) = segment.file_range();
                LoadSegment {
                    offset,
                    size,
                    address: segment.address(),
                    executable: matches!(
                        segment.flags(),
                        object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0
                    ),
                }
            })
            .collect(),
    )
}

/// The ELF virtual address mapped at `file_offset`, from the loadable
/// segments: `address - (start - this)` is then the ELF address of any
/// address of a mapping that starts at `file_offset`.
///
/// The kernel maps segments from page boundaries, so a mapping's offset can
/// lie before its segment's `p_offset` (inside the previous segment's
/// bytes): executable segments win.
pub fn vaddr_of_offset(data: &[u8], file_offset: u64) -> Option<u64> {
    vaddr_in(&load_segments(data)?, file_offset)
}

/// [`vaddr_of_offset`] from segments found before.
pub fn vaddr_in(segments: &[LoadSegment], file_offset: u64) -> Option<u64> {
    const PAGE: u64 = 4096;
    let mut best = None;
    for segment in segments {
        let (offset, size) = (segment.offset, segment.size);
        let aligned = offset & !(PAGE - 1);
        // Offsets, sizes and addresses come from the file: saturate.
        if !(aligned <= file_offset && file_offset < offset.saturating_add(size.max(1))) {
            continue;
        }
        let vaddr = (segment.address & !(PAGE - 1)).wrapping_add(file_offset - aligned);
        if segment.executable {
            return Some(vaddr);
        }
        best.get_or_insert(vaddr);
    }
    best
}

#[cfg(test)]
mod tests;
