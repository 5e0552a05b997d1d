//! Tables for the code that runs, on fake kernel maps: this test's own
//! executable (more than [`SPARSE_FROM`] bytes of CFI) mapped by two
//! processes.
use std::sync::Arc;

use hostprof_common::unwind::{self, Lookup, Sorted, cfa};

use super::super::tests::{FakeMaps, OwnExe};
use super::*;
use crate::unwind::early::{self, StackCopy};
use hostprof_unwind::UnwindRow;

const START: u64 = 0x10_0000;

fn whole_file() -> Mapping {
    Mapping {
        start: START,
        end: START + (1 << 30),
        file_offset: 0,
        path: "/x".into(),
        dev: 0,
        inode: 10,
        build_ids: Default::default(),
    }
}

/// What the kernel would find for `pc` in `pid`, from the fake maps.
fn lookup(maps: &FakeMaps, pid: u32, pc: u64) -> Lookup {
    let mappings = maps.processes.get(&pid).expect("loaded");
    let word = |index: u32| {
        let chunk = maps.chunks.get(&(index / ROW_CHUNK as u32))?;
        Some(chunk.0[index as usize % ROW_CHUNK])
    };
    let rule = |index: u32| Some([word(index)?, word(index + 1)?]);
    let search = |what: Sorted, len: u32, target: u64| {
        unwind::search_last_le(len, target, |i| match what {
            Sorted::Mappings => mappings.mappings.get(i as usize).map(|m| m.start),
            Sorted::Rows { start } => word(start + i).map(|word| u64::from(word as u32)),
        })
    };
    unwind::lookup_in(mappings, pc, search, |start, len, found| {
        unwind::packed_row(start, len, found, word, rule)
    })
}

/// Addresses of a few functions of the file, far apart (ELF addresses).
fn functions(data: &[u8]) -> Vec<u32> {
    let whole = table::build(data).unwrap();
    whole
        .rows()
        .unwrap()
        .iter()
        .filter(|row| row.cfa_rule == cfa::SP)
        .step_by(5000)
        .map(|row| row.pc)
        .take(4)
        .collect()
}

#[test]
fn a_large_files_table_grows_by_the_functions_walks_stop_at_in_every_process() {
    let exe: FileData = Arc::new(std::fs::read(std::env::current_exe().unwrap()).unwrap());
    let data: &[u8] = (*exe).as_ref();
    assert!(table::cfi_bytes(data).unwrap() >= SPARSE_FROM);
    let wanted = functions(data);
    assert_eq!(wanted.len(), 4);
    let mut maps = FakeMaps::default();
    let mut files = OwnExe(exe.clone(), 0);
    let mut loader = TableLoader::new(&mut maps, 4096).with_sparse(true);
    for pid in [1, 2] {
        loader
            .load_process(pid, &[whole_file()], &mut files)
            .unwrap();
    }
    let first = loader.stats();
    assert_eq!((first.tables, first.sparse_tables), (1, 1));
    assert!(first.rows < 100, "{} rows before any function", first.rows);
    let (bias, vaddr) = (START, wanted[0]);
    let pc = bias + u64::from(vaddr);
    drop(loader);
    // Not loaded: the walk is to stop there.
    for pid in [1, 2] {
        let Lookup::Row(row) = lookup(&maps, pid, pc) else {
            panic!("no row at all");
        };
        assert_eq!(row.cfa_rule, cfa::NOT_LOADED);
    }

    let mut loader = TableLoader::new(&mut maps, 4096).with_sparse(true);
    for pid in [1, 2] {
        loader
            .load_process(pid, &[whole_file()], &mut files)
            .unwrap();
    }
    // Two walks of process 1 stopped at two functions, one of them twice.
    let pcs: Vec<u64> = [wanted[0], wanted[1], wanted[0]]
        .iter()
        .map(|&vaddr| bias + u64::from(vaddr))
        .collect();
    loader.add_functions(1, &pcs, &[], &mut files);
    let grown = loader.stats();
    assert_eq!(grown.sparse_growths, 1);
    assert_eq!((grown.tables, grown.sparse_tables), (1, 1));
    assert!(grown.rows > first.rows);
    // Asked again (samples taken before the growth landed): nothing to do.
    loader.add_functions(2, &pcs[..1], &[], &mut files);
    assert_eq!(loader.stats().sparse_growths, 1);
    // A function past the file's mapping, or of a process without a
    // sparse table: ignored.
    loader.add_functions(1, &[START - 1], &[], &mut files);
    loader.add_functions(3, &pcs, &[], &mut files);
    assert_eq!(loader.stats().sparse_growths, 1);
    // The next function, asked for by the other process: the file kept
    // from the last growth, not read again.
    let opened = files.1;
    loader.add_functions(2, &[bias + u64::from(wanted[3])], &[], &mut files);
    assert_eq!(loader.stats().sparse_growths, 2);
    assert_eq!(files.1, opened, "the file was read again");
    let used = loader.stats().bytes_used;
    drop(loader);

    let whole = table::build(data).unwrap();
    let whole_rule = |vaddr: u32| {
        let rows = whole.rows().unwrap();
        rows[rows.partition_point(|row| row.pc <= vaddr) - 1]
    };
    for pid in [1, 2] {
        for &vaddr in [wanted[0], wanted[1], wanted[3]].iter() {
            let Lookup::Row(row) = lookup(&maps, pid, bias + u64::from(vaddr)) else {
                panic!("pid {pid}: no row at {vaddr:#x}");
            };
            assert_eq!(
                unwind::UnwindRule::of(&row),
                unwind::UnwindRule::of(&whole_rule(vaddr)),
                "pid {pid} at {vaddr:#x}"
            );
        }
        let Lookup::Row(row) = lookup(&maps, pid, bias + u64::from(wanted[2])) else {
            panic!("no row at all");
        };
        assert_eq!(row.cfa_rule, cfa::NOT_LOADED, "not asked for");
    }
    // The old placement was freed: one table's chunks in use.
    assert!(
        used <= 2 * size_of::<RowChunk>() as u64,
        "{used} bytes in use"
    );
}

