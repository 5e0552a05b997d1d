//! Symbolization: addresses in, source-level function names out.
//!
//! [`Symbolizer`] is shared by every process: files are identified by what they
//! are on disk (device, inode, size, mtime), so a hundred processes mapping the
//! same libc parse it once. Files are opened through the process's own view
//! (`/proc/PID/map_files/…`, then `/proc/PID/root/…`), so binaries inside
//! containers and binaries deleted after they were mapped still resolve.
//!
//! ```no_run
//! # use hostprof::symbolize::Symbolizer;
//! let symbolizer = Symbolizer::new();
//! let line = symbolizer.kernel_symbol(0xffffffff81000100);
//! ```
mod elf;
mod kallsyms;

use std::{
    collections::HashMap,
    fs::File,
    sync::{Arc, Mutex},
};

pub use elf::ElfSymbols;
pub use kallsyms::KernelSymbols;

use crate::model::{Frame, FrameKind, Line, Mapping};

#[derive(Debug, thiserror::Error)]
pub enum SymbolizeError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a readable ELF file: {0}")]
    Parse(#[source] object::Error),
}

/// Which file: device and inode, as `/proc/PID/maps` reports them, so a cached
/// file is found without opening anything (the process may be gone by now).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    inode: u64,
}

/// Resolves kernel and user addresses to function names.
pub struct Symbolizer {
    kernel: KernelSymbols,
    /// Parsed files; `None` remembers a file that could not be parsed.
    files: Mutex<HashMap<FileKey, Option<Arc<ElfSymbols>>>>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// Loads kernel symbols; user files are read lazily.
    pub fn new() -> Self {
        let kernel = KernelSymbols::load().unwrap_or_else(|err| {
            tracing::warn!(
                "cannot read /proc/kallsyms ({err}): kernel frames will show as addresses"
            );
            KernelSymbols::default()
        });
        if kernel.is_empty() {
            tracing::warn!(
                "/proc/kallsyms hides kernel addresses: run as root or set kernel.kptr_restrict=0"
            );
        }
        Symbolizer {
            kernel,
            files: Mutex::default(),
        }
    }

    /// The kernel function containing `address`.
    pub fn kernel_symbol(&self, address: u64) -> Option<Line> {
        self.kernel.lookup(address)
    }

    /// Fills `frame.lines` for a kernel or user frame; leaves them empty when
    /// the address cannot be named (the frame keeps mapping and offset).
    ///
    /// `return_address`: the frame is a caller's (not the leaf), so its address
    /// points after the call; look up the byte before it, or a call that ends a
    /// function would be named after the next one.
    pub fn symbolize(&self, pid: u32, frame: &mut Frame, return_address: bool) {
        let back = u64::from(return_address);
        let line = match (frame.kind, &frame.mapping) {
            (FrameKind::Kernel, _) => self.kernel_symbol(frame.address.saturating_sub(back)),
            (_, Some(mapping)) => self.elf_for(pid, mapping).and_then(|elf| {
                elf.lookup(elf.offset_to_address(frame.file_offset.saturating_sub(back))?)
            }),
            (_, None) => None,
        };
        frame.lines.extend(line);
    }

    fn elf_for(&self, pid: u32, mapping: &Mapping) -> Option<Arc<ElfSymbols>> {
        if mapping.inode == 0 {
            return None;
        }
        let key = FileKey {
            dev: mapping.dev,
            inode: mapping.inode,
        };
        if let Some(cached) = self.files.lock().ok()?.get(&key) {
            return cached.clone();
        }
        let file = match open_mapped_file(pid, mapping) {
            Ok(file) => file,
            Err(err) => {
                // Not cached: the next sample of a live process may succeed.
                tracing::debug!("pid {pid}: {err}");
                return None;
            }
        };
        // Parse outside the lock: other threads keep symbolizing meanwhile.
        let parsed = map_file(&file)
            .ok()
            .and_then(|data| ElfSymbols::parse(&data).ok())
            .map(Arc::new);
        self.files.lock().ok()?.insert(key, parsed.clone());
        parsed
    }
}

/// Opens the file behind `mapping` as process `pid` sees it.
fn open_mapped_file(pid: u32, mapping: &Mapping) -> Result<File, SymbolizeError> {
    // map_files names the mapped inode itself: right even when the path was
    // deleted or replaced, and inside the process's mount namespace.
    let by_mapping = format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    if let Ok(file) = File::open(&by_mapping) {
        return Ok(file);
    }
    if !mapping.path.starts_with('/') {
        return Err(SymbolizeError::Open {
            path: mapping.path.to_string(),
            source: std::io::ErrorKind::NotFound.into(),
        });
    }
    let through_root = format!("/proc/{pid}/root{}", mapping.path);
    File::open(&through_root).map_err(|source| SymbolizeError::Open {
        path: through_root,
        source,
    })
}

fn map_file(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only; a file truncated underneath us would
    // fault, which executables in use cannot be (ETXTBSY) and libraries are not
    // in practice. Reading whole multi-hundred-MB binaries would cost more.
    unsafe { memmap2::Mmap::map(file) }
}

/// Demangles Rust (legacy and v0) names; other names are returned as they are.
pub fn demangle(name: &str) -> Arc<str> {
    match rustc_demangle::try_demangle(name) {
        Ok(demangled) => format!("{demangled:#}").into(),
        Err(_) => name.into(),
    }
}
