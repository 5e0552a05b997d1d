//! hostprof's eBPF side: a perf_event program that samples every CPU.
//!
//! Per sample it records who ran (tgid, tid, comm), where (cpu), when (ktime),
//! and both stacks, straight into a ring-buffer reservation: no stack-id hash
//! map, so nothing is lost to hash collisions and each sample keeps its own
//! timestamp. Every way a sample can be skipped, lost or damaged bumps a
//! per-CPU counter (see `hostprof_common::Counter`).
//!
//! This binary only exists for the BPF target; on the host the crate is just
//! its library (the shared contract), so the host build has nothing to do here.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// `#[inline(always)]` on closures (the eBPF object is built with nightly).
#![cfg_attr(target_arch = "bpf", feature(stmt_expr_attributes))]

#[cfg(target_arch = "bpf")]
mod programs;

#[cfg(not(target_arch = "bpf"))]
fn main() {
    // Built for the host only by `cargo clippy --workspace`; the real binary is
    // the bpfel-unknown-none object embedded in the agent.
}
