//! A Python process's `_Py_DebugOffsets` (the first bytes of `_PyRuntime`,
//! `runtime/python/layout.rs`), then a code object read with the layout it gives,
//! over the same bytes. Accepted offsets must stay inside their caps.
#![no_main]

use hostprof::{
    procs::memory::Image,
    runtime::python::{
        Code,
        layout::from_debug_offsets,
        limits::{MAX_OBJECT_BYTES, MAX_STATE_BYTES},
    },
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte: 3.13 or 3.14; the rest: the blob.
    let Some((&minor, blob)) = data.split_first() else {
        return;
    };
    let Ok(layout) = from_debug_offsets(13 + (minor & 1), blob) else {
        return;
    };
    let code = layout.code;
    for offset in [code.filename, code.qualname, code.linetable] {
        assert!(offset + 8 <= MAX_OBJECT_BYTES, "{layout:?}");
    }
    assert!(code.firstlineno + 4 <= MAX_OBJECT_BYTES && code.code_adaptive <= MAX_OBJECT_BYTES);
    let kernel = layout.kernel;
    for offset in [kernel.interpreters_head, kernel.threads_head] {
        assert!(u64::from(offset) + 8 <= MAX_STATE_BYTES, "{layout:?}");
    }
    for offset in [
        kernel.thread_next,
        kernel.thread_native_id,
        kernel.thread_frame,
        kernel.frame_previous,
        kernel.frame_code,
        kernel.frame_instr,
        kernel.frame_owner,
    ] {
        assert!(u64::from(offset) < MAX_OBJECT_BYTES, "{layout:?}");
    }
    let memory = Image {
        base: 0,
        bytes: blob,
    };
    let _ = Code::fingerprint(&memory, 0, &code);
    let _ = Code::read(&memory, 0, 0, &code);
});
