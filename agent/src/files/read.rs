//! Reading a checked file into memory, bounded by its kind's cap.
use std::io::Read;

use std::sync::Arc;

use super::{FileError, OpenFile, Stat, refused, sparse::ZeroImage};

/// A file's contents, read into memory: the bytes as they were when read
/// (a file truncated meanwhile gives fewer bytes, never a fault). Either
/// every byte, or (see [`super::Parts`]) an image of the file holding only
/// the parts a job reads, zeros elsewhere.
#[derive(Debug)]
pub struct FileData {
    bytes: Bytes,
    stat: Stat,
    /// The content id of every byte, when they are not all held.
    content: Option<Arc<str>>,
    /// `fstat` said the same after the read as before it: the bytes are
    /// the file `stat` describes, and their id may be remembered.
    stable: bool,
}

#[derive(Debug)]
enum Bytes {
    Whole(Vec<u8>),
    Parts(ZeroImage),
}

impl FileData {
    /// What `fstat` said when the file was opened.
    pub fn stat(&self) -> &Stat {
        &self.stat
    }

    /// Bytes held in memory (for tests and tools).
    pub fn from_bytes(bytes: Vec<u8>, stat: Stat) -> Self {
        FileData {
            bytes: Bytes::Whole(bytes),
            stat,
            content: None,
            stable: false,
        }
    }

    pub(super) fn sparse(image: ZeroImage, content: Arc<str>, stat: Stat) -> Self {
        FileData {
            bytes: Bytes::Parts(image),
            stat,
            content: Some(content),
            stable: false,
        }
    }

    /// [`super::content_id`] of every byte of the file as read.
    pub fn content_id(&self) -> Arc<str> {
        match &self.content {
            Some(content) => content.clone(),
            None if self.stable => {
                if let Some(id) = super::memo::known(&self.stat) {
                    return id;
                }
                let id = super::content_id(self);
                super::memo::remember(self.stat, id.clone());
                id
            }
            None => super::content_id(self),
        }
    }

    /// True when only some parts of the file are held (the rest reads as
    /// zeros).
    pub fn is_partial(&self) -> bool {
        matches!(self.bytes, Bytes::Parts(_))
    }
}

impl std::ops::Deref for FileData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Whole(bytes) => bytes,
            Bytes::Parts(image) => image.as_ref(),
        }
    }
}

impl AsRef<[u8]> for FileData {
    fn as_ref(&self) -> &[u8] {
        self
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
    let stable = super::Stat::now(&file.file) == Some(file.stat);
    Ok(FileData {
        stable,
        ..FileData::from_bytes(bytes, file.stat)
    })
}
