//! `/proc/PID/maps` text (paths are chosen by the process: file names with
//! spaces, newlines, " (deleted)"), then lookups in the executable mappings.
#![no_main]

use hostprof::procs::parse_maps;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(maps) = parse_maps(data) else {
        return;
    };
    let _ = maps.len();
    let starts = data
        .split(|&byte| byte == b'\n')
        .filter_map(|line| line.split(|&byte| byte == b'-').next())
        .filter_map(|start| std::str::from_utf8(start).ok())
        .filter_map(|start| u64::from_str_radix(start, 16).ok());
    for start in starts.take(32) {
        for address in [start, start.wrapping_sub(1), start.wrapping_add(0x10)] {
            if let Some((mapping, offset)) = maps.find(address) {
                let _ = (mapping.file_name(), offset);
            }
        }
    }
    let _ = maps.find(u64::MAX);
});
