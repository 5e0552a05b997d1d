//! Go function names from `.gopclntab`, which Go binaries keep even when
//! stripped (the runtime needs it for tracebacks).
//!
//! Only the header and the function table of the Go 1.18+ layout are read:
//! names, not lines (DWARF gives lines when present). Layout:
//! `runtime/symtab.go` (`pcHeader`, `functab`, `_func`) in the Go sources.
use std::sync::Arc;

use object::{Object, ObjectSection};

/// Go 1.18 and 1.19.
const MAGIC_118: u32 = 0xffff_fff0;
/// Go 1.20 and later.
const MAGIC_120: u32 = 0xffff_fff1;

/// Reads the Go function table of `file` as (start, size, name), sorted by
/// start; `None` when the file has no Go 1.18+ pclntab.
pub fn functions(file: &object::File) -> Option<Vec<(u64, u64, Arc<str>)>> {
    let data = file.section_by_name(".gopclntab")?.data().ok()?;
    // The header's textStart is relocated at load time in position-independent
    // binaries and then reads 0 on disk; `.text` is where Go puts runtime.text.
    let text = file
        .section_by_name(".text")
        .map(|section| section.address());
    parse(data, text)
}

/// Parses a pclntab; `text_fallback` is used when the header's text start is 0.
pub fn parse(data: &[u8], text_fallback: Option<u64>) -> Option<Vec<(u64, u64, Arc<str>)>> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            data.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
    };
    let magic = u32_at(0)?;
    if magic != MAGIC_118 && magic != MAGIC_120 {
        return None;
    }
    let ptr_size = usize::from(*data.get(7)?);
    if ptr_size != 8 && ptr_size != 4 {
        return None;
    }
    let word = |index: usize| -> Option<u64> {
        let at = 8 + index * ptr_size;
        let bytes = data.get(at..at + ptr_size)?;
        Some(match ptr_size {
            8 => u64::from_le_bytes(bytes.try_into().ok()?),
            _ => u64::from(u32::from_le_bytes(bytes.try_into().ok()?)),
        })
    };
    let nfunc = usize::try_from(word(0)?).ok()?;
    let text_start = match word(2)? {
        0 => text_fallback?,
        start => start,
    };
    let funcname_offset = usize::try_from(word(3)?).ok()?;
    let func_data_offset = usize::try_from(word(7)?).ok()?;
    let names = data.get(funcname_offset..)?;
    let func_data = data.get(func_data_offset..)?;
    // functab: nfunc+1 pairs of (entry offset from text start, _func offset),
    // the last entry holding the end of the last function.
    let entry = |index: usize| -> Option<(u32, u32)> {
        let at = index.checked_mul(8)?;
        let pair = func_data.get(at..at + 8)?;
        Some((
            u32::from_le_bytes(pair[..4].try_into().ok()?),
            u32::from_le_bytes(pair[4..].try_into().ok()?),
        ))
    };
    // nfunc comes from the file: never reserve more than the table can hold.
    let mut functions = Vec::with_capacity(nfunc.min(func_data.len() / 8));
    for index in 0..nfunc {
        let (start, func_offset) = entry(index)?;
        let (end, _) = entry(index + 1)?;
        // _func starts with entryOff (u32) then nameOff (i32).
        let name_at = usize::try_from(func_offset).ok()?.checked_add(4)?;
        let name_offset = func_data.get(name_at..name_at + 4)?;
        let name_offset = usize::try_from(i32::from_le_bytes(name_offset.try_into().ok()?)).ok()?;
        let name = names.get(name_offset..)?;
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        // A start past the end of the address space is not a function.
        let Some(start_address) = text_start.checked_add(u64::from(start)) else {
            continue;
        };
        functions.push((
            start_address,
            u64::from(end.saturating_sub(start)),
            Arc::from(name),
        ));
    }
    functions.sort_unstable_by_key(|(start, _, _)| *start);
    Some(functions)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built Go 1.20 pclntab with two functions.
    fn table(text_start: u64) -> Vec<u8> {
        let mut data = Vec::new();
        data.extend(MAGIC_120.to_le_bytes());
        data.extend([0, 0, 1, 8]);
        // nfunc, nfiles, textStart, funcnameOffset, cuOffset, filetabOffset,
        // pctabOffset, pclnOffset.
        let header_end = 8 + 8 * 8;
        let names = b"main.main\0main.helper\0";
        let func_data_offset = header_end + names.len();
        for value in [
            2,
            0,
            text_start,
            header_end as u64,
            0,
            0,
            0,
            func_data_offset as u64,
        ] {
            data.extend(value.to_le_bytes());
        }
        data.extend(names);
        // functab: 3 entries (2 functions + end), then two _func records.
        let funcs_at = 3 * 8u32;
        for (entry, func) in [(0x0u32, funcs_at), (0x40, funcs_at + 8), (0x100, 0)] {
            data.extend(entry.to_le_bytes());
            data.extend(func.to_le_bytes());
        }
        for (entry, name) in [(0x0u32, 0i32), (0x40, 10)] {
            data.extend(entry.to_le_bytes());
            data.extend(name.to_le_bytes());
        }
        data
    }

    #[test]
    fn reads_names_and_extents() {
        let functions = parse(&table(0x401000), None).unwrap();
        assert_eq!(functions.len(), 2);
        assert_eq!(functions[0], (0x401000, 0x40, Arc::from("main.main")));
        assert_eq!(functions[1], (0x401040, 0xc0, Arc::from("main.helper")));
    }

    #[test]
    fn zero_text_start_uses_the_text_section() {
        let functions = parse(&table(0), Some(0x1000)).unwrap();
        assert_eq!(functions[1].0, 0x1040);
        assert!(parse(&table(0), None).is_none());
    }

    /// Found by fuzzing: header fields past what the data can hold.
    #[test]
    fn hostile_header_fields_do_not_panic() {
        // A text start so high that function addresses would wrap.
        let functions = parse(&table(u64::MAX - 0x10), None).unwrap();
        assert_eq!(functions.len(), 1);
        assert_eq!(functions[0].0, u64::MAX - 0x10);
        // A function count far beyond the table: no huge reservation, and
        // the table's end stops the parse.
        let mut data = table(0x401000);
        data[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&data, None).is_none());
    }

    #[test]
    fn rejects_other_data() {
        assert!(parse(b"not a pclntab at all", None).is_none());
        let mut truncated = table(0x401000);
        truncated.truncate(100);
        assert!(parse(&truncated, None).is_none());
    }
}