#[test]
fn whole_tables_unless_the_loader_is_made_sparse() {
    let exe: FileData = Arc::new(std::fs::read(std::env::current_exe().unwrap()).unwrap());
    let mut maps = FakeMaps::default();
    let mut files = OwnExe(exe, 0);
    let mut loader = TableLoader::new(&mut maps, 16384);
    loader.load_process(1, &[whole_file()], &mut files).unwrap();
    let stats = loader.stats();
    assert_eq!(stats.sparse_tables, 0);
    assert!(stats.rows > 10_000, "{} rows", stats.rows);
    // A pc asked for in a whole table: nothing to grow.
    loader.add_functions(1, &[START + 0x1000], &[], &mut files);
    assert_eq!(loader.stats().sparse_growths, 0);
}

#[test]
fn a_stack_copy_brings_every_function_its_walk_needs_in_one_growth() {
    let exe: FileData = Arc::new(std::fs::read(std::env::current_exe().unwrap()).unwrap());
    let data: &[u8] = (*exe).as_ref();
    let whole = table::build(data).unwrap();
    // Rows of four functions far apart whose caller's frame is found from
    // sp alone: the return address saved at cfa + offset.
    let framed: Vec<UnwindRow> = whole
        .rows()
        .unwrap()
        .iter()
        .filter(|row| {
            row.cfa_rule == cfa::SP
                && row.cfa_offset > 0
                && row.ra_rule == unwind::reg::AT_CFA
                && row.fp_rule != unwind::reg::UNKNOWN
        })
        .step_by(3000)
        .take(4)
        .copied()
        .collect();
    assert_eq!(framed.len(), 4);
    // A stack in which each calls the one before, the leaf in the first,
    // the outermost returning to 0 (the end).
    const SP: u64 = 0x7f00_0000;
    let mut stack = vec![0u8; 64 << 10];
    let mut sp = SP;
    for (at, row) in framed.iter().enumerate() {
        let cfa = sp + row.cfa_offset as u64;
        let ra = framed
            .get(at + 1)
            .map_or(0, |next| START + u64::from(next.pc) + 1);
        let slot = (cfa.wrapping_add_signed(i64::from(row.ra_offset)) - SP) as usize;
        stack[slot..slot + 8].copy_from_slice(&ra.to_le_bytes());
        sp = cfa;
    }
    stack.truncate((sp - SP) as usize + 64);
    let leaf = START + u64::from(framed[0].pc);
    let copy = StackCopy::new([leaf, SP, 0, 0], &stack);

    let mut maps = FakeMaps::default();
    let mut files = OwnExe(exe.clone(), 0);
    let mut loader = TableLoader::new(&mut maps, 4096).with_sparse(true);
    loader.load_process(1, &[whole_file()], &mut files).unwrap();
    // The kernel's walk stopped at the leaf; the copy came with the ask.
    loader.add_functions(1, &[leaf], std::slice::from_ref(&copy), &mut files);
    assert_eq!(loader.stats().sparse_growths, 1, "one growth for the stack");
    drop(loader);
    for row in &framed {
        let Lookup::Row(loaded) = lookup(&maps, 1, START + u64::from(row.pc)) else {
            panic!("no row at {:#x}", row.pc);
        };
        assert_eq!(unwind::UnwindRule::of(&loaded), unwind::UnwindRule::of(row));
    }
    // And the walk the kernel would do now goes through all four.
    let mappings = *maps.processes[&1];
    let read = |index: u32| maps.chunks.get(&index).map(|chunk| **chunk);
    let mut frames = [0u64; 16];
    let (len, _) = early::walk_copy(&mappings, Some(&read), &copy, &mut frames, &mut |_| None);
    let expected: Vec<u64> = std::iter::once(leaf)
        .chain(framed[1..].iter().map(|row| START + u64::from(row.pc) + 1))
        .collect();
    assert_eq!(frames[..len.min(4)], expected[..]);
}

