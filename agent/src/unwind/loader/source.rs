//! Where the loader gets a process's files, and how it names them.
use std::sync::Arc;

use hostprof_unwind::table::{TableError, UnwindTable};

use super::super::FileData;
use crate::model::Mapping;

/// Which file a table belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FileKey {
    /// [`crate::files::content_id`] of the bytes the table was built from.
    Content(Arc<str>),
    Inode {
        dev: u64,
        inode: u64,
        size: u64,
    },
    Vdso,
}

/// Where the bytes of a mapped file come from.
pub trait FileSource {
    /// The file's identity and contents; `None` when it cannot be read
    /// (anonymous memory, gone, not an ELF file).
    fn open(&mut self, pid: u32, mapping: &Mapping) -> Option<(FileKey, FileData)>;

    /// The identity `open` gave this very file before, if it is known
    /// without reading the file again (unchanged since); `None`: call `open`.
    fn identify(&mut self, _pid: u32, _mapping: &Mapping) -> Option<FileKey> {
        None
    }

    /// The table of the file `open` just gave as `key`, if it was built
    /// already (true: taken from the disk cache), or why it has none.
    fn take_built(&mut self, _key: &FileKey) -> Option<Result<(UnwindTable, bool), TableError>> {
        None
    }

    /// Whether `pid` still maps the files of `mappings` where they were:
    /// false when it exec'd (or unmapped one) since they were read.
    fn still_mapped(&mut self, _pid: u32, _mappings: &[Mapping]) -> bool {
        true
    }
}
