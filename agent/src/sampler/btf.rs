//! Just enough of a BTF reader to find a struct member's byte offset in the
//! running kernel (`/sys/kernel/btf/vmlinux`).
//!
//! aya (0.14) does no CO-RE relocation for Rust eBPF programs, so the few
//! kernel struct fields the eBPF side reads get their offsets from here, passed
//! in as load-time globals. Layout: include/uapi/linux/btf.h.

/// Byte offset of `member` in `struct name`, if the BTF describes it.
pub fn member_offset(btf: &[u8], name: &str, member: &str) -> Option<u32> {
    let strings = btf.get(Header::parse(btf)?.strings)?;
    let mut found = None;
    for_each_type(btf, |info, type_name, _, members| {
        let (kind, vlen) = ((info >> 24) & 0x1f, info & 0xffff);
        if kind != KIND_STRUCT || vlen == 0 || type_name != name.as_bytes() {
            return false;
        }
        // Members of structs with bitfields encode (bits << 24 | offset).
        let kind_flag = info >> 31 == 1;
        for entry in members.chunks_exact(12) {
            if string_at(strings, u32_at(entry, 0).unwrap_or(u32::MAX)) == Some(member.as_bytes()) {
                let raw = u32_at(entry, 8).unwrap_or(1);
                let bits = if kind_flag { raw & 0x00ff_ffff } else { raw };
                found = (bits % 8 == 0).then_some(bits / 8);
                return true;
            }
        }
        false
    })?;
    found
}

/// Byte offset, in `task_struct`, of the task's saved user thread pointer:
/// `thread.fsbase` on x86_64, `thread.uw.tp_value` on aarch64 (the first
/// member of `uw`).
pub fn thread_pointer_offset(btf: &[u8]) -> Option<u32> {
    let thread = member_offset(btf, "task_struct", "thread")?;
    #[cfg(target_arch = "aarch64")]
    let member = member_offset(btf, "thread_struct", "uw")?;
    #[cfg(not(target_arch = "aarch64"))]
    let member = member_offset(btf, "thread_struct", "fsbase")?;
    Some(thread + member)
}

/// `sizeof(struct name)`, if the BTF describes the struct.
pub fn struct_size(btf: &[u8], name: &str) -> Option<u32> {
    let mut found = None;
    for_each_type(btf, |info, type_name, size, _| {
        let (kind, vlen) = ((info >> 24) & 0x1f, info & 0xffff);
        if kind == KIND_STRUCT && vlen > 0 && type_name == name.as_bytes() {
            found = Some(size);
            return true;
        }
        false
    })?;
    found
}

/// Calls `visit(info, name, size_or_type, trailing bytes)` for each type
/// until it returns true; `None` when the BTF is malformed.
fn for_each_type(btf: &[u8], mut visit: impl FnMut(u32, &[u8], u32, &[u8]) -> bool) -> Option<()> {
    let header = Header::parse(btf)?;
    let types = btf.get(header.types.clone())?;
    let strings = btf.get(header.strings.clone())?;
    let mut at = 0usize;
    while at + 12 <= types.len() {
        let info = u32_at(types, at + 4)?;
        let vlen = (info & 0xffff) as usize;
        let kind = (info >> 24) & 0x1f;
        let body = at + 12;
        let end = body + trailing_bytes(kind, vlen)?;
        let name = string_at(strings, u32_at(types, at)?)?;
        if visit(info, name, u32_at(types, at + 8)?, types.get(body..end)?) {
            return Some(());
        }
        at = end;
    }
    Some(())
}

fn string_at(strings: &[u8], offset: u32) -> Option<&[u8]> {
    let rest = strings.get(offset as usize..)?;
    Some(&rest[..rest.iter().position(|&b| b == 0)?])
}

const KIND_STRUCT: u32 = 4;

struct Header {
    types: std::ops::Range<usize>,
    strings: std::ops::Range<usize>,
}

