//! `.eh_frame` / `.debug_frame` of any mapped binary into the in-kernel
//! unwinder's rows: a hostile ELF must not panic the table builder, and what
//! it accepts must be a table the kernel can binary-search.
#![no_main]

use hostprof_unwind::table::build;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(table) = build(data) {
        let rows = table.rows();
        assert!(
            rows.windows(2).all(|pair| pair[0].pc <= pair[1].pc),
            "rows not sorted by pc"
        );
    }
});
