//! Go function names from `.gopclntab`, which Go binaries keep even when
//! stripped (the runtime needs it for tracebacks).
//!
//! The Go 1.18+ layout: names from the function table ([`functions`]),
//! files and lines from each function's pc-value tables ([`Lines`], used
//! when there is no DWARF, as in binaries linked with `-s -w`). Layout:
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
    fn pc_value_tables_decode_zigzag_value_and_pc_deltas() {
        assert_eq!(varint(&[0x96, 0x01, 7]), Some((150, &[7u8][..])));
        assert_eq!(varint(&[0x80]), None);
        // From entry: +11 (to 10) for 4 bytes, then +2 (to 12) for 3 bytes,
        // then -13 (to -1) for 2, then the end.
        let table = [22u8, 4, 4, 3, 25, 2, 0];
        let lines = Lines {
            data: Arc::from([&[0u8][..], &table[..]].concat()),
            quantum: 1,
            has_start_line: true,
            cu_offset: 0,
            filetab_offset: 0,
            pctab_offset: 0,
            func_data_offset: 0,
            functab: Vec::new(),
        };
        let at = |pc| lines.value_at(1, 0x1000, pc);
        assert_eq!(at(0x1000), Some(10));
        assert_eq!(at(0x1003), Some(10));
        assert_eq!(at(0x1004), Some(12));
        assert_eq!(at(0x1006), Some(12));
        assert_eq!(at(0x1008), Some(-1));
        assert_eq!(at(0x1009), None, "past the table's end");
        assert_eq!(lines.value_at(0, 0x1000, 0x1000), None, "no table");
    }

    #[test]
    fn rejects_other_data() {
        assert!(parse(b"not a pclntab at all", None).is_none());
        let mut truncated = table(0x401000);
        truncated.truncate(100);
        assert!(parse(&truncated, None).is_none());
    }
}

/// File and line lookups in a Go 1.18+ pclntab: each function's `pcfile`
/// and `pcln` tables (varint-encoded value and pc deltas, `runtime/symtab.go`
/// `pcvalue`/`step`). Inlined calls (the `FUNCDATA_InlTree`) are not
/// expanded: the line is the innermost position, named after the function
/// it was inlined into.
pub struct Lines {
    data: Arc<[u8]>,
    quantum: u64,
    /// Go 1.20+: `_func` has `startLine`.
    has_start_line: bool,
    cu_offset: usize,
    filetab_offset: usize,
    pctab_offset: usize,
    func_data_offset: usize,
    /// (start address, `_func` offset), sorted; the last entry is the end.
    functab: Vec<(u64, u32)>,
}

/// Where an address is in Go source.
#[derive(Debug, PartialEq, Eq)]
pub struct GoLine {
    pub file: Arc<str>,
    pub line: u32,
    /// 0 before Go 1.20 (the table does not say).
    pub start_line: u32,
}

impl Lines {
    /// Parses the pclntab of `file`; `None` without a Go 1.18+ one.
    pub fn of(file: &object::File) -> Option<Lines> {
        let data = file.section_by_name(".gopclntab")?.data().ok()?;
        let text = file
            .section_by_name(".text")
            .map(|section| section.address());
        Lines::parse(Arc::from(data), text)
    }

    /// Parses `data`; `text_fallback` is used when the header's text start
    /// is 0.
    pub fn parse(data: Arc<[u8]>, text_fallback: Option<u64>) -> Option<Lines> {
        let magic = u32::from_le_bytes(data.get(..4)?.try_into().ok()?);
        if magic != MAGIC_118 && magic != MAGIC_120 {
            return None;
        }
        let quantum = u64::from(*data.get(6)?);
        let ptr_size = usize::from(*data.get(7)?);
        if (ptr_size != 8 && ptr_size != 4) || quantum == 0 {
            return None;
        }
        let word = |index: usize| -> Option<usize> {
            let at = 8 + index * ptr_size;
            let bytes = data.get(at..at + ptr_size)?;
            let value = match ptr_size {
                8 => u64::from_le_bytes(bytes.try_into().ok()?),
                _ => u64::from(u32::from_le_bytes(bytes.try_into().ok()?)),
            };
            usize::try_from(value).ok()
        };
        let nfunc = word(0)?;
        let text_start = match word(2)? as u64 {
            0 => text_fallback?,
            start => start,
        };
        let func_data_offset = word(7)?;
        let func_data = data.get(func_data_offset..)?;
        let count = nfunc.checked_add(1)?;
        if func_data.len() / 8 < count {
            return None;
        }
        let functab = (0..count)
            .map(|index| {
                let pair = &func_data[index * 8..index * 8 + 8];
                let start = u32::from_le_bytes(pair[..4].try_into().unwrap_or_default());
                let func = u32::from_le_bytes(pair[4..].try_into().unwrap_or_default());
                (text_start.saturating_add(u64::from(start)), func)
            })
            .collect();
        Some(Lines {
            quantum,
            has_start_line: magic == MAGIC_120,
            cu_offset: word(4)?,
            filetab_offset: word(5)?,
            pctab_offset: word(6)?,
            func_data_offset,
            functab,
            data,
        })
    }

