//! [`step`] on synthetic stacks: a fake process whose memory, mappings and
//! rows each test lays out by hand, so every rule and every way an unwind
//! stops is checked on the host without a kernel.
//! (The searches' own tests are in `search.rs`.)
extern crate std;

use std::{collections::HashMap, vec, vec::Vec};

use super::*;

mod signal;

/// Where the fake process's code is mapped; ELF virtual addresses are the
/// runtime addresses minus `BIAS`.
const MAP_START: u64 = 0x55_0000_0000;
const MAP_END: u64 = MAP_START + 0x10_0000;
const BIAS: u64 = MAP_START - 0x1000;
/// A table-less mapping, then one that keeps frame pointers.
const NO_TABLE_START: u64 = 0x56_0000_0000;
const FP_START: u64 = 0x57_0000_0000;
const MAPPING_LEN: u64 = 0x1_0000;
/// Where the stacks of these tests live.
const STACK: u64 = 0x7ffd_0000_0000;

/// Runtime address of the ELF virtual address `vaddr` in the main mapping.
const fn at(vaddr: u32) -> u64 {
    vaddr as u64 + BIAS
}

/// A process made of byte-addressed memory, three mappings (a table, none,
/// frame pointers) and the first one's table, packed as in the kernel's
/// rows map.
struct Fake {
    memory: HashMap<u64, u8>,
    mappings: ProcessMappings,
    /// [`pack`]ed rows, from word 0.
    words: Vec<u64>,
    /// Every pc [`Process::lookup`] was asked about.
    lookups: Vec<u64>,
    /// The mark of each lookup's mapping.
    marks: Vec<u32>,
}

impl Fake {
    /// `rows` sorted by pc, for the main mapping.
    fn new(rows: Vec<UnwindRow>) -> Self {
        let mut mappings = ProcessMappings::default();
        let table = [
            ExecMapping {
                start: MAP_START,
                end: MAP_END,
                bias: BIAS,
                table_start: 0,
                table_len: rows.len() as u32,
            },
            ExecMapping {
                start: NO_TABLE_START,
                end: NO_TABLE_START + MAPPING_LEN,
                ..Default::default()
            },
            ExecMapping {
                start: FP_START,
                end: FP_START + MAPPING_LEN,
                table_start: FRAME_POINTER_TABLE,
                ..Default::default()
            },
        ];
        mappings.mappings[..table.len()].copy_from_slice(&table);
        mappings.len = table.len() as u32;
        Fake {
            memory: HashMap::new(),
            mappings,
            words: pack(&rows),
            lookups: Vec::new(),
            marks: Vec::new(),
        }
    }

    fn set_rows(&mut self, rows: Vec<UnwindRow>) {
        self.words = pack(&rows);
        self.mappings.mappings[0].table_len = rows.len() as u32;
    }

    fn write_bytes(&mut self, address: u64, bytes: &[u8]) {
        for (at, byte) in bytes.iter().enumerate() {
            self.memory.insert(address + at as u64, *byte);
        }
    }

    fn write(&mut self, address: u64, value: u64) {
        self.write_bytes(address, &value.to_le_bytes());
    }
}

impl Process for Fake {
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        let mut bytes = [0; 8];
        for (at, byte) in bytes.iter_mut().enumerate() {
            *byte = *self.memory.get(&address.checked_add(at as u64)?)?;
        }
        Some(u64::from_le_bytes(bytes))
    }

    fn lookup(&mut self, pc: u64) -> Lookup {
        self.lookups.push(pc);
        let (mappings, words) = (&self.mappings, &self.words);
        let word = |at: u32| words.get(at as usize).copied();
        let mut mark = 0;
        let found = lookup_marked(
            mappings,
            pc,
            |what, len, target| {
                search_last_le(len, target, |index| match what {
                    Sorted::Mappings => mappings.mappings.get(index as usize).map(|m| m.start),
                    // The low half of a row's word, as the kernel reads it.
                    Sorted::Rows { start } => word(start + index).map(|w| u64::from(w as u32)),
                })
            },
            |start, len, found| {
                packed_row(start, len, found, word, |at| {
                    Some([word(at)?, word(at + 1)?])
                })
            },
            |found| mark = found,
        );
        self.marks.push(mark);
        found
    }
}

/// A row at `pc`: CFA by `cfa_rule` + `cfa_offset`, the return address at
/// CFA + `ra_offset`, the frame pointer unchanged.
fn row(pc: u32, cfa_rule: u8, cfa_offset: i32, ra_offset: i16) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_offset,
        cfa_rule,
        ra_rule: reg::AT_CFA,
        ra_offset,
        fp_rule: reg::SAME,
        ..Default::default()
    }
}

