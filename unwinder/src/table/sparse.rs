//! Tables for the code that runs: the rows of the functions asked for,
//! [`cfa::NOT_LOADED`] everywhere else (see [`build_sparse`]).
use super::*;

/// Bytes of CFI an ELF image holds (`.eh_frame`, else `.debug_frame`):
/// what its whole table costs to build, without building it.
pub fn cfi_bytes(data: &[u8]) -> Option<u64> {
    let file = object::File::parse(data).ok()?;
    [".eh_frame", ".debug_frame"]
        .iter()
        .find_map(|name| file.section_by_name(name).map(|section| section.size()))
}

/// Builds a table of an ELF image for the code that runs: the rows of the
/// functions holding `pcs` (ELF virtual addresses) and of the PLT, and
/// [`cfa::NOT_LOADED`] everywhere else, for the walk to stop and the agent
/// to add the function there. A binary has tens of thousands of functions
/// and a busy process runs in a few dozen: its whole table costs a build
/// of every FDE (150 ms of CPU for a 3 MiB interpreter on a saturated
/// host) and 8 bytes a row in the kernel for code that never runs.
///
/// The functions are found through `.eh_frame_hdr`'s sorted table, else
/// by a scan of the FDEs' headers (no CFI evaluated but theirs). An
/// address no FDE covers gets a [`cfa::NOT_COVERED`] row (frame pointers
/// may walk it), so it is not asked for again.
pub fn build_sparse(data: &[u8], pcs: &[u32]) -> Result<UnwindTable, TableError> {
    build_sparse_with(data, pcs, None)
}

/// The FDEs of a file's `.eh_frame` by address, for a file without a
/// usable `.eh_frame_hdr` (gcc links static binaries without one): made
/// once by a scan of the FDEs' headers ([`fde_index`]), it lets every
/// later [`build_sparse_with`] of the file find its functions as the
/// header would, where each had scanned every FDE (a growth of a 20,000
/// function static binary's table, or each frame of a walk that finds the
/// functions a stack needs).
#[derive(Clone, Debug, Default)]
pub struct FdeIndex {
    /// (first address, length, offset in `.eh_frame`), by address.
    fdes: Vec<(u32, u32, u32)>,
}

impl FdeIndex {
    /// Bytes it takes.
    pub fn bytes(&self) -> usize {
        self.fdes.len() * size_of::<(u32, u32, u32)>()
    }

    /// Where the FDE holding `pc` is in `.eh_frame`.
    fn offset_of(&self, pc: u64) -> Option<usize> {
        let after = self
            .fdes
            .partition_point(|&(start, _, _)| u64::from(start) <= pc);
        let &(start, len, offset) = self.fdes.get(after.checked_sub(1)?)?;
        (pc - u64::from(start) < u64::from(len)).then_some(offset as usize)
    }
}

/// The index of `data`'s FDEs, when it has `.eh_frame` and no usable
/// `.eh_frame_hdr` (which is one already).
pub fn fde_index(data: &[u8]) -> Option<FdeIndex> {
    let image = Image::parse(data).ok()?;
    let (eh_frame, bases) = image.eh_frame()?;
    if HeaderTable::of(&image).is_some() {
        return None;
    }
    let mut fdes = Vec::new();
    collect(
        image.arch,
        &eh_frame,
        &bases,
        |fde| {
            let fits = (
                u32::try_from(fde.initial_address()),
                u32::try_from(fde.len()),
                u32::try_from(fde.offset()),
            );
            if let (Ok(start), Ok(len), Ok(offset)) = fits {
                fdes.push((start, len, offset));
            }
            false
        },
        cfa::NOT_LOADED,
        &mut Vec::new(),
    );
    fdes.sort_unstable();
    Some(FdeIndex { fdes })
}

/// [`build_sparse`], its functions found through `index` (of this file's
/// FDEs, [`fde_index`]) when the file has no header.
pub fn build_sparse_with(
    data: &[u8],
    pcs: &[u32],
    index: Option<&FdeIndex>,
) -> Result<UnwindTable, TableError> {
    let image = Image::parse(data)?;
    if image.is_go() {
        return Ok(image.frame_pointers());
    }
    let arch = image.arch;
    let mut rows = vec![not_loaded(0)];
    let mut wanted: Vec<u32> = pcs.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    let wants = |fde_start: u64, fde_len: u64| {
        let first = wanted.partition_point(|&pc| u64::from(pc) < fde_start);
        wanted
            .get(first)
            .is_some_and(|&pc| u64::from(pc) - fde_start < fde_len)
    };
    let found_cfi = if let Some((eh_frame, bases)) = image.eh_frame() {
        // A first table (no function yet) needs no FDE at all.
        let offsets: Option<Box<dyn Fn(u64) -> Option<usize> + '_>> =
            match (HeaderTable::of(&image), index) {
                (Some(header), _) => Some(Box::new(move |pc| header.offset_of(pc))),
                (None, Some(index)) => Some(Box::new(|pc| index.offset_of(pc))),
                (None, None) => None,
            };
        let found = wanted.is_empty()
            || offsets.is_some_and(|offset_of| {
                fdes_rows(arch, &eh_frame, &bases, &wanted, offset_of, &mut rows);
                true
            });
        if !found {
            collect(
                arch,
                &eh_frame,
                &bases,
                |fde| wants(fde.initial_address(), fde.len()),
                cfa::NOT_LOADED,
                &mut rows,
            );
        }
        true
    } else {
        image.debug_frame_rows(
            |fde| !wanted.is_empty() && wants(fde.initial_address(), fde.len()),
            cfa::NOT_LOADED,
            &mut rows,
        )
    };
    if !found_cfi {
        return Err(TableError::NoCfi);
    }
    add_plt_rows(arch, &image.file, cfa::NOT_LOADED, &mut rows);
    // What no function covers: a gap, for frame pointers.
    for &pc in &wanted {
        if !covered_by_fde(&rows, pc) {
            rows.push(UnwindRow {
                pc,
                cfa_rule: cfa::NOT_COVERED,
                ..Default::default()
            });
            rows.push(not_loaded(pc.saturating_add(1)));
        }
    }
    Ok(image.table(rows))
}

