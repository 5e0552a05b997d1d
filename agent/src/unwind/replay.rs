//! Replays recorded stacks through the kernel's unwinder on the host.
//!
//! A [`Snapshot`] is what the kernel saw at a sample: registers, stack bytes
//! and the process's executable mappings. [`unwind`] walks it with
//! `hostprof_unwind::step` and tables built by [`super::table`], the same
//! code and tables the eBPF program uses, so replay tests check the kernel's
//! unwinder on any architecture the tables support.
//!
//! Snapshots come from ELF core files ([`Snapshot::from_core`], e.g. written
//! by `qemu-aarch64` for aarch64 test programs) or from
//! `hostprof record --stack-copy`.
use std::{path::PathBuf, sync::Arc};

use hostprof_unwind::{
    self as unwind, Arch, ExecMapping, FRAME_POINTER_TABLE, Lookup, MAX_PROCESS_MAPPINGS,
    ProcessMappings, Regs, Step, UnwindRow,
};
use object::{Object, ObjectSegment};

use hostprof_unwind::table::{self, TableKind};

/// A mapped executable file of a snapshot.
#[derive(Clone, Debug)]
pub struct SnapshotMapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub path: PathBuf,
}

/// Registers, memory and mappings of one stopped thread.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub arch: Arch,
    pub regs: Regs,
    /// Captured memory: (address, bytes). The stack, at least.
    pub memory: Vec<(u64, Vec<u8>)>,
    pub mappings: Vec<SnapshotMapping>,
}

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("cannot parse the core file")]
    Parse(#[source] object::Error),
    #[error("the core file has no NT_PRSTATUS note (no registers)")]
    NoRegisters,
    #[error("unsupported architecture")]
    UnsupportedArch,
}

/// `NT_PRSTATUS`.
const NT_PRSTATUS: u32 = 1;
/// Offset of `pr_reg` in `struct elf_prstatus` on 64-bit Linux.
const PR_REG_OFFSET: usize = 112;

impl Snapshot {
    /// The first thread of an ELF core file, with the given mappings (the
    /// cores qemu writes list no files: pass the program's own).
    pub fn from_core(core: &[u8], mappings: Vec<SnapshotMapping>) -> Result<Self, SnapshotError> {
        let file = object::File::parse(core).map_err(SnapshotError::Parse)?;
        let arch = table::arch_of(&file).ok_or(SnapshotError::UnsupportedArch)?;
        let object::File::Elf64(elf) = &file else {
            return Err(SnapshotError::UnsupportedArch);
        };
        use object::read::elf::ProgramHeader;
        let endian = elf.endian();
        let mut regs = None;
        let mut memory = Vec::new();
        for segment in elf.elf_program_headers() {
            if let Ok(Some(mut notes)) = segment.notes(endian, core) {
                while let Ok(Some(note)) = notes.next() {
                    if note.n_type(endian) == NT_PRSTATUS && regs.is_none() {
                        regs = Some(prstatus_regs(arch, note.desc()));
                    }
                }
            }
        }
        for segment in elf.segments() {
            if let Ok(data) = segment.data()
                && !data.is_empty()
            {
                memory.push((segment.address(), data.to_vec()));
            }
        }
        let regs = regs.flatten().ok_or(SnapshotError::NoRegisters)?;
        Ok(Snapshot {
            arch,
            regs,
            memory,
            mappings,
        })
    }
}

/// pc, sp, frame pointer and link register from `pr_reg`.
fn prstatus_regs(arch: Arch, desc: &[u8]) -> Option<Regs> {
    let reg = |index: usize| -> Option<u64> {
        let at = PR_REG_OFFSET + index * 8;
        Some(u64::from_le_bytes(desc.get(at..at + 8)?.try_into().ok()?))
    };
    // x86_64 user_regs_struct: rbp 4, rip 16, rsp 19; aarch64: x29, x30, sp 31, pc 32.
    let (pc, sp, fp, lr) = match arch {
        Arch::X86_64 => (reg(16)?, reg(19)?, reg(4)?, 0),
        Arch::Aarch64 => (reg(32)?, reg(31)?, reg(29)?, reg(30)?),
    };
    Some(Regs::interrupted(pc, sp, fp, lr))
}

