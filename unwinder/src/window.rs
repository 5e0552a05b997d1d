//! The unwinder's copy of a window of the user stack, which serves its
//! reads of return addresses and saved registers.
//!
//! A user read is the costliest step of a frame in the kernel (about
//! 65 ns on this project's VMs, against about 35 for the rest of a frame),
//! and reading a few frames' worth of stack costs little more than reading
//! one word. So the first read of an unwind copies up to
//! [`STACK_WINDOW_BYTES`] from its address on, and the frames above it are
//! read from the copy. A copy never runs past the end of the page it starts
//! in: it fails only where a one-word read at its address would.

/// Bytes of user stack a [`StackWindow`] holds.
pub const STACK_WINDOW_BYTES: usize = 512;
const _: () = assert!(STACK_WINDOW_BYTES.is_power_of_two());

/// The smallest page either architecture maps.
const PAGE_BYTES: u64 = 4096;

/// `len` bytes of user memory from `base` on (a multiple of 8; 0: empty).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackWindow {
    pub base: u64,
    pub len: u32,
    pub _pad: u32,
    pub words: [u64; STACK_WINDOW_BYTES / 8],
}

impl StackWindow {
    /// The index in `words` of the aligned word at `address`, if the
    /// window holds it.
    #[inline(always)]
    pub fn slot(&self, address: u64) -> Option<usize> {
        let offset = address.wrapping_sub(self.base);
        // `len` is a multiple of 8: an aligned word that starts inside
        // ends inside.
        (address & 7 == 0 && offset < u64::from(self.len))
            .then(|| (crate::opaque(offset >> 3) & (STACK_WINDOW_BYTES as u64 / 8 - 1)) as usize)
    }
}

/// How many bytes to copy into a window that starts at the aligned
/// `address`: up to [`STACK_WINDOW_BYTES`], not past the end of its page,
/// and at least the word itself. Masked so that the BPF verifier sees the
/// bounds.
#[inline(always)]
pub fn window_fill_len(address: u64) -> u32 {
    let page_left = PAGE_BYTES - (address & (PAGE_BYTES - 1));
    let len = if page_left > STACK_WINDOW_BYTES as u64 {
        STACK_WINDOW_BYTES as u64
    } else {
        page_left
    };
    let len = (crate::opaque(len) & (2 * STACK_WINDOW_BYTES as u64 - 1)).max(8);
    if len > STACK_WINDOW_BYTES as u64 {
        STACK_WINDOW_BYTES as u32
    } else {
        len as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(base: u64, len: u32) -> StackWindow {
        StackWindow {
            base,
            len,
            _pad: 0,
            words: [0; STACK_WINDOW_BYTES / 8],
        }
    }

    #[test]
    fn a_window_holds_the_aligned_words_it_copied() {
        let copied = window(0x7ff0_1000, 64);
        assert_eq!(copied.slot(0x7ff0_1000), Some(0));
        assert_eq!(copied.slot(0x7ff0_1038), Some(7));
        // Past its end, below its start (wrapping), unaligned.
        assert_eq!(copied.slot(0x7ff0_1040), None);
        assert_eq!(copied.slot(0x7ff0_0ff8), None);
        assert_eq!(copied.slot(0x7ff0_1004), None);
        // An empty window holds nothing.
        assert_eq!(window(0x7ff0_1000, 0).slot(0x7ff0_1000), None);
    }

    #[test]
    fn a_fill_stops_at_the_end_of_its_page() {
        assert_eq!(window_fill_len(0x7ff0_1000), STACK_WINDOW_BYTES as u32);
        assert_eq!(window_fill_len(0x7ff0_1e00), STACK_WINDOW_BYTES as u32);
        assert_eq!(window_fill_len(0x7ff0_1f00), 256);
        assert_eq!(window_fill_len(0x7ff0_1ff8), 8);
        // Whatever the address, the copy fits the window.
        for address in (0..2 * PAGE_BYTES).step_by(8) {
            let len = window_fill_len(address);
            assert!(
                (8..=STACK_WINDOW_BYTES as u32).contains(&len),
                "{address:#x}: {len}"
            );
            assert!(address + u64::from(len) <= (address / PAGE_BYTES + 1) * PAGE_BYTES);
        }
    }
}
