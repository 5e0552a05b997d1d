//! Code objects read from a Python process: qualified name, file, first
//! line and lines ([`Lines`]), and the fingerprint that tells one object
//! from another put at the same address.
//!
//! Every pointer and length read is the process's: lengths are capped
//! ([`limits`](super::limits)) before they size a read, and pointer plus
//! offset is checked, so a hostile or damaged object is refused, not read.
use std::sync::Arc;

use super::{
    layout::{BYTES_DATA, CodeLayout, LineTable, OB_TYPE, UNICODE_LENGTH, UNICODE_STATE, VAR_SIZE},
    legacy,
    limits::{MAX_LINETABLE_BYTES, MAX_OBJECT_BYTES, MAX_STRING_CHARS, Refusal, offset},
    lines::Lines,
};
use crate::procs::memory::Memory;

/// What the profile shows of a code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    pub qualname: Arc<str>,
    pub filename: Arc<str>,
    pub first_line: u32,
    /// Its location table, decoded.
    pub lines: Lines,
}

impl Code {
    /// Reads the code object at `address`: `Ok(None)` when it is not one
    /// (`ob_type` is not `code_type`) or cannot be read, `Err` when a
    /// length or pointer in it is past a cap.
    pub fn read(
        memory: &impl Memory,
        address: u64,
        code_type: u64,
        layout: &CodeLayout,
    ) -> Result<Option<Code>, Refusal> {
        let field = |at: u64, what| -> Result<Option<u64>, Refusal> {
            Ok(memory.read_u64(offset(address, at, what)?))
        };
        if field(OB_TYPE, "type")? != Some(code_type) {
            return Ok(None);
        }
        let Some(qualname) = field(layout.qualname, "qualname")? else {
            return Ok(None);
        };
        let Some(qualname) = read_str(memory, qualname, layout, "qualname")? else {
            return Ok(None);
        };
        let Some(filename) = field(layout.filename, "filename")? else {
            return Ok(None);
        };
        let Some(filename) = read_str(memory, filename, layout, "filename")? else {
            return Ok(None);
        };
        let first_line = offset(address, layout.firstlineno, "first line")?;
        let Some(first_line) = memory.read_u32(first_line) else {
            return Ok(None);
        };
        let Some(table) = field(layout.linetable, "location table")? else {
            return Ok(None);
        };
        let Some(len) = memory.read_u64(offset(table, VAR_SIZE, "location table")?) else {
            return Ok(None);
        };
        if len > MAX_LINETABLE_BYTES {
            return Err(Refusal::TooLong {
                address,
                what: "location table",
                len,
                cap: MAX_LINETABLE_BYTES,
            });
        }
        let data = offset(table, BYTES_DATA, "location table")?;
        let Some(table) = memory.read_vec(data, len as usize) else {
            return Ok(None);
        };
        Ok(Some(Code {
            qualname: qualname.into(),
            filename: filename.into(),
            first_line,
            lines: match layout.line_table {
                LineTable::Locations => Lines::decode(&table, first_line),
                LineTable::Lnotab => {
                    Lines::from_entries(legacy::lnotab(&table, first_line).into_iter())
                }
                LineTable::Pairs => {
                    Lines::from_entries(legacy::pairs(&table, first_line).into_iter())
                }
            },
        }))
    }

    /// The line of the instruction at byte offset `offset` in the bytecode
    /// (0 when the table says none).
    pub fn line_at(&self, offset: u64) -> u32 {
        self.lines.line(offset / 2)
    }