fn end_row(pc: u32) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_rule: cfa::END,
        ra_rule: reg::UNKNOWN,
        ..Default::default()
    }
}

/// Steps until the unwind stops: the pcs of every frame (the first one
/// included) and the reason.
fn walk(arch: Arch, mut regs: Regs, process: &mut Fake) -> (Vec<u64>, u32) {
    let mut pcs = vec![regs.pc];
    for _ in 0..32 {
        match step(arch, &mut regs, process) {
            Step::Caller => pcs.push(regs.pc),
            Step::Stop(why) => return (pcs, why),
            Step::Runtime(_) => return (pcs, reason::NO_TABLE),
        }
    }
    panic!("no end after 32 frames: {pcs:x?}");
}

#[test]
fn x86_64_cfa_from_sp_with_the_return_address_below_it() {
    // A function at 0x1100 that pushed 8 bytes past its return address.
    let mut process = Fake::new(vec![row(0x1100, cfa::SP, 16, -8), end_row(0x1200)]);
    let sp = STACK;
    process.write(sp + 8, at(0x1180));
    let mut regs = Regs::interrupted(at(0x1120), sp, 0xf00d, 0);
    assert_eq!(step(Arch::X86_64, &mut regs, &mut process), Step::Caller);
    assert_eq!(regs.pc, at(0x1180));
    assert_eq!(regs.sp, sp + 16);
    // The frame pointer is untouched (rule SAME), and still known.
    assert_eq!((regs.fp, regs.fp_valid), (0xf00d, 1));
    assert_eq!(regs.interrupted, 0);
    // Interrupted: the pc itself was looked up.
    assert_eq!(process.lookups, [at(0x1120)]);
}

#[test]
fn a_return_address_is_looked_up_inside_its_call() {
    // The caller's call is the last instruction of the function at 0x1100,
    // so its return address is the first byte of the END function at 0x1200:
    // the row used must be the caller's, not the next function's.
    let mut process = Fake::new(vec![row(0x1100, cfa::SP, 16, -8), end_row(0x1200)]);
    let sp = STACK;
    process.write(sp + 8, 0x4242);
    let mut regs = Regs {
        pc: at(0x1200),
        sp,
        ..Default::default()
    };
    assert_eq!(step(Arch::X86_64, &mut regs, &mut process), Step::Caller);
    assert_eq!(process.lookups, [at(0x1200) - 1]);
    assert_eq!((regs.pc, regs.sp), (0x4242, sp + 16));
}

#[test]
fn x86_64_cfa_from_fp_restores_the_callers_fp() {
    // push rbp; mov rbp, rsp: CFA = rbp + 16, rbp saved at CFA - 16.
    let mut process = Fake::new(vec![UnwindRow {
        fp_rule: reg::AT_CFA,
        fp_offset: -16,
        ..row(0x1100, cfa::FP, 16, -8)
    }]);
    let sp = STACK;
    let fp = sp + 0x40;
    process.write(fp, fp + 0x100);
    process.write(fp + 8, at(0x1500));
    let mut regs = Regs::interrupted(at(0x1110), sp, fp, 0);
    assert_eq!(step(Arch::X86_64, &mut regs, &mut process), Step::Caller);
    assert_eq!(regs.pc, at(0x1500));
    assert_eq!(regs.sp, fp + 16);
    assert_eq!((regs.fp, regs.fp_valid), (fp + 0x100, 1));
}

#[test]
fn a_cfa_from_an_unknown_fp_is_unsupported() {
    let mut process = Fake::new(vec![row(0x1100, cfa::FP, 16, -8)]);
    let mut regs = Regs {
        fp_valid: 0,
        ..Regs::interrupted(at(0x1110), STACK, STACK + 0x40, 0)
    };
    let before = regs;
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::UNSUPPORTED_RULE)
    );
    assert_eq!(regs, before);
}

#[test]
fn an_fp_rule_that_cannot_be_followed_forgets_the_fp() {
    let mut process = Fake::new(vec![UnwindRow {
        fp_rule: reg::UNKNOWN,
        ..row(0x1100, cfa::SP, 8, -8)
    }]);
    process.write(STACK, at(0x1500));
    let mut regs = Regs::interrupted(at(0x1110), STACK, 0xf00d, 0);
    assert_eq!(step(Arch::X86_64, &mut regs, &mut process), Step::Caller);
    assert_eq!(regs.fp_valid, 0);
}

