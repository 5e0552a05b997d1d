//! Signal frames: the kernel's sigreturn trampolines on both architectures,
//! the interrupted frame behind them, and the ways reading one fails.
use std::vec;

use super::*;

/// `mov $15, %rax; syscall`, and the nops that pad it (the check reads 8
/// bytes from the `syscall` on).
const X86_64_SIGRETURN: [u8; 16] = [
    0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
];
/// `mov x8, #139; svc #0`.
const AARCH64_SIGRETURN: [u8; 8] = [0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4];

/// Lays out the kernel's x86_64 signal frame at `sp`.
fn x86_64_signal_frame(process: &mut Fake, sp: u64, pc: u64, old_sp: u64, fp: u64) {
    // ucontext: uc_flags, uc_link, uc_stack (40 bytes), then sigcontext's
    // r8..r15 (8), rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip.
    let sigcontext = sp + 40;
    for slot in 0..17 {
        process.write(sigcontext + slot * 8, 0xdead_0000 + slot);
    }
    process.write(sigcontext + 10 * 8, fp);
    process.write(sigcontext + 15 * 8, old_sp);
    process.write(sigcontext + 16 * 8, pc);
}

#[test]
fn x86_64_sigreturn_trampolines_step_into_the_interrupted_frame() {
    let sp = STACK;
    let (pc, old_sp, fp) = (at(0x1234), STACK + 0x1000, STACK + 0x1040);
    // Wherever the trampoline is: on a page of its own (no mapping), in code
    // whose table misses it, whose row is an expression, or marked SIGNAL.
    let in_table = at(0x1400);
    let cases = [
        (NO_TABLE_START - 0x1000, vec![]),
        (in_table, vec![row(0x1100, cfa::NOT_COVERED, 0, 0)]),
        (in_table, vec![row(0x1100, cfa::UNSUPPORTED, 0, 0)]),
        (in_table, vec![row(0x1100, cfa::SIGNAL, 0, 0)]),
    ];
    for (trampoline, rows) in cases {
        let mut process = Fake::new(rows);
        process.write_bytes(trampoline, &X86_64_SIGRETURN);
        x86_64_signal_frame(&mut process, sp, pc, old_sp, fp);
        // The trampoline is entered by the handler's return.
        let mut regs = Regs {
            pc: trampoline,
            sp,
            ..Default::default()
        };
        assert_eq!(
            step(Arch::X86_64, &mut regs, &mut process),
            Step::Caller,
            "trampoline at {trampoline:#x}"
        );
        assert_eq!(regs, Regs::interrupted(pc, old_sp, fp, 0));
    }
}

#[test]
fn the_frame_a_signal_interrupted_is_looked_up_at_its_pc() {
    let mut process = Fake::new(vec![row(0x1200, cfa::SP, 8, -8)]);
    let trampoline = NO_TABLE_START - 0x1000;
    process.write_bytes(trampoline, &X86_64_SIGRETURN);
    // Interrupted at the first instruction of the function at 0x1200: pc - 1
    // would be before its row.
    x86_64_signal_frame(&mut process, STACK, at(0x1200), STACK + 0x1000, 0);
    process.write(STACK + 0x1000, at(0x1500));
    let regs = Regs {
        pc: trampoline,
        sp: STACK,
        ..Default::default()
    };
    let (pcs, _) = walk(Arch::X86_64, regs, &mut process);
    assert_eq!(pcs[..3], [trampoline, at(0x1200), at(0x1500)]);
    assert_eq!(process.lookups[1], at(0x1200));
}

