//! Go's pprof labels: finds the Go processes and tells the kernel where
//! each thread's goroutine and its labels are (the `GO_PROCS` map), so
//! that samples carry the labels of the goroutine they caught
//! (`hostprof_common::golang`; decoded by `crate::procs::go_labels`).
//!
//! Read from the executable, once per file: its Go version (the
//! `.go.buildinfo` header, Go 1.13 on), which gives the offsets of
//! `g.m`, `m.curg` and `g.labels` and the labels' layout, and where `g`
//! is in the thread's TLS.
//!
//! The offsets come from a table per Go release rather than from the
//! binary's DWARF: Go services are often built with `-ldflags=-s -w`
//! (no DWARF, no symbols), and the fields moved only a few times (the
//! table matches the DWARF of the builds of every release
//! tests/go_labels.rs reads labels with, 1.15 to 1.27).
//! A release past the table is not registered (logged): a guessed offset
//! would read some other field as a pointer.
use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use hostprof_common::golang::{self as go, Process};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

use super::{
    Registry, Runtime,
    elf::{ByFile, FileKey},
    thread_ctx::{TlsSymbol, TlsVariant},
};
use crate::model::Mapping;

/// The kernel map of Go processes.
pub type ProcessMap = BpfHashMap<MapData, u32, Process>;

/// Go executables whose labels cannot be read (see [`unreadable`]).
static UNREADABLE: AtomicU64 = AtomicU64::new(0);

/// Distinct Go executables seen whose goroutines' labels are not read
/// (version unreadable or unknown, or the goroutine's place unknown), so
/// far in this process: each is also logged once, but a fleet reads
/// metrics, not every node's log.
pub fn unreadable() -> u64 {
    UNREADABLE.load(Ordering::Relaxed)
}

/// Executables remembered, by what they are (see [`super::elf::FileKey`]),
/// before the cache starts over.
const MAX_FILES: usize = 4096;

/// How often a process whose executable is not among its mappings yet
/// (a sample of the image before an exec) is looked at again.
const RECHECK_INTERVAL: Duration = Duration::from_millis(250);

/// The TLS variable Go keeps `g` in when it uses the system's TLS (cgo,
/// external linking): x86_64's and arm64's names.
const TLS_G: [&str; 2] = ["runtime.tlsg", "runtime.tls_g"];

/// A Go binary's release, `(1, minor)`, from its `.go.buildinfo` header:
/// 16 bytes of magic, pointer size and flags, then, with flag 2 (Go 1.18
/// on), the version as a varint-prefixed string at byte 32. Older headers
/// (Go 1.13 to 1.17) hold at byte 16 the address of `runtime.buildVersion`,
/// a string header (address, length) in the binary's data.
pub fn go_version(file: &object::File) -> Option<(u32, u32)> {
    const MAGIC: &[u8] = b"\xff Go buildinf:";
    let data = file.section_by_name(".go.buildinfo")?.data().ok()?;
    if !data.starts_with(MAGIC) {
        return None;
    }
    let flags = *data.get(15)?;
    if flags & 2 == 0 {
        // Little-endian 64-bit only (x86_64, arm64: what the kernel reads).
        if *data.get(14)? != 8 || flags & 1 != 0 {
            return None;
        }
        let word = |bytes: &[u8], at: usize| {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let header = at_address(file, word(data, 16)?, 16)?;
        let (address, len) = (word(header, 0)?, word(header, 8)?);
        // A version string is far shorter than 64 bytes.
        if len >= 64 {
            return None;
        }
        let version = at_address(file, address, len)?;
        return parse_version(std::str::from_utf8(version).ok()?);
    }
    let len = usize::from(*data.get(32)?);
    // One varint byte: a version string is far shorter than 128 bytes.
    if len >= 0x80 {
        return None;
    }
    parse_version(std::str::from_utf8(data.get(33..33 + len)?).ok()?)
}

/// `len` bytes of the file's sections at virtual address `address`.
fn at_address<'a>(file: &object::File<'a>, address: u64, len: u64) -> Option<&'a [u8]> {
    file.sections()
        .find_map(|section| section.data_range(address, len).ok().flatten())
}

