//! The `.xz` container of MiniDebugInfo (`.gnu_debugdata`), read by hand
//! with checked arithmetic; lzma-rs decodes only the LZMA2 data inside.
//!
//! Why not `lzma_rs::xz_decompress`: the section is written by whoever
//! built the file, and that function both panics on some hostile footers
//! (an unchecked `+ 1`, found by fuzzing) and buffers every decoded byte
//! before any limit can refuse it — six input bytes may claim 2 MiB of
//! output, so a small section could exhaust the agent's memory. Here the
//! LZMA2 chunk headers are summed first, and nothing is decoded unless the
//! total fits the caller's limit. The index, footer and checksums are not
//! read: a corrupt payload yields a corrupt ELF image, which the ELF parser
//! rejects like any other bad file.

use std::fmt;

/// The stream header's magic bytes.
const MAGIC: [u8; 6] = [0xfd, b'7', b'z', b'X', b'Z', 0];
/// The filter id of LZMA2, the only filter MiniDebugInfo is written with.
const LZMA2: u64 = 0x21;

/// Why a stream was not decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum XzError {
    /// Not an xz stream, or one cut short or inconsistent.
    Malformed(&'static str),
    /// A block uses filters other than LZMA2 alone (BCJ, delta, …).
    UnsupportedFilter,
    /// The stream would decode to more than the limit.
    TooLarge { limit: usize },
    /// lzma-rs rejected the LZMA2 data.
    Lzma2(String),
}

impl fmt::Display for XzError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            XzError::Malformed(what) => write!(f, "malformed xz stream: {what}"),
            XzError::UnsupportedFilter => write!(f, "xz block uses a filter other than LZMA2"),
            XzError::TooLarge { limit } => {
                write!(f, "xz stream decodes to more than {limit} bytes")
            }
            XzError::Lzma2(err) => write!(f, "bad LZMA2 data: {err}"),
        }
    }
}

impl std::error::Error for XzError {}

/// Decodes every block of the xz stream at the start of `data`, refusing
/// streams that would decode to more than `limit` bytes.
pub fn decompress(data: &[u8], limit: usize) -> Result<Vec<u8>, XzError> {
    let mut reader = Reader { data, pos: 0 };
    if reader.take(MAGIC.len())? != MAGIC {
        return Err(XzError::Malformed("no xz magic"));
    }
    let flags = reader.take(2)?;
    if flags[0] != 0 || flags[1] & 0xf0 != 0 {
        return Err(XzError::Malformed("reserved stream flags set"));
    }
    let check_size = check_size(flags[1] & 0x0f);
    reader.take(4)?; // The flags' CRC32.

    let mut out = Vec::new();
    // Each block consumes at least its 8-byte header, so this ends.
    while reader.peek()? != 0 {
        let start = reader.pos;
        let header_size = (usize::from(reader.peek()?) + 1) * 4;
        let header = reader.take(header_size)?;
        block_header(header)?;
        let chunks = lzma2_extent(&data[reader.pos..])?;
        let room = limit.saturating_sub(out.len());
        if chunks.unpacked > room as u64 {
            return Err(XzError::TooLarge { limit });
        }
        let mut payload = reader.take(chunks.packed)?;
        lzma_rs::lzma2_decompress(&mut payload, &mut out)
            .map_err(|err| XzError::Lzma2(err.to_string()))?;
        // Block padding to a multiple of four, then the block's check.
        let padding = (4 - (reader.pos - start) % 4) % 4;
        reader.take(padding + check_size)?;
    }
    Ok(out)
}

/// Bytes of a block's check for a stream's check id (xz spec 2.1.1.2).
fn check_size(id: u8) -> usize {
    match id {
        0 => 0,
        id => 4 << ((id - 1) / 3),
    }
}

/// Accepts a block header that names exactly one filter, LZMA2.
fn block_header(header: &[u8]) -> Result<(), XzError> {
    // Size byte, flags, …, CRC32: the fields lie between the flags and the CRC.
    let flags = header[1];
    if flags & 0x3c != 0 {
        return Err(XzError::Malformed("reserved block flags set"));
    }
    if flags & 0x03 != 0 {
        return Err(XzError::UnsupportedFilter);
    }
    let mut fields = Reader {
        data: &header[2..header.len() - 4],
        pos: 0,
    };
    if flags & 0x40 != 0 {
        fields.varint()?; // Compressed size: the LZMA2 chunks say it too.
    }
    if flags & 0x80 != 0 {
        fields.varint()?; // Uncompressed size: likewise.
    }
    if fields.varint()? != LZMA2 {
        return Err(XzError::UnsupportedFilter);
    }
    let properties = fields.varint()?;
    fields
        .take(usize::try_from(properties).map_err(|_| XzError::Malformed("filter properties"))?)?;
    Ok(())
}

