//! Drains the sample ring buffer from tokio, woken by epoll (`AsyncFd`) when the
//! kernel signals a batch and by a timer for the remainder: no busy polling.
use std::{
    sync::mpsc::{SyncSender, TrySendError},
    time::Duration,
};

use hostprof_common::Sample;

use super::{EarlyCopy, Records, StackCopy};
use aya::maps::{MapData, RingBuf};
use tokio::{io::unix::AsyncFd, sync::watch};

/// What the reader saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderStats {
    /// Records decoded.
    pub samples: u64,
    /// Samples dropped because the pipeline behind was full.
    pub dropped_backlog: u64,
    /// Records too short to be a sample (a contract mismatch).
    pub malformed: u64,
    /// Records carrying a copy of the user stack (`--stack-copy`).
    pub stack_copies: u64,
    /// Stack copies dropped because their bounded queue was full (the
    /// sample itself still counts).
    pub stack_copies_dropped: u64,
    /// Copies of samples taken before their process's tables were loaded,
    /// passed on to be unwound on the host.
    pub early_copies: u64,
    /// Such copies dropped because their bounded queue was full.
    pub early_copies_dropped: u64,
}

/// The unwind service's request: a process's tables, or (with an
/// address) the rows of the function there.
pub type AskTables = Box<dyn Fn(u32, Option<u64>) + Send + Sync>;

/// Where the stack copies of ring records go, and who hears of the
/// processes whose tables the kernel lacked.
#[derive(Default)]
pub struct CopySinks {
    /// Every copy (`--stack-copy`).
    pub all: Option<SyncSender<StackCopy>>,
    /// Copies of samples the kernel could not unwind for want of tables
    /// (`crate::unwind::early`).
    pub early: Option<SyncSender<EarlyCopy>>,
    /// Called with the process of each record the kernel could not unwind
    /// for want of tables ([`super::needs_tables`]), and with the address
    /// too where it wanted a function's rows ([`super::function_wanted`]):
    /// the unwind service's request, made as the record arrives. Made by attribution instead,
    /// it waited behind whatever attribution was busy with (a co-tenant's
    /// huge binary read for names): on a saturated host, tables came after
    /// the recording while the copies waiting for them overflowed.
    pub tables: Option<AskTables>,
}

/// Reads samples until `stop` turns true, then drains what is left and returns.
/// Batches go to `out`; while it is full they wait in the reader, up to
/// [`MAX_WAITING_SAMPLES`], and beyond that the oldest are dropped and
/// counted, so a slow consumer never stalls the kernel side. `progress` always holds the
/// stats so far.
pub async fn read_ring(
    ring: RingBuf<MapData>,
    out: SyncSender<Records>,
    stop: watch::Receiver<bool>,
    progress: watch::Sender<ReaderStats>,
) -> std::io::Result<ReaderStats> {
    let every = Duration::from_millis(hostprof_common::RING_DRAIN_INTERVAL_MS);
    read_ring_with_copies(ring, out, CopySinks::default(), every, stop, progress).await
}

/// [`read_ring`], also sending the stack copies of `--stack-copy` records
/// to `copies` (each sample still goes to `out` as usual); a full `copies`
/// drops the copy and counts it, never blocks the reader. Unless the
/// kernel wakes it (a full-ish ring, a new targeted process), the reader
/// drains the ring every `drain_every`: each drain wakes every thread of
/// the pipeline once, so this sets an idle agent's CPU.
pub async fn read_ring_with_copies(
    ring: RingBuf<MapData>,
    out: SyncSender<Records>,
    copies: CopySinks,
    drain_every: Duration,
    mut stop: watch::Receiver<bool>,
    progress: watch::Sender<ReaderStats>,
) -> std::io::Result<ReaderStats> {
    // SAFETY: the RingBuf owns its map fd and keeps it open and unchanged
    // until it is dropped, which happens only with the AsyncFd.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|err| err.into_parts().1)?;
    let mut stats = ReaderStats::default();
    let mut tick = Ticker::new(drain_every)?;
    let mut out = Outbox::new(out);
    loop {
        progress.send_if_modified(|published| {
            let changed = *published != stats;
            *published = stats;
            changed
        });
        let stopping = tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard?;
                let batch = drain(guard.get_inner_mut(), &copies, &mut stats);
                guard.clear_ready();
                out.send(batch, &mut stats);
                false
            }
            ticked = tick.tick() => {
                ticked?;
                let batch = drain(ring.get_mut(), &copies, &mut stats);
                out.tick(batch, &mut stats);
                false
            }
            _ = stop.wait_for(|stop| *stop) => true,
        };
        if stopping {
            let batch = drain(ring.get_mut(), &copies, &mut stats);
            if !out.finish(batch) {
                break;
            }
            return Ok(stats);
        }
    }
    Ok(stats)
}

