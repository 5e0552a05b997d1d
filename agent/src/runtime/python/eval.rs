//! Where CPython's evaluation loop is in its binary: what the symbol
//! `_PyEval_EvalFrameDefault` covers, and the parts a compiler split off
//! it. gcc's hot/cold partitioning can leave little under the symbol:
//! Debian's 3.14 keeps 1 KiB there and the loop's 84 KiB body in a part of
//! its own (`_PyEval_EvalFrameDefault.cold`), which only a symbol table
//! names, and Debian strips those. So a part is found from the code, as
//! the reference profiler does: each jump out of the loop's code lands in
//! a part, the function (by `.eh_frame`) the jump lands inside. A call is
//! no jump into a part, nor is a jump to a function's first byte (a tail
//! call to another function).
//!
//! The unwind service marks these ranges for the kernel, whose unwinder
//! then marks each of their frames in the stack (`CodeUse::Marked`): the
//! host puts the interpreter frames where those marks are.

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};

/// Parts kept per binary, and bytes decoded in all: the loop and its
/// parts are about 100 KiB of code.
pub const MAX_PARTS: usize = 16;
const MAX_DECODED: usize = 4 << 20;

/// The instruction sets whose jumps are decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    X86_64,
    Aarch64,
}

/// The loop's ranges (see [`loop_ranges`]), and whether the search
/// stopped at a cap before it had read every part it found.
#[derive(Debug, PartialEq, Eq)]
pub struct LoopRanges {
    /// Link-time addresses, sorted.
    pub ranges: Vec<(u64, u64)>,
    /// Parts past [`MAX_PARTS`] were left out, or parts found were not
    /// read past the bytes decoded cap (their own parts with them).
    pub capped: bool,
    /// Bytes decoded.
    pub decoded: usize,
}

/// The loop's ranges: `named`, the symbols' ranges, and every part found
/// from their code's jumps, and from the parts' own. `code(start, end)`
/// gives the bytes of a range (`None`: not in the file); `functions` are
/// the binary's functions by `.eh_frame`, sorted.
pub fn loop_ranges(
    isa: Isa,
    named: &[(u64, u64)],
    functions: &[(u64, u64)],
    code: impl Fn(u64, u64) -> Option<Vec<u8>>,
) -> LoopRanges {
    let mut ranges: Vec<(u64, u64)> = named.to_vec();
    let mut next = 0;
    let mut decoded = 0usize;
    let mut capped = false;
    while next < ranges.len() {
        let (start, end) = ranges[next];
        next += 1;
        let Some(bytes) = code(start, end) else {
            continue;
        };
        decoded += bytes.len();
        if decoded > MAX_DECODED {
            capped = true;
            break;
        }
        for target in jump_targets(isa, &bytes, start) {
            if ranges
                .iter()
                .any(|&(low, high)| (low..high).contains(&target))
            {
                continue;
            }
            if let Some(part) = landed_inside(functions, target) {
                if ranges.len() < named.len() + MAX_PARTS {
                    ranges.push(part);
                } else {
                    capped = true;
                }
            }
        }
    }
    ranges.sort_unstable();
    ranges.dedup();
    LoopRanges {
        ranges,
        capped,
        decoded,
    }
}

/// The function of `functions` (sorted) that `target` lies inside of,
/// past its first byte.
fn landed_inside(functions: &[(u64, u64)], target: u64) -> Option<(u64, u64)> {
    let index = functions.partition_point(|&(start, _)| start <= target);
    let &(start, end) = functions.get(index.checked_sub(1)?)?;
    (start < target && target < end).then_some((start, end))
}

/// Where the jumps (conditional or not, never calls) of the code `bytes`,
/// at `address`, go.
pub fn jump_targets(isa: Isa, bytes: &[u8], address: u64) -> Vec<u64> {
    match isa {
        Isa::X86_64 => x86_64_jumps(bytes, address),
        Isa::Aarch64 => aarch64_jumps(bytes, address),
    }
}

fn x86_64_jumps(bytes: &[u8], address: u64) -> Vec<u64> {
    let mut decoder = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE);
    let mut targets = Vec::new();
    while decoder.can_decode() {
        let instruction = decoder.decode();
        // Direct jumps only (`jmp`, `jcc`, `loop`, `jrcxz`): an indirect
        // one (a switch's table) has no target in its bytes.
        if instruction.op0_kind() == OpKind::NearBranch64
            && instruction.mnemonic() != Mnemonic::Call
        {
            targets.push(instruction.near_branch_target());
        }
    }
    targets
}

