//! The userspace pipeline: a raw kernel [`Sample`] becomes a [`ResolvedSample`]
//! (procs → unwind → symbolize) and goes to every [`SampleSink`].
//!
//! The kernel already walked the stacks (frame pointers), so "unwind" here is
//! turning each instruction pointer into a [`Frame`] with its mapping.
use std::{sync::Arc, time::Instant};

use agent_ebpf::Sample;

use crate::{
    model::{Frame, FrameKind, ResolvedSample},
    procs::ProcessTable,
    symbolize::Symbolizer,
};

/// Where resolved samples go: a file format, an exporter, a summary.
pub trait SampleSink: Send {
    fn push(&mut self, sample: &ResolvedSample);
}

/// Converts kernel CLOCK_MONOTONIC timestamps to Unix time.
#[derive(Clone, Copy, Debug)]
pub struct KernelClock {
    /// realtime - monotonic, in nanoseconds.
    offset_ns: i128,
}

impl KernelClock {
    /// Measures the offset now.
    pub fn now() -> Self {
        let monotonic = clock_ns(libc::CLOCK_MONOTONIC);
        let realtime = clock_ns(libc::CLOCK_REALTIME);
        KernelClock {
            offset_ns: realtime - monotonic,
        }
    }

    /// Unix time in nanoseconds of a `bpf_ktime_get_ns()` value.
    pub fn to_unix_nanos(&self, ktime_ns: u64) -> u64 {
        (ktime_ns as i128 + self.offset_ns).max(0) as u64
    }
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// Turns raw samples into resolved ones.
pub struct Resolver {
    procs: ProcessTable,
    symbolizer: Arc<Symbolizer>,
    clock: KernelClock,
    last_sweep: Instant,
}

impl Resolver {
    pub fn new(symbolizer: Arc<Symbolizer>) -> Self {
        Resolver {
            procs: ProcessTable::new(),
            symbolizer,
            clock: KernelClock::now(),
            last_sweep: Instant::now(),
        }
    }

    /// Processes currently cached.
    pub fn cached_processes(&self) -> usize {
        self.procs.len()
    }

    pub fn resolve(&mut self, sample: &Sample) -> ResolvedSample {
        let comm = comm_str(&sample.comm);
        let process = self.procs.info(sample.tgid, &comm);
        let kernel = &sample.kernel_stack
            [..(sample.kernel_stack_len as usize).min(sample.kernel_stack.len())];
        let user =
            &sample.user_stack[..(sample.user_stack_len as usize).min(sample.user_stack.len())];
        let mut frames = Vec::with_capacity(kernel.len() + user.len());
        for (depth, &address) in kernel.iter().enumerate() {
            let mut frame = Frame {
                kind: FrameKind::Kernel,
                address,
                mapping: None,
                file_offset: 0,
                lines: Vec::new(),
            };
            self.symbolizer
                .symbolize(sample.tgid, &mut frame, depth > 0);
            frames.push(frame);
        }
        for (depth, &address) in user.iter().enumerate() {
            let (mapping, file_offset) = match self.procs.mapping_of(sample.tgid, &comm, address) {
                Some((mapping, offset)) => (Some(mapping), offset),
                None => (None, 0),
            };
            let mut frame = Frame {
                kind: FrameKind::Native,
                address,
                mapping,
                file_offset,
                lines: Vec::new(),
            };
            self.symbolizer
                .symbolize(sample.tgid, &mut frame, depth > 0);
            frames.push(frame);
        }
        if self.last_sweep.elapsed().as_secs() >= 10 {
            self.procs.forget_exited();
            self.last_sweep = Instant::now();
        }
        ResolvedSample {
            process,
            tid: sample.tid,
            thread_name: comm.into(),
            cpu: sample.cpu,
            time_unix_nano: self.clock.to_unix_nanos(sample.ktime_ns),
            frames,
        }
    }
}

/// The NUL-padded kernel comm as text.
pub fn comm_str(comm: &[u8]) -> String {
    let end = comm
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_time_converts_to_now() {
        let clock = KernelClock::now();
        let unix = clock.to_unix_nanos(clock_ns(libc::CLOCK_MONOTONIC) as u64);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(now.abs_diff(unix) < 1_000_000_000, "{now} vs {unix}");
    }

    #[test]
    fn comm_stops_at_nul() {
        assert_eq!(comm_str(b"bash\0\0\0\0\0\0\0\0\0\0\0\0"), "bash");
        assert_eq!(comm_str(b"0123456789abcdef"), "0123456789abcdef");
    }
}