/// `go1.23.5`, `go1.24rc1`, `go1.22-20240109-RC01 cl/…` → `(1, minor)`.
pub fn parse_version(version: &str) -> Option<(u32, u32)> {
    let rest = version.strip_prefix("go1.")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    Some((1, rest[..digits].parse().ok()?))
}

/// `(g.m, m.curg, g.labels, layout)` of a Go release (x86_64 and arm64
/// alike: the fields before them are pointers and 64-bit integers),
/// checked against the runtime's DWARF of 1.15.15, 1.19.8, 1.23.5,
/// 1.24.4, 1.25.12, 1.26.11 and 1.27.4 builds for both. 1.13, 1.14 and
/// 1.16 share 1.15's layout and 1.17 1.18's (no toolchain of theirs is
/// packaged where the tests can get one; the reference profiler's table
/// agrees).
pub fn offsets(version: (u32, u32)) -> Option<(u32, u32, u32, u32)> {
    let (curg, labels, layout) = match version {
        (1, 13..=16) => (192, 344, go::LAYOUT_MAP),
        (1, 17..=20) => (192, 360, go::LAYOUT_MAP),
        (1, 21..=22) => (192, 344, go::LAYOUT_MAP),
        (1, 23) => (192, 352, go::LAYOUT_MAP),
        // `labelMap` became `struct { LabelSet{ list []label } }`.
        (1, 24) => (192, 352, go::LAYOUT_SLICE),
        // `gobuf` lost 8 bytes, and `m.morebuf` and `g.sched` are one.
        (1, 25) => (184, 344, go::LAYOUT_SLICE),
        // `g` gained 8 bytes of fields before `labels`; `labelMap` became
        // `struct { label.Set{ List []label.Label } }`
        // (internal/runtime/pprof/label): the same slice of pairs.
        (1, 26..=27) => (184, 352, go::LAYOUT_SLICE),
        _ => return None,
    };
    Some((48, curg, labels, layout))
}

/// Where a thread's `g` is: `(go::G_IN_TLS, offset from the thread
/// pointer)` or `(go::G_IN_REGISTER, 0)`.
///
/// - x86_64 without cgo: Go sets `fs` itself, to 8 bytes past its own TLS
///   slot (`runtime.settls`), and the binary has no TLS segment.
/// - arm64 without cgo: `g` lives in R28 alone (Go's code never moves it
///   elsewhere), and the binary has no TLS segment.
/// - Both with cgo: `g` is also stored in `runtime.tlsg` (arm64:
///   `runtime.tls_g`) at every switch, in the executable's static TLS,
///   placed as the loader places it; read there, since C code called
///   through cgo may use R28 for itself. A stripped binary: only when
///   the segment holds just that 8-byte variable.
pub fn g_location(file: &object::File, data: &[u8]) -> Option<(u32, i64)> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let variant = match file.architecture() {
        object::Architecture::X86_64 => TlsVariant::Below,
        object::Architecture::Aarch64 => TlsVariant::Above,
        _ => return None,
    };
    let elf = ElfFile64::<object::Endianness>::parse(data).ok()?;
    let endian = elf.endian();
    let Some(tls) = elf
        .elf_program_headers()
        .iter()
        .find(|header| header.p_type(endian) == object::elf::PT_TLS)
    else {
        return Some(match variant {
            TlsVariant::Below => (go::G_IN_TLS, -8),
            TlsVariant::Above => (go::G_IN_REGISTER, 0),
        });
    };
    let symbol = file.symbols().find(|symbol| {
        symbol.kind() == SymbolKind::Tls && symbol.name().is_ok_and(|name| TLS_G.contains(&name))
    });
    let offset = match symbol {
        Some(symbol) => symbol.address(),
        None if tls.p_memsz(endian) == 8 => 0,
        None => return None,
    };
    let offset = TlsSymbol {
        segment_address: tls.p_vaddr(endian),
        segment_size: tls.p_memsz(endian),
        segment_align: tls.p_align(endian),
        offset,
    }
    .thread_pointer_offset(variant)?;
    Some((go::G_IN_TLS, offset))
}

