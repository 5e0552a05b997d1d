//! Opening files as a process sees them, without escaping its root.
//!
//! `/proc/PID/root/etc/x` alone is not safe: a symlink inside a container
//! pointing at `/etc/shadow` would be followed in *our* root. Paths are
//! resolved with `openat2(RESOLVE_IN_ROOT)` (Linux 5.6+) against the
//! process's root directory, so absolute symlinks and `..` stay inside it.
use std::{
    ffi::CString,
    fs::File,
    io,
    os::fd::{AsRawFd, FromRawFd},
    path::Path,
};

/// A process's root directory, held open.
#[derive(Debug)]
pub struct Root {
    dir: File,
}

impl Root {
    /// The root of process `pid` (`/proc/PID/root`).
    pub fn of_process(pid: u32) -> io::Result<Self> {
        Self::open(Path::new(&format!("/proc/{pid}/root")))
    }

    /// A directory used as a root (tests; debug directories).
    pub fn open(path: &Path) -> io::Result<Self> {
        let path = cstring(path.as_os_str().as_encoded_bytes())?;
        // SAFETY: `path` is NUL-terminated; the returned fd is owned below.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(Root {
            dir: unsafe { File::from_raw_fd(fd) },
        })
    }

    /// Opens `path` (absolute or relative, as the process would see it) for
    /// reading, resolving every component inside this root.
    pub fn open_file(&self, path: &str) -> io::Result<File> {
        let path = cstring(path.as_bytes())?;
        let how = OpenHow {
            flags: (libc::O_RDONLY | libc::O_CLOEXEC) as u64,
            mode: 0,
            resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
        };
        // SAFETY: `how` and `path` outlive the call; size matches the struct.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.dir.as_raw_fd(),
                path.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).map_err(|_| io::Error::other("fd out of range"))?;
        // SAFETY: the kernel returned a new fd that nobody else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}

/// `struct open_how` of openat2(2) (libc's is `non_exhaustive`, so it cannot
/// be built outside libc).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_cannot_leave_the_root() {
        let base = std::env::temp_dir().join(format!("hostprof-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("etc")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        let root_dir = base.join("root");
        std::fs::create_dir_all(root_dir.join("etc")).unwrap();
        std::fs::write(root_dir.join("etc/inside"), "in").unwrap();
        std::fs::write(base.join("outside/secret"), "out").unwrap();
        // An absolute link and a `..` climb, both aimed outside the root.
        let secret = base.join("outside/secret");
        std::os::unix::fs::symlink(&secret, root_dir.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../outside/secret", root_dir.join("etc/up")).unwrap();
        let root = Root::open(&root_dir).unwrap();
        let read = |path: &str| std::io::read_to_string(root.open_file(path)?);
        assert_eq!(read("/etc/inside").unwrap(), "in");
        assert!(read("/abs").is_err(), "absolute symlink escaped the root");
        assert!(read("/etc/up").is_err(), "`..` escaped the root");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
