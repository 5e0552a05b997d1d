//! The table-driven user-stack unwinder, shared by the eBPF sampler and the
//! host.
//!
//! The agent turns each executable's `.eh_frame` (or `.debug_frame`) into a
//! sorted slice of [`UnwindRow`]s; [`step`] walks one frame with them. The same
//! code runs in the kernel (memory read with `bpf_probe_read_user`, rows
//! found in BPF maps) and on the host (memory from a recorded snapshot, rows
//! from a `Vec`), so replay tests exercise exactly what the kernel runs.
//!
//! Everything here obeys the BPF verifier: no recursion, every loop bounded
//! by a constant, small values on the stack, `#[inline(always)]` so the eBPF
//! program has a single function to verify per callback.
//!
//! The row and mapping layouts here are part of the kernel/userspace contract
//! (`hostprof-common` re-exports this crate as `unwind`); the table builder
//! ([`table`], gimli and object) is host-only, behind the `std` feature, so the
//! eBPF program and the contract stay free of it.
//!
//! The row format and [`step`] are here; the searches ([`search`]) and
//! the per-process mappings and their lookup ([`mappings`]) beside it,
//! all `#[inline(always)]`, so the verifier still sees one program.
#![no_std]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

pub mod mappings;
pub mod packed;
pub mod search;
#[cfg(feature = "std")]
pub mod table;
#[cfg(test)]
mod tests;
pub mod window;

pub use mappings::*;
pub use packed::*;
pub use search::*;
pub use window::*;

/// Target architecture of the unwound code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

/// How to compute the canonical frame address (the caller's stack pointer).
pub mod cfa {
    /// `sp + offset`.
    pub const SP: u8 = 0;
    /// `fp + offset` (rbp / x29).
    pub const FP: u8 = 1;
    /// x86_64 PLT stub expression: `sp + offset`, plus 8 once
    /// `(pc & 15) >= arg` (the stub pushed its argument).
    pub const PLT: u8 = 2;
    /// Outermost frame: the return address is undefined, the stack ends here.
    pub const END: u8 = 3;
    /// A DWARF expression or register this unwinder does not evaluate.
    pub const UNSUPPORTED: u8 = 4;
    /// Walk this frame with the frame-pointer chain.
    pub const USE_FP: u8 = 5;
    /// A signal trampoline (`sigreturn`): the interrupted registers are in the
    /// signal frame at `sp`.
    pub const SIGNAL: u8 = 6;
    /// No FDE covers this address (a gap between functions).
    pub const NOT_COVERED: u8 = 7;
    /// A table built for the code that runs ([`table::build_sparse`]) has
    /// no rows here yet: the walk stops, and the agent adds the rows of
    /// the function at this address (no frame-pointer guess: in code
    /// without frame pointers it makes up frames).
    pub const NOT_LOADED: u8 = 8;
}

/// Where the caller's frame pointer (rbp / x29) or return address is.
pub mod reg {
    /// Unchanged by this frame (for the return address on aarch64: still in
    /// the link register).
    pub const SAME: u8 = 0;
    /// Saved at `cfa + offset`.
    pub const AT_CFA: u8 = 1;
    /// Not recoverable (saved in another register, an expression, ...).
    pub const UNKNOWN: u8 = 2;
}

/// One row of an unwind table: from `pc` up to the next row's `pc`, how to
/// find the caller's registers. What [`step`] follows and the table builder
/// makes; the rows map holds it as a [`PackedRow`] and a shared
/// [`UnwindRule`] (see [`packed`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    /// First address covered: a virtual address of the ELF file.
    pub pc: u32,
    pub cfa_offset: i32,
    pub fp_offset: i16,
    pub ra_offset: i16,
    /// One of [`cfa`].
    pub cfa_rule: u8,
    /// One of [`reg`].
    pub fp_rule: u8,
    /// One of [`reg`].
    pub ra_rule: u8,
    /// [`cfa::PLT`]: the `pc & 15` threshold.
    pub arg: u8,
}

/// 8-byte words (packed rows, or halves of rules) per element of the rows
/// map (4 KiB); tables start on a chunk boundary.
pub const ROW_CHUNK: usize = 512;