/// A snapshot's process, as `hostprof_unwind` sees it.
pub struct ReplayProcess<'a> {
    snapshot: &'a Snapshot,
    mappings: ProcessMappings,
    rows: Vec<UnwindRow>,
    /// Per mapping: the file's bytes and the bias to its ELF addresses.
    files: Vec<(u64, u64, u64, Arc<Vec<u8>>)>,
}

impl<'a> ReplayProcess<'a> {
    /// Builds the tables of every mapping of `snapshot`.
    pub fn new(snapshot: &'a Snapshot) -> Self {
        let mut mappings = ProcessMappings::default();
        let mut rows = Vec::new();
        let mut files = Vec::new();
        let mut sorted = snapshot.mappings.clone();
        sorted.sort_by_key(|mapping| mapping.start);
        sorted.truncate(MAX_PROCESS_MAPPINGS);
        for (slot, mapping) in sorted.iter().enumerate() {
            let mut entry = ExecMapping {
                start: mapping.start,
                end: mapping.end,
                ..Default::default()
            };
            if let Ok(data) = std::fs::read(&mapping.path)
                && let Some(vaddr) = table::vaddr_of_offset(&data, mapping.file_offset)
            {
                entry.bias = mapping.start.wrapping_sub(vaddr);
                match table::build(&data) {
                    Ok(built) => match built.kind {
                        TableKind::Rows(table_rows) => {
                            entry.table_start = rows.len() as u32;
                            entry.table_len = table_rows.len() as u32;
                            rows.extend(table_rows);
                        }
                        TableKind::FramePointers => entry.table_start = FRAME_POINTER_TABLE,
                        // Only the disk cache's tables come packed.
                        TableKind::Packed { .. } => {
                            tracing::debug!("{}: a packed table", mapping.path.display())
                        }
                    },
                    Err(err) => tracing::debug!("{}: no table: {err}", mapping.path.display()),
                }
                files.push((mapping.start, mapping.end, entry.bias, Arc::new(data)));
            }
            mappings.mappings[slot] = entry;
            mappings.len = slot as u32 + 1;
        }
        ReplayProcess {
            snapshot,
            mappings,
            rows,
            files,
        }
    }

    /// Reads from a mapped file's loadable segments (code, for the
    /// sigreturn check).
    fn read_file(&self, address: u64) -> Option<u64> {
        let (_, _, bias, data) = self
            .files
            .iter()
            .find(|(start, end, _, _)| (*start..*end).contains(&address))?;
        let vaddr = address.wrapping_sub(*bias);
        let file = object::File::parse(&***data).ok()?;
        file.segments().find_map(|segment| {
            let offset = vaddr.checked_sub(segment.address())?;
            let bytes = segment.data().ok()?;
            let at = usize::try_from(offset).ok()?;
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        })
    }
}

impl unwind::Process for ReplayProcess<'_> {
    fn read_u64(&mut self, address: u64) -> Option<u64> {
        for (start, bytes) in &self.snapshot.memory {
            if let Some(offset) = address.checked_sub(*start)
                && let Ok(at) = usize::try_from(offset)
                && let Some(word) = bytes.get(at..at.checked_add(8)?)
            {
                return Some(u64::from_le_bytes(word.try_into().ok()?));
            }
        }
        self.read_file(address)
    }

    fn lookup(&mut self, pc: u64) -> Lookup {
        unwind::lookup_in_memory(&self.mappings, &self.rows, pc)
    }
}

/// The frames of a snapshot, leaf first (the leaf's pc, then return
/// addresses), and why the walk ended (an `hostprof_unwind::reason`).
pub fn unwind(snapshot: &Snapshot, max_frames: usize) -> (Vec<u64>, u32) {
    let mut process = ReplayProcess::new(snapshot);
    let mut regs = snapshot.regs;
    let mut frames = vec![regs.pc];
    // The same loop as the eBPF program's bpf_loop callback.
    loop {
        match unwind::step(snapshot.arch, &mut regs, &mut process) {
            Step::Caller if frames.len() >= max_frames => {
                return (frames, unwind::reason::DEPTH_LIMIT);
            }
            Step::Caller => frames.push(regs.pc),
            Step::Stop(reason) => return (frames, reason),
            // Runtime frames are walked in the kernel only.
            Step::Runtime(_) => return (frames, unwind::reason::NO_TABLE),
        }
    }
}

