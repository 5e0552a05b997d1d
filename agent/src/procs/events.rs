//! The kernel's process events (`hostprof_common::MAP_PROCESS_EVENTS`): forks,
//! execs and exits of wanted processes, drained by the attribution thread
//! before each batch of samples, so every event that came before a sample
//! is known when the sample is attributed.
use aya::maps::{MapData, RingBuf};
use hostprof_common::ProcessEvent;

/// The events ring, taken from the sampler.
pub struct EventSource {
    ring: RingBuf<MapData>,
}

impl EventSource {
    pub fn new(ring: RingBuf<MapData>) -> Self {
        EventSource { ring }
    }

    /// Every event waiting, oldest first; never blocks.
    pub fn drain(&mut self, mut each: impl FnMut(&ProcessEvent)) {
        while let Some(record) = self.ring.next() {
            if let Some(event) = decode_event(&record) {
                each(&event);
            }
        }
    }
}

/// Decodes one record of the events ring; `None` when too short (a
/// contract mismatch).
pub fn decode_event(record: &[u8]) -> Option<ProcessEvent> {
    if record.len() < std::mem::size_of::<ProcessEvent>() {
        return None;
    }
    // SAFETY: `ProcessEvent` is plain old data (integers, no padding) and
    // the record holds at least that many bytes; read unaligned.
    Some(unsafe { std::ptr::read_unaligned(record.as_ptr().cast::<ProcessEvent>()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_what_the_kernel_writes_and_refuses_short_records() {
        let event = ProcessEvent {
            kind: hostprof_common::PROCESS_EVENT_FORK,
            tgid: 42,
            parent_tgid: 7,
            _pad: 0,
            ktime_ns: 123,
        };
        // SAFETY: viewing a padding-free repr(C) value as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&event as *const ProcessEvent).cast::<u8>(),
                std::mem::size_of::<ProcessEvent>(),
            )
        };
        assert_eq!(decode_event(bytes), Some(event));
        assert_eq!(decode_event(&bytes[..8]), None);
    }
}
