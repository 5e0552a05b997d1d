//! A code object in a Python process's memory (`runtime/python/code.rs`): its
//! fingerprint, then its name, file and location table, then lines of it.
//! Pointers in it may point anywhere in the input, to itself included.
#![no_main]

use hostprof::{
    procs::memory::{Image, Memory},
    runtime::python::{
        Code,
        layout::fixed,
        limits::{MAX_LINETABLE_BYTES, MAX_STRING_CHARS},
    },
};
use libfuzzer_sys::fuzz_target;

/// Where the input is mapped; the code object is at its start.
const BASE: u64 = 0x1000;

fuzz_target!(|data: &[u8]| {
    // First byte: a fixed layout (3.8 to 3.12, each line table form); the
    // rest: memory from BASE on.
    let Some((&version, image)) = data.split_first() else {
        return;
    };
    let layout = fixed(8 + version % 5).expect("a fixed layout").code;
    let memory = Image {
        base: BASE,
        bytes: image,
    };
    // Whatever type the object says it has (so the fuzzer need not guess).
    let code_type = memory.read_u64(BASE + 8).unwrap_or(0);
    let _ = Code::fingerprint(&memory, BASE, &layout);
    if let Ok(Some(code)) = Code::read(&memory, BASE, code_type, &layout) {
        for text in [&code.qualname, &code.filename] {
            assert!(text.chars().count() as u64 <= MAX_STRING_CHARS);
        }
        assert!(code.lines.bytes() as u64 <= (MAX_LINETABLE_BYTES + 1) * 8);
        for offset in [0, 1, 2, 64, 1 << 20, u64::MAX] {
            let _ = code.line_at(offset);
        }
    }
    // The same object at the very end of the address space.
    let end = Image {
        base: u64::MAX - image.len() as u64,
        bytes: image,
    };
    let _ = Code::fingerprint(&end, end.base, &layout);
    let _ = Code::read(&end, end.base, code_type, &layout);
});
