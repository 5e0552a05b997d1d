//! Sparkplug (baseline) code's pcs as bytecode offsets: its code object
//! keeps, where optimized code keeps source positions, a bytecode offset
//! table: one unsigned variable-length integer (7 bits a byte, least
//! significant first, the high bit saying that more follow) per piece of
//! code, the length of that piece in bytes; the first piece is the
//! function's entry, each next one a bytecode, in order. Which bytecode
//! starts where takes their lengths: V8 exports them
//! (`interpreter::Bytecodes::kBytecodeSizes`, bytes, by operand scale), and four
//! prefix bytecodes (`Wide`, `ExtraWide` and their debug-break forms, V8's
//! first four) scale the operands of the bytecode after them.
//!
//! The table and the bytecodes are the tenant's: every integer and step is
//! bounded by the bytes given; a malformed table ends the map where it
//! goes wrong.

use super::positions::read_unsigned;

/// Operand scales V8 has (single, double, quadruple).
const SCALES: usize = 3;
/// Most bytecodes believed (V8 has about two hundred).
const MAX_BYTECODES: usize = 1024;
/// Longest bytecode believed, prefix included.
const MAX_BYTECODE_SIZE: u8 = 64;

/// The length of each bytecode at each operand scale.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BytecodeSizes {
    count: usize,
    sizes: Vec<u8>,
}

impl BytecodeSizes {
    /// From V8's `uint8_t kBytecodeSizes[3][count]`; `None` unless every
    /// size is plausible.
    pub fn new(raw: &[u8]) -> Option<BytecodeSizes> {
        let count = raw.len() / SCALES;
        if count == 0 || count > MAX_BYTECODES || !raw.len().is_multiple_of(SCALES) {
            return None;
        }
        if !raw
            .iter()
            .all(|size| (1..=MAX_BYTECODE_SIZE).contains(size))
        {
            return None;
        }
        let sizes = raw.to_vec();
        Some(BytecodeSizes { count, sizes })
    }

    /// The length of the bytecode at `at` in `bytecodes`, its prefix
    /// included; `None` past the end or for an unknown bytecode.
    fn size(&self, bytecodes: &[u8], at: usize) -> Option<usize> {
        let first = usize::from(*bytecodes.get(at)?);
        let (prefix, scale, bytecode) = match first {
            // Wide, DebugBreakWide: double; ExtraWide, DebugBreakExtraWide:
            // quadruple.
            0 | 2 => (1, 1, usize::from(*bytecodes.get(at + 1)?)),
            1 | 3 => (1, 2, usize::from(*bytecodes.get(at + 1)?)),
            _ => (0, 0, first),
        };
        if bytecode >= self.count {
            return None;
        }
        Some(prefix + usize::from(self.sizes[scale * self.count + bytecode]))
    }
}

/// Baseline code's pieces: each ends at a pc offset and runs a bytecode
/// (offset -1: the function's entry), in pc order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PcMap {
    pieces: Vec<(u64, i64)>,
}

