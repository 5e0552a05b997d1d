//! The evaluation loop's parts (`runtime/python/eval.rs`), found from a
//! file's code: any bytes, decoded as x86_64 or A64, give jumps and parts
//! that are functions of the file, no more than the cap, and never hang.
#![no_main]

use hostprof::runtime::python::eval::{Isa, MAX_PARTS, jump_targets, loop_ranges};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte: the instruction set; the rest: the loop's code, at
    // 0x10000, among functions of 4 KiB from 0 to 1 MiB.
    let Some((&isa, code)) = data.split_first() else {
        return;
    };
    let isa = if isa & 1 == 0 { Isa::X86_64 } else { Isa::Aarch64 };
    let start = 0x10000u64;
    let named = [(start, start + code.len() as u64)];
    let functions: Vec<(u64, u64)> = (0..256u64).map(|i| (i << 12, (i + 1) << 12)).collect();
    let targets = jump_targets(isa, code, start);
    assert!(targets.len() <= code.len());
    // Every range reads as the same bytes: parts of parts are decoded too.
    let ranges = loop_ranges(isa, &named, &functions, |_, _| Some(code.to_vec())).ranges;
    assert!(ranges.len() <= 1 + MAX_PARTS);
    assert!(ranges.windows(2).all(|pair| pair[0] < pair[1]));
    for range in ranges.iter().filter(|range| **range != named[0]) {
        assert!(functions.contains(range), "{range:x?} is no function");
    }
});