#[test]
fn code_that_only_looks_like_sigreturn_is_no_trampoline() {
    let trampoline = NO_TABLE_START - 0x1000;
    // `mov $15, %rax` then something other than syscall, and an unreadable pc.
    let mut almost = X86_64_SIGRETURN;
    almost[8] = 0x90;
    for code in [&almost[..], &X86_64_SIGRETURN[..7], &[0u8; 0][..]] {
        let mut process = Fake::new(vec![]);
        process.write_bytes(trampoline, code);
        x86_64_signal_frame(&mut process, STACK, at(0x1234), STACK + 0x1000, 0);
        let mut regs = Regs::interrupted(trampoline, STACK, 0, 0);
        assert_eq!(
            step(Arch::X86_64, &mut regs, &mut process),
            Step::Stop(reason::NO_MAPPING),
            "code {code:x?}"
        );
    }
    // The aarch64 trampoline means nothing on x86_64, and the other way round.
    let mut process = Fake::new(vec![]);
    process.write_bytes(trampoline, &AARCH64_SIGRETURN);
    let mut regs = Regs::interrupted(trampoline, STACK, 0, 0);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::NO_MAPPING)
    );
    let mut process = Fake::new(vec![]);
    process.write_bytes(trampoline, &X86_64_SIGRETURN);
    let mut regs = Regs::interrupted(trampoline, STACK, 0, 0);
    assert_eq!(
        step(Arch::Aarch64, &mut regs, &mut process),
        Step::Stop(reason::NO_MAPPING)
    );
}

#[test]
fn aarch64_sigreturn_restores_pc_sp_fp_and_lr() {
    let trampoline = NO_TABLE_START - 0x1000;
    let mut process = Fake::new(vec![]);
    process.write_bytes(trampoline, &AARCH64_SIGRETURN);
    // rt_sigframe: siginfo (128), ucontext up to sigcontext (176), then
    // fault_address, regs[31], sp, pc.
    let sigcontext = STACK + 128 + 176;
    let regs_at = sigcontext + 8;
    for n in 0..31 {
        process.write(regs_at + n * 8, 0xdead_0000 + n);
    }
    let (pc, old_sp, fp, lr) = (at(0x1234), STACK + 0x2000, STACK + 0x2040, at(0x1500));
    process.write(regs_at + 29 * 8, fp);
    process.write(regs_at + 30 * 8, lr);
    process.write(regs_at + 31 * 8, old_sp);
    process.write(regs_at + 32 * 8, 0x0031_0000_0000_0000 | pc);
    let mut regs = Regs {
        pc: trampoline,
        sp: STACK,
        ..Default::default()
    };
    assert_eq!(step(Arch::Aarch64, &mut regs, &mut process), Step::Caller);
    assert_eq!(regs, Regs::interrupted(pc, old_sp, fp, lr));
    // The interrupted frame may be a leaf: its return address is the LR
    // the signal frame held.
    process.set_rows(vec![UnwindRow {
        ra_rule: reg::SAME,
        ..row(0x1200, cfa::SP, 0, 0)
    }]);
    assert_eq!(step(Arch::Aarch64, &mut regs, &mut process), Step::Caller);
    assert_eq!(regs.pc, lr);
}

#[test]
fn an_unreadable_signal_frame_is_a_read_fault() {
    let trampoline = NO_TABLE_START - 0x1000;
    for arch in [Arch::X86_64, Arch::Aarch64] {
        let mut process = Fake::new(vec![]);
        process.write_bytes(
            trampoline,
            match arch {
                Arch::X86_64 => &X86_64_SIGRETURN[..],
                Arch::Aarch64 => &AARCH64_SIGRETURN[..],
            },
        );
        let mut regs = Regs {
            pc: trampoline,
            sp: STACK,
            ..Default::default()
        };
        assert_eq!(
            step(arch, &mut regs, &mut process),
            Step::Stop(reason::READ_FAULT),
            "{arch:?}"
        );
    }
}

#[test]
fn a_signal_frame_with_a_null_pc_is_a_bad_frame() {
    let trampoline = NO_TABLE_START - 0x1000;
    let mut process = Fake::new(vec![]);
    process.write_bytes(trampoline, &X86_64_SIGRETURN);
    x86_64_signal_frame(&mut process, STACK, 0, STACK + 0x1000, 0);
    let mut regs = Regs::interrupted(trampoline, STACK, 0, 0);
    assert_eq!(
        step(Arch::X86_64, &mut regs, &mut process),
        Step::Stop(reason::BAD_FRAME)
    );
}
