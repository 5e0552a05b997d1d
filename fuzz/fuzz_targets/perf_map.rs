//! A JIT's perf map (`/tmp/perf-PID.map`), written by the profiled process,
//! then lookups at the addresses it names and around them.
#![no_main]

use hostprof::symbolize::PerfMap;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The agent reads the file as text (read_to_string), so non-UTF-8 input
    // never reaches the parser.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let map = PerfMap::parse(text);
    let _ = map.estimated_size();
    let starts = text
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|start| u64::from_str_radix(start.trim_start_matches("0x"), 16).ok());
    for start in starts.take(32) {
        for address in [start, start.wrapping_sub(1), start.wrapping_add(1)] {
            let _ = map.lookup(address);
        }
    }
    let _ = map.lookup(0);
    let _ = map.lookup(u64::MAX);
});