#[test]
fn plt_cfa_counts_the_pushed_argument_past_the_threshold() {
    // A PLT stub at 0x1100: CFA = sp + 8, + 8 more from (pc & 15) >= 11 on.
    let plt = UnwindRow {
        arg: 11,
        ..row(0x1100, cfa::PLT, 8, -8)
    };
    let sp = STACK;
    for (offset, cfa) in [(0x1100, sp + 8), (0x110a, sp + 8), (0x110b, sp + 16)] {
        let mut process = Fake::new(vec![plt]);
        process.write(cfa - 8, at(0x1500));
        let mut regs = Regs::interrupted(at(offset), sp, 0, 0);
        assert_eq!(
            step(Arch::X86_64, &mut regs, &mut process),
            Step::Caller,
            "pc {offset:#x}"
        );
        assert_eq!(
            (regs.pc, regs.sp),
            (at(0x1500), cfa),
            "pc {offset:#x}: wrong CFA"
        );
    }
}

#[test]
fn an_end_row_stops_complete() {
    let mut process = Fake::new(vec![end_row(0x1000)]);
    let mut regs = Regs::interrupted(at(0x1010), STACK, 0, 0);
    let before = regs;
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::COMPLETE)
    );
    assert_eq!(regs, before);
}

#[test]
fn a_whole_x86_64_stack_walks_to_its_end() {
    // _start (END) <- main (fp-based) <- work (sp-based) <- leaf (sp, nothing pushed).
    let mut process = Fake::new(vec![
        end_row(0x1000),
        UnwindRow {
            fp_rule: reg::AT_CFA,
            fp_offset: -16,
            ..row(0x1100, cfa::FP, 16, -8)
        },
        row(0x1200, cfa::SP, 32, -8),
        row(0x1300, cfa::SP, 8, -8),
    ]);
    let leaf_sp = STACK;
    let work_sp = leaf_sp + 8;
    let main_sp = work_sp + 32;
    let main_fp = main_sp + 0x20;
    process.write(leaf_sp, at(0x1250));
    process.write(work_sp + 24, at(0x1150));
    process.write(main_fp, 0);
    process.write(main_fp + 8, at(0x1020));
    let regs = Regs::interrupted(at(0x1310), leaf_sp, main_fp, 0);
    let (pcs, why) = walk(Arch::X86_64, regs, &mut process);
    assert_eq!(pcs, [at(0x1310), at(0x1250), at(0x1150), at(0x1020)]);
    assert_eq!(why, reason::COMPLETE);
}

#[test]
fn aarch64_leaf_returns_through_lr_without_pointer_auth_bits() {
    // A leaf that saved nothing: CFA = sp, the return address still in LR.
    let leaf = UnwindRow {
        ra_rule: reg::SAME,
        ..row(0x1100, cfa::SP, 0, 0)
    };
    let mut process = Fake::new(vec![leaf]);
    let signed_lr = 0x002a_0000_0000_0000 | at(0x1500);
    let mut regs = Regs::interrupted(at(0x1110), STACK, 0, signed_lr);
    assert_eq!(step(Arch::Aarch64, &mut regs, &mut process), Step::Caller);
    assert_eq!(regs.pc, at(0x1500));
    assert_eq!(regs.sp, STACK);
    // In a caller, LR no longer holds this frame's return address.
    let mut caller = Regs {
        pc: at(0x1120),
        sp: STACK,
        lr: signed_lr,
        ..Default::default()
    };
    assert_eq!(
        step(Arch::Aarch64, &mut caller, &mut process),
        Step::Stop(reason::UNSUPPORTED_RULE)
    );
    // x86_64 has no link register.
    let mut regs = Regs::interrupted(at(0x1110), STACK, 0, signed_lr);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::UNSUPPORTED_RULE)
    );
}

#[test]
fn aarch64_saved_return_address_loses_its_pointer_auth_bits() {
    // stp x29, x30, [sp, #-16]!: CFA = sp + 16, x29 at CFA-16, x30 at CFA-8.
    let mut process = Fake::new(vec![UnwindRow {
        fp_rule: reg::AT_CFA,
        fp_offset: -16,
        ..row(0x1100, cfa::SP, 16, -8)
    }]);
    process.write(STACK, STACK + 0x80);
    process.write(STACK + 8, 0x8055_0000_0000_0000 | at(0x1500));
    let mut regs = Regs::interrupted(at(0x1110), STACK, 0, 0);
    assert_eq!(step(Arch::Aarch64, &mut regs, &mut process), Step::Caller);
    assert_eq!(regs.pc, at(0x1500));
    assert_eq!((regs.sp, regs.fp), (STACK + 16, STACK + 0x80));
    // The same value on x86_64 is taken as it is.
    let mut regs = Regs::interrupted(at(0x1110), STACK, 0, 0);
    assert_eq!(step(Arch::X86_64, &mut regs, &mut process), Step::Caller);
    assert_eq!(regs.pc, 0x8055_0000_0000_0000 | at(0x1500));
}

