//! The rows map's free space: chunk ranges, first fit, merged when freed.
use super::*;

impl<M: TableMaps> TableLoader<M> {
    /// First fit over the free list.
    pub(super) fn allocate(&mut self, chunks: u32) -> Option<u32> {
        if chunks == 0 || chunks > self.capacity_chunks {
            return None;
        }
        let index = self.free.iter().position(|&(_, len)| len >= chunks)?;
        let (start, len) = self.free[index];
        if len == chunks {
            self.free.remove(index);
        } else {
            self.free[index] = (start + chunks, len - chunks);
        }
        Some(start)
    }

    pub(super) fn free_range(&mut self, start: u32, len: u32) {
        let index = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(index, (start, len));
        // Merge with the next, then with the previous range.
        if index + 1 < self.free.len() && start + len == self.free[index + 1].0 {
            self.free[index].1 += self.free[index + 1].1;
            self.free.remove(index + 1);
        }
        if index > 0 && self.free[index - 1].0 + self.free[index - 1].1 == start {
            self.free[index - 1].1 += self.free[index].1;
            self.free.remove(index);
        }
    }

    /// Free chunk ranges (for tests).
    #[cfg(test)]
    pub(super) fn free_list(&self) -> &[(u32, u32)] {
        &self.free
    }
}
