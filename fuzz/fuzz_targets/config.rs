//! The agent's TOML configuration file (`--config`): written by an operator,
//! but a typo must be one clear line, never a panic.
#![no_main]

use hostprof::config::check_file;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(err) = check_file(text) {
        // The promise to the operator: one line naming what is wrong.
        assert!(!err.to_string().contains('\n'), "multi-line error: {err}");
    }
});
