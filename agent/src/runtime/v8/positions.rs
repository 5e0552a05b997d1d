//! V8's source position tables: where in a function's source each piece of
//! its code comes from, so a frame names the line being run rather than
//! the line its function starts on.
//!
//! A table is a byte string of entries, each two variable-length integers
//! (7 bits a byte, least significant first, the high bit saying that more
//! follow; zig-zag signed): the code offset's change since the previous
//! entry, negated minus one for an expression's position (a statement's is
//! kept as it is), then the packed `SourcePosition`'s change. Offsets
//! start at -1 (the function's entry) and positions at 0. A packed
//! position is bit 0 "external" (a `.tq`/`.cc` line, for builtins: no
//! JavaScript), bits 1..31 the script offset plus one, bits 31..47 the
//! inlining id plus one (for optimized code).
//!
//! The bytes are the tenant's: a table is decoded at most [`MAX_TABLE`]
//! bytes, and an integer running past the table or past 64 bits ends the
//! decoding with the entries before it.

use super::names::{Heap, small_integer};
use crate::{
    procs::memory::Memory,
    runtime::refusals::{self, Reason, Runtime},
};

/// Longest table decoded (a big function's is a few kilobytes).
pub const MAX_TABLE: usize = 256 << 10;

/// A function's bytecode position table, as read from the heap.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// The table's bytes.
    Table(Vec<u8>),
    /// V8 has not collected the function's source positions (it does so
    /// lazily: for a stack trace, or when a profiler or debugger asks), or
    /// could not.
    Absent,
    /// No bytecode, or an object of the wrong type, or a read failed.
    Unreadable,
}

impl<M: Memory> Heap<'_, M> {
    /// The `BytecodeArray` of the function whose `SharedFunctionInfo` is
    /// at `shared`: its function data, or the one that data holds (an
    /// `InterpreterData`, or baseline code's).
    pub fn bytecode_array(&self, shared: u64) -> Option<u64> {
        let layout = self.layout;
        let mut data = self.field(shared, layout.shared_function_data)?;
        // At most two steps: baseline code → interpreter data → bytecode.
        for _ in 0..3 {
            let kind = self.instance_type(data)?;
            data = if kind == layout.type_bytecode_array {
                return Some(data);
            } else if Some(kind) == layout.type_interpreter_data {
                self.field(data, layout.interpreter_data_bytecode?)?
            } else if Some(kind) == layout.type_code {
                self.field(data, layout.code_bytecode?)?
            } else {
                return None;
            };
        }
        None
    }

    /// The bytecodes of the baseline `Code` at `code` (at most
    /// [`MAX_TABLE`] of them: a bigger function's are not read).
    pub fn code_bytecodes(&self, code: u64) -> Option<Vec<u8>> {
        let layout = self.layout;
        let mut data = self.field(code, layout.code_bytecode?)?;
        if Some(self.instance_type(data)?) == layout.type_interpreter_data {
            data = self.field(data, layout.interpreter_data_bytecode?)?;
        }
        if self.instance_type(data)? != layout.type_bytecode_array {
            return None;
        }
        let length = small_integer(self.word(data.checked_add(layout.array_length)?)?)?;
        let length = usize::try_from(length).ok()?;
        if length > MAX_TABLE {
            refusals::refuse(Runtime::V8, Reason::TooLong);
            return None;
        }
        self.memory
            .read_vec(data.checked_add(layout.bytecode_data)?, length)
    }

    /// The source position table of the `BytecodeArray` at `bytecode`.
    pub fn position_table(&self, bytecode: u64) -> Found {
        self.byte_array_at(bytecode, self.layout.bytecode_positions)
    }

    /// The bytes of the byte array (trusted or not) in field `offset` of
    /// `object` (a source position table: `undefined` until V8 collects
    /// one).
    pub fn byte_array_at(&self, object: u64, offset: u64) -> Found {
        let layout = self.layout;
        let Some(field) = object.checked_add(offset) else {
            return Found::Unreadable;
        };
        let Some(word) = self.word(field) else {
            return Found::Unreadable;
        };
        // `undefined` or an exception marker (oddballs) until collected.
        let Some(table) = super::names::heap_object(word).filter(|&table| {
            let kind = self.instance_type(table);
            kind == Some(layout.type_byte_array) || kind == Some(layout.type_plain_byte_array)
        }) else {
            return Found::Absent;
        };
        let Some(length) = self
            .word(table + layout.array_length)
            .and_then(small_integer)
            .and_then(|length| usize::try_from(length).ok())
        else {
            return Found::Unreadable;
        };
        if length > MAX_TABLE {
            refusals::refuse(Runtime::V8, Reason::TooLong);
            return Found::Unreadable;
        }
        match self.memory.read_vec(table + layout.byte_array_data, length) {
            Some(bytes) => Found::Table(bytes),
            None => Found::Unreadable,
        }
    }
}

