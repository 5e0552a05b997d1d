//! ELF notes (`.note.gnu.build-id`, `.note.go.buildid`, `/sys/kernel/notes`).
#![no_main]

use hostprof::symbolize::notes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for note in notes(data) {
        assert!(note.name.len() + note.desc.len() <= data.len());
    }
});