#[test]
fn frame_pointers_take_over_where_there_is_no_table() {
    let mut process = Fake::new(vec![]);
    let fp = STACK + 0x40;
    process.write(fp, fp + 0x40);
    process.write(fp + 8, at(0x1500));
    let mut regs = Regs::interrupted(NO_TABLE_START + 0x10, STACK, fp, 0);
    assert_eq!(step(Arch::X86_64, &mut regs, &mut process), Step::Caller);
    assert_eq!(regs.pc, at(0x1500));
    assert_eq!(regs.sp, fp + 16);
    assert_eq!((regs.fp, regs.fp_valid), (fp + 0x40, 1));
    // The chain's end, a null fp, says the table was missing...
    let mut regs = Regs::interrupted(NO_TABLE_START + 0x10, STACK, 0, 0);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::NO_TABLE)
    );
    // ... and so do a frame pointer below sp and an unreadable record.
    let mut regs = Regs::interrupted(NO_TABLE_START + 0x10, STACK, STACK - 0x40, 0);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::NO_TABLE)
    );
    let mut regs = Regs::interrupted(NO_TABLE_START + 0x10, STACK, STACK + 0x400, 0);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::NO_TABLE)
    );
    // A row that says "use frame pointers" behaves the same.
    let mut process = Fake::new(vec![UnwindRow {
        cfa_rule: cfa::USE_FP,
        ..Default::default()
    }]);
    process.write(fp, 0);
    process.write(fp + 8, at(0x1500));
    let mut regs = Regs::interrupted(at(0x1010), STACK, fp, 0);
    assert_eq!(step(Arch::X86_64, &mut regs, &mut process), Step::Caller);
    assert_eq!(regs.pc, at(0x1500));
}

#[test]
fn frame_pointer_code_ends_complete_at_a_null_fp() {
    let mut process = Fake::new(vec![]);
    let fp = STACK + 0x40;
    process.write(fp, 0);
    process.write(fp + 8, FP_START + 0x200);
    let regs = Regs::interrupted(FP_START + 0x100, STACK, fp, 0);
    let (pcs, why) = walk(Arch::X86_64, regs, &mut process);
    assert_eq!(pcs, [FP_START + 0x100, FP_START + 0x200]);
    assert_eq!(why, reason::COMPLETE);
    // Where the chain cannot be read, the code that keeps frame pointers
    // reports the fault itself.
    let mut regs = Regs::interrupted(FP_START + 0x100, STACK, STACK + 0x400, 0);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::READ_FAULT)
    );
}

#[test]
fn a_pc_outside_every_mapping_stops_there() {
    let mut process = Fake::new(vec![row(0x1100, cfa::SP, 8, -8)]);
    for pc in [0x1000, MAP_END + 1, NO_TABLE_START - 1, u64::MAX - 8] {
        let mut regs = Regs::interrupted(pc, STACK, 0, 0);
        assert_eq!(
            step(Arch::X86_64, &mut regs, &mut process),
            Step::Stop(reason::NO_MAPPING),
            "pc {pc:#x}"
        );
    }
    // Below the table's first row: not covered, and no frame pointer.
    let mut regs = Regs::interrupted(at(0x1010), STACK, 0, 0);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::PC_NOT_COVERED)
    );
}

#[test]
fn an_unreadable_saved_register_is_a_read_fault() {
    // The return address slot is not mapped.
    let mut process = Fake::new(vec![row(0x1100, cfa::SP, 16, -8)]);
    let mut regs = Regs::interrupted(at(0x1110), STACK, 0, 0);
    let before = regs;
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::READ_FAULT)
    );
    assert_eq!(regs, before);
    // The return address is readable, the saved frame pointer is not.
    let mut process = Fake::new(vec![UnwindRow {
        fp_rule: reg::AT_CFA,
        fp_offset: -16,
        ..row(0x1100, cfa::SP, 16, -8)
    }]);
    process.write(STACK + 8, at(0x1500));
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::READ_FAULT)
    );
}