/// The architecture this binary runs on (that of the samples it records).
pub const HOST_ARCH: Arch = if cfg!(target_arch = "aarch64") {
    Arch::Aarch64
} else {
    Arch::X86_64
};

/// The executable file mappings of a live process, from `/proc/PID/maps`;
/// its vDSO too when `vdso` names a copy of the image (every process of a
/// kernel maps the same one: see [`save_vdso`]).
pub fn process_mappings(
    pid: u32,
    vdso: Option<&std::path::Path>,
) -> std::io::Result<Vec<SnapshotMapping>> {
    // The one /proc/PID/maps parser (procs/maps.rs): executable mappings.
    let text = std::fs::read(format!("/proc/{pid}/maps"))?;
    let maps = crate::procs::parse_maps(&text).map_err(std::io::Error::other)?;
    let mappings = maps
        .iter()
        .filter_map(|map| {
            let path = match vdso {
                Some(vdso) if &*map.path == "[vdso]" => vdso.to_path_buf(),
                _ if map.path.starts_with('/') => PathBuf::from(&*map.path),
                _ => return None,
            };
            Some(SnapshotMapping {
                start: map.start,
                end: map.end,
                file_offset: map.file_offset,
                path,
            })
        })
        .collect();
    Ok(mappings)
}

/// Writes this kernel's vDSO image to `path`, for [`process_mappings`].
pub fn save_vdso(path: &std::path::Path) -> std::io::Result<()> {
    let image = super::own_vdso().ok_or_else(|| std::io::Error::other("no vDSO"))?;
    std::fs::write(path, &*image)
}

/// A sample taken with `hostprof record --stack-copy`: its snapshot and
/// what the kernel's unwinder made of it, so the two can be compared (and
/// kept as a replay fixture, see [`RecordedSample::write`]).
#[derive(Clone, Debug)]
pub struct RecordedSample {
    pub tgid: u32,
    pub tid: u32,
    pub ktime_ns: u64,
    /// `hostprof_common::SAMPLE_FLAG_*` bits, with the unwind reason.
    pub flags: u32,
    /// The user frames the kernel found, leaf first.
    pub kernel_frames: Vec<u64>,
    pub snapshot: Snapshot,
}

/// First line of a [`RecordedSample`] file.
const RECORDED_MAGIC: &str = "hostprof-stack-copy 1";

impl RecordedSample {
    /// A sample with its stack copy and the process's mappings; `None`
    /// when the kernel could not read the registers.
    pub fn new(copy: &crate::sampler::StackCopy, mappings: Vec<SnapshotMapping>) -> Option<Self> {
        let [pc, sp, fp, lr] = copy.regs?;
        let sample = &copy.sample;
        let frames = (sample.user_stack_len as usize).min(sample.user_stack.len());
        Some(RecordedSample {
            tgid: sample.tgid,
            tid: sample.tid,
            ktime_ns: sample.ktime_ns,
            flags: sample.flags,
            kernel_frames: sample.user_stack[..frames].to_vec(),
            snapshot: Snapshot {
                arch: HOST_ARCH,
                // As the eBPF program starts its unwind.
                regs: Regs::interrupted(pc, sp, fp, lr),
                memory: vec![(sp, copy.stack.clone())],
                mappings,
            },
        })
    }

    /// True when the kernel walked this stack with unwind tables (rather
    /// than frame pointers, before the process's tables were loaded).
    pub fn unwound_with_tables(&self) -> bool {
        self.flags & hostprof_common::SAMPLE_FLAG_USER_TABLES != 0
    }