/// `.eh_frame_hdr`'s search table as linkers write it: a count
/// (`udata4`), then (first address, FDE address) pairs (`datarel sdata4`,
/// from the header's own address), sorted. Read here with checked
/// arithmetic: gimli's reading of a damaged header (a huge count, an FDE
/// pointer below `.eh_frame`) overflows, a panic where overflow is
/// checked (`cargo xtask fuzz`). Another encoding: no header (an index is
/// made instead, [`fde_index`]).
struct HeaderTable<'a> {
    entries: &'a [u8],
    /// Addresses of `.eh_frame_hdr` and of `.eh_frame`.
    header: u64,
    eh_frame: u64,
    little: bool,
}

impl<'a> HeaderTable<'a> {
    fn of(image: &Image<'a>) -> Option<Self> {
        const DATAREL_SDATA4: u8 = 0x3b;
        const UDATA4: u8 = 0x03;
        let section = image.file.section_by_name(".eh_frame_hdr")?;
        let eh_frame = image.file.section_by_name(".eh_frame")?.address();
        let bytes = section.data().ok()?;
        let (&[version, pointer_enc, count_enc, table_enc], rest) = bytes.split_first_chunk()?;
        if version != 1 || count_enc != UDATA4 || table_enc != DATAREL_SDATA4 {
            return None;
        }
        // eh_frame_ptr, unused: the section header says where .eh_frame is.
        let pointer_bytes = match pointer_enc & 0x0f {
            0x03 | 0x0b => 4,
            0x04 | 0x0c => 8,
            _ => return None,
        };
        let little = matches!(image.endian, RunTimeEndian::Little);
        let (count, table) = rest.get(pointer_bytes..)?.split_first_chunk::<4>()?;
        let count = if little {
            u32::from_le_bytes(*count)
        } else {
            u32::from_be_bytes(*count)
        };
        let entries = table.get(..usize::try_from(count).ok()?.checked_mul(8)?)?;
        (!entries.is_empty()).then_some(HeaderTable {
            entries,
            header: section.address(),
            eh_frame,
            little,
        })
    }

    /// Address `word` of entry `index` holds (0: first address, 1: FDE).
    fn address(&self, index: usize, word: usize) -> Option<u64> {
        let at = index.checked_mul(8)?.checked_add(word * 4)?;
        let bytes: [u8; 4] = self.entries.get(at..at + 4)?.try_into().ok()?;
        let value = if self.little {
            i32::from_le_bytes(bytes)
        } else {
            i32::from_be_bytes(bytes)
        };
        self.header.checked_add_signed(i64::from(value))
    }

    /// Where the FDE for `pc` is in `.eh_frame` (the one starting last at
    /// or below it: the caller checks it holds `pc`).
    fn offset_of(&self, pc: u64) -> Option<usize> {
        let count = self.entries.len() / 8;
        let (mut low, mut high) = (0, count);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.address(mid, 0)? <= pc {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        let fde = self.address(low.checked_sub(1)?, 1)?;
        usize::try_from(fde.checked_sub(self.eh_frame)?).ok()
    }
}

/// The rows of the FDEs holding `wanted`, each found at the offset in
/// `.eh_frame` that `offset_of` gives.
fn fdes_rows<'a>(
    arch: Arch,
    eh_frame: &EhFrame<EndianSlice<'a, RunTimeEndian>>,
    bases: &BaseAddresses,
    wanted: &[u32],
    offset_of: impl Fn(u64) -> Option<usize>,
    rows: &mut Vec<UnwindRow>,
) {
    let mut ctx = Box::new(UnwindContext::new());
    let mut done: Vec<u64> = Vec::new();
    for &pc in wanted {
        let pc = u64::from(pc);
        let Some(offset) = offset_of(pc) else {
            continue;
        };
        let Ok(fde) = eh_frame.fde_from_offset(
            bases,
            gimli::EhFrameOffset(offset),
            EhFrame::cie_from_offset,
        ) else {
            continue;
        };
        if !fde.contains(pc) || done.contains(&fde.initial_address()) {
            continue;
        }
        done.push(fde.initial_address());
        fde_rows(arch, eh_frame, bases, &mut ctx, &fde, cfa::NOT_LOADED, rows);
    }
}

fn not_loaded(pc: u32) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_rule: cfa::NOT_LOADED,
        ..Default::default()
    }
}

/// Whether a function's row (not a marker) covers `pc` in unsorted `rows`.
fn covered_by_fde(rows: &[UnwindRow], pc: u32) -> bool {
    let mut sorted: Vec<&UnwindRow> = rows.iter().filter(|row| row.pc <= pc).collect();
    sorted.sort_by_key(|row| (row.pc, is_marker(row)));
    sorted.last().is_some_and(|row| !is_marker(row))
}

#[cfg(test)]
#[path = "sparse_tests.rs"]
mod tests;
