//! Drains the sample ring buffer from tokio, woken by epoll (`AsyncFd`) when the
//! kernel signals a batch and by a timer for the remainder: no busy polling.
use std::{
    sync::mpsc::{Sender, SyncSender, TrySendError},
    time::Duration,
};

use agent_ebpf::Sample;

use super::StackCopy;
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
}

/// Reads samples until `stop` turns true, then drains what is left and returns.
/// Batches go to `out`; when it is full the batch is dropped and counted, so
/// a slow consumer never stalls the kernel side. `progress` always holds the
/// stats so far.
pub async fn read_ring(
    ring: RingBuf<MapData>,
    out: SyncSender<Vec<Sample>>,
    stop: watch::Receiver<bool>,
    progress: watch::Sender<ReaderStats>,
) -> std::io::Result<ReaderStats> {
    read_ring_with_copies(ring, out, None, stop, progress).await
}

/// [`read_ring`], also sending the stack copies of `--stack-copy` records
/// to `copies` (each sample still goes to `out` as usual).
pub async fn read_ring_with_copies(
    ring: RingBuf<MapData>,
    out: SyncSender<Vec<Sample>>,
    copies: Option<Sender<StackCopy>>,
    mut stop: watch::Receiver<bool>,
    progress: watch::Sender<ReaderStats>,
) -> std::io::Result<ReaderStats> {
    // SAFETY: the RingBuf owns its map fd and keeps it open and unchanged
    // until it is dropped, which happens only with the AsyncFd.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|err| err.into_parts().1)?;
    let mut stats = ReaderStats::default();
    let mut tick = tokio::time::interval(Duration::from_millis(agent_ebpf::RING_DRAIN_INTERVAL_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        progress.send_if_modified(|published| {
            let changed = *published != stats;
            *published = stats;
            changed
        });
        let stopping = tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard?;
                let batch = drain(guard.get_inner_mut(), copies.as_ref(), &mut stats);
                guard.clear_ready();
                send(&out, batch, &mut stats);
                false
            }
            _ = tick.tick() => {
                let batch = drain(ring.get_mut(), copies.as_ref(), &mut stats);
                send(&out, batch, &mut stats);
                false
            }
            _ = stop.wait_for(|stop| *stop) => true,
        };
        if stopping {
            let batch = drain(ring.get_mut(), copies.as_ref(), &mut stats);
            // The end of a run: wait for room rather than drop the tail.
            if !batch.is_empty() && out.send(batch).is_err() {
                break;
            }
            return Ok(stats);
        }
    }
    Ok(stats)
}

fn drain(
    ring: &mut RingBuf<MapData>,
    copies: Option<&Sender<StackCopy>>,
    stats: &mut ReaderStats,
) -> Vec<Sample> {
    let mut batch = Vec::new();
    while let Some(record) = ring.next() {
        if let Some(copy) = super::decode_stack_copy(&record) {
            stats.stack_copies += 1;
            if let Some(copies) = copies {
                // The receiver gone (stopping) is not the reader's concern.
                let _ = copies.send(copy);
            }
        }
        match super::decode_sample(&record) {
            Some(sample) => batch.push(sample),
            None => stats.malformed += 1,
        }
    }
    stats.samples += batch.len() as u64;
    batch
}

fn send(out: &SyncSender<Vec<Sample>>, batch: Vec<Sample>, stats: &mut ReaderStats) {
    if batch.is_empty() {
        return;
    }
    let len = batch.len() as u64;
    match out.try_send(batch) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
            stats.dropped_backlog += len
        }
    }
}