/// Kept files are bounded by count and by bytes, the oldest forgotten
/// first, and the newest is kept however large.
#[test]
fn kept_files_make_room_oldest_first() {
    let kept = |inode: u64, bytes: usize| Kept {
        key: FileKey::Inode {
            dev: 0,
            inode,
            size: 0,
        },
        data: Arc::new(Vec::<u8>::new()),
        index: None,
        bytes,
    };
    let inodes = |growing: &[Kept]| -> Vec<u64> {
        growing
            .iter()
            .map(|kept| match kept.key {
                FileKey::Inode { inode, .. } => inode,
                _ => unreachable!(),
            })
            .collect()
    };
    let mut growing: Vec<Kept> = (1..=3).map(|inode| kept(inode, KEPT_BYTES / 4)).collect();
    make_room(&mut growing, KEPT_BYTES / 4);
    assert_eq!(inodes(&growing), [1, 2, 3], "room enough");
    make_room(&mut growing, KEPT_BYTES / 2);
    assert_eq!(inodes(&growing), [2, 3], "the oldest goes for bytes");
    make_room(&mut growing, KEPT_BYTES * 4);
    assert!(growing.is_empty(), "a file past the bound: kept alone");
    growing = (1..=KEPT_FILES as u64)
        .map(|inode| kept(inode, 1))
        .collect();
    make_room(&mut growing, 1);
    assert_eq!(growing.len(), KEPT_FILES - 1, "and for count");
    assert_eq!(inodes(&growing)[0], 2);
}

#[test]
fn a_marked_piece_keeps_its_mark_when_its_table_grows() {
    let exe: FileData = Arc::new(std::fs::read(std::env::current_exe().unwrap()).unwrap());
    let wanted = functions((*exe).as_ref());
    let mut maps = FakeMaps::default();
    let mut files = OwnExe(exe.clone(), 0);
    let mut loader = TableLoader::new(&mut maps, 4096).with_sparse(true);
    let pc = START + u64::from(wanted[0]);
    let mark = hostprof_common::runtime::mark::CPYTHON;
    loader.set_runtime_code(
        1,
        vec![crate::model::CodeRange::marked(pc - 16, pc + 16, mark)],
    );
    loader.load_process(1, &[whole_file()], &mut files).unwrap();
    loader.add_functions(1, &[pc], &[], &mut files);
    assert_eq!(loader.stats().sparse_growths, 1);
    drop(loader);
    let entries = &maps.processes[&1];
    let pieces = &entries.mappings[..entries.len as usize];
    let marked: Vec<_> = pieces.iter().filter(|piece| piece.mark() == mark).collect();
    assert_eq!(marked.len(), 1);
    assert_eq!((marked[0].start, marked[0].end), (pc - 16, pc + 16));
    // Every piece points at the grown table, which has the function.
    assert!(
        pieces
            .iter()
            .all(|piece| piece.table_start == marked[0].table_start)
    );
    let Lookup::Row(row) = lookup(&maps, 1, pc) else {
        panic!("no row at all");
    };
    assert_ne!(row.cfa_rule, cfa::NOT_LOADED, "the grown rows are found");
}
