//! `.eh_frame` / `.debug_frame` of any mapped binary into the in-kernel
//! unwinder's rows: a hostile ELF must not panic the table builder, and what
//! it accepts must be a table the kernel can binary-search. The same for
//! tables for the code that runs (found through `.eh_frame_hdr`, a scan, or
//! the index of a header-less file's FDEs), at addresses the whole table
//! names and one it may not.
#![no_main]

use hostprof_unwind::table::{UnwindTable, build, build_sparse, build_sparse_with, fde_index};
use libfuzzer_sys::fuzz_target;

fn assert_sorted(table: &UnwindTable) {
    let rows = table.rows().expect("built from CFI, not read from the cache");
    assert!(
        rows.windows(2).all(|pair| pair[0].pc <= pair[1].pc),
        "rows not sorted by pc"
    );
}

fuzz_target!(|data: &[u8]| {
    let whole = build(data).ok();
    let mut pcs: Vec<u32> = whole
        .iter()
        .flat_map(|table| table.rows().unwrap_or_default().iter().step_by(7).map(|row| row.pc))
        .take(64)
        .collect();
    pcs.push(0x1000);
    if let Some(table) = &whole {
        assert_sorted(table);
    }
    if let Ok(table) = build_sparse(data, &pcs) {
        assert_sorted(&table);
    }
    if let Some(index) = fde_index(data)
        && let Ok(table) = build_sparse_with(data, &pcs, Some(&index))
    {
        assert_sorted(&table);
    }
});