/// A64: `B`, `B.cond`, `CBZ`/`CBNZ`, `TBZ`/`TBNZ` (not `BL`, a call).
fn aarch64_jumps(bytes: &[u8], address: u64) -> Vec<u64> {
    // The `bits`-bit two's complement field `value`, as a signed number.
    let signed = |value: u32, bits: u32| -> i64 {
        i64::from(((value << (32 - bits)) as i32) >> (32 - bits))
    };
    bytes
        .chunks_exact(4)
        .enumerate()
        .filter_map(|(at, word)| {
            let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            let offset = if word & 0xfc00_0000 == 0x1400_0000 {
                signed(word & 0x03ff_ffff, 26)
            } else if word & 0xff00_0010 == 0x5400_0000 || word & 0x7e00_0000 == 0x3400_0000 {
                signed((word >> 5) & 0x7_ffff, 19)
            } else if word & 0x7e00_0000 == 0x3600_0000 {
                signed((word >> 5) & 0x3fff, 14)
            } else {
                return None;
            };
            let pc = address.wrapping_add(4 * at as u64);
            Some(pc.wrapping_add_signed(offset * 4))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x86_64_jumps_count_and_calls_do_not() {
        let at = 0x1000u64;
        let mut code = Vec::new();
        // jmp rel32 to 0x9000; je rel32 to 0x9100; call rel32 to 0x5000;
        // jmp rel8 back to the start; jmp *%rax (no target).
        let rel = |from: u64, to: u64| ((to as i64 - from as i64) as i32).to_le_bytes();
        code.push(0xe9);
        code.extend(rel(at + 5, 0x9000));
        code.extend([0x0f, 0x84]);
        code.extend(rel(at + 11, 0x9100));
        code.push(0xe8);
        code.extend(rel(at + 16, 0x5000));
        code.extend([0xeb, (-18i8) as u8]);
        code.extend([0xff, 0xe0]);
        assert_eq!(jump_targets(Isa::X86_64, &code, at), [0x9000, 0x9100, at]);
    }

    #[test]
    fn aarch64_jumps_count_and_calls_do_not() {
        let words: [u32; 6] = [
            0x1400_0010, // b +0x40
            0x9400_0010, // bl +0x40: a call
            0x5400_0040, // b.eq +8
            0xb4ff_ffe0, // cbz x0, -4
            0x3610_0060, // tbz w0, #2, +12
            0xd65f_03c0, // ret
        ];
        let bytes: Vec<u8> = words.iter().flat_map(|word| word.to_le_bytes()).collect();
        let at = 0x2000;
        assert_eq!(
            jump_targets(Isa::Aarch64, &bytes, at),
            [at + 0x40, at + 8 + 8, at + 12 - 4, at + 16 + 12]
        );
    }

    #[test]
    fn a_part_is_the_function_a_jump_lands_inside() {
        // The loop's symbol at 0x1000..0x1100 jumps into the middle of
        // 0x8000..0x9000 (its cold part), to the start of 0x9000..0x9100
        // (a tail call), and into no function; the part jumps to
        // 0xa010, inside 0xa000..0xa100 (a part of the part).
        let functions = [
            (0x1000, 0x1100),
            (0x8000, 0x9000),
            (0x9000, 0x9100),
            (0xa000, 0xa100),
        ];
        let code = |start: u64, _end: u64| -> Option<Vec<u8>> {
            let rel = |from: u64, to: u64| ((to as i64 - from as i64) as i32).to_le_bytes();
            let mut bytes = Vec::new();
            let targets: &[u64] = match start {
                0x1000 => &[0x8400, 0x9000, 0x7000],
                0x8000 => &[0xa010, 0x1050],
                _ => &[],
            };
            for &target in targets {
                bytes.push(0xe9);
                bytes.extend(rel(start + bytes.len() as u64 + 4, target));
            }
            Some(bytes)
        };
        let found = loop_ranges(Isa::X86_64, &[(0x1000, 0x1100)], &functions, code);
        assert_eq!(
            found.ranges,
            [(0x1000, 0x1100), (0x8000, 0x9000), (0xa000, 0xa100)]
        );
        assert!(!found.capped);
    }

    #[test]
    fn a_search_past_its_cap_of_parts_says_so() {
        // The loop jumps into the middle of MAX_PARTS + 1 functions.
        let functions: Vec<(u64, u64)> = (0..=MAX_PARTS as u64)
            .map(|part| (0x10_000 + part * 0x100, 0x10_000 + part * 0x100 + 0x100))
            .collect();
        let targets: Vec<u64> = functions.iter().map(|&(start, _)| start + 0x10).collect();
        let code = |start: u64, _end: u64| -> Option<Vec<u8>> {
            if start != 0x1000 {
                return Some(vec![0xc3]);
            }
            let mut bytes = Vec::new();
            for &target in &targets {
                let from = start + bytes.len() as u64 + 5;
                bytes.push(0xe9);
                bytes.extend(((target as i64 - from as i64) as i32).to_le_bytes());
            }
            Some(bytes)
        };
        let found = loop_ranges(Isa::X86_64, &[(0x1000, 0x1100)], &functions, code);
        assert_eq!(found.ranges.len(), 1 + MAX_PARTS);
        assert!(found.capped);
        // One part fewer: all found, not capped.
        let found = loop_ranges(
            Isa::X86_64,
            &[(0x1000, 0x1100)],
            &functions[..MAX_PARTS],
            code,
        );
        assert_eq!(found.ranges.len(), 1 + MAX_PARTS);
        assert!(!found.capped);
    }
}
