//! The retry queue: requests waiting for the collector, bounded in bytes,
//! dropping the oldest first; and the backoff between attempts.
use std::{collections::VecDeque, time::Duration};

/// A FIFO bounded by the sum of its items' sizes.
#[derive(Debug)]
pub struct ByteQueue<T> {
    items: VecDeque<(T, usize)>,
    bytes: usize,
    limit: usize,
    /// Items and bytes dropped to make room, since creation.
    pub dropped_items: u64,
    pub dropped_bytes: u64,
}

impl<T> ByteQueue<T> {
    pub fn new(limit: usize) -> Self {
        ByteQueue {
            items: VecDeque::new(),
            bytes: 0,
            limit,
            dropped_items: 0,
            dropped_bytes: 0,
        }
    }

    /// Appends `item` of `size` bytes, dropping the oldest items until it fits.
    /// An item larger than the whole limit is kept alone rather than lost:
    /// the newest data is the most useful.
    pub fn push(&mut self, item: T, size: usize) {
        while !self.items.is_empty() && self.bytes + size > self.limit {
            self.drop_oldest();
        }
        self.bytes += size;
        self.items.push_back((item, size));
    }

    /// Drops the oldest item, counting it.
    pub fn drop_oldest(&mut self) {
        if let Some((_, size)) = self.items.pop_front() {
            self.bytes -= size;
            self.dropped_items += 1;
            self.dropped_bytes += size as u64;
        }
    }

    pub fn front(&self) -> Option<&T> {
        self.items.front().map(|(item, _)| item)
    }

    /// Removes the oldest item (it was delivered).
    pub fn pop(&mut self) -> Option<T> {
        let (item, size) = self.items.pop_front()?;
        self.bytes -= size;
        Some(item)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Exponential backoff with jitter: each delay is drawn from the upper half
/// of a range that doubles from `initial` up to `max`, so agents that lost the
/// same collector do not retry in lockstep.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            current: initial,
        }
    }

    /// The next delay; `random` in 0..=1 picks the jitter.
    pub fn next_delay(&mut self, random: f64) -> Duration {
        let delay = self.current.mul_f64(0.5 + 0.5 * random.clamp(0.0, 1.0));
        self.current = (self.current * 2).min(self.max);
        delay
    }

    /// Back to the initial delay after a success.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_oldest_first_and_counts() {
        let mut queue = ByteQueue::new(10);
        queue.push("a", 4);
        queue.push("b", 4);
        queue.push("c", 4);
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.front(), Some(&"b"));
        assert_eq!((queue.dropped_items, queue.dropped_bytes), (1, 4));
        queue.push("huge", 50);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.bytes(), 50);
        assert_eq!(queue.pop(), Some("huge"));
        assert!(queue.is_empty());
        assert_eq!(queue.bytes(), 0);
    }

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        assert_eq!(backoff.next_delay(1.0), Duration::from_millis(100));
        assert_eq!(backoff.next_delay(0.0), Duration::from_millis(100));
        assert_eq!(backoff.next_delay(1.0), Duration::from_millis(400));
        assert_eq!(backoff.next_delay(1.0), Duration::from_millis(400));
        backoff.reset();
        assert_eq!(backoff.next_delay(0.5), Duration::from_millis(75));
    }
}