/// One entry: from `code_offset` on, the code is at script offset
/// `script_offset` (`None`: an external position, or none known).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub code_offset: i64,
    pub script_offset: Option<u32>,
    pub inlining_id: Option<u16>,
    pub is_statement: bool,
}

/// A decoded table, in code-offset order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    entries: Vec<Entry>,
}

/// Reads one zig-zag variable-length integer at `*at`; `None` past the end
/// of `bytes` or past 64 bits.
fn read_int(bytes: &[u8], at: &mut usize) -> Option<i64> {
    let value = read_unsigned(bytes, at)?;
    Some(((value >> 1) as i64) ^ -((value & 1) as i64))
}

/// Reads one unsigned variable-length integer at `*at` (V8's VLQ: 7 bits a
/// byte, low first); `None` past the end of `bytes` or past 64 bits.
pub(super) fn read_unsigned(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value: u64 = 0;
    let mut shift = 0u32;
    loop {
        let byte = *bytes.get(*at)?;
        *at += 1;
        if shift >= 64 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
}

/// How a table's entries say their code offset's delta and whether they
/// are statements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// V8 13 and older: the delta for a statement, minus it and one for an
    /// expression.
    Signed,
    /// V8 14: the delta shifted up one bit (the bit below it set in every
    /// table read), as is for an expression, minus it and one for a
    /// statement (read from node 26.12.1's tables beside the offsets and
    /// positions `--print-bytecode` shows for them).
    Shifted,
}

impl Encoding {
    /// The encoding of V8 `major`.
    pub fn of(major: u32) -> Encoding {
        if major >= 14 {
            Encoding::Shifted
        } else {
            Encoding::Signed
        }
    }

    /// Whether an entry whose first integer is `value` is a statement, and
    /// its code offset's delta.
    fn split(self, value: i64) -> (bool, i64) {
        let (negative, magnitude) = if value >= 0 {
            (false, value)
        } else {
            (true, -(value + 1))
        };
        match self {
            Encoding::Signed => (!negative, magnitude),
            Encoding::Shifted => (negative, magnitude >> 1),
        }
    }
}

impl Table {
    /// Decodes `bytes` (at most [`MAX_TABLE`] of them). A malformed end
    /// (an integer cut short or too long) drops the entry it is in.
    pub fn decode(bytes: &[u8], encoding: Encoding) -> Table {
        let bytes = &bytes[..bytes.len().min(MAX_TABLE)];
        let mut entries = Vec::new();
        let (mut at, mut code_offset, mut position) = (0usize, -1i64, 0i64);
        while at < bytes.len() {
            let Some(code_delta) = read_int(bytes, &mut at) else {
                break;
            };
            let Some(position_delta) = read_int(bytes, &mut at) else {
                break;
            };
            let (is_statement, delta) = encoding.split(code_delta);
            code_offset = code_offset.saturating_add(delta);
            position = position.wrapping_add(position_delta);
            entries.push(Entry {
                code_offset,
                script_offset: script_offset(position),
                inlining_id: inlining_id(position),
                is_statement,
            });
        }
        Table { entries }
    }

    #[cfg(test)]
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entry for the code at `offset`: the last at or before it.
    pub fn entry_at(&self, offset: i64) -> Option<&Entry> {
        let after = self
            .entries
            .partition_point(|entry| entry.code_offset <= offset);
        self.entries.get(after.checked_sub(1)?)
    }

    /// The script offset of the code at `offset`: that of the last entry
    /// at or before it (statement or expression, as V8's CPU profiler and
    /// its stack traces take it); `None` before the first entry or for an
    /// external position.
    pub fn script_offset_at(&self, offset: i64) -> Option<u32> {
        // V8 writes ascending offsets; a table that is not (the tenant's
        // bytes) gives some entry, never a fault.
        self.entry_at(offset)?.script_offset
    }
}