#[test]
fn a_frame_below_its_callee_is_a_bad_frame() {
    // CFA = fp + 16 with fp far below sp: the caller's frame would be
    // below the callee's.
    let mut process = Fake::new(vec![row(0x1100, cfa::FP, 16, -8)]);
    let fp = STACK - 0x100;
    process.write(fp + 8, at(0x1500));
    let mut regs = Regs::interrupted(at(0x1110), STACK, fp, 0);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::BAD_FRAME)
    );
    // The control: the same frame above sp is fine.
    let fp = STACK + 0x100;
    process.write(fp + 8, at(0x1500));
    let mut regs = Regs::interrupted(at(0x1110), STACK, fp, 0);
    assert_eq!(step(Arch::X86_64, &mut regs, &mut process), Step::Caller);
}

#[test]
fn a_frame_that_returns_to_itself_in_place_is_a_bad_frame() {
    // CFA = sp and the return address is the pc: the next step would be
    // this one again.
    let leaf = UnwindRow {
        ra_rule: reg::SAME,
        ..row(0x1100, cfa::SP, 0, 0)
    };
    let mut process = Fake::new(vec![leaf]);
    let mut regs = Regs::interrupted(at(0x1110), STACK, 0, at(0x1110));
    assert_eq!(
        step(Arch::Aarch64, &mut regs, &mut process),
        Step::Stop(reason::BAD_FRAME)
    );
}

#[test]
fn a_null_return_address_ends_the_stack() {
    let mut process = Fake::new(vec![row(0x1100, cfa::SP, 8, -8)]);
    process.write(STACK, 0);
    let mut regs = Regs::interrupted(at(0x1110), STACK, 0, 0);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::COMPLETE)
    );
}

#[test]
fn a_not_covered_row_falls_back_to_frame_pointers() {
    // A gap between two functions' FDEs.
    let mut process = Fake::new(vec![
        row(0x1100, cfa::SP, 8, -8),
        UnwindRow {
            pc: 0x1180,
            cfa_rule: cfa::NOT_COVERED,
            ..Default::default()
        },
        row(0x1200, cfa::SP, 8, -8),
    ]);
    let fp = STACK + 0x40;
    process.write(fp, 0);
    process.write(fp + 8, at(0x1500));
    let mut regs = Regs::interrupted(at(0x1190), STACK, fp, 0);
    assert_eq!(step(Arch::X86_64, &mut regs, &mut process), Step::Caller);
    assert_eq!((regs.pc, regs.sp), (at(0x1500), fp + 16));
    let mut regs = Regs::interrupted(at(0x1190), STACK, 0, 0);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::PC_NOT_COVERED)
    );
}

#[test]
fn a_marked_mappings_frames_step_as_before_and_carry_its_mark() {
    // The same frame as `x86_64_cfa_from_sp_with_the_return_address_below_it`,
    // in a mapping marked 5: the mark bits are no rows to search.
    let mut process = Fake::new(vec![row(0x1100, cfa::SP, 16, -8), end_row(0x1200)]);
    process.mappings.mappings[0].set_mark(5);
    assert_eq!(process.mappings.mappings[0].rows(), 2);
    assert_eq!(process.mappings.mappings[0].mark(), 5);
    let sp = STACK;
    process.write(sp + 8, at(0x1180));
    let mut regs = Regs::interrupted(at(0x1120), sp, 0, 0);
    assert_eq!(step(Arch::X86_64, &mut regs, &mut process), Step::Caller);
    assert_eq!((regs.pc, regs.sp), (at(0x1180), sp + 16));
    // A pc in no mapping, and one in a mapping without a table: no mark.
    let _ = process.lookup(0x10);
    let _ = process.lookup(NO_TABLE_START + 4);
    assert_eq!(process.marks, [5, 0, 0]);
}

#[test]
fn a_stack_entrys_mark_comes_off_whole() {
    // The highest user address with 5-level page tables, marked.
    let address = (1u64 << 56) - 16;
    let entry = address | (5 << STACK_MARK_SHIFT);
    assert_eq!((stack_mark(entry), without_mark(entry)), (5, address));
    assert_eq!((stack_mark(address), without_mark(address)), (0, address));
    // Entries with the top nibble set are no addresses: left alone.
    let runtime_frame = 0xfff0_0000_0000_0003;
    assert_eq!(stack_mark(runtime_frame), 0);
    assert_eq!(without_mark(runtime_frame), runtime_frame);
}