/// Why an unwind stopped short of the end of the stack. Stored in the
/// sample's flags (see `SAMPLE_UNWIND_SHIFT`) and counted per reason.
pub mod reason {
    /// The stack ended normally (undefined return address, null frame pointer).
    pub const COMPLETE: u32 = 0;
    /// An address lies in a mapping without an unwind table (JIT code,
    /// anonymous memory, a file without CFI); frame pointers took over and
    /// failed.
    pub const NO_TABLE: u32 = 1;
    /// The table of the mapping has no row for the address.
    pub const PC_NOT_COVERED: u32 = 2;
    /// A rule this unwinder does not evaluate (DWARF expression, other
    /// register).
    pub const UNSUPPORTED_RULE: u32 = 3;
    /// Reading the stack failed (bad pointer, or a page not in memory).
    pub const READ_FAULT: u32 = 4;
    /// More frames than a sample holds.
    pub const DEPTH_LIMIT: u32 = 5;
    /// The computed frame moved down the stack, or the return address is 0
    /// where a caller was expected: the registers are garbage.
    pub const BAD_FRAME: u32 = 6;
    /// The process's mappings were not loaded into the kernel yet: frame
    /// pointers were used.
    pub const UNKNOWN_PROCESS: u32 = 7;
    /// An address outside every known mapping (the process mapped code since
    /// the agent read its maps).
    pub const NO_MAPPING: u32 = 8;
    /// The mapping's table is built for the code that runs and has no rows
    /// for this address yet ([`cfa::NOT_LOADED`]): the last frame is the
    /// address, for the agent to add its function's rows.
    pub const NOT_LOADED: u32 = 9;
    /// Number of reasons.
    pub const COUNT: u32 = 10;

    /// A short snake_case name.
    pub const fn name(reason: u32) -> &'static str {
        match reason {
            COMPLETE => "complete",
            NO_TABLE => "no_table",
            PC_NOT_COVERED => "pc_not_covered",
            UNSUPPORTED_RULE => "unsupported_rule",
            READ_FAULT => "read_fault",
            DEPTH_LIMIT => "depth_limit",
            BAD_FRAME => "bad_frame",
            UNKNOWN_PROCESS => "unknown_process",
            NO_MAPPING => "no_mapping",
            NOT_LOADED => "not_loaded",
            _ => "unknown",
        }
    }
}

/// The registers the unwinder tracks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    pub pc: u64,
    pub sp: u64,
    /// rbp / x29.
    pub fp: u64,
    /// aarch64 link register (x30); valid only while `lr_valid` is set.
    pub lr: u64,
    /// Non-zero when `pc` is where the thread was interrupted (the first
    /// frame, or the frame a signal interrupted) rather than a return
    /// address, and `lr` holds the live link register.
    pub interrupted: u32,
    /// Non-zero when `fp` is known.
    pub fp_valid: u32,
}

impl Regs {
    /// Where a thread was interrupted: the registers every unwind starts from.
    pub const fn interrupted(pc: u64, sp: u64, fp: u64, lr: u64) -> Self {
        Regs {
            pc,
            sp,
            fp,
            lr,
            interrupted: 1,
            fp_valid: 1,
        }
    }
}

/// What the unwinder found about an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A table row.
    Row(UnwindRow),
    /// The mapping has no table.
    NoTable,
    /// The mapping's code keeps frame pointers (Go): follow them.
    FramePointers,
    /// The mapping's table has no row for it.
    NotCovered,
    /// No mapping holds it.
    NoMapping,
    /// The mapping is a language runtime's code (a JIT code cache, marked
    /// [`RUNTIME_TABLE`]): that runtime's walker takes the frame. The
    /// runtime is the mapping's tag (`hostprof_common::runtime::tag`).
    Runtime(u8),
}

/// The unwinder's view of a process: memory and tables.
pub trait Process {
    /// Reads 8 bytes of user memory.
    fn read_u64(&mut self, address: u64) -> Option<u64>;
    /// A read the walk seldom makes (the code at a pc, a signal frame's
    /// saved registers): as [`Process::read_u64`] unless the process says
    /// otherwise. The kernel's reads these directly, so that its copy of
    /// the stack ([`StackWindow`]) serves the reads of every frame, and
    /// the verifier checks that copy's paths at four places, not ten.
    fn read_u64_seldom(&mut self, address: u64) -> Option<u64> {
        self.read_u64(address)
    }
    /// Finds the row for `pc` (already adjusted to lie inside the call
    /// instruction for return addresses).
    fn lookup(&mut self, pc: u64) -> Lookup;
}