/// The script offset of packed position `raw`, unless it is external or
/// unknown.
pub(super) fn script_offset(raw: i64) -> Option<u32> {
    let raw = raw as u64;
    if raw & 1 != 0 {
        return None;
    }
    let offset = (raw >> 1) & ((1 << 30) - 1);
    u32::try_from(offset).ok()?.checked_sub(1)
}

/// The inlining id of packed position `raw` (`None`: not inlined).
pub(super) fn inlining_id(raw: i64) -> Option<u16> {
    let id = ((raw as u64) >> 31) & 0xffff;
    u16::try_from(id).ok()?.checked_sub(1)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Writes `value` as V8 does: zig-zag, then 7 bits a byte.
    pub(in crate::runtime::v8) fn write_int(bytes: &mut Vec<u8>, value: i64) {
        let mut encoded = ((value << 1) ^ (value >> 63)) as u64;
        loop {
            let more = encoded > 0x7f;
            bytes.push((encoded & 0x7f) as u8 | if more { 0x80 } else { 0 });
            encoded >>= 7;
            if !more {
                break;
            }
        }
    }

    /// A packed JavaScript position.
    fn packed(script_offset: i64, inlining_id: i64) -> i64 {
        ((script_offset + 1) << 1) | ((inlining_id + 1) << 31)
    }

    /// A table of (code offset, statement?, packed position), as V8's
    /// builder writes it.
    fn table(entries: &[(i64, bool, i64)]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let (mut code, mut position) = (-1i64, 0i64);
        for &(offset, statement, raw) in entries {
            let delta = offset - code;
            write_int(&mut bytes, if statement { delta } else { -delta - 1 });
            write_int(&mut bytes, raw - position);
            (code, position) = (offset, raw);
        }
        bytes
    }

    #[test]
    fn a_table_gives_the_last_position_at_or_before_an_offset() {
        let bytes = table(&[
            (-1, true, packed(10, -1)),
            (0, true, packed(40, -1)),
            (5, false, packed(48, -1)),
            (9, true, packed(300, -1)),
            (200, true, packed(20_000, -1)),
        ]);
        let decoded = Table::decode(&bytes, Encoding::Signed);
        assert_eq!(decoded.entries().len(), 5);
        assert!(decoded.entries()[1].is_statement);
        assert!(!decoded.entries()[2].is_statement);
        assert_eq!(decoded.entries()[4].code_offset, 200);
        assert_eq!(decoded.script_offset_at(-2), None);
        assert_eq!(decoded.script_offset_at(-1), Some(10));
        assert_eq!(decoded.script_offset_at(0), Some(40));
        assert_eq!(decoded.script_offset_at(4), Some(40));
        assert_eq!(decoded.script_offset_at(5), Some(48));
        assert_eq!(decoded.script_offset_at(8), Some(48));
        assert_eq!(decoded.script_offset_at(199), Some(300));
        assert_eq!(decoded.script_offset_at(1 << 40), Some(20_000));
    }

    #[test]
    fn positions_going_back_and_inlined_ones_decode() {
        // Optimized code: positions move back and forth, some inlined.
        let bytes = table(&[
            (3, true, packed(500, -1)),
            (17, false, packed(120, 0)),
            (40, true, packed(90_000, 2)),
            (41, true, packed(7, -1)),
        ]);
        let decoded = Table::decode(&bytes, Encoding::Signed);
        let offsets: Vec<_> = decoded.entries().iter().map(|e| e.script_offset).collect();
        assert_eq!(offsets, [Some(500), Some(120), Some(90_000), Some(7)]);
        let inlined: Vec<_> = decoded.entries().iter().map(|e| e.inlining_id).collect();
        assert_eq!(inlined, [None, Some(0), Some(2), None]);
    }

    #[test]
    fn external_and_unknown_positions_have_no_script_offset() {
        let external = (123 << 1) | 1;
        let bytes = table(&[(0, true, external), (4, true, 0), (8, true, packed(0, -1))]);
        let decoded = Table::decode(&bytes, Encoding::Signed);
        assert_eq!(decoded.script_offset_at(0), None);
        assert_eq!(decoded.script_offset_at(4), None);
        assert_eq!(decoded.script_offset_at(8), Some(0));
    }

    #[test]
    fn a_truncated_table_keeps_the_entries_before_the_cut() {
        let bytes = table(&[(0, true, packed(40, -1)), (9, true, packed(3_000_000, -1))]);
        // Every cut inside the second entry (its position's delta takes
        // several bytes) drops it and keeps the first.
        let first = table(&[(0, true, packed(40, -1))]).len();
        for cut in first..bytes.len() {
            let decoded = Table::decode(&bytes[..cut], Encoding::Signed);
            assert_eq!(decoded.entries().len(), 1, "cut at {cut}");
            assert_eq!(decoded.script_offset_at(100), Some(40));
        }
        assert!(Table::decode(&[], Encoding::Signed).is_empty());
        // A lone continuation byte.
        assert!(Table::decode(&[0x80], Encoding::Signed).is_empty());
    }

    #[test]
    fn hostile_tables_end_without_fault() {
        // An integer whose continuation bits never stop: past 64 bits it
        // is refused.
        let endless = vec![0xffu8; 4096];
        assert!(Table::decode(&endless, Encoding::Signed).is_empty());
        // Largest deltas, again and again: offsets saturate, positions
        // wrap, nothing panics.
        let mut bytes = Vec::new();
        for _ in 0..1000 {
            write_int(&mut bytes, i64::MAX);
            write_int(&mut bytes, i64::MIN);
        }
        let decoded = Table::decode(&bytes, Encoding::Signed);
        assert_eq!(decoded.entries().len(), 1000);
        assert_eq!(decoded.entries()[999].code_offset, i64::MAX);
        let _ = decoded.script_offset_at(0);
        let _ = decoded.script_offset_at(i64::MAX);
        // Descending offsets (never V8's): some answer, no fault.
        let bytes = table(&[(50, true, packed(1, -1)), (10, false, packed(2, -1))]);
        let _ = Table::decode(&bytes, Encoding::Signed).script_offset_at(20);
        // Longer than the cap: only the first MAX_TABLE bytes are read.
        let mut long = Vec::new();
        while long.len() <= MAX_TABLE {
            long.extend(table(&[(0, true, packed(1, -1))]));
        }
        let decoded = Table::decode(&long, Encoding::Signed);
        assert!(decoded.entries().len() <= MAX_TABLE / 2);
    }

    /// The statements of `hex`'s table: (code offset, script offset).
    fn statements(hex: &str, encoding: Encoding) -> Vec<(i64, Option<u32>)> {
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).unwrap())
            .collect();
        let table = Table::decode(&bytes, encoding);
        let entries = table.entries().iter();
        let statements = entries.filter(|entry| entry.is_statement);
        statements
            .map(|entry| (entry.code_offset, entry.script_offset))
            .collect()
    }

    #[test]
    fn node_26s_tables_shift_the_code_offset_and_flip_the_statement_sign() {
        // One function's bytecode position table, read from node 24.22.3
        // and 26.12.1 (`hot` of two loops, --jitless); the statements
        // are where `--print-bytecode` shows them (26's comparisons are a
        // byte longer).
        const NODE_24: &str = "01340240044804140510070f0a40052c070f072416570b6f08b80204140510\
                               070f0a40052c070f072416570b6f0884020424";
        const NODE_26: &str = "023407400b480b140a100e0f1b400a2c0e0f0e242f57166f13b8020b140a10\
                               0e0f1b400a2c0e0f0e242f57166f1384020b24";
        let at = |offsets: [i64; 11]| {
            let script = [28, 46, 51, 67, 61, 111, 116, 132, 126, 163, 172];
            offsets
                .into_iter()
                .zip(script.map(Some))
                .collect::<Vec<_>>()
        };
        let node_24 = at([0, 2, 4, 14, 33, 42, 44, 54, 73, 82, 84]);
        let node_26 = at([0, 2, 4, 15, 34, 43, 45, 56, 75, 84, 86]);
        assert_eq!(statements(NODE_24, Encoding::of(13)), node_24);
        assert_eq!(statements(NODE_26, Encoding::of(14)), node_26);
        assert_ne!(statements(NODE_26, Encoding::of(13)), node_26);
    }
}