/// Where an LZMA2 chunk sequence ends and how much it decodes to.
#[derive(Debug, PartialEq, Eq)]
struct Extent {
    /// Bytes of chunks, their end marker included.
    packed: usize,
    /// Bytes the chunks decode to.
    unpacked: u64,
}

/// Walks LZMA2 chunk headers (control byte, sizes) without decoding.
fn lzma2_extent(data: &[u8]) -> Result<Extent, XzError> {
    let mut reader = Reader { data, pos: 0 };
    let mut unpacked = 0u64;
    loop {
        let control = reader.take(1)?[0];
        let (chunk_unpacked, chunk_packed) = match control {
            0 => {
                return Ok(Extent {
                    packed: reader.pos,
                    unpacked,
                });
            }
            1 | 2 => {
                let size = u64::from(reader.u16_be()?) + 1;
                (size, size as usize)
            }
            0x80.. => {
                let low = u64::from(reader.u16_be()?);
                let size = (u64::from(control & 0x1f) << 16 | low) + 1;
                let packed = usize::from(reader.u16_be()?) + 1;
                if (control >> 5) & 3 >= 2 {
                    reader.take(1)?; // New lc/lp/pb properties.
                }
                (size, packed)
            }
            _ => return Err(XzError::Malformed("invalid LZMA2 control byte")),
        };
        reader.take(chunk_packed)?;
        unpacked += chunk_unpacked;
    }
}

/// A cursor over bytes whose every read is bounds-checked.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], XzError> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|end| *end <= self.data.len())
            .ok_or(XzError::Malformed("cut short"))?;
        let bytes = &self.data[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn peek(&self) -> Result<u8, XzError> {
        self.data
            .get(self.pos)
            .copied()
            .ok_or(XzError::Malformed("cut short"))
    }

    fn u16_be(&mut self) -> Result<u16, XzError> {
        let bytes = self.take(2)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    /// The xz multibyte integer: seven bits a byte, at most nine bytes.
    fn varint(&mut self) -> Result<u64, XzError> {
        let mut value = 0u64;
        for shift in (0..63).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(XzError::Malformed("integer longer than nine bytes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compressed(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        lzma_rs::xz_compress(&mut std::io::Cursor::new(data), &mut out).unwrap();
        out
    }

    #[test]
    fn decodes_what_an_encoder_wrote() {
        let data: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        assert_eq!(decompress(&compressed(&data), 1 << 20).unwrap(), data);
    }

    #[test]
    fn refuses_output_past_the_limit_before_decoding() {
        let data = vec![7u8; 10_000];
        assert_eq!(
            decompress(&compressed(&data), 9_999),
            Err(XzError::TooLarge { limit: 9_999 })
        );
        assert_eq!(decompress(&compressed(&data), 10_000).unwrap(), data);
    }

    /// Six bytes claiming 2 MiB each: the bomb is refused from its headers.
    #[test]
    fn a_chunk_bomb_is_refused_from_its_headers() {
        let mut stream = compressed(b"");
        // Replace the (empty) block with one whose chunks claim 2 MiB each.
        let header = [0x02, 0x00, 0x21, 0x01, 0x16, 0x00, 0x00, 0x00, 0, 0, 0, 0];
        stream.truncate(12);
        stream.extend_from_slice(&header);
        for _ in 0..1000 {
            stream.extend_from_slice(&[0xff, 0xff, 0xff, 0x00, 0x00, 0x5d, 0x00]);
        }
        stream.push(0);
        assert_eq!(
            decompress(&stream, 256 << 20),
            Err(XzError::TooLarge { limit: 256 << 20 })
        );
    }

    /// Found by fuzzing lzma-rs's own container reader: a footer whose
    /// backward size is `u32::MAX`. The footer is not read here at all.
    #[test]
    fn a_hostile_footer_is_not_read() {
        let mut stream = compressed(b"hello");
        let len = stream.len();
        stream[len - 8..len - 4].copy_from_slice(&[0xff; 4]);
        assert_eq!(decompress(&stream, 1 << 20).unwrap(), b"hello");
    }

    #[test]
    fn every_cut_of_a_stream_is_an_error_not_a_panic() {
        let stream = compressed(b"some bytes to cut");
        for len in 0..stream.len() - 1 {
            let _ = decompress(&stream[..len], 1 << 20);
        }
        assert!(decompress(&stream[..10], 1 << 20).is_err());
    }

    #[test]
    fn other_filters_are_refused() {
        // Block header: size byte, flags (two filters), x86 BCJ, LZMA2, CRC.
        let mut stream = compressed(b"").split_at(12).0.to_vec();
        stream.extend_from_slice(&[0x02, 0x01, 0x04, 0x00, 0x21, 0x01, 0x16, 0x00, 0, 0, 0, 0]);
        stream.push(0);
        assert_eq!(
            decompress(&stream, 1 << 20),
            Err(XzError::UnsupportedFilter)
        );
    }
}