/// The outcome of one [`step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `regs` now describe the caller; its pc is `regs.pc`.
    Caller,
    /// The stack ended with this reason (see [`reason`]).
    Stop(u32),
    /// `regs.pc` is in the code of the language runtime tagged so
    /// ([`Lookup::Runtime`]): `regs` are unchanged, for that runtime's
    /// walker to step.
    Runtime(u8),
}

/// Address bits of a user pointer on aarch64: the rest holds pointer
/// authentication codes (or tags) to strip from return addresses.
const AARCH64_VA_MASK: u64 = (1 << 48) - 1;

/// Walks one frame: from the registers of a function to those of its caller.
#[inline(always)]
pub fn step<P: Process>(arch: Arch, regs: &mut Regs, process: &mut P) -> Step {
    // A return address points after the call: look up the call itself.
    let lookup_pc = if regs.interrupted != 0 {
        regs.pc
    } else {
        regs.pc.wrapping_sub(1)
    };
    // Without a row to follow, what to try: decided first, then done in
    // one place. The eBPF verifier checks every inlined copy of the
    // signal and frame-pointer steps on its own, and the copies one per
    // case made it walk several times more instructions at load time.
    let (cfa, return_address, bad_frame) = 'caller: {
        let fallback = match process.lookup(lookup_pc) {
            Lookup::Row(row) => match row_step(arch, regs, process, &row) {
                Rules::Caller {
                    cfa,
                    return_address,
                } => break 'caller (cfa, return_address, reason::BAD_FRAME),
                Rules::Stop(why) => return Step::Stop(why),
                Rules::Fallback(fallback) => fallback,
            },
            Lookup::Runtime(runtime) => return Step::Runtime(runtime),
            // Signal trampolines may sit on a page of their own.
            Lookup::NoMapping => Fallback::SIGRETURN_OR_STOP | reason::NO_MAPPING,
            Lookup::NoTable => Fallback::FRAME_POINTERS | reason::NO_TABLE,
            Lookup::FramePointers => Fallback::FRAME_POINTERS | reason::COMPLETE,
            Lookup::NotCovered => Fallback::SIGRETURN_OR_FRAME_POINTERS | reason::PC_NOT_COVERED,
        };
        let why = fallback & Fallback::REASON;
        let try_signal = fallback & Fallback::SIGNAL != 0
            || (fallback & Fallback::SIGRETURN != 0 && is_sigreturn(arch, regs.pc, process));
        if try_signal {
            return signal_step(arch, regs, process);
        }
        if fallback & Fallback::FRAME_POINTERS == 0 {
            return Step::Stop(why);
        }
        match frame_pointer_step(regs, process, why) {
            // A bad frame found by the chain: only a table could have said
            // more.
            Ok((cfa, return_address)) => (cfa, return_address, why),
            Err(stop) => return stop,
        }
    };
    match finish_step(arch, regs, cfa, return_address) {
        Step::Stop(reason::BAD_FRAME) => Step::Stop(bad_frame),
        other => other,
    }
}

/// Where a row's rules lead.
enum Rules {
    /// The caller's frame: not checked yet.
    Caller {
        cfa: u64,
        return_address: u64,
    },
    Stop(u32),
    /// [`Fallback`] flags and a reason.
    Fallback(u32),
}

/// What [`step`] does when no row applies: flags above a `reason` in the
/// low byte.
struct Fallback;

impl Fallback {
    const REASON: u32 = 0xff;
    /// Step out of a signal frame.
    const SIGNAL: u32 = 1 << 8;
    /// Step out of a signal frame if the pc is at the sigreturn trampoline.
    const SIGRETURN: u32 = 1 << 9;
    /// Else follow the frame pointer (else stop with the reason).
    const FRAME_POINTERS: u32 = 1 << 10;
    const SIGRETURN_OR_STOP: u32 = Self::SIGRETURN;
    const SIGRETURN_OR_FRAME_POINTERS: u32 = Self::SIGRETURN | Self::FRAME_POINTERS;
}