/// A kernel timer (timerfd) firing every period: one wakeup per tick.
/// tokio's timer wheel wakes twice for a period above 64 ms (once at its
/// coarse slot, once at the exact millisecond), and for an idle agent
/// these wakeups are most of its CPU.
struct Ticker(AsyncFd<std::os::fd::OwnedFd>);

impl Ticker {
    fn new(period: Duration) -> std::io::Result<Self> {
        use rustix::time::{
            Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create,
            timerfd_settime,
        };
        let timer = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        let period = Timespec {
            tv_sec: period.as_secs() as _,
            tv_nsec: period.subsec_nanos().max(1) as _,
        };
        timerfd_settime(
            &timer,
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: period,
                it_value: period,
            },
        )?;
        // SAFETY: the AsyncFd owns the timer's fd, which stays open and
        // unchanged until the AsyncFd is dropped.
        let timer =
            unsafe { AsyncFd::register_with_interest(timer, tokio::io::Interest::READABLE) }
                .map_err(|err| err.into_parts().1)?;
        Ok(Ticker(timer))
    }

    /// Waits for the next tick (ticks missed meanwhile count as one).
    async fn tick(&mut self) -> std::io::Result<()> {
        loop {
            let mut guard = self.0.readable_mut().await?;
            let mut expirations = [0u8; 8];
            match rustix::io::read(guard.get_inner(), &mut expirations) {
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
                Err(err) => return Err(err.into()),
            }
        }
    }
}

fn drain(ring: &mut RingBuf<MapData>, copies: &CopySinks, stats: &mut ReaderStats) -> Records {
    let mut batch = Records::default();
    // Where each record is checked (decoded and dropped): one buffer per
    // drain, not a 4 KiB `Sample` per record.
    // SAFETY: all-zero is a valid `Sample` (integers only).
    let mut scratch: Box<Sample> = Box::new(unsafe { std::mem::zeroed() });
    while let Some(record) = ring.next() {
        let pushed = batch.push(&record, &mut scratch);
        if !pushed {
            stats.malformed += 1;
        }
        let mut held = false;
        // A stack-copy record's registers and stack are read once, for
        // both sinks.
        if let Some(mut copy) = super::decode_early_copy(&record) {
            stats.stack_copies += 1;
            // Held for the tables the sample wanted (its process, the
            // mapping its walk reached, or a function's rows): not our own, whose executable's
            // are left out on purpose (with `--stack-copy` every sample
            // has a copy).
            let early = copies.early.as_ref().filter(|_| {
                (super::needs_tables(copy.flags) || super::stopped_not_loaded(copy.flags))
                    && scratch.tgid != std::process::id()
            });
            if let Some(all) = &copies.all
                && let Some(sample) = super::decode_sample(&record)
            {
                let stack = match early {
                    Some(_) => copy.stack.clone(),
                    None => std::mem::take(&mut copy.stack),
                };
                let whole = StackCopy {
                    sample,
                    regs: copy.regs,
                    stack,
                };
                match all.try_send(whole) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => stats.stack_copies_dropped += 1,
                    // The receiver gone (stopping) is not the reader's concern.
                    Err(TrySendError::Disconnected(_)) => {}
                }
            }
            if let Some(early) = early {
                stats.early_copies += 1;
                match early.try_send(copy) {
                    Ok(()) => held = true,
                    Err(TrySendError::Full(_)) => stats.early_copies_dropped += 1,
                    Err(TrySendError::Disconnected(_)) => {}
                }
            }
        }
        if pushed && let Some(ask) = &copies.tables {
            if super::needs_tables(scratch.flags) {
                ask(scratch.tgid, None);
            } else if let Some(pc) = super::function_wanted(&scratch).filter(|_| !held) {
                // A held copy asks itself, its stack along (the functions
                // its callers need come in the same growth).
                ask(scratch.tgid, Some(pc));
            }
        }
    }
    stats.samples += batch.len() as u64;
    batch
}

/// Samples the reader keeps while the pipeline behind it is full; past
/// this the oldest are dropped and counted. About two seconds of a 2-CPU
/// host sampled at 999 Hz; about 1 MiB (records wait at their compact
/// size, some 200 bytes for a C stack, at most 2 KiB), and only while
/// attribution is behind.
const MAX_WAITING_SAMPLES: usize = 4096;

