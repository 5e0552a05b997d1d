//! The table builder's own tests (the sparse tables': sparse_tests.rs).
use super::*;

fn row(pc: u32, cfa_rule: u8, cfa_offset: i32) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_rule,
        cfa_offset,
        ..Default::default()
    }
}

/// Rows pushed as `collect` pushes them (each FDE's rows, then its end
/// marker) make the same table as all of them sorted, for functions
/// back to back, with a gap, and out of address order.
#[test]
fn end_markers_replaced_while_pushing_make_the_same_table() {
    let fdes: [&[(u32, i32)]; 4] = [
        &[(0x100, 8), (0x104, 24)],
        // Starts where the one before ends.
        &[(0x110, 8), (0x111, 16)],
        // After a gap.
        &[(0x140, 8)],
        // Out of order, ending where the first starts.
        &[(0x0f0, 8), (0x0f8, 32)],
    ];
    let ends = [0x110, 0x140, 0x150, 0x100];
    let (mut naive, mut pushed) = (Vec::new(), Vec::new());
    for (fde, end) in fdes.iter().zip(ends) {
        for &(pc, offset) in *fde {
            naive.push(row(pc, cfa::SP, offset));
            push_row(&mut pushed, row(pc, cfa::SP, offset));
        }
        naive.push(row(end, cfa::NOT_COVERED, 0));
        pushed.push(row(end, cfa::NOT_COVERED, 0));
    }
    assert!(pushed.len() < naive.len());
    let table = finish(pushed);
    assert_eq!(table, finish(naive));
    assert_eq!(
        table.iter().map(|row| row.pc).collect::<Vec<_>>(),
        [0x0f0, 0x0f8, 0x100, 0x104, 0x110, 0x111, 0x140, 0x150]
    );
    assert_eq!(table[4].cfa_rule, cfa::SP);
}

/// `.eh_frame` of one aarch64 function `paciasp; stp x29, x30, [sp,
/// #-16]!; …` at 0x1000, as gcc describes it with
/// `-mbranch-protection=pac-ret`: a CIE (code alignment 4, data
/// alignment -8, return address in x30, absolute pointers; CFA = sp)
/// and its FDE, then the terminator.
const SIGNED_FUNCTION_CFI: &[u8] = &[
    // CIE: length 20, id 0, version 1, "zR", 4, -8, x30, 1 byte of
    // augmentation data (DW_EH_PE_absptr), DW_CFA_def_cfa sp 0, nops.
    20, 0, 0, 0, 0, 0, 0, 0, 1, b'z', b'R', 0, 4, 0x78, 30, 1, 0x00, 0x0c, 31, 0, 0, 0, 0,
    0, //
    // FDE: length 32, CIE 28 bytes back, 0x1000, 0x20 bytes, no
    // augmentation data.
    32, 0, 0, 0, 28, 0, 0, 0, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0,
    // advance 4; DW_CFA_AARCH64_negate_ra_state (after paciasp);
    // advance 4; def_cfa_offset 16; x29 at cfa-16, x30 at cfa-8; nops.
    0x41, 0x2d, 0x41, 0x0e, 16, 0x9d, 2, 0x9e, 1, 0, 0, //
    0, 0, 0, 0,
];

#[test]
fn aarch64_return_address_signing_keeps_the_function_s_rows() {
    let eh_frame = eh_frame_section(SIGNED_FUNCTION_CFI, RunTimeEndian::Little, Arch::Aarch64);
    let mut rows = Vec::new();
    collect(
        Arch::Aarch64,
        &eh_frame,
        &BaseAddresses::default(),
        |_| true,
        cfa::NOT_COVERED,
        &mut rows,
    );
    let table = finish(rows);
    let framed = table
        .iter()
        .find(|row| row.pc == 0x1008)
        .expect("the row after the frame is built");
    assert_eq!(
        (framed.cfa_rule, framed.cfa_offset),
        (cfa::SP, 16),
        "{table:?}"
    );
    assert_eq!((framed.ra_rule, framed.ra_offset), (reg::AT_CFA, -8));
    assert_eq!((framed.fp_rule, framed.fp_offset), (reg::AT_CFA, -16));
    assert_eq!(table.last().map(|row| row.pc), Some(0x1020));
}