/// One frame by the rules of `row`.
#[inline(always)]
fn row_step<P: Process>(arch: Arch, regs: &mut Regs, process: &mut P, row: &UnwindRow) -> Rules {
    let cfa = match row.cfa_rule {
        cfa::SP => regs.sp.wrapping_add(row.cfa_offset as i64 as u64),
        cfa::FP => {
            if regs.fp_valid == 0 {
                return Rules::Stop(reason::UNSUPPORTED_RULE);
            }
            regs.fp.wrapping_add(row.cfa_offset as i64 as u64)
        }
        cfa::PLT => {
            let pushed = if (regs.pc & 15) >= row.arg as u64 {
                8
            } else {
                0
            };
            regs.sp
                .wrapping_add(row.cfa_offset as i64 as u64)
                .wrapping_add(pushed)
        }
        cfa::END => return Rules::Stop(reason::COMPLETE),
        cfa::USE_FP => return Rules::Fallback(Fallback::FRAME_POINTERS | reason::NO_TABLE),
        cfa::SIGNAL => return Rules::Fallback(Fallback::SIGNAL),
        cfa::NOT_COVERED => {
            return Rules::Fallback(Fallback::SIGRETURN_OR_FRAME_POINTERS | reason::PC_NOT_COVERED);
        }
        cfa::NOT_LOADED => {
            return Rules::Fallback(Fallback::SIGRETURN_OR_STOP | reason::NOT_LOADED);
        }
        // glibc's sigreturn trampolines describe themselves with
        // expressions; recognise them by their code instead.
        _ => return Rules::Fallback(Fallback::SIGRETURN_OR_STOP | reason::UNSUPPORTED_RULE),
    };
    let return_address = match row.ra_rule {
        reg::AT_CFA => match process.read_u64(cfa.wrapping_add(row.ra_offset as i64 as u64)) {
            Some(value) => value,
            None => return Rules::Stop(reason::READ_FAULT),
        },
        // Still in the link register: only known where the thread stopped.
        reg::SAME if arch == Arch::Aarch64 && regs.interrupted != 0 => regs.lr,
        _ => return Rules::Stop(reason::UNSUPPORTED_RULE),
    };
    match row.fp_rule {
        reg::SAME => {}
        reg::AT_CFA => match process.read_u64(cfa.wrapping_add(row.fp_offset as i64 as u64)) {
            Some(value) => {
                regs.fp = value;
                regs.fp_valid = 1;
            }
            None => return Rules::Stop(reason::READ_FAULT),
        },
        _ => regs.fp_valid = 0,
    }
    Rules::Caller {
        cfa,
        return_address,
    }
}

/// Moves `regs` to the caller, checking the new frame makes sense.
#[inline(always)]
fn finish_step(arch: Arch, regs: &mut Regs, cfa: u64, return_address: u64) -> Step {
    let return_address = strip_pointer_auth(arch, return_address);
    if return_address == 0 {
        // The outermost frames of threads often end with a null return
        // address instead of CFI saying so.
        return Step::Stop(reason::COMPLETE);
    }
    // Stacks grow down: a caller's frame is never below its callee's.
    if cfa < regs.sp || (cfa == regs.sp && return_address == regs.pc) {
        return Step::Stop(reason::BAD_FRAME);
    }
    regs.pc = return_address;
    regs.sp = cfa;
    regs.interrupted = 0;
    Step::Caller
}

/// Return addresses on aarch64 may carry a pointer authentication code in
/// their high bits.
#[inline(always)]
pub fn strip_pointer_auth(arch: Arch, address: u64) -> u64 {
    match arch {
        Arch::Aarch64 => address & AARCH64_VA_MASK,
        Arch::X86_64 => address,
    }
}

