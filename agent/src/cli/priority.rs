//! `record` and `top` run ahead of the host's busy processes.
//!
//! A recording's samples are complete only if the agent keeps up with
//! them: it reads the ring, holds early stack copies until their tables
//! come, and attributes each sample. On a saturated host (the bench's
//! scale row: 40 busy binaries on 2 CPUs) a thread at nice 0 gets one
//! runnable thread's share of a CPU, and a 10 s host-wide record saw the
//! early-copy queue overflow (4,392 of 5,517 copies dropped), tables in
//! after a median of 41 s and a quarter of the stacks complete. The work
//! is the same at either priority; done first, it helps the samples it
//! is for. The agent (`hostprof agent`) is the opposite: a guest on the
//! node, it yields (`crate::unwind`'s background nice).
//!
//! `nice` is per thread on Linux, and new threads inherit their creator's:
//! raised on the main thread before the session's threads exist, it holds
//! for all of them. A command `record` starts gets the user's back
//! ([`user_nice`]), so the profiled program runs as it would alone.
use std::sync::atomic::{AtomicI32, Ordering};

/// The niceness `record` and `top` run at: nine times a nice-0 thread's
/// weight.
pub const FOREGROUND_NICE: i32 = crate::unwind::FOREGROUND_NICE;

/// The main thread's niceness before [`raise`], for children
/// (`i32::MIN`: not raised).
static USER_NICE: AtomicI32 = AtomicI32::new(i32::MIN);

/// Raises the calling thread (and the threads it creates from now on) to
/// [`FOREGROUND_NICE`] when it runs lower and may be raised
/// (`CAP_SYS_NICE`); otherwise leaves it as it is, which still works, only
/// slower on a busy host.
pub fn raise() {
    // SAFETY: getpriority/setpriority on our own thread id. getpriority
    // may return -1 as a value: errno tells an error apart.
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        *libc::__errno_location() = 0;
        let before = libc::getpriority(libc::PRIO_PROCESS, tid);
        if *libc::__errno_location() != 0 || before <= FOREGROUND_NICE {
            return;
        }
        if libc::setpriority(libc::PRIO_PROCESS, tid, FOREGROUND_NICE) == 0 {
            USER_NICE.store(before, Ordering::Relaxed);
            tracing::debug!("running at nice {FOREGROUND_NICE} (was {before})");
        }
    }
}

/// The niceness a child should get back, if [`raise`] changed ours.
pub fn user_nice() -> Option<i32> {
    let nice = USER_NICE.load(Ordering::Relaxed);
    (nice != i32::MIN).then_some(nice)
}
