//! A Go `.gopclntab` section (Go 1.18+ header and function table), with and
//! without a text start from the `.text` section.
#![no_main]

use hostprof::symbolize::parse_gopclntab;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_gopclntab(data, None);
    let _ = parse_gopclntab(data, Some(0x401000));
    let _ = parse_gopclntab(data, Some(u64::MAX));
});