/// What a Go executable needs registered; `Err` says why a Go binary is
/// not (`Ok(None)`: not a Go binary).
pub fn process_of(data: &[u8]) -> Result<Option<Process>, String> {
    let Ok(file) = object::File::parse(data) else {
        return Ok(None);
    };
    if file.section_by_name(".go.buildinfo").is_none() {
        return Ok(None);
    }
    let Some(version) = go_version(&file) else {
        return Err("its Go version is not readable (Go 1.13 or later is)".into());
    };
    let Some((m, curg, labels, layout)) = offsets(version) else {
        return Err(format!(
            "its Go release 1.{} is not among those hostprof knows (1.13 to 1.27)",
            version.1
        ));
    };
    let Some((g_in, tls_offset)) = g_location(&file, data) else {
        return Err(
            "where it keeps the current goroutine is not known (x86_64 and arm64 only; \
                    with cgo, a stripped binary whose TLS holds more than Go's)"
                .into(),
        );
    };
    Ok(Some(Process {
        g_in,
        _pad: 0,
        tls_offset,
        m,
        curg,
        labels,
        layout,
    }))
}

/// The Go processes looked at (the attribution thread owns it).
pub struct GoLabels {
    /// Looked at: registered (true) or not a Go process we read (false);
    /// `Err`: its executable was not among its mappings then.
    processes: Registry<Result<bool, Instant>, Process>,
    /// Each executable looked at -> what to register.
    files: ByFile<Option<Process>>,
}

impl GoLabels {
    /// With the kernel's map (none: nothing is registered, e.g. tests).
    pub fn new(map: Option<ProcessMap>) -> Self {
        GoLabels {
            processes: Registry::new(map, "its Go labels", |state| *state == Ok(true))
                .read_by_the_whole_program()
                .marks_present(hostprof_common::present::GO),
            files: ByFile::new(MAX_FILES),
        }
    }

    /// What to register for `pid`'s executable, read once per file;
    /// `None` also while its executable is not among the mappings yet.
    fn find(&mut self, pid: u32, mappings: &[Arc<Mapping>]) -> Option<Option<Process>> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let exe = exe.to_string_lossy();
        let exe = exe.strip_suffix(" (deleted)").unwrap_or(&exe);
        let mapping = mappings.iter().find(|mapping| &*mapping.path == exe)?;
        // Not remembered when it cannot be opened: it may be later.
        let Ok(file) = super::elf::open(pid, mapping) else {
            return Some(None);
        };
        let key = FileKey::of(&file);
        if let Some(known) = self.files.get(&key) {
            return Some(known);
        }
        // Most executables are not Go, as their section names tell: only
        // a Go binary is read whole (symbols, `.go.buildinfo`), and what
        // it holds is remembered by its content, which that read hashes.
        let is_go = file.read_dynamic().is_ok_and(|data| {
            object::File::parse(&*data)
                .is_ok_and(|file| file.section_by_name(".go.buildinfo").is_some())
        });
        if !is_go {
            self.files.insert(key, None);
            return Some(None);
        }
        let unreadable = |_| ();
        let read = self.files.read(pid, mapping, unreadable, |data| {
            Ok(process_of(data).unwrap_or_else(|why| {
                UNREADABLE.fetch_add(1, Ordering::Relaxed);
                tracing::info!("pid {pid}: its goroutines' pprof labels are not read: {why}");
                None
            }))
        });
        Some(read.unwrap_or(None))
    }
}