impl PcMap {
    /// Decodes `table` along `bytecodes`; a table running past the
    /// bytecodes, or cut short, keeps the pieces before.
    pub fn decode(table: &[u8], bytecodes: &[u8], sizes: &BytecodeSizes) -> PcMap {
        let mut pieces = Vec::new();
        let mut at = 0;
        let Some(mut end) = read_unsigned(table, &mut at) else {
            return PcMap { pieces };
        };
        pieces.push((end, -1));
        let mut bytecode = 0usize;
        while bytecode < bytecodes.len() {
            let Some(length) = read_unsigned(table, &mut at) else {
                break;
            };
            let Some(next_end) = end.checked_add(length) else {
                break;
            };
            let Some(size) = sizes.size(bytecodes, bytecode) else {
                break;
            };
            end = next_end;
            pieces.push((end, bytecode as i64));
            bytecode += size;
        }
        PcMap { pieces }
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// The bytecode offset the code at `offset` runs: that of the piece
    /// holding it (V8 looks a return address up as the end of its piece,
    /// so the instruction at `offset` is in the piece ending past it).
    pub fn bytecode_offset_at(&self, offset: u64) -> Option<i64> {
        let piece = self.pieces.partition_point(|&(end, _)| end <= offset);
        self.pieces.get(piece).map(|&(_, bytecode)| bytecode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_unsigned(bytes: &mut Vec<u8>, mut value: u64) {
        loop {
            let more = value > 0x7f;
            bytes.push((value & 0x7f) as u8 | if more { 0x80 } else { 0 });
            value >>= 7;
            if !more {
                break;
            }
        }
    }

    /// Bytecodes 0 to 3 are prefixes; 4 is 1 byte (2, 3 scaled), 5 is 3
    /// bytes (5, 9 scaled).
    fn sizes() -> BytecodeSizes {
        BytecodeSizes::new(&[1, 1, 1, 1, 1, 3, 1, 1, 1, 1, 2, 5, 1, 1, 1, 1, 3, 9]).unwrap()
    }

    fn table(lengths: &[u64]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for &length in lengths {
            write_unsigned(&mut bytes, length);
        }
        bytes
    }

    #[test]
    fn pcs_map_to_the_bytecode_their_piece_runs() {
        // Bytecodes: 5 at 0 (3 bytes), Wide 4 at 3 (1 + 2), 4 at 6,
        // ExtraWide 5 at 7 (1 + 9).
        let bytecodes = [5, 0, 0, 0, 4, 0, 4, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0];
        // Entry 10 bytes, then 20, 300, 1, 5.
        let map = PcMap::decode(&table(&[10, 20, 300, 1, 5]), &bytecodes, &sizes());
        assert_eq!(map.len(), 5);
        let at = |offset| map.bytecode_offset_at(offset);
        assert_eq!(at(0), Some(-1));
        assert_eq!(at(9), Some(-1));
        assert_eq!(at(10), Some(0));
        assert_eq!(at(29), Some(0));
        assert_eq!(at(30), Some(3));
        assert_eq!(at(329), Some(3));
        assert_eq!(at(330), Some(6));
        assert_eq!(at(331), Some(7));
        assert_eq!(at(335), Some(7));
        assert_eq!(at(336), None);
    }

    #[test]
    fn hostile_tables_and_bytecodes_end_the_map() {
        let bytecodes = [5, 0, 0, 4, 4, 4];
        let full = table(&[10, 20, 300, 1, 5]);
        // Cut at every byte: the pieces before the cut, never a fault.
        for cut in 0..full.len() {
            let map = PcMap::decode(&full[..cut], &bytecodes, &sizes());
            assert!(map.len() <= 5, "cut at {cut}");
            let _ = map.bytecode_offset_at(u64::MAX);
        }
        assert_eq!(PcMap::decode(&[], &bytecodes, &sizes()).len(), 0);
        // Endless continuation bits: refused past 64 bits.
        let endless = vec![0xffu8; 4096];
        assert_eq!(PcMap::decode(&endless, &bytecodes, &sizes()).len(), 0);
        // Extreme lengths: the sum overflows, the map ends there.
        let map = PcMap::decode(&table(&[u64::MAX, 1, 2]), &bytecodes, &sizes());
        assert_eq!(map.len(), 1);
        assert_eq!(map.bytecode_offset_at(u64::MAX - 1), Some(-1));
        // More pieces than bytecodes: one per bytecode, then it ends.
        let map = PcMap::decode(&table(&[1; 100]), &bytecodes, &sizes());
        assert_eq!(map.len(), 1 + 4);
        // An unknown bytecode, or a prefix at the very end, ends it.
        let map = PcMap::decode(&table(&[1; 10]), &[4, 200, 4], &sizes());
        assert_eq!(map.len(), 2);
        let map = PcMap::decode(&table(&[1; 10]), &[4, 1], &sizes());
        assert_eq!(map.len(), 2);
        // Implausible size tables are refused.
        assert_eq!(BytecodeSizes::new(&[]), None);
        assert_eq!(BytecodeSizes::new(&[1, 2]), None);
        assert_eq!(BytecodeSizes::new(&[1, 0, 1]), None);
        assert_eq!(BytecodeSizes::new(&[1, 65, 1]), None);
        assert_eq!(BytecodeSizes::new(&[1; 3 * 2000]), None);
    }
}
