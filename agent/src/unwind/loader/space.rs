//! The rows map's space: tables written into chunk ranges (first fit,
//! merged when freed), idle tables evicted for room.
use super::*;

impl<M: TableMaps> TableLoader<M> {
    /// Writes `table`'s packed rows into free chunks (evicting idle
    /// tables for room): its placement, not yet anyone's.
    pub(super) fn store(&mut self, table: &UnwindTable) -> Option<Loaded> {
        let rows = match &table.kind {
            TableKind::FramePointers => {
                return Some(Loaded {
                    first_chunk: FRAME_POINTER_TABLE,
                    chunks: 0,
                    rows: 0,
                    text_bytes: table.text_bytes,
                    refs: 1,
                    idle_seq: None,
                    segments: Vec::new(),
                    sparse: None,
                });
            }
            TableKind::Rows(_) | TableKind::Packed { .. } => table.row_count(),
        };
        // 8-byte rows and the table's distinct rules (`unwind::packed`):
        // packed here, or as the disk cache kept them.
        let words = table.packed();
        let chunks = words.len().div_ceil(ROW_CHUNK) as u32;
        let mut allocated = self.allocate(chunks);
        while allocated.is_none() && chunks <= self.capacity_chunks && self.evict_oldest_idle() {
            allocated = self.allocate(chunks);
        }
        let Some(first) = allocated else {
            self.stats.table_full += 1;
            tracing::debug!("unwind rows map full: {chunks} chunks do not fit");
            return None;
        };
        for (i, part) in words.chunks(ROW_CHUNK).enumerate() {
            let mut chunk = RowChunk([0; ROW_CHUNK]);
            chunk.0[..part.len()].copy_from_slice(part);
            if let Err(err) = self.maps.write_chunk(first + i as u32, &chunk) {
                tracing::debug!("cannot write unwind rows: {err}");
                self.free_range(first, chunks);
                return None;
            }
        }
        Some(Loaded {
            first_chunk: first,
            chunks,
            rows: rows as u32,
            text_bytes: table.text_bytes,
            refs: 1,
            idle_seq: None,
            segments: Vec::new(),
            sparse: None,
        })
    }

    /// Frees the table idle the longest; false when none is idle.
    pub(super) fn evict_oldest_idle(&mut self) -> bool {
        let Some((_, key)) = self.idle.pop_first() else {
            return false;
        };
        let loaded = self.loaded.remove(&key).expect("idle tables are loaded");
        self.stats.idle_tables -= 1;
        self.stats.evicted += 1;
        self.stats.tables -= 1;
        self.stats.rows -= loaded.rows as u64;
        self.stats.text_bytes -= loaded.text_bytes;
        self.stats.bytes_used -= loaded.chunks as u64 * size_of::<RowChunk>() as u64;
        if loaded.sparse.is_some() {
            self.stats.sparse_tables -= 1;
        }
        if loaded.first_chunk != FRAME_POINTER_TABLE {
            self.free_range(loaded.first_chunk, loaded.chunks);
        }
        true
    }

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