/// The reader's side of the channel to the pipeline. A batch that does not
/// fit waits here and later drains join it, so what bounds the backlog is
/// samples, not batches: a burst of wakeups (every first sample of a
/// selected process wakes the reader) makes batches of one sample, and
/// the channel's batches would fill in a fraction of a second.
struct Outbox {
    out: SyncSender<Records>,
    waiting: Records,
}

impl Outbox {
    fn new(out: SyncSender<Records>) -> Self {
        Outbox {
            out,
            waiting: Records::default(),
        }
    }

    /// Passes `batch` on (after the samples still waiting) if the channel
    /// has room, keeps it otherwise; never blocks.
    fn send(&mut self, mut batch: Records, stats: &mut ReaderStats) {
        if !self.waiting.is_empty() {
            self.waiting.append(&mut batch);
            batch = std::mem::take(&mut self.waiting);
        }
        if batch.is_empty() {
            return;
        }
        match self.out.try_send(batch) {
            Ok(()) => {}
            Err(TrySendError::Full(mut batch)) => {
                // The oldest go first: theirs are the processes likeliest
                // to have exited before they could be attributed.
                let excess = batch.len().saturating_sub(MAX_WAITING_SAMPLES);
                batch.drop_oldest(excess);
                stats.dropped_backlog += excess as u64;
                self.waiting = batch;
            }
            Err(TrySendError::Disconnected(batch)) => stats.dropped_backlog += batch.len() as u64,
        }
    }

    /// An empty batch when nothing waits: the attribution thread then
    /// applies the process events waiting (an exec's tables are asked for
    /// within a tick, not at the process's first sample).
    fn tick(&mut self, batch: Records, stats: &mut ReaderStats) {
        if batch.is_empty() && self.waiting.is_empty() {
            let _ = self.out.try_send(batch);
        } else {
            self.send(batch, stats);
        }
    }

    /// The end of a run: waits for room rather than drop the tail; false
    /// when the pipeline is gone.
    fn finish(mut self, mut batch: Records) -> bool {
        self.waiting.append(&mut batch);
        self.waiting.is_empty() || self.out.send(self.waiting).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn batch(tids: std::ops::Range<u32>) -> Records {
        let mut records = Records::default();
        // SAFETY: all-zero is a valid `Sample` (integers only).
        let mut scratch: Box<Sample> = Box::new(unsafe { std::mem::zeroed() });
        for tid in tids {
            let mut header = [0u8; hostprof_common::SAMPLE_HEADER_BYTES];
            let at = std::mem::offset_of!(Sample, tid);
            header[at..at + 4].copy_from_slice(&tid.to_ne_bytes());
            assert!(records.push(&header, &mut scratch));
        }
        records
    }

    /// The tids of what `rx` holds, in order.
    fn tids(rx: &mpsc::Receiver<Records>) -> Vec<u32> {
        let mut tids = Vec::new();
        for records in rx.try_iter() {
            records.for_each(|sample| tids.push(sample.tid));
        }
        tids
    }

    #[test]
    fn a_burst_of_tiny_batches_waits_instead_of_being_dropped() {
        let (tx, rx) = mpsc::sync_channel(2);
        let mut out = Outbox::new(tx);
        let mut stats = ReaderStats::default();
        // Far more one-sample batches than the channel holds.
        for tid in 0..1000 {
            out.send(batch(tid..tid + 1), &mut stats);
        }
        assert_eq!(stats.dropped_backlog, 0);
        // A tick with nothing new still passes on what waits.
        let received = tids(&rx);
        assert_eq!(received, [0, 1]);
        out.tick(Records::default(), &mut stats);
        let received = tids(&rx);
        assert_eq!(
            received,
            (2..1000).collect::<Vec<_>>(),
            "in order, once each"
        );
    }

    #[test]
    fn past_its_bound_the_oldest_waiting_samples_are_dropped_and_counted() {
        let (tx, rx) = mpsc::sync_channel(1);
        let mut out = Outbox::new(tx);
        let mut stats = ReaderStats::default();
        out.send(batch(0..1), &mut stats);
        let total = MAX_WAITING_SAMPLES as u32 + 10;
        for tid in 1..=total {
            out.send(batch(tid..tid + 1), &mut stats);
        }
        assert_eq!(stats.dropped_backlog, 10);
        let first = tids(&rx);
        assert_eq!(first, [0], "the batch that fitted");
        assert!(
            out.finish(Records::default()),
            "the pipeline is still there"
        );
        let rest = tids(&rx);
        let received: Vec<u32> = first.into_iter().chain(rest).collect();
        assert_eq!(received[1], 11, "the oldest waiting went");
        assert_eq!(received.last(), Some(&total));
        assert_eq!(received.len() as u32, 1 + MAX_WAITING_SAMPLES as u32);
    }
}