impl Header {
    fn parse(btf: &[u8]) -> Option<Header> {
        // Magic 0xeB9F, little-endian on the machines we run on.
        if btf.get(0..2)? != [0x9f, 0xeb] {
            return None;
        }
        let header_len = u32_at(btf, 4)? as usize;
        let range = |off: usize, len: usize| header_len + off..header_len + off + len;
        Some(Header {
            types: range(u32_at(btf, 8)? as usize, u32_at(btf, 12)? as usize),
            strings: range(u32_at(btf, 16)? as usize, u32_at(btf, 20)? as usize),
        })
    }
}

/// Bytes that follow the 12-byte common header of a type of `kind`.
fn trailing_bytes(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        // int, var, decl_tag: one u32.
        1 | 14 | 17 => 4,
        // ptr, fwd, typedef, volatile, const, restrict, func, float, type_tag.
        2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
        // array: elem type, index type, count.
        3 => 12,
        // struct, union, datasec, enum64: three u32 per entry.
        4 | 5 | 15 | 19 => 12 * vlen,
        // enum, func_proto: two u32 per entry.
        6 | 13 => 8 * vlen,
        _ => return None,
    })
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_task_struct_pid_and_tgid_in_the_running_kernel() {
        let Ok(btf) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipping: this kernel has no BTF");
            return;
        };
        let pid = member_offset(&btf, "task_struct", "pid").expect("task_struct.pid");
        let tgid = member_offset(&btf, "task_struct", "tgid").expect("task_struct.tgid");
        // Declared next to each other (`pid_t pid; pid_t tgid;`) in every kernel.
        assert_eq!(tgid, pid + 4);
        assert!(member_offset(&btf, "task_struct", "no_such_member").is_none());
        assert!(member_offset(&btf, "no_such_struct", "pid").is_none());
    }

    #[test]
    fn finds_pt_regs_size_and_task_stack_in_the_running_kernel() {
        let Ok(btf) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipping: this kernel has no BTF");
            return;
        };
        let size = struct_size(&btf, "pt_regs").expect("struct pt_regs");
        // x86_64: 21 registers; arm64: at least regs[31], sp, pc, pstate.
        #[cfg(target_arch = "x86_64")]
        assert_eq!(size, 21 * 8);
        #[cfg(target_arch = "aarch64")]
        assert!(size >= 34 * 8);
        assert!(member_offset(&btf, "task_struct", "stack").is_some());
        assert!(struct_size(&btf, "no_such_struct").is_none());
    }

    #[test]
    fn finds_the_thread_pointer_in_the_running_kernel() {
        let Ok(btf) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipping: this kernel has no BTF");
            return;
        };
        let offset = thread_pointer_offset(&btf).expect("task_struct.thread's thread pointer");
        // `thread` is task_struct's last member but for variable-size ones.
        let stack = member_offset(&btf, "task_struct", "stack").expect("task_struct.stack");
        assert!(offset > stack);
        assert!(offset < struct_size(&btf, "task_struct").expect("struct task_struct"));
    }

    #[test]
    fn reads_the_fuzz_seed() {
        // fuzz/corpus/btf's seed is valid BTF: fuzzing starts from real
        // structs, bitfield encoding (pt_regs) included.
        let seed = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fuzz/corpus/btf/small_task_struct.btf"
        );
        let btf = std::fs::read(seed).unwrap();
        assert_eq!(member_offset(&btf, "task_struct", "tgid"), Some(36));
        assert_eq!(member_offset(&btf, "task_struct", "stack"), Some(8));
        assert_eq!(member_offset(&btf, "pt_regs", "sp"), Some(19));
        assert_eq!(struct_size(&btf, "pt_regs"), Some(168));
    }

    #[test]
    fn rejects_what_is_not_btf() {
        assert!(member_offset(b"", "task_struct", "tgid").is_none());
        assert!(member_offset(&[0x9f, 0xeb, 1, 0, 0xff, 0xff, 0xff, 0xff], "a", "b").is_none());
        assert!(member_offset(&[0u8; 64], "task_struct", "tgid").is_none());
    }
}