impl Runtime for GoLabels {
    fn attach(&mut self, pid: u32, mappings: &[Arc<Mapping>]) -> bool {
        match self.processes.get(pid) {
            Some(Ok(_)) => return false,
            Some(Err(at)) if at.elapsed() < RECHECK_INTERVAL => return false,
            _ if mappings.is_empty() => return false,
            _ => {}
        }
        let Some(found) = self.find(pid, mappings) else {
            self.processes.set(pid, Err(Instant::now()));
            return false;
        };
        if let Some(process) = found {
            self.processes.register(pid, process);
            if process.g_in == go::G_IN_REGISTER {
                tracing::debug!(
                    "pid {pid}: Go process, g in a register, labels at {}",
                    process.labels
                );
            } else {
                tracing::debug!(
                    "pid {pid}: Go process, g at {:+}, labels at {}",
                    process.tls_offset,
                    process.labels
                );
            }
        }
        self.processes.set(pid, Ok(found.is_some()));
        false
    }

    fn pids(&self) -> Vec<u32> {
        self.processes.pids()
    }

    fn forget(&mut self, pid: u32) {
        self.processes.forget(pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_minor_release() {
        assert_eq!(parse_version("go1.23.5"), Some((1, 23)));
        assert_eq!(parse_version("go1.24rc1"), Some((1, 24)));
        assert_eq!(parse_version("go1.19"), Some((1, 19)));
        assert_eq!(parse_version("devel +abc"), None);
        assert_eq!(parse_version("go1."), None);
    }

    #[test]
    fn knows_the_label_offsets_of_the_releases_it_was_checked_on() {
        assert_eq!(offsets((1, 15)), Some((48, 192, 344, go::LAYOUT_MAP)));
        assert_eq!(offsets((1, 19)), Some((48, 192, 360, go::LAYOUT_MAP)));
        assert_eq!(offsets((1, 23)), Some((48, 192, 352, go::LAYOUT_MAP)));
        assert_eq!(offsets((1, 24)), Some((48, 192, 352, go::LAYOUT_SLICE)));
        assert_eq!(offsets((1, 25)), Some((48, 184, 344, go::LAYOUT_SLICE)));
        assert_eq!(offsets((1, 26)), Some((48, 184, 352, go::LAYOUT_SLICE)));
        assert_eq!(offsets((1, 27)), Some((48, 184, 352, go::LAYOUT_SLICE)));
        // Past the newest checked: not guessed.
        assert_eq!(offsets((1, 28)), None);
        assert_eq!(offsets((1, 12)), None);
        assert_eq!(offsets((1, 99)), None);
    }

    /// A little-endian ELF64 file with `.go.buildinfo` at 0x1000 and
    /// `.data` at 0x2000.
    fn elf(buildinfo: &[u8], data: &[u8]) -> Vec<u8> {
        let names = b"\0.go.buildinfo\0.data\0.shstrtab\0";
        let mut file = vec![0u8; 64];
        let at_buildinfo = file.len();
        file.extend_from_slice(buildinfo);
        let at_data = file.len();
        file.extend_from_slice(data);
        let at_names = file.len();
        file.extend_from_slice(names);
        file.resize(file.len().next_multiple_of(8), 0);
        let at_headers = file.len();
        file.extend_from_slice(&[0; 64]);
        // (name, type, address, offset, size): PROGBITS twice, STRTAB.
        for (name, kind, address, offset, size) in [
            (1u32, 1u32, 0x1000u64, at_buildinfo, buildinfo.len()),
            (15, 1, 0x2000, at_data, data.len()),
            (21, 3, 0, at_names, names.len()),
        ] {
            file.extend_from_slice(&name.to_le_bytes());
            file.extend_from_slice(&kind.to_le_bytes());
            file.extend_from_slice(&2u64.to_le_bytes()); // SHF_ALLOC
            file.extend_from_slice(&address.to_le_bytes());
            file.extend_from_slice(&(offset as u64).to_le_bytes());
            file.extend_from_slice(&(size as u64).to_le_bytes());
            file.extend_from_slice(&[0; 8]); // link, info
            file.extend_from_slice(&1u64.to_le_bytes());
            file.extend_from_slice(&[0; 8]);
        }
        file[..16].copy_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
        file[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        file[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86_64
        file[20..24].copy_from_slice(&1u32.to_le_bytes());
        file[40..48].copy_from_slice(&(at_headers as u64).to_le_bytes());
        file[52..54].copy_from_slice(&64u16.to_le_bytes());
        file[54..56].copy_from_slice(&56u16.to_le_bytes());
        file[58..60].copy_from_slice(&64u16.to_le_bytes());
        file[60..62].copy_from_slice(&4u16.to_le_bytes());
        file[62..64].copy_from_slice(&3u16.to_le_bytes());
        file
    }

    /// A pre-1.18 header (pointer size, flags) pointing at `pointer`.
    fn old_header(size: u8, flags: u8, pointer: u64) -> Vec<u8> {
        let mut header = b"\xff Go buildinf:".to_vec();
        header.extend_from_slice(&[size, flags]);
        header.extend_from_slice(&pointer.to_le_bytes());
        header.resize(32, 0);
        header
    }

    /// `.data` holding a string header (address, length) at 0x2000 and
    /// the bytes it points at from 0x2010.
    fn version_string(text: &[u8], len: u64) -> Vec<u8> {
        let mut data = 0x2010u64.to_le_bytes().to_vec();
        data.extend_from_slice(&len.to_le_bytes());
        data.extend_from_slice(text);
        data
    }

    fn version_of(bytes: &[u8]) -> Option<(u32, u32)> {
        go_version(&object::File::parse(bytes).expect("a well-formed ELF file"))
    }

    #[test]
    fn an_old_header_is_followed_to_runtime_build_version() {
        let good = version_string(b"go1.15.15", 9);
        assert_eq!(
            version_of(&elf(&old_header(8, 0, 0x2000), &good)),
            Some((1, 15))
        );
        // Go 1.18's inline string, for comparison.
        let mut new = old_header(8, 2, 0);
        new.push(7);
        new.extend_from_slice(b"go1.24.4");
        assert_eq!(version_of(&elf(&new, &[])), Some((1, 24)));
    }

    #[test]
    fn a_hostile_old_header_reads_no_version_and_nothing_outside_the_file() {
        let good = version_string(b"go1.15.15", 9);
        let cases: [(&str, Vec<u8>, Vec<u8>); 10] = [
            ("32-bit", old_header(4, 0, 0x2000), good.clone()),
            ("big-endian", old_header(8, 1, 0x2000), good.clone()),
            (
                "cut after the flags",
                old_header(8, 0, 0x2000)[..18].to_vec(),
                good.clone(),
            ),
            (
                "pointer to no section",
                old_header(8, 0, 0xdead_0000),
                good.clone(),
            ),
            (
                "pointer at the top",
                old_header(8, 0, u64::MAX - 4),
                good.clone(),
            ),
            (
                "header cut by the section's end",
                old_header(8, 0, 0x2000 + 20),
                good.clone(),
            ),
            (
                "length past the data",
                old_header(8, 0, 0x2000),
                version_string(b"go1.15", 60),
            ),
            (
                "length of 2^64 - 1",
                old_header(8, 0, 0x2000),
                version_string(b"go1.15", u64::MAX),
            ),
            (
                "not UTF-8",
                old_header(8, 0, 0x2000),
                version_string(b"go1.\xff5", 6),
            ),
            (
                "not a Go version",
                old_header(8, 0, 0x2000),
                version_string(b"devel +1", 8),
            ),
        ];
        for (what, buildinfo, data) in cases {
            assert_eq!(version_of(&elf(&buildinfo, &data)), None, "{what}");
        }
        // The string's own address at the top of the address space.
        let mut wrapped = u64::MAX.to_le_bytes().to_vec();
        wrapped.extend_from_slice(&9u64.to_le_bytes());
        assert_eq!(version_of(&elf(&old_header(8, 0, 0x2000), &wrapped)), None);
    }

    #[test]
    fn a_non_go_binary_is_not_registered() {
        assert_eq!(process_of(b"not an ELF"), Ok(None));
        let me = std::fs::read("/proc/self/exe").expect("own executable");
        assert_eq!(process_of(&me), Ok(None));
    }
}
