//! Opening paths inside a root directory without leaving it, and checking
//! what was opened before reading a byte of it.
use std::{
    io,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::Path,
};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

use super::{FileError, Kind, OpenFile, Stat, file_type_name, refused};

/// A directory used as a root, held open (`O_PATH`).
#[derive(Debug)]
pub struct Root {
    dir: OwnedFd,
}

impl Root {
    /// The root of process `pid` (`/proc/PID/root`): a container's own `/`.
    pub fn of_process(pid: u32) -> io::Result<Self> {
        Self::open_dir(Path::new(&format!("/proc/{pid}/root")))
    }

    /// The agent's own root (host paths).
    pub fn host() -> io::Result<Self> {
        Self::open_dir(Path::new("/"))
    }

    /// A directory used as a root (tests).
    pub fn open_dir(path: &Path) -> io::Result<Self> {
        let dir = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root { dir })
    }

    /// The root directory's (device, inode): which root it is.
    pub fn id(&self) -> io::Result<(u64, u64)> {
        let stat = rustix::fs::fstat(&self.dir)?;
        Ok((stat.st_dev, stat.st_ino))
    }

    /// Opens `path` (absolute or relative, as a process in this root sees
    /// it), resolving every component inside the root: absolute symlinks and
    /// `..` cannot leave it, magic links are refused.
    pub fn open(&self, path: &str, kind: Kind) -> Result<OpenFile, FileError> {
        let fd = rustix::fs::openat2(
            self.dir.as_fd(),
            path,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|errno| open_error(path, errno))?;
        checked(fd, kind, path.to_string())
    }
}

/// Opens a path of the host's `/proc` that is itself a magic link
/// (`/proc/PID/map_files/…`), with the same checks on what it leads to.
pub(super) fn open_magic(path: &str, kind: Kind) -> Result<OpenFile, FileError> {
    let fd = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|errno| open_error(path, errno))?;
    checked(fd, kind, path.to_string())
}

fn open_error(path: &str, errno: rustix::io::Errno) -> FileError {
    if errno == rustix::io::Errno::LOOP || errno == rustix::io::Errno::XDEV {
        refused(FileError::Escape {
            path: path.to_string(),
        })
    } else {
        FileError::Open {
            path: path.to_string(),
            source: errno.into(),
        }
    }
}

/// Checks an `O_PATH` descriptor (a regular file within its kind's cap) and
/// only then opens it for reading. `O_PATH` never ran a FIFO's or a device's
/// open, so neither can block or have side effects.
fn checked(fd: OwnedFd, kind: Kind, path: String) -> Result<OpenFile, FileError> {
    let raw = rustix::fs::fstat(&fd).map_err(|errno| FileError::Open {
        path: path.clone(),
        source: errno.into(),
    })?;
    let file_type = FileType::from_raw_mode(raw.st_mode);
    if file_type != FileType::RegularFile {
        return Err(refused(FileError::NotRegular {
            path,
            what: file_type_name(file_type),
        }));
    }
    let stat = Stat::of(&raw);
    if stat.size > kind.max_bytes() {
        return Err(refused(FileError::TooLarge {
            path,
            size: stat.size,
            limit: kind.max_bytes(),
            kind: kind.name(),
        }));
    }
    // Reopening through our own fd table gives the very inode checked above.
    let readable = rustix::fs::open(
        format!("/proc/self/fd/{}", fd.as_raw_fd()),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| FileError::Open {
        path: path.clone(),
        source: errno.into(),
    })?;
    Ok(OpenFile {
        file: std::fs::File::from(readable),
        stat,
        kind,
        path,
    })
}
