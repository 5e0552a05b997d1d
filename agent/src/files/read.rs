//! Reading a checked file into memory, bounded by its kind's cap.
use std::io::Read;

use super::{FileError, OpenFile, Stat, refused};

/// A file's contents, read into memory: the bytes as they were when read
/// (a file truncated meanwhile gives fewer bytes, never a fault).
#[derive(Debug)]
pub struct FileData {
    bytes: Vec<u8>,
    stat: Stat,
}

impl FileData {
    /// What `fstat` said when the file was opened.
    pub fn stat(&self) -> &Stat {
        &self.stat
    }

    /// Bytes held in memory (for tests and tools).
    pub fn from_bytes(bytes: Vec<u8>, stat: Stat) -> Self {
        FileData { bytes, stat }
    }
}

impl std::ops::Deref for FileData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AsRef<[u8]> for FileData {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

pub(super) fn read_all(file: OpenFile) -> Result<FileData, FileError> {
    let limit = file.kind.max_bytes();
    // fstat's size was checked against the cap; a file that grew since is
    // read up to one byte past it, to notice.
    let mut bytes = Vec::with_capacity(file.stat.size.min(limit) as usize);
    (&file.file)
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| FileError::Read {
            path: file.path.clone(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(refused(FileError::TooLarge {
            path: file.path,
            size: bytes.len() as u64,
            limit,
            kind: file.kind.name(),
        }));
    }
    bytes.shrink_to_fit();
    Ok(FileData {
        bytes,
        stat: file.stat,
    })
}