    /// Writes a self-contained text header and the raw stack bytes.
    pub fn write(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let snapshot = &self.snapshot;
        let arch = match snapshot.arch {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        };
        let regs = &snapshot.regs;
        writeln!(out, "{RECORDED_MAGIC}")?;
        writeln!(out, "arch {arch}")?;
        writeln!(out, "task {} {} {}", self.tgid, self.tid, self.ktime_ns)?;
        writeln!(out, "flags {}", self.flags)?;
        writeln!(
            out,
            "regs {:x} {:x} {:x} {:x}",
            regs.pc, regs.sp, regs.fp, regs.lr
        )?;
        write!(out, "frames")?;
        for frame in &self.kernel_frames {
            write!(out, " {frame:x}")?;
        }
        writeln!(out)?;
        for mapping in &snapshot.mappings {
            writeln!(
                out,
                "mapping {:x} {:x} {:x} {}",
                mapping.start,
                mapping.end,
                mapping.file_offset,
                mapping.path.display()
            )?;
        }
        for (address, bytes) in &snapshot.memory {
            writeln!(out, "memory {address:x} {}", bytes.len())?;
            out.write_all(bytes)?;
        }
        Ok(())
    }

    /// Reads what [`RecordedSample::write`] wrote.
    pub fn read(mut data: &[u8]) -> Result<Self, String> {
        if next_line(&mut data)? != RECORDED_MAGIC {
            return Err("not a hostprof stack copy".into());
        }
        let hex = |text: &str| u64::from_str_radix(text, 16).map_err(|err| err.to_string());
        let dec = |text: &str| text.parse::<u64>().map_err(|err| err.to_string());
        let mut arch = None;
        let (mut tgid, mut tid, mut ktime_ns, mut flags) = (0, 0, 0, 0);
        let mut regs = None;
        let mut kernel_frames = Vec::new();
        let mut mappings = Vec::new();
        let mut memory = Vec::new();
        while let Ok(text) = next_line(&mut data) {
            let (key, rest) = text.split_once(' ').unwrap_or((text, ""));
            let fields: Vec<&str> = rest.split(' ').filter(|f| !f.is_empty()).collect();
            let field = |index: usize| fields.get(index).copied().ok_or("missing field");
            match key {
                "arch" => {
                    arch = Some(match rest {
                        "x86_64" => Arch::X86_64,
                        "aarch64" => Arch::Aarch64,
                        other => return Err(format!("unknown arch {other}")),
                    })
                }
                "task" => {
                    tgid = dec(field(0)?)? as u32;
                    tid = dec(field(1)?)? as u32;
                    ktime_ns = dec(field(2)?)?;
                }
                "flags" => flags = dec(field(0)?)? as u32,
                "regs" => {
                    regs = Some(Regs::interrupted(
                        hex(field(0)?)?,
                        hex(field(1)?)?,
                        hex(field(2)?)?,
                        hex(field(3)?)?,
                    ))
                }
                "frames" => {
                    kernel_frames = fields.iter().map(|f| hex(f)).collect::<Result<_, _>>()?
                }
                "mapping" => {
                    let path = rest.splitn(4, ' ').nth(3).ok_or("mapping without path")?;
                    mappings.push(SnapshotMapping {
                        start: hex(field(0)?)?,
                        end: hex(field(1)?)?,
                        file_offset: hex(field(2)?)?,
                        path: PathBuf::from(path),
                    })
                }
                "memory" => {
                    let address = hex(field(0)?)?;
                    let len = dec(field(1)?)? as usize;
                    let bytes = data.get(..len).ok_or("truncated memory")?.to_vec();
                    memory.push((address, bytes));
                    // One memory block, always last.
                    break;
                }
                other => return Err(format!("unknown line {other}")),
            }
        }
        Ok(RecordedSample {
            tgid,
            tid,
            ktime_ns,
            flags,
            kernel_frames,
            snapshot: Snapshot {
                arch: arch.ok_or("no arch")?,
                regs: regs.ok_or("no registers")?,
                memory,
                mappings,
            },
        })
    }
}

/// The next line of `data`, which moves past it.
fn next_line<'a>(data: &mut &'a [u8]) -> Result<&'a str, String> {
    let end = data
        .iter()
        .position(|byte| *byte == b'\n')
        .ok_or("truncated header")?;
    let text = std::str::from_utf8(&data[..end]).map_err(|err| err.to_string())?;
    *data = &data[end + 1..];
    Ok(text)
}
