//! Reads another process's memory with `process_vm_readv`: one system call
//! per read, no ptrace stop, the process keeps running.

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
    let mut buf = [0u8; 8];
    read(pid, address, &mut buf).then(|| u64::from_le_bytes(buf))
}

/// A little-endian `u32` at `address`.
pub fn read_u32(pid: u32, address: u64) -> Option<u32> {
    let mut buf = [0u8; 4];
    read(pid, address, &mut buf).then(|| u32::from_le_bytes(buf))
}

/// `len` bytes at `address`.
pub fn read_vec(pid: u32, address: u64, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; len];
    read(pid, address, &mut buf).then_some(buf)
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
}
