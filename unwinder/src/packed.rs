//! How a table lies in the kernel's rows map: 8-byte rows (an address and
//! the index of its rule) followed by the table's distinct rules.
//!
//! A 16-byte row repeated the same few rules tens of thousands of times:
//! a binary has a few hundred to a few thousand distinct (CFA, fp, return
//! address) rules. So each table is stored as
//!
//! - `len` rows of one 64-bit word each, [`PackedRow`]: `pc` in the low
//!   half (which the searches read, as a `u32` at the word's address on
//!   these little-endian targets), the rule's index in the high half;
//! - a pad word when `len` is odd, so that every rule starts on an even
//!   word and never straddles a chunk (one map lookup reads it);
//! - the table's distinct rules, two words each ([`UnwindRule`]).
//!
//! The rules live and die with their table (no sharing between tables,
//! so no reference counts: a cached table and an evicted one are whole),
//! and a step costs one more map lookup than a row holding its rule.
//! Words are explicit little-endian bit fields, not a `repr(C)` cast: the
//! host and the kernel agree by construction.
use super::*;

#[cfg(any(test, feature = "std"))]
extern crate std;

/// One row as the rows map holds it: the first address it covers, and the
/// index of its rule among the table's rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackedRow {
    pub pc: u32,
    pub rule: u32,
}

impl PackedRow {
    #[inline(always)]
    pub const fn word(self) -> u64 {
        self.pc as u64 | (self.rule as u64) << 32
    }

    #[inline(always)]
    pub const fn from_word(word: u64) -> Self {
        PackedRow {
            pc: word as u32,
            rule: (word >> 32) as u32,
        }
    }
}

/// A row's rules without its address: what [`UnwindRow`]s share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindRule {
    pub cfa_offset: i32,
    pub fp_offset: i16,
    pub ra_offset: i16,
    pub cfa_rule: u8,
    pub fp_rule: u8,
    pub ra_rule: u8,
    pub arg: u8,
}

/// Words a rule takes in the rows map.
pub const RULE_WORDS: u32 = 2;

impl UnwindRule {
    /// `row`'s rules.
    pub const fn of(row: &UnwindRow) -> Self {
        UnwindRule {
            cfa_offset: row.cfa_offset,
            fp_offset: row.fp_offset,
            ra_offset: row.ra_offset,
            cfa_rule: row.cfa_rule,
            fp_rule: row.fp_rule,
            ra_rule: row.ra_rule,
            arg: row.arg,
        }
    }

    /// The row at `pc` with these rules.
    #[inline(always)]
    pub const fn at(self, pc: u32) -> UnwindRow {
        UnwindRow {
            pc,
            cfa_offset: self.cfa_offset,
            fp_offset: self.fp_offset,
            ra_offset: self.ra_offset,
            cfa_rule: self.cfa_rule,
            fp_rule: self.fp_rule,
            ra_rule: self.ra_rule,
            arg: self.arg,
        }
    }

    /// Offsets in the first word, rule kinds and the PLT threshold in the
    /// low half of the second.
    pub const fn words(self) -> [u64; 2] {
        [
            self.cfa_offset as u32 as u64
                | (self.fp_offset as u16 as u64) << 32
                | (self.ra_offset as u16 as u64) << 48,
            self.cfa_rule as u64
                | (self.fp_rule as u64) << 8
                | (self.ra_rule as u64) << 16
                | (self.arg as u64) << 24,
        ]
    }

    #[inline(always)]
    pub const fn from_words(words: [u64; 2]) -> Self {
        UnwindRule {
            cfa_offset: words[0] as u32 as i32,
            fp_offset: (words[0] >> 32) as u16 as i16,
            ra_offset: (words[0] >> 48) as u16 as i16,
            cfa_rule: words[1] as u8,
            fp_rule: (words[1] >> 8) as u8,
            ra_rule: (words[1] >> 16) as u8,
            arg: (words[1] >> 24) as u8,
        }
    }
}

/// The word where the rules of the table of `len` rows at word `start`
/// begin: after its rows, on an even word.
#[inline(always)]
pub const fn rules_at(start: u32, len: u32) -> u32 {
    let end = start.wrapping_add(len);
    end.wrapping_add(end & 1)
}

/// Words a table of `rows` rows and `rules` distinct rules takes.
pub const fn table_words(rows: usize, rules: usize) -> usize {
    rows + (rows & 1) + rules * RULE_WORDS as usize
}

/// The full row `found` of the table of `len` rows at word `start`:
/// `word` reads one word of the rows map, `rule` the two words of a rule
/// (an even word index: both in one chunk). `None` when either cannot be
/// read.
#[inline(always)]
pub fn packed_row(
    start: u32,
    len: u32,
    found: u32,
    word: impl FnOnce(u32) -> Option<u64>,
    rule: impl FnOnce(u32) -> Option<[u64; 2]>,
) -> Option<UnwindRow> {
    let row = PackedRow::from_word(word(start.wrapping_add(found))?);
    let at = rules_at(start, len).wrapping_add(row.rule.wrapping_mul(RULE_WORDS));
    Some(UnwindRule::from_words(rule(at)?).at(row.pc))
}

