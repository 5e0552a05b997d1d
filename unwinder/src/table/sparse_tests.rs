//! [`build_sparse`] on a real binary: this test's own executable (built
//! with `.eh_frame_hdr`, like nearly every binary a host runs).
use super::*;

/// The row a lookup finds for `pc` in sorted `rows`.
fn row_at(rows: &[UnwindRow], pc: u32) -> Option<UnwindRow> {
    let index = rows.partition_point(|row| row.pc <= pc);
    index.checked_sub(1).map(|index| rows[index])
}

/// Rules only: a sparse table's rows start where its functions start,
/// a whole one's may merge across functions.
fn rules(row: Option<UnwindRow>) -> Option<UnwindRule> {
    row.map(|row| crate::UnwindRule::of(&row))
}

use crate::{Lookup, UnwindRule};

fn own_executable() -> Vec<u8> {
    std::fs::read(std::env::current_exe().unwrap()).unwrap()
}

/// Addresses inside functions with CFI: one row start out of every
/// `every` in the whole table, past its first function.
fn function_pcs(whole: &[UnwindRow], every: usize) -> Vec<u32> {
    whole
        .iter()
        .filter(|row| !is_marker(row) && row.cfa_rule != cfa::SIGNAL)
        .step_by(every)
        .map(|row| row.pc)
        .collect()
}

#[test]
fn a_sparse_table_has_the_rules_of_the_functions_asked_for_and_nothing_else() {
    let data = own_executable();
    let whole = build(&data).unwrap();
    let whole = whole.rows().unwrap();
    let pcs = function_pcs(whole, 997);
    assert!(pcs.len() >= 5, "{} rows", whole.len());
    let sparse = build_sparse(&data, &pcs).unwrap();
    let sparse = sparse.rows().unwrap();
    assert!(
        sparse.len() * 10 < whole.len(),
        "{} sparse rows of {}",
        sparse.len(),
        whole.len()
    );
    // Where asked, and everywhere in the same function after it up to
    // the next row of the whole table: the same rules.
    for &pc in &pcs {
        for at in [pc, pc + 1] {
            let expected = row_at(whole, at).unwrap();
            if at != pc && is_marker(&expected) {
                continue;
            }
            assert_eq!(rules(row_at(sparse, at)), rules(Some(expected)), "{at:#x}");
        }
    }
    // Another function, not asked for: not loaded, so the walk stops there.
    let others = function_pcs(whole, 1);
    let other = others
        .iter()
        .find(|&&pc| {
            !pcs.iter().any(|&asked| {
                let (low, high) = (asked.min(pc), asked.max(pc));
                high - low < 0x1000
            })
        })
        .expect("a function far from every asked one");
    assert_eq!(row_at(sparse, *other).unwrap().cfa_rule, cfa::NOT_LOADED);
    // Below every function, and past the last.
    assert_eq!(sparse[0].pc, 0);
    assert_eq!(sparse[0].cfa_rule, cfa::NOT_LOADED);
    assert_eq!(sparse.last().unwrap().cfa_rule, cfa::NOT_LOADED);
    // Nothing but the functions asked for, and the PLT, is ever a gap
    // (which frame pointers would walk): the rest is to be loaded.
    let gap = sparse.iter().find(|row| row.cfa_rule == cfa::NOT_COVERED);
    assert!(gap.is_none(), "a gap at {gap:x?} in {sparse:#x?}");
}

#[test]
fn a_sparse_table_grows_to_the_whole_tables_rules_where_asked() {
    // Asked for every function start: the same rules as the whole table
    // at every row of it (what the header's search finds is what the
    // scan of every FDE found).
    let data = own_executable();
    let whole = build(&data).unwrap();
    let whole = whole.rows().unwrap();
    let pcs = function_pcs(whole, 1);
    let sparse = build_sparse(&data, &pcs).unwrap();
    for row in whole {
        let found = row_at(sparse.rows().unwrap(), row.pc).unwrap();
        if is_marker(row) {
            assert!(is_marker(&found), "{:#x}: {found:?}", row.pc);
        } else {
            assert_eq!(UnwindRule::of(&found), UnwindRule::of(row), "{:#x}", row.pc);
        }
    }
}

