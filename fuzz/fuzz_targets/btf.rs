//! Kernel BTF (`/sys/kernel/btf/vmlinux`, `sampler/btf.rs`): read at load
//! time for a few `task_struct` offsets. Not tenant data, but a kernel of an
//! unexpected version or a damaged file must give `None` (one clear error
//! line), never a panic, a hang or a huge allocation.
#![no_main]

use hostprof::sampler::btf::{member_offset, struct_size};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // What the sampler asks at load time.
    for member in ["tgid", "pid", "stack", "__state", "state"] {
        let _ = member_offset(data, "task_struct", member);
    }
    let _ = struct_size(data, "pt_regs");
});