/// Rows and their rules in the rows map's layout (host only).
#[cfg(any(test, feature = "std"))]
pub fn pack(rows: &[UnwindRow]) -> std::vec::Vec<u64> {
    use std::{collections::HashMap, vec::Vec};

    // Every row is looked up: SipHash on the rule's six fields was a
    // quarter of a table's load. The rules are the file's, so a hostile
    // one could only slow its own table down.
    let mut ids: HashMap<UnwindRule, u32, foldhash::fast::RandomState> = HashMap::default();
    let mut rules: Vec<UnwindRule> = Vec::new();
    let mut words: Vec<u64> = Vec::with_capacity(rows.len() + 1);
    for row in rows {
        let rule = UnwindRule::of(row);
        let id = *ids.entry(rule).or_insert_with(|| {
            rules.push(rule);
            rules.len() as u32 - 1
        });
        words.push(
            PackedRow {
                pc: row.pc,
                rule: id,
            }
            .word(),
        );
    }
    if words.len() & 1 == 1 {
        words.push(0);
    }
    for rule in &rules {
        words.extend_from_slice(&rule.words());
    }
    debug_assert_eq!(words.len(), table_words(rows.len(), rules.len()));
    words
}

/// Whether `words` hold a table of `len` rows as [`pack`] lays them out:
/// each row's rule within the words ([`unpack`] would succeed).
pub fn packed_rows_valid(words: &[u64], len: usize) -> bool {
    let rules_at = len + (len & 1);
    let Some(rows) = words.get(..len) else {
        return false;
    };
    rows.iter().all(|&word| {
        let rule = PackedRow::from_word(word).rule as usize;
        rule.checked_mul(RULE_WORDS as usize)
            .and_then(|at| at.checked_add(rules_at))
            .and_then(|at| at.checked_add(2))
            .is_some_and(|end| end <= words.len())
    })
}

/// The rows of a table of `len` rows packed by [`pack`]; `None` when the
/// words are not such a table (a rule index past the end).
#[cfg(any(test, feature = "std"))]
pub fn unpack(words: &[u64], len: usize) -> Option<std::vec::Vec<UnwindRow>> {
    let rules_at = len + (len & 1);
    words
        .get(..len)?
        .iter()
        .map(|&word| {
            let row = PackedRow::from_word(word);
            let at = rules_at.checked_add(row.rule as usize * RULE_WORDS as usize)?;
            let rule = words.get(at..at + 2)?;
            Some(UnwindRule::from_words([rule[0], rule[1]]).at(row.pc))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;

    fn rows() -> Vec<UnwindRow> {
        // Every field at its extremes, rules repeated out of order.
        let wide = UnwindRow {
            pc: 0,
            cfa_offset: i32::MIN,
            fp_offset: i16::MIN,
            ra_offset: i16::MAX,
            cfa_rule: cfa::PLT,
            fp_rule: reg::UNKNOWN,
            ra_rule: reg::AT_CFA,
            arg: 0xff,
        };
        let plain = UnwindRow {
            cfa_rule: cfa::SP,
            cfa_offset: 16,
            ra_rule: reg::AT_CFA,
            ra_offset: -8,
            ..Default::default()
        };
        (0..9u32)
            .map(|i| UnwindRow {
                pc: i * 16 + u32::MAX / 2,
                ..[plain, wide, UnwindRow::default()][(i % 3 + i / 4) as usize % 3]
            })
            .collect()
    }

    #[test]
    fn packing_keeps_every_row_and_stores_each_rule_once() {
        let rows = rows();
        let words = pack(&rows);
        // 9 rows, a pad word, 3 distinct rules of 2 words.
        assert_eq!(words.len(), 9 + 1 + 3 * 2);
        assert_eq!(unpack(&words, rows.len()).unwrap(), rows);
        assert!(packed_rows_valid(&words, rows.len()));
        // The kernel's way: at word 512 (a chunk's start) of a map.
        let start = 512;
        for (found, row) in rows.iter().enumerate() {
            let read = |at: u32| words.get(at.checked_sub(start)? as usize).copied();
            let got = packed_row(start, rows.len() as u32, found as u32, read, |at| {
                Some([read(at)?, read(at + 1)?])
            });
            assert_eq!(got, Some(*row), "row {found}");
            // Searches read the pc as the word's low 32 bits.
            assert_eq!(words[found] as u32, row.pc);
        }
    }

    #[test]
    fn an_even_table_has_no_pad_and_rules_start_even() {
        let rows = &rows()[..4];
        let words = pack(rows);
        assert_eq!(words.len(), table_words(4, 3));
        assert_eq!(rules_at(512, 4), 516);
        assert_eq!(rules_at(512, 9), 522);
        assert_eq!(unpack(&words, 4).unwrap(), rows);
    }

    #[test]
    fn a_rule_index_past_the_end_is_refused() {
        let mut words = pack(&rows()[..2]);
        words[1] = PackedRow { pc: 20, rule: 7 }.word();
        assert_eq!(unpack(&words, 2), None);
        assert_eq!(unpack(&words, 40), None);
        assert!(!packed_rows_valid(&words, 2));
        assert!(!packed_rows_valid(&words, 40));
    }
}
