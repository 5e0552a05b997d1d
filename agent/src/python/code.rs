//! Code objects read from a Python process: qualified name, file, first
//! line and location table, and the line of an instruction.
use std::sync::Arc;

use super::layout::{BYTES_DATA, CodeLayout, OB_TYPE, UNICODE_LENGTH, UNICODE_STATE, VAR_SIZE};
use crate::runtime::memory;

/// Longest string read (names, paths).
const MAX_STRING_BYTES: u64 = 4096;
/// Longest location table read.
const MAX_LINETABLE_BYTES: u64 = 1 << 20;

/// What the profile shows of a code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    pub qualname: Arc<str>,
    pub filename: Arc<str>,
    pub first_line: u32,
    /// `co_linetable`: the PEP 626 location table (3.11+ form).
    pub linetable: Vec<u8>,
}

impl Code {
    /// Reads the code object at `address` of process `pid`; `None` when it
    /// is not one (`ob_type` is not `code_type`) or cannot be read.
    pub fn read(pid: u32, address: u64, code_type: u64, layout: &CodeLayout) -> Option<Code> {
        if memory::read_u64(pid, address + OB_TYPE)? != code_type {
            return None;
        }
        let field = |offset: u64| memory::read_u64(pid, address + offset);
        let qualname = read_str(pid, field(layout.qualname)?, layout)?;
        let filename = read_str(pid, field(layout.filename)?, layout)?;
        let first_line = memory::read_u32(pid, address + layout.firstlineno)?;
        let table = field(layout.linetable)?;
        let len = memory::read_u64(pid, table + VAR_SIZE)?.min(MAX_LINETABLE_BYTES);
        let linetable = memory::read_vec(pid, table + BYTES_DATA, len as usize)?;
        Some(Code {
            qualname: qualname.into(),
            filename: filename.into(),
            first_line,
            linetable,
        })
    }

    /// The line of the instruction at byte offset `offset` in the bytecode
    /// (0 when the table says none).
    pub fn line_at(&self, offset: u64) -> u32 {
        line_at(&self.linetable, self.first_line, offset / 2)
    }
}

/// A `str` object's text (compact strings: every string CPython makes for
/// code objects).
fn read_str(pid: u32, address: u64, layout: &CodeLayout) -> Option<String> {
    let length = memory::read_u64(pid, address + UNICODE_LENGTH)?.min(MAX_STRING_BYTES);
    let state = memory::read_u32(pid, address + UNICODE_STATE)?;
    // state: interned:2, kind:3, compact:1, ascii:1 (low bits first).
    let kind = (state >> 2) & 7;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact {
        return None;
    }
    let data = address
        + if ascii {
            layout.ascii_size
        } else {
            layout.compact_size
        };
    let bytes = memory::read_vec(pid, data, (length * u64::from(kind.max(1))) as usize)?;
    Some(match kind {
        1 => bytes.iter().map(|&byte| char::from(byte)).collect(),
        2 => char::decode_utf16(
            bytes
                .chunks_exact(2)
                .map(|pair| u16::from_le_bytes([pair[0], pair[1]])),
        )
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect(),
        4 => bytes
            .chunks_exact(4)
            .map(|quad| {
                char::from_u32(u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
        _ => return None,
    })
}

/// The line of code unit `unit` by the location table (3.11+): entries of
/// a header byte `1cccclll` (code `c`, `l + 1` code units) and, by code,
/// a line delta and columns, in 6-bit varints with bit 6 as continuation.
pub fn line_at(table: &[u8], first_line: u32, unit: u64) -> u32 {
    let mut line = i64::from(first_line);
    let mut at = 0u64;
    let mut bytes = table.iter().copied().peekable();
    let varint = |bytes: &mut std::iter::Peekable<std::iter::Copied<std::slice::Iter<u8>>>| {
        let mut value = 0u64;
        let mut shift = 0;
        for byte in bytes.by_ref() {
            value |= u64::from(byte & 63) << shift;
            shift += 6;
            if byte & 64 == 0 || shift > 60 {
                break;
            }
        }
        value
    };
    while let Some(header) = bytes.next() {
        if header & 0x80 == 0 {
            // Not an entry's first byte: the table is damaged.
            return 0;
        }
        let code = (header >> 3) & 15;
        let units = u64::from(header & 7) + 1;
        let delta = match code {
            // No location.
            15 => None,
            // Long form: line delta (signed), end line, column, end column.
            14 => {
                let delta = signed(varint(&mut bytes));
                for _ in 0..3 {
                    varint(&mut bytes);
                }
                Some(delta)
            }
            // No column: line delta only.
            13 => Some(signed(varint(&mut bytes))),
            // One-line forms: delta 0, 1 or 2, then two column bytes.
            10..=12 => {
                bytes.next();
                bytes.next();
                Some(i64::from(code) - 10)
            }
            // Short forms: same line, one column byte.
            _ => {
                bytes.next();
                Some(0)
            }
        };
        if let Some(delta) = delta {
            line += delta;
        }
        if unit < at + units {
            return if delta.is_some() {
                u32::try_from(line).unwrap_or(0)
            } else {
                0
            };
        }
        at += units;
    }
    0
}

fn signed(value: u64) -> i64 {
    if value & 1 != 0 {
        -((value >> 1) as i64)
    } else {
        (value >> 1) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::line_at;

    #[test]
    fn location_table_gives_lines() {
        // Code units 0..2 on the first line (short form), 2..5 one line
        // down (one-line form, delta 1), 5..6 without location, 6..8 three
        // lines up (no-column form, delta -3 = varint 7).
        let table = [
            0x80 | 1,
            0x05, // short form, 2 units
            0x80 | (11 << 3) | 2,
            4,
            8,                // one-line, delta 1, 3 units
            0x80 | (15 << 3), // no location, 1 unit
            0x80 | (13 << 3) | 1,
            7, // no column, delta -3, 2 units
        ];
        assert_eq!(line_at(&table, 10, 0), 10);
        assert_eq!(line_at(&table, 10, 1), 10);
        assert_eq!(line_at(&table, 10, 4), 11);
        assert_eq!(line_at(&table, 10, 5), 0);
        assert_eq!(line_at(&table, 10, 7), 8);
        assert_eq!(line_at(&table, 10, 8), 0);
        assert_eq!(line_at(&[0x12], 10, 0), 0, "damaged table");
    }
}
