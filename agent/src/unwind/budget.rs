//! The agent's table thread's CPU budget. At `nice` 10 the thread got a
//! weight of 110 against each busy process's 1024: on a 2-CPU node with
//! 200 busy processes about 1 ms of CPU a second, seven process loads in
//! 80 s (`cargo xtask bench --only scale --copies 200`), so most stacks
//! stayed incomplete for good. Now it runs ahead of them (`nice`
//! [`super::TABLES_NICE`], as `record`'s does) but within a budget of its own CPU time: [`SHARE`] of
//! one CPU over its life, with [`BURST`] of it up front, so a start or a
//! wave of new binaries is served at once and a steady churn of execs
//! costs the node at most [`SHARE`].
use std::time::{Duration, Instant};

/// The share of one CPU the thread may use, averaged over its life.
pub const SHARE: f64 = 0.05;
/// CPU time it may use ahead of that average (the first tables of a
/// start, a deploy's new binaries).
pub const BURST: Duration = Duration::from_secs(3);

/// A thread's spending against the budget.
pub struct CpuBudget {
    started: Instant,
    share: f64,
    burst: Duration,
}

impl CpuBudget {
    pub fn new(share: f64, burst: Duration) -> Self {
        CpuBudget {
            started: Instant::now(),
            share,
            burst,
        }
    }

    /// How long to pause after using `used` of CPU by `elapsed` after the
    /// start, so that the use falls back within the budget (zero when it
    /// is within).
    pub fn pause_for(&self, used: Duration, elapsed: Duration) -> Duration {
        let allowed = elapsed.mul_f64(self.share) + self.burst;
        match used.checked_sub(allowed) {
            // Pausing p adds p × share to what is allowed.
            Some(over) if !over.is_zero() => over.div_f64(self.share),
            _ => Duration::ZERO,
        }
    }

    /// Sleeps while the calling thread is over its budget.
    pub fn pause(&self) {
        let used = thread_cpu_time();
        let wait = self.pause_for(used, self.started.elapsed());
        if !wait.is_zero() {
            tracing::debug!("unwind tables: {wait:?} paused, within the agent's CPU budget");
            std::thread::sleep(wait);
        }
    }
}

/// CPU time of the calling thread.
fn thread_cpu_time() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pauses_only_past_its_share_and_burst() {
        let budget = CpuBudget::new(0.05, Duration::from_secs(3));
        let s = Duration::from_secs;
        // Within the burst: no pause, however early.
        assert_eq!(budget.pause_for(s(3), s(0)), Duration::ZERO);
        // 100 s in: 5 s + 3 s allowed.
        assert_eq!(budget.pause_for(s(8), s(100)), Duration::ZERO);
        // One second over: paused until 20 s more wall time allow it.
        let pause = budget.pause_for(s(9), s(100));
        assert_eq!(pause, s(20));
        assert_eq!(budget.pause_for(s(9), s(100) + pause), Duration::ZERO);
        // The thread's own clock moves.
        let start = thread_cpu_time();
        let mut x = 0u64;
        while thread_cpu_time() - start < Duration::from_millis(5) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }
}
