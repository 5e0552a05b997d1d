//! A code object's location table (`co_linetable`, `runtime/python/lines.rs`):
//! decoded once into line runs, which must agree with a scan of the table
//! at every code unit looked at, and hold no more than the table's entries.
#![no_main]

use hostprof::runtime::python::{Lines, line_at};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First four bytes: the code object's first line; the rest: the table.
    let Some((first_line, table)) = data.split_first_chunk::<4>() else {
        return;
    };
    let first_line = u32::from_le_bytes(*first_line);
    let lines = Lines::decode(table, first_line);
    // A run per entry at most, and the end.
    assert!(lines.bytes() <= (table.len() + 1) * 8);
    // Each unit up to 64, then about 256 more across the table (eight units
    // a byte at most) and past its end: the scan is linear, keep it cheap.
    let units = table.len() as u64 * 8 + 2;
    let stride = (units / 256).max(1);
    let looked_at = (0..64).chain((64..units).step_by(stride as usize));
    for unit in looked_at.chain([units, u64::MAX]) {
        assert_eq!(
            lines.line(unit),
            line_at(table, first_line, unit),
            "unit {unit}"
        );
    }
});