#[test]
fn an_address_no_function_covers_is_a_gap_not_asked_for_again() {
    let data = own_executable();
    // The ELF header's own address: code nowhere near it.
    let sparse = build_sparse(&data, &[0x10]).unwrap();
    let rows = sparse.rows().unwrap();
    assert_eq!(row_at(rows, 0x10).unwrap().cfa_rule, cfa::NOT_COVERED);
    assert_eq!(row_at(rows, 0x11).unwrap().cfa_rule, cfa::NOT_LOADED);
}

#[test]
fn a_not_loaded_row_stops_the_walk_there_without_frame_pointers() {
    struct Table(Vec<UnwindRow>);
    impl crate::Process for Table {
        fn read_u64(&mut self, _address: u64) -> Option<u64> {
            // Frame pointers would find a caller: they must not be tried.
            Some(0x7000)
        }
        fn lookup(&mut self, pc: u64) -> Lookup {
            match row_at(&self.0, pc as u32) {
                Some(row) => Lookup::Row(row),
                None => Lookup::NotCovered,
            }
        }
    }
    let mut table = Table(vec![not_loaded(0)]);
    let mut regs = crate::Regs::interrupted(0x1234, 0x8000, 0x8100, 0);
    let step = crate::step(Arch::X86_64, &mut regs, &mut table);
    assert_eq!(step, crate::Step::Stop(crate::reason::NOT_LOADED));
    assert_eq!(regs.pc, 0x1234);
}

#[test]
fn a_damaged_file_gives_a_sorted_table_or_an_error_never_a_panic() {
    // A tenant's binary is hostile input: bytes of its `.eh_frame_hdr`
    // (the sorted search table) and `.eh_frame` overwritten, one place at
    // a time, as `fuzz/unwind_table` does for whole tables.
    let data = own_executable();
    let whole = build(&data).unwrap();
    let pcs = function_pcs(whole.rows().unwrap(), 499);
    let file = object::File::parse(&*data).unwrap();
    let mut spots = Vec::new();
    for name in [".eh_frame_hdr", ".eh_frame"] {
        let (offset, size) = file.section_by_name(name).unwrap().file_range().unwrap();
        spots.extend((0..64).map(|i| (offset + size * i / 64) as usize));
    }
    for (i, &at) in spots.iter().enumerate() {
        let mut damaged = data.clone();
        for (j, byte) in damaged[at..at + 8].iter_mut().enumerate() {
            *byte = [0xff, 0x00, 0x7f, 0x80][(i + j) % 4];
        }
        if let Ok(table) = build_sparse(&damaged, &pcs) {
            let rows = table.rows().unwrap();
            assert!(
                rows.windows(2).all(|pair| pair[0].pc <= pair[1].pc),
                "rows not sorted after damage at {at:#x}"
            );
        }
    }
}

#[test]
fn a_file_without_a_header_finds_its_functions_through_its_index() {
    // This executable with its `.eh_frame_hdr` renamed away: a file as
    // gcc links static binaries.
    let data = own_executable();
    assert!(fde_index(&data).is_none(), "the header is an index already");
    let mut bare = data.clone();
    let name = b".eh_frame_hdr\0";
    let at = bare
        .windows(name.len())
        .position(|window| window == name)
        .expect("the section's name");
    bare[at + name.len() - 2] = b'X';
    let index = fde_index(&bare).expect("an index of a file without a header");
    let whole = build(&data).unwrap();
    let pcs = function_pcs(whole.rows().unwrap(), 1);
    // One entry per FDE: at least one per function end the whole table
    // marks, at most one per row.
    let fdes = index.bytes() / 12;
    let ends = whole
        .rows()
        .unwrap()
        .iter()
        .filter(|row| is_marker(row))
        .count();
    assert!(
        (ends..=pcs.len()).contains(&fdes),
        "{fdes} FDEs, {ends} ends"
    );
    // Every function asked for: the rules the header's search finds.
    let by_header = build_sparse(&data, &pcs).unwrap();
    let by_index = build_sparse_with(&bare, &pcs, Some(&index)).unwrap();
    assert_eq!(by_index.rows().unwrap(), by_header.rows().unwrap());
    // A few: the same rows as a scan of every FDE finds.
    let few = function_pcs(whole.rows().unwrap(), 997);
    let scanned = build_sparse(&bare, &few).unwrap();
    let indexed = build_sparse_with(&bare, &few, Some(&index)).unwrap();
    assert_eq!(indexed.rows().unwrap(), scanned.rows().unwrap());
    assert!(indexed.rows().unwrap().len() < whole.rows().unwrap().len() / 10);
}
