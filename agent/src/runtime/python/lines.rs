//! Lines of a code object's instructions, from its location table
//! (`co_linetable`, PEP 626, 3.11+ form).
//!
//! A table is decoded once, when its code object is read, into [`Lines`]:
//! the runs of code units on one line, sorted, so that naming a frame is a
//! binary search, not a scan of the table per frame per sample.

/// One entry of a location table: how many code units it covers and their
/// line (`None`: no location).
pub type Entry = (u64, Option<u32>);

/// The entries of `table` for code starting at `first_line`, up to its end
/// or to the first damaged byte. Entries are a header byte `1cccclll` (code
/// `c`, `l + 1` code units) and, by code, a line delta and columns, in
/// 6-bit varints with bit 6 as continuation.
fn entries(table: &[u8], first_line: u32) -> impl Iterator<Item = Entry> + '_ {
    let mut line = i64::from(first_line);
    let mut bytes = table.iter().copied();
    std::iter::from_fn(move || {
        let header = bytes.next()?;
        if header & 0x80 == 0 {
            // Not an entry's first byte: the table is damaged.
            return None;
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
        // Deltas are the tenant's: a line out of range is no line.
        Some((
            units,
            delta.map(|delta| {
                line = line.saturating_add(delta);
                u32::try_from(line).unwrap_or(0)
            }),
        ))
    })
}

fn varint(bytes: &mut impl Iterator<Item = u8>) -> u64 {
    let mut value = 0u64;
    let mut shift = 0;
    for byte in bytes {
        value |= u64::from(byte & 63) << shift;
        shift += 6;
        if byte & 64 == 0 || shift > 60 {
            break;
        }
    }
    value
}

fn signed(value: u64) -> i64 {
    let magnitude = (value >> 1) as i64;
    if value & 1 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// The line of code unit `unit` by scanning `table` (0 when the table says
/// none): the reference [`Lines`] is checked against.
pub fn line_at(table: &[u8], first_line: u32, unit: u64) -> u32 {
    let mut at = 0u64;
    for (units, line) in entries(table, first_line) {
        at += units;
        if unit < at {
            return line.unwrap_or(0);
        }
    }
    0
}

/// The lines of a code object's units: `(first unit, line)` of each run of
/// units on one line (0: none), sorted; past the last run, no line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lines(Box<[(u32, u32)]>);

impl Lines {
    /// Decodes `table` (at most [`super::limits::MAX_LINETABLE_BYTES`] when
    /// read from a process: eight units a byte fit a `u32`).
    pub fn decode(table: &[u8], first_line: u32) -> Lines {
        Lines::from_entries(entries(table, first_line))
    }

    /// The lines of consecutive runs of `(units, line)` from the first unit
    /// (`None`: no line); the table forms of 3.8 to 3.10 give them too.
    pub fn from_entries(entries: impl Iterator<Item = Entry>) -> Lines {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        let mut at = 0u64;
        for (units, line) in entries {
            let (Ok(start), line) = (u32::try_from(at), line.unwrap_or(0)) else {
                break;
            };
            if runs.last().is_none_or(|&(_, last)| last != line) {
                runs.push((start, line));
            }
            at += units;
        }
        // The end: units past it have no line.
        if let Ok(end) = u32::try_from(at)
            && runs.last().is_some_and(|&(_, line)| line != 0)
        {
            runs.push((end, 0));
        }
        Lines(runs.into_boxed_slice())
    }

    /// The line of code unit `unit` (0 when none).
    pub fn line(&self, unit: u64) -> u32 {
        let index = self
            .0
            .partition_point(|&(start, _)| u64::from(start) <= unit);
        index
            .checked_sub(1)
            .and_then(|index| self.0.get(index))
            .map_or(0, |&(_, line)| line)
    }

    /// Bytes held (for the code cache's budget).
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::{Lines, line_at};

    /// Code units 0..2 on the first line (short form), 2..5 one line down
    /// (one-line form, delta 1), 5..6 without location, 6..8 three lines up
    /// (no-column form, delta -3 = varint 7).
    const TABLE: [u8; 8] = [
        0x80 | 1,
        0x05, // short form, 2 units
        0x80 | (11 << 3) | 2,
        4,
        8,                // one-line, delta 1, 3 units
        0x80 | (15 << 3), // no location, 1 unit
        0x80 | (13 << 3) | 1,
        7, // no column, delta -3, 2 units
    ];

    #[test]
    fn location_table_gives_lines() {
        let lines = Lines::decode(&TABLE, 10);
        for (unit, line) in [(0, 10), (1, 10), (4, 11), (5, 0), (7, 8), (8, 0)] {
            assert_eq!(line_at(&TABLE, 10, unit), line, "scan, unit {unit}");
            assert_eq!(lines.line(unit), line, "decoded, unit {unit}");
        }
        assert_eq!(line_at(&[0x12], 10, 0), 0, "damaged table");
        assert_eq!(Lines::decode(&[0x12], 10).line(0), 0, "damaged table");
    }

    #[test]
    fn garbage_never_panics_and_agrees_with_the_scan() {
        // Long forms with huge deltas (varints of all ones), truncated
        // entries, damage in the middle.
        let mut table = Vec::new();
        for round in 0..64u8 {
            table.push(0x80 | (14 << 3) | (round & 7));
            table.extend([0x7f; 12]);
            table.push(round);
            table.push(0x80 | (13 << 3));
            table.push(0x7f ^ round);
        }
        for cut in [0, 1, 7, table.len() / 2, table.len()] {
            let part = &table[..cut];
            let lines = Lines::decode(part, u32::MAX);
            for unit in (0..600).chain([u64::MAX]) {
                assert_eq!(lines.line(unit), line_at(part, u32::MAX, unit));
            }
        }
    }
}