    /// Bytes held.
    pub fn estimated_size(&self) -> usize {
        self.data.len() + self.functab.len() * 16
    }

    /// File and line of the code at `address`.
    pub fn lookup(&self, address: u64) -> Option<GoLine> {
        let index = self
            .functab
            .partition_point(|(start, _)| *start <= address)
            .checked_sub(1)?;
        // The last entry only marks the end of the last function.
        if index + 1 >= self.functab.len() {
            return None;
        }
        let (entry, func) = self.functab[index];
        let func = self
            .func_data_offset
            .checked_add(usize::try_from(func).ok()?)?;
        let field = |index: usize| -> Option<u32> {
            let at = func.checked_add(index * 4)?;
            Some(u32::from_le_bytes(
                self.data.get(at..at + 4)?.try_into().ok()?,
            ))
        };
        // _func: entryOff, nameOff, args, deferreturn, pcsp, pcfile, pcln,
        // npcdata, cuOffset, then (Go 1.20+) startLine.
        let (pcfile, pcln, cu) = (field(5)?, field(6)?, field(8)?);
        let start_line = if self.has_start_line {
            u32::try_from(field(9)? as i32).unwrap_or(0)
        } else {
            0
        };
        let file_index = self.value_at(pcfile, entry, address)?;
        let line = self.value_at(pcln, entry, address)?;
        let cu_entry = self.cu_offset.checked_add(
            (usize::try_from(cu).ok()?)
                .checked_add(usize::try_from(file_index).ok()?)?
                .checked_mul(4)?,
        )?;
        let file_offset =
            u32::from_le_bytes(self.data.get(cu_entry..cu_entry + 4)?.try_into().ok()?);
        let name_at = self
            .filetab_offset
            .checked_add(usize::try_from(file_offset).ok()?)?;
        let name = self.data.get(name_at..)?;
        let name = &name[..name.iter().position(|&b| b == 0)?];
        Some(GoLine {
            file: Arc::from(std::str::from_utf8(name).ok()?),
            line: u32::try_from(line).ok()?,
            start_line,
        })
    }

    /// The value a pc-value table (at `offset` in the pctab) holds at
    /// `target`, for a function starting at `entry`.
    fn value_at(&self, offset: u32, entry: u64, target: u64) -> Option<i64> {
        if offset == 0 {
            return None;
        }
        let start = self
            .pctab_offset
            .checked_add(usize::try_from(offset).ok()?)?;
        let mut table = self.data.get(start..)?;
        let mut value: i64 = -1;
        let mut pc = entry;
        let mut first = true;
        loop {
            let (delta, rest) = varint(table)?;
            if delta == 0 && !first {
                return None;
            }
            first = false;
            let delta = if delta & 1 != 0 {
                !((delta >> 1) as i64)
            } else {
                (delta >> 1) as i64
            };
            let (pc_delta, rest) = varint(rest)?;
            table = rest;
            value = value.wrapping_add(delta);
            pc = pc.checked_add(pc_delta.checked_mul(self.quantum)?)?;
            if target < pc {
                return Some(value);
            }
        }
    }
}

/// An unsigned LEB128 varint and what follows it.
fn varint(data: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (index, byte) in data.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, &data[index + 1..]));
        }
    }
    None
}
