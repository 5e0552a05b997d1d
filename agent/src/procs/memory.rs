//! Reads another process's memory with `process_vm_readv`: one system call
//! per read, no ptrace stop, the process keeps running.
//!
//! Readers of a runtime's structures take a [`Memory`]: a live process
//! ([`Process`]) in the agent, bytes standing for memory ([`Image`]) in unit
//! tests and fuzz targets.

/// Memory to read structures from: every value in it is the tenant's, so
/// readers range-check what they read before it sizes another read.
pub trait Memory {
    /// Fills `buf` from `address`; false when any byte of it is not there.
    fn read(&self, address: u64, buf: &mut [u8]) -> bool;

    /// A little-endian `u64` at `address`.
    fn read_u64(&self, address: u64) -> Option<u64> {
        let mut buf = [0u8; 8];
        self.read(address, &mut buf)
            .then(|| u64::from_le_bytes(buf))
    }

    /// A little-endian `u32` at `address`.
    fn read_u32(&self, address: u64) -> Option<u32> {
        let mut buf = [0u8; 4];
        self.read(address, &mut buf)
            .then(|| u32::from_le_bytes(buf))
    }

    /// A little-endian `u16` at `address`.
    fn read_u16(&self, address: u64) -> Option<u16> {
        let mut buf = [0u8; 2];
        self.read(address, &mut buf)
            .then(|| u16::from_le_bytes(buf))
    }

    /// `len` bytes at `address` (the caller caps `len`).
    fn read_vec(&self, address: u64, len: usize) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.read(address, &mut buf).then_some(buf)
    }

    /// A NUL-terminated string of at most `max` bytes (lossy UTF-8); `None`
    /// when unreadable or longer. Read page by page: a short string may
    /// end just before an unmapped page.
    fn read_cstr(&self, address: u64, max: usize) -> Option<String> {
        if address == 0 {
            return None;
        }
        let mut out = Vec::new();
        let mut at = address;
        while out.len() <= max {
            let to_page_end = 4096 - (at % 4096) as usize;
            let want = to_page_end.min(max + 1 - out.len()).min(64);
            let mut buf = vec![0u8; want];
            if !self.read(at, &mut buf) {
                return None;
            }
            if let Some(end) = buf.iter().position(|&byte| byte == 0) {
                out.extend_from_slice(&buf[..end]);
                return Some(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&buf);
            at = at.checked_add(want as u64)?;
        }
        None
    }
}

/// The memory of process `pid`.
#[derive(Clone, Copy, Debug)]
pub struct Process(pub u32);

impl Memory for Process {
    fn read(&self, address: u64, buf: &mut [u8]) -> bool {
        read(self.0, address, buf)
    }
}

/// `bytes` standing for memory from address `base` on; nothing else is
/// mapped.
#[derive(Clone, Copy, Debug)]
pub struct Image<'a> {
    pub base: u64,
    pub bytes: &'a [u8],
}

impl Memory for Image<'_> {
    fn read(&self, address: u64, buf: &mut [u8]) -> bool {
        let Some(start) = address
            .checked_sub(self.base)
            .and_then(|start| usize::try_from(start).ok())
        else {
            return false;
        };
        match start
            .checked_add(buf.len())
            .and_then(|end| self.bytes.get(start..end))
        {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }
}

/// Fills `buf` from `address` in process `pid`; false when any byte of it
/// could not be read (unmapped, the process gone, no permission).
pub fn read(pid: u32, address: u64, buf: &mut [u8]) -> bool {
    if buf.is_empty() {
        return true;
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` covers exactly `buf`, which we own mutably; the kernel
    // checks `remote` against the other process's address space.
    let read = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    read == buf.len() as isize
}

/// A little-endian `u64` at `address`.
pub fn read_u64(pid: u32, address: u64) -> Option<u64> {
    Process(pid).read_u64(address)
}

/// A little-endian `u32` at `address`.
pub fn read_u32(pid: u32, address: u64) -> Option<u32> {
    Process(pid).read_u32(address)
}

/// `len` bytes at `address`.
pub fn read_vec(pid: u32, address: u64, len: usize) -> Option<Vec<u8>> {
    Process(pid).read_vec(address, len)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_memory_and_refuses_unmapped() {
        let value: u64 = 0x1122_3344_5566_7788;
        let pid = std::process::id();
        assert_eq!(
            super::read_u64(pid, &value as *const u64 as u64),
            Some(value)
        );
        assert_eq!(super::read_u64(pid, 8), None);
    }

    #[test]
    fn image_reads_inside_only() {
        use super::{Image, Memory};
        let image = Image {
            base: 0x1000,
            bytes: &[1, 2, 3, 4, 5, 6, 7, 8, 9],
        };
        assert_eq!(image.read_u64(0x1001), Some(0x0908_0706_0504_0302));
        assert_eq!(image.read_u64(0x1002), None, "past the end");
        assert_eq!(image.read_u32(0xfff), None, "before the start");
        assert_eq!(image.read_u64(u64::MAX), None);
    }
}