    /// Bytes held (for the code cache's budget).
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Code>() + self.qualname.len() + self.filename.len() + self.lines.bytes()
    }

    /// A cheap identity of the object at `address`: its type pointer xor
    /// its name, file and table pointers. A code object freed and another
    /// put in its place changes it. One read of at most
    /// [`MAX_OBJECT_BYTES`].
    pub fn fingerprint(memory: &impl Memory, address: u64, layout: &CodeLayout) -> Option<[u8; 8]> {
        let end = layout
            .qualname
            .max(layout.filename)
            .max(layout.linetable)
            .max(OB_TYPE)
            .checked_add(8)
            .filter(|&end| end <= MAX_OBJECT_BYTES)?;
        let bytes = memory.read_vec(address, end as usize)?;
        let at = |offset: u64| {
            let offset = offset as usize;
            let field = bytes.get(offset..offset + 8)?;
            Some(u64::from_le_bytes(field.try_into().ok()?))
        };
        let value = at(OB_TYPE)?
            ^ at(layout.qualname)?
            ^ at(layout.filename)?.rotate_left(17)
            ^ at(layout.linetable)?.rotate_left(31);
        Some(value.to_le_bytes())
    }
}

/// A `str` object's text (compact strings: every string CPython makes for
/// code objects); `Ok(None)` when not one or not readable.
fn read_str(
    memory: &impl Memory,
    address: u64,
    layout: &CodeLayout,
    what: &'static str,
) -> Result<Option<String>, Refusal> {
    let (Some(length), Some(state)) = (
        memory.read_u64(offset(address, UNICODE_LENGTH, what)?),
        memory.read_u32(offset(address, UNICODE_STATE, what)?),
    ) else {
        return Ok(None);
    };
    if length > MAX_STRING_CHARS {
        return Err(Refusal::TooLong {
            address,
            what,
            len: length,
            cap: MAX_STRING_CHARS,
        });
    }
    // state: interned:2, kind:3, compact:1, ascii:1 (low bits first).
    let kind = (state >> 2) & 7;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    if !compact || !matches!(kind, 1 | 2 | 4) {
        return Ok(None);
    }
    let data = offset(
        address,
        if ascii {
            layout.ascii_size
        } else {
            layout.compact_size
        },
        what,
    )?;
    // At most 4 KiB characters of 4 bytes: 16 KiB.
    let Some(bytes) = memory.read_vec(data, (length * u64::from(kind)) as usize) else {
        return Ok(None);
    };
    Ok(Some(match kind {
        1 => bytes.iter().map(|&byte| char::from(byte)).collect(),
        2 => char::decode_utf16(
            bytes
                .chunks_exact(2)
                .map(|pair| u16::from_le_bytes([pair[0], pair[1]])),
        )
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|quad| {
                char::from_u32(u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::Code;
    use crate::{
        procs::memory::Image,
        runtime::python::{
            layout::{self, CodeLayout},
            limits::{MAX_LINETABLE_BYTES, Refusal},
        },
    };

    const BASE: u64 = 0x1000;
    const CODE_TYPE: u64 = 0xc0de;

    fn put(image: &mut [u8], at: u64, value: u64) {
        let at = (at - BASE) as usize;
        image[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    /// A 3.12 code object at `BASE` named `qualname` in `filename`, first
    /// line 10, location table `table` (whose size field says `table_len`).
    fn image(
        qualname: &str,
        filename: &str,
        table: &[u8],
        table_len: u64,
    ) -> (Vec<u8>, CodeLayout) {
        let layout = layout::fixed(12).expect("3.12").code;
        let mut image = vec![0u8; 0x400 + table.len()];
        let (qualname_at, filename_at, table_at) = (BASE + 0x100, BASE + 0x200, BASE + 0x300);
        put(&mut image, BASE + 8, CODE_TYPE);
        put(&mut image, BASE + layout.qualname, qualname_at);
        put(&mut image, BASE + layout.filename, filename_at);
        put(&mut image, BASE + layout.linetable, table_at);
        image[(layout.firstlineno) as usize..][..4].copy_from_slice(&10u32.to_le_bytes());
        for (at, text) in [(qualname_at, qualname), (filename_at, filename)] {
            put(&mut image, at + 16, text.len() as u64);
            // Compact ASCII, kind 1.
            put(&mut image, at + 32, (1 << 6) | (1 << 5) | (1 << 2));
            let data = (at - BASE + layout.ascii_size) as usize;
            image[data..data + text.len()].copy_from_slice(text.as_bytes());
        }
        put(&mut image, table_at + 16, table_len);
        let data = (table_at - BASE + 32) as usize;
        image[data..data + table.len()].copy_from_slice(table);
        (image, layout)
    }

    fn read(image: &[u8], layout: &CodeLayout) -> Result<Option<Code>, Refusal> {
        Code::read(
            &Image {
                base: BASE,
                bytes: image,
            },
            BASE,
            CODE_TYPE,
            layout,
        )
    }

    #[test]
    fn reads_a_code_object() {
        // Two units on line 10, then two one line down.
        let table = [0x80 | 1, 5, 0x80 | (11 << 3) | 1, 4, 8];
        let (image, layout) = image("Class.method", "/app/main.py", &table, 5);
        let code = read(&image, &layout)
            .expect("in range")
            .expect("a code object");
        assert_eq!(&*code.qualname, "Class.method");
        assert_eq!(&*code.filename, "/app/main.py");
        assert_eq!(
            (code.line_at(0), code.line_at(6), code.line_at(8)),
            (10, 11, 0)
        );
        let memory = Image {
            base: BASE,
            bytes: &image,
        };
        assert!(Code::fingerprint(&memory, BASE, &layout).is_some());
        assert_eq!(
            Code::read(&memory, BASE, CODE_TYPE + 1, &layout),
            Ok(None),
            "another type"
        );
    }

    #[test]
    fn line_tables_and_strings_over_their_caps_are_refused() {
        let too_long = |image: &[u8], layout: &CodeLayout| match read(image, layout) {
            Err(Refusal::TooLong { what, .. }) => what,
            other => panic!("{other:?}"),
        };
        let (table_too_long, layout) = image("f", "f.py", &[], MAX_LINETABLE_BYTES + 1);
        assert_eq!(too_long(&table_too_long, &layout), "location table");
        let (mut name_too_long, layout) = image("f", "f.py", &[], 0);
        put(&mut name_too_long, BASE + 0x100 + 16, u64::MAX);
        assert_eq!(too_long(&name_too_long, &layout), "qualname");
    }

    #[test]
    fn pointers_at_the_end_of_the_address_space_are_refused() {
        let (mut image, layout) = image("f", "f.py", &[], 0);
        put(&mut image, BASE + layout.filename, u64::MAX - 8);
        assert!(matches!(
            read(&image, &layout),
            Err(Refusal::Overflow {
                what: "filename",
                ..
            })
        ));
        let memory = Image {
            base: BASE,
            bytes: &image,
        };
        assert!(matches!(
            Code::read(&memory, u64::MAX - 4, CODE_TYPE, &layout),
            Err(Refusal::Overflow { .. })
        ));
        assert_eq!(Code::fingerprint(&memory, u64::MAX - 4, &layout), None);
    }

    #[test]
    fn cyclic_and_garbage_objects_never_panic() {
        // Every pointer to the object itself: its "strings" and "table"
        // are the code object's own bytes.
        let (mut image, layout) = image("f", "f.py", &[], 0);
        for field in [layout.qualname, layout.filename, layout.linetable] {
            put(&mut image, BASE + field, BASE);
        }
        let _ = read(&image, &layout);
        // Pseudo-random images, pointers into the image made likely.
        let mut rng = crate::test_rng::XorShift::new(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let mut garbage = rng.bytes(0x200);
            let state = rng.next_u64();
            put(&mut garbage, BASE + 8, CODE_TYPE);
            for field in [layout.qualname, layout.filename, layout.linetable] {
                put(&mut garbage, BASE + field, BASE + (state % 0x1f8));
            }
            let memory = Image {
                base: BASE,
                bytes: &garbage,
            };
            let _ = Code::fingerprint(&memory, BASE, &layout);
            if let Ok(Some(code)) = read(&garbage, &layout) {
                let _ = code.line_at(state);
            }
        }
    }
}
