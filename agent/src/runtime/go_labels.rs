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
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use hostprof_common::golang::{self as go, Process};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

use super::{
    Registry, Runtime,
    thread_ctx::{TlsSymbol, TlsVariant},
};
use crate::model::Mapping;

/// The kernel map of Go processes.
pub type ProcessMap = BpfHashMap<MapData, u32, Process>;

/// Executables remembered (by device and inode) before the cache starts over.
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
    /// (device, inode) of each executable read -> what to register.
    files: HashMap<(u64, u64), Option<Process>>,
}

impl GoLabels {
    /// With the kernel's map (none: nothing is registered, e.g. tests).
    pub fn new(map: Option<ProcessMap>) -> Self {
        GoLabels {
            processes: Registry::new(map, "its Go labels", |state| *state == Ok(true))
                .read_by_the_whole_program(),
            files: HashMap::new(),
        }
    }

    /// What to register for `pid`'s executable, read once per file;
    /// `None` also while its executable is not among the mappings yet.
    fn find(&mut self, pid: u32, mappings: &[Arc<Mapping>]) -> Option<Option<Process>> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let exe = exe.to_string_lossy();
        let exe = exe.strip_suffix(" (deleted)").unwrap_or(&exe);
        let mapping = mappings.iter().find(|mapping| &*mapping.path == exe)?;
        let key = (mapping.dev, mapping.inode);
        if let Some(known) = self.files.get(&key) {
            return Some(*known);
        }
        // Most executables are not Go, as their section names tell: only
        // a Go binary is read whole (symbols, `.go.buildinfo`).
        let is_go = super::elf::read_dynamic(pid, mapping).is_ok_and(|data| {
            object::File::parse(&*data)
                .is_ok_and(|file| file.section_by_name(".go.buildinfo").is_some())
        });
        let process = match is_go.then(|| super::elf::read(pid, mapping).map(|d| process_of(&d))) {
            Some(Ok(Ok(process))) => process,
            Some(Ok(Err(why))) => {
                tracing::info!("pid {pid}: its goroutines' pprof labels are not read: {why}");
                None
            }
            Some(Err(_)) | None => None,
        };
        if self.files.len() >= MAX_FILES {
            self.files.clear();
        }
        self.files.insert(key, process);
        Some(process)
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

    #[test]
    fn a_non_go_binary_is_not_registered() {
        assert_eq!(process_of(b"not an ELF"), Ok(None));
        let me = std::fs::read("/proc/self/exe").expect("own executable");
        assert_eq!(process_of(&me), Ok(None));
    }
}