/// The caller's frame through the frame-pointer chain: (cfa, return
/// address), not checked yet; `why` is the reason reported when the chain
/// breaks.
#[inline(always)]
fn frame_pointer_step<P: Process>(
    regs: &mut Regs,
    process: &mut P,
    why: u32,
) -> Result<(u64, u64), Step> {
    if regs.fp_valid == 0 || regs.fp == 0 {
        // A null frame pointer ends the chain the way _start leaves it; but
        // we only got here for lack of a table, so say so.
        return Err(Step::Stop(why));
    }
    let fp = regs.fp;
    if fp < regs.sp {
        return Err(Step::Stop(why));
    }
    // One read at a time, each failure returning at once: reads combined in
    // a tuple let the compiler pick a failed read's (undefined) value from
    // any stack slot, which verifiers before 6.x reject as uninitialized.
    let fault = if why == reason::COMPLETE {
        reason::READ_FAULT
    } else {
        why
    };
    let Some(caller_fp) = process.read_u64(fp) else {
        return Err(Step::Stop(fault));
    };
    let Some(return_address) = process.read_u64(fp.wrapping_add(8)) else {
        return Err(Step::Stop(fault));
    };
    // x86_64 frame pointers point at the saved rbp, aarch64 ones at the frame
    // record; both leave the caller's sp just above the record (on aarch64
    // this is approximate, but only the CFA of table frames depends on sp).
    regs.fp = caller_fp;
    regs.fp_valid = 1;
    Ok((fp.wrapping_add(16), return_address))
}

/// The `rt_sigreturn` trampoline: x86_64 `mov $15, %rax; syscall`, aarch64
/// `mov x8, #139; svc #0`.
#[inline(always)]
fn is_sigreturn<P: Process>(arch: Arch, pc: u64, process: &mut P) -> bool {
    let Some(code) = process.read_u64_seldom(pc) else {
        return false;
    };
    match arch {
        // 48 c7 c0 0f 00 00 00 | 0f 05
        Arch::X86_64 => {
            code & 0x00ff_ffff_ffff_ffff == 0x0000_0000_0fc0_c748
                && process
                    .read_u64_seldom(pc.wrapping_add(7))
                    .is_some_and(|next| next & 0xffff == 0x050f)
        }
        // d2801168 d4000001
        Arch::Aarch64 => code == 0xd400_0001_d280_1168,
    }
}

/// Offsets, from the stack pointer at the sigreturn trampoline, of the
/// interrupted registers in the kernel's signal frame.
struct SignalFrame {
    pc: u64,
    sp: u64,
    fp: u64,
    lr: u64,
}

const X86_64_SIGNAL_FRAME: SignalFrame = SignalFrame {
    // sp -> ucontext: uc_flags, uc_link, uc_stack (40 bytes), then
    // sigcontext: r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip.
    pc: 40 + 16 * 8,
    sp: 40 + 15 * 8,
    fp: 40 + 10 * 8,
    lr: 0,
};

const AARCH64_SIGNAL_FRAME: SignalFrame = SignalFrame {
    // sp -> rt_sigframe: siginfo (128), ucontext: uc_flags, uc_link,
    // uc_stack, uc_sigmask (128) and padding up to 176, then sigcontext:
    // fault_address, regs[31], sp, pc.
    pc: 128 + 176 + 8 + 32 * 8,
    sp: 128 + 176 + 8 + 31 * 8,
    fp: 128 + 176 + 8 + 29 * 8,
    lr: 128 + 176 + 8 + 30 * 8,
};

/// Steps out of a signal trampoline to the interrupted code.
#[inline(always)]
fn signal_step<P: Process>(arch: Arch, regs: &mut Regs, process: &mut P) -> Step {
    let frame = match arch {
        Arch::X86_64 => X86_64_SIGNAL_FRAME,
        Arch::Aarch64 => AARCH64_SIGNAL_FRAME,
    };
    let base = regs.sp;
    // One read at a time (see `frame_pointer_step`).
    let Some(pc) = process.read_u64_seldom(base.wrapping_add(frame.pc)) else {
        return Step::Stop(reason::READ_FAULT);
    };
    let Some(sp) = process.read_u64_seldom(base.wrapping_add(frame.sp)) else {
        return Step::Stop(reason::READ_FAULT);
    };
    let Some(fp) = process.read_u64_seldom(base.wrapping_add(frame.fp)) else {
        return Step::Stop(reason::READ_FAULT);
    };
    if arch == Arch::Aarch64 {
        match process.read_u64_seldom(base.wrapping_add(frame.lr)) {
            Some(lr) => regs.lr = lr,
            None => return Step::Stop(reason::READ_FAULT),
        }
    }
    if pc == 0 {
        return Step::Stop(reason::BAD_FRAME);
    }
    regs.pc = strip_pointer_auth(arch, pc);
    regs.sp = sp;
    regs.fp = fp;
    regs.fp_valid = 1;
    // The interrupted instruction itself, not a return address.
    regs.interrupted = 1;
    Step::Caller
}
