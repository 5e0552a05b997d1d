//! The OpenTelemetry thread context (OTEP 4947): finds a process's
//! `otel_thread_ctx_v1` thread-local and tells the kernel where it is in
//! each thread (the `TRACE_PROCS` map), so that samples carry the thread's
//! active trace and span.
//!
//! Read from the process, once per image: its executable's dynamic symbol
//! table and TLS segment (through `crate::files`, like any binary the
//! agent reads), for a variable in the executable's static TLS (local-exec
//! or initial-exec, which a linker relaxes a writer's access to there);
//! else its libraries with a TLS segment, for one defining the variable,
//! whose place the loader's answers in the library tell
//! ([`super::tls_library`]): static TLS (a library loaded at start, or
//! `dlopen`ed into the static surplus) as an offset from the thread
//! pointer, dynamic TLS as a module id and an offset in its block, which
//! the kernel finds through the thread's DTV. A process without the
//! variable is looked at again when its mappings change (a `dlopen`).
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use hostprof_common::trace;
use object::{Object, ObjectSymbol, SymbolKind, read::elf::ElfFile64};

use super::{
    Registry, Runtime,
    elf::{ByFile, FileKey},
    tls_library::{self, LibraryTls, Location},
};
use crate::{
    model::Mapping,
    procs::otel_ctx::{Refusal, count_refusal},
};

/// The kernel map of processes publishing a thread context.
pub type ProcessMap = BpfHashMap<MapData, u32, trace::Process>;

/// The thread-local the SDK points at its current record.
pub const VARIABLE: &str = "otel_thread_ctx_v1";

/// How often a process whose executable is not among its mappings (a
/// sample of the image before an exec, attributed after it) is looked at
/// again.
const RECHECK_INTERVAL: Duration = Duration::from_millis(250);

/// Executables (and, apart, libraries) remembered, by what they are (see
/// [`super::elf::FileKey`]), before the cache starts over.
const MAX_FILES: usize = 4096;

/// The executable's TLS segment and the variable in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlsSymbol {
    /// `p_vaddr`, `p_memsz`, `p_align` of `PT_TLS`.
    pub segment_address: u64,
    pub segment_size: u64,
    pub segment_align: u64,
    /// The symbol's value: its offset in the TLS block.
    pub offset: u64,
}

/// Which TLS layout the thread pointer follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsVariant {
    /// x86_64: the static blocks below the thread pointer.
    Below,
    /// aarch64: a 16-byte TCB at the thread pointer, the blocks above it.
    Above,
}

impl TlsVariant {
    /// This machine's.
    pub const NATIVE: TlsVariant = if cfg!(target_arch = "aarch64") {
        TlsVariant::Above
    } else {
        TlsVariant::Below
    };
}

/// The DTV's place and shape in a process: musl's when its executable
/// asks for musl's loader (`PT_INTERP` `ld-musl-*.so.1`, which is its
/// libc too) or one is mapped under musl's names (Alpine's
/// `/lib/ld-musl-x86_64.so.1`; Debian's `musl-gcc` programs map it as
/// `/usr/lib/x86_64-linux-musl/libc.so`), glibc's otherwise. Only a
/// process with a dynamic loader reaches dynamic TLS.
pub fn dtv_of(musl_interpreter: bool, mappings: &[Arc<Mapping>]) -> trace::Dtv {
    let aarch64 = TlsVariant::NATIVE == TlsVariant::Above;
    let musl = musl_interpreter
        || mappings.iter().any(|mapping| {
            let mut parts = mapping.path.rsplit('/');
            let name = parts.next().unwrap_or_default();
            let dir = parts.next().unwrap_or_default();
            name.starts_with("ld-musl-")
                || name.starts_with("libc.musl-")
                || (dir.ends_with("-linux-musl") && name == "libc.so")
        });
    if musl {
        trace::Dtv::musl(aarch64)
    } else {
        trace::Dtv::glibc(aarch64)
    }
}

/// True when `data`, an executable, names musl's loader as its
/// interpreter.
#[cfg(test)]
fn musl_interpreter(data: &[u8]) -> bool {
    ElfFile64::<object::Endianness>::parse(data).is_ok_and(|elf| asks_for_musl(&elf, data))
}

/// True when `elf` (parsed from `data`) names musl's loader as its
/// interpreter.
fn asks_for_musl(elf: &ElfFile64<object::Endianness>, data: &[u8]) -> bool {
    use object::read::elf::ProgramHeader;
    let endian = elf.endian();
    elf.elf_program_headers().iter().any(|header| {
        header.p_type(endian) == object::elf::PT_INTERP
            && header.data(endian, data).is_ok_and(|path| {
                let name = path.rsplit(|&byte| byte == b'/').next().unwrap_or_default();
                name.starts_with(b"ld-musl-")
            })
    })
}

/// What an executable tells: where its own variable is, if it has one,
/// and whose loader it asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Executable {
    /// The variable's offset from the thread pointer.
    offset: Option<i64>,
    musl: bool,
}

impl Executable {
    /// What `data`, an executable, tells; its ELF parsed once.
    fn read(data: &[u8]) -> Executable {
        let Ok(elf) = ElfFile64::<object::Endianness>::parse(data) else {
            return Executable::default();
        };
        Executable {
            offset: tls_symbol(&elf)
                .and_then(|symbol| symbol.thread_pointer_offset(TlsVariant::NATIVE)),
            musl: asks_for_musl(&elf, data),
        }
    }
}

impl TlsSymbol {
    /// Address of the variable minus the thread pointer, for the main
    /// executable's block (the first static block, as glibc and musl lay
    /// it out: its start congruent to `p_vaddr` modulo the alignment).
    pub fn thread_pointer_offset(&self, variant: TlsVariant) -> Option<i64> {
        let align = self.segment_align.max(1);
        if !align.is_power_of_two() || self.offset > self.segment_size {
            return None;
        }
        let phase = self.segment_address & (align - 1);
        let offset = i64::try_from(self.offset).ok()?;
        match variant {
            // The smallest size >= memsz whose distance below the thread
            // pointer keeps the block's phase.
            TlsVariant::Below => {
                let size = self.segment_size;
                let pad = phase.wrapping_add(size).wrapping_neg() & (align - 1);
                let block = i64::try_from(size.checked_add(pad)?).ok()?;
                Some(offset - block)
            }
            // The smallest start >= 16 with the block's phase.
            TlsVariant::Above => {
                let start = 16 + (phase.wrapping_sub(16) & (align - 1));
                Some(i64::try_from(start).ok()? + offset)
            }
        }
    }
}

/// Finds [`VARIABLE`] among `data`'s dynamic symbols (OTEP 4947 asks
/// writers to export it there) and the file's TLS segment.
pub fn find_tls_symbol(data: &[u8]) -> Option<TlsSymbol> {
    tls_symbol(&ElfFile64::<object::Endianness>::parse(data).ok()?)
}

/// [`find_tls_symbol`] in a parsed file.
fn tls_symbol(elf: &ElfFile64<object::Endianness>) -> Option<TlsSymbol> {
    use object::read::elf::ProgramHeader;
    let symbol = elf
        .dynamic_symbols()
        // Defined here: an executable reaching a library's variable names
        // it too, undefined (its place is then the library's).
        .find(|symbol| {
            symbol.kind() == SymbolKind::Tls
                && !symbol.is_undefined()
                && symbol.name() == Ok(VARIABLE)
        })?;
    let endian = elf.endian();
    let tls = elf
        .elf_program_headers()
        .iter()
        .find(|header| header.p_type(endian) == object::elf::PT_TLS)?;
    Some(TlsSymbol {
        segment_address: tls.p_vaddr(endian),
        segment_size: tls.p_memsz(endian),
        segment_align: tls.p_align(endian),
        offset: symbol.address(),
    })
}

/// What is known of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Registered with the kernel.
    Registered,
    /// No variable in the files it mapped when last looked: looked at
    /// again when its mappings change (a library `dlopen`ed), told by the
    /// mappings given (the process table re-reads them on an address
    /// they miss, or takes the maps a search for the process context read
    /// when they hold a library its own lack, and hands out a new list).
    Absent(MapsSeen),
    /// Its executable was not among the mappings given, or a library's
    /// slots were not filled yet, when last looked.
    NotYet(Instant),
    /// Its process context names another schema than the OTEP's for its
    /// threads' records: not read (looked at again once it names none).
    Foreign,
}

/// Which list of mappings a process was looked at with: its address and
/// length (a new reading is a new list).
type MapsSeen = (usize, usize);

fn maps_seen(mappings: &[Arc<Mapping>]) -> MapsSeen {
    (mappings.as_ptr() as usize, mappings.len())
}

/// Where the variable of a process is, as far as its mappings tell.
enum Found {
    At(trace::Process),
    Absent,
    NotYet,
}

/// The processes looked at (the attribution thread owns it).
pub struct ThreadContext {
    processes: Registry<State, trace::Process>,
    /// Each executable read -> what it tells.
    files: ByFile<Executable>,
    /// Each library with a TLS segment looked at -> the variable's
    /// library part, if it defines it.
    libraries: ByFile<Option<Arc<LibraryTls>>>,
}

impl ThreadContext {
    /// With the kernel's map (none: nothing is registered, e.g. tests).
    pub fn new(map: Option<ProcessMap>) -> Self {
        ThreadContext {
            processes: Registry::new(map, "its thread context", |state| {
                *state == State::Registered
            })
            .marks_present(hostprof_common::present::TRACE),
            files: ByFile::new(MAX_FILES),
            libraries: ByFile::new(MAX_FILES),
        }
    }

    /// Where the variable is in `pid`: its executable's static TLS, or a
    /// library's, each file read once.
    fn find(&mut self, pid: u32, mappings: &[Arc<Mapping>]) -> Found {
        let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
            return Found::Absent;
        };
        let exe = exe.to_string_lossy();
        let exe = exe.strip_suffix(" (deleted)").unwrap_or(&exe);
        let Some(mapping) = mappings.iter().find(|mapping| &*mapping.path == exe) else {
            return Found::NotYet;
        };
        let executable = match super::elf::open(pid, mapping) {
            Ok(file) => {
                let key = FileKey::of(&file);
                match self.files.get(&key) {
                    Some(known) => known,
                    None => {
                        let executable = file
                            .read_dynamic()
                            .map(|data| Executable::read(&data))
                            .unwrap_or_default();
                        self.files.insert(key, executable);
                        executable
                    }
                }
            }
            // Not remembered: it may be opened later. Its libraries may
            // still tell.
            Err(_) => Executable::default(),
        };
        if let Some(tls_offset) = executable.offset {
            return Found::At(trace::Process {
                tls_offset,
                module: 0,
                dtv: trace::Dtv::default(),
            });
        }
        let exe = (mapping.dev, mapping.inode);
        self.find_in_libraries(pid, exe, executable.musl, mappings)
    }

    /// The variable in one of `pid`'s libraries (not its executable, whose
    /// mappings are `exe`'s device and inode, and which asks for musl's
    /// loader if `musl`), from the slots the loader filled for it.
    fn find_in_libraries(
        &mut self,
        pid: u32,
        exe: (u64, u64),
        musl: bool,
        mappings: &[Arc<Mapping>],
    ) -> Found {
        for mapping in mappings {
            if (mapping.dev, mapping.inode) == exe || mapping.inode == 0 {
                continue;
            }
            let library = self.library(pid, mapping);
            let Some(library) = library else {
                continue;
            };
            if !library.has_slots() {
                tracing::info!("pid {pid}: {VARIABLE} in {} is not read", mapping.path);
                count_refusal(pid, Refusal::TlsUnreachable);
                return Found::Absent;
            }
            let Some(bias) = super::elf::load_bias(library.segments(), mapping) else {
                return Found::NotYet;
            };
            let memory = crate::procs::memory::Process(pid);
            return match library.locate(&memory, bias, TlsVariant::NATIVE) {
                Some(Location::Static(tls_offset)) => Found::At(trace::Process {
                    tls_offset,
                    module: 0,
                    dtv: trace::Dtv::default(),
                }),
                Some(Location::Dynamic { module, offset }) => match i64::try_from(offset) {
                    Ok(tls_offset) => Found::At(trace::Process {
                        tls_offset,
                        module,
                        dtv: dtv_of(musl, mappings),
                    }),
                    Err(_) => {
                        count_refusal(pid, Refusal::TlsUnreachable);
                        Found::Absent
                    }
                },
                None => Found::NotYet,
            };
        }
        Found::Absent
    }
}

impl ThreadContext {
    /// A library's part of the variable, when it defines it. Files with no
    /// TLS segment (most) are not read beyond their headers, nor
    /// remembered: telling costs two small reads of the file opened anyway
    /// for its key. A file that cannot be opened or read is not
    /// remembered either: it may be later.
    fn library(&mut self, pid: u32, mapping: &Mapping) -> Option<Arc<LibraryTls>> {
        let file = super::elf::open(pid, mapping).ok()?;
        if !tls_library::has_tls_segment(|buf, offset| file.read_at(buf, offset).is_ok()) {
            return None;
        }
        let key = FileKey::of(&file);
        if let Some(known) = self.libraries.get(&key) {
            return known;
        }
        let library = tls_library::find(&file.read_dynamic().ok()?).map(Arc::new);
        self.libraries.insert(key, library.clone());
        library
    }
}

impl Runtime for ThreadContext {
    /// A process whose context names a foreign schema leaves the kernel's
    /// map (its records are not the OTEP's: reading them costs every
    /// sample for nothing), and comes back when its context stops saying so.
    fn identity(&mut self, pid: u32, process: &crate::model::ProcessInfo) {
        let foreign = process
            .thread_keys
            .as_deref()
            .is_some_and(crate::procs::thread_attrs::KeyMap::foreign_schema);
        match self.processes.get(pid) {
            Some(State::Registered) if foreign => {
                tracing::debug!(
                    "pid {pid}: its threads' records are of a foreign schema: not read"
                );
                self.processes.forget(pid);
                self.processes.set(pid, State::Foreign);
            }
            Some(State::Foreign) if !foreign => self.processes.forget(pid),
            _ => {}
        }
    }

    fn attach(&mut self, pid: u32, mappings: &[Arc<Mapping>]) -> bool {
        match self.processes.get(pid) {
            Some(State::Registered | State::Foreign) => return false,
            Some(State::Absent(seen)) if *seen == maps_seen(mappings) => return false,
            Some(State::NotYet(at)) if at.elapsed() < RECHECK_INTERVAL => return false,
            _ if mappings.is_empty() => return false,
            _ => {}
        }
        let state = match self.find(pid, mappings) {
            Found::At(process) => {
                self.processes.register(pid, process);
                tracing::debug!(
                    "pid {pid}: thread context at {:+} (module {})",
                    process.tls_offset,
                    process.module
                );
                State::Registered
            }
            Found::Absent => State::Absent(maps_seen(mappings)),
            Found::NotYet => State::NotYet(Instant::now()),
        };
        self.processes.set(pid, state);
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
    fn a_process_whose_context_names_a_foreign_schema_is_not_read() {
        let process = |schema: Option<&str>| crate::model::ProcessInfo {
            pid: 7,
            comm: "app".into(),
            exe_path: "/bin/app".into(),
            container_id: None,
            pod_uid: None,
            service: None,
            thread_keys: Some(Arc::new(
                crate::procs::thread_attrs::KeyMap::new(["http.route"])
                    .with_schema(schema.map(Arc::from)),
            )),
        };
        let mut context = ThreadContext::new(None);
        context.processes.set(7, State::Registered);
        // The OTEP's schema, named or not: still read.
        context.identity(7, &process(Some("tls_v1")));
        context.identity(7, &process(None));
        assert_eq!(context.processes.get(7), Some(&State::Registered));
        // Another: out of the kernel's map, and not found again.
        context.identity(7, &process(Some("tls_v2")));
        assert_eq!(context.processes.get(7), Some(&State::Foreign));
        assert!(!context.attach(7, &[]));
        assert_eq!(context.processes.get(7), Some(&State::Foreign));
        // Republished without it: looked for again.
        context.identity(7, &process(None));
        assert_eq!(context.processes.get(7), None);
    }

    #[test]
    fn places_the_executable_block_below_the_thread_pointer() {
        // 8-byte variable at offset 8 of a 16-byte, 8-aligned block.
        let symbol = TlsSymbol {
            segment_address: 0x3dd8,
            segment_size: 0x14,
            segment_align: 8,
            offset: 8,
        };
        // Block rounded to 0x18 below tp, variable 8 bytes in.
        assert_eq!(symbol.thread_pointer_offset(TlsVariant::Below), Some(-0x10));
        // aarch64: after the 16-byte TCB.
        assert_eq!(symbol.thread_pointer_offset(TlsVariant::Above), Some(0x18));
    }

    #[test]
    fn tells_musl_by_its_loader() {
        let mapped = |path: &str| {
            Arc::new(Mapping {
                start: 0x1000,
                end: 0x2000,
                file_offset: 0,
                path: path.into(),
                dev: 1,
                inode: 2,
                build_ids: Default::default(),
            })
        };
        let aarch64 = TlsVariant::NATIVE == TlsVariant::Above;
        let glibc = [
            mapped("/usr/lib/x86_64-linux-gnu/libc.so.6"),
            mapped("/app/a"),
        ];
        assert_eq!(dtv_of(false, &glibc), trace::Dtv::glibc(aarch64));
        // The executable asked for musl's loader.
        assert_eq!(dtv_of(true, &glibc), trace::Dtv::musl(aarch64));
        // Alpine's loader, and Debian's musl-gcc programs' libc.
        for loader in [
            "/lib/ld-musl-x86_64.so.1",
            "/lib/ld-musl-aarch64.so.1",
            "/usr/lib/x86_64-linux-musl/libc.so",
        ] {
            let musl = [mapped("/app/a"), mapped(loader)];
            assert_eq!(dtv_of(false, &musl), trace::Dtv::musl(aarch64));
        }
        // A file merely named after it elsewhere in the path is not it.
        let other = [mapped("/ld-musl-x/libfoo.so"), mapped("/usr/lib/libc.so")];
        assert_eq!(dtv_of(false, &other), trace::Dtv::glibc(aarch64));
        // This test binary asks for glibc's loader.
        let this = std::fs::read("/proc/self/exe").expect("this test binary");
        assert!(!musl_interpreter(&this));
        // The two layouts differ where the kernel looks.
        let (glibc, musl) = (trace::Dtv::glibc(true), trace::Dtv::musl(true));
        assert_eq!((glibc.at, musl.at), (0, -8));
        assert_ne!(glibc.entry_shift, musl.entry_shift);
    }

    #[test]
    fn keeps_the_phase_of_an_unaligned_block() {
        // p_vaddr 4 past a 16-byte boundary, 20 bytes: the block's start
        // must stay 4 past a boundary: 28 below tp (tp is 16-aligned).
        let symbol = TlsSymbol {
            segment_address: 0x1004,
            segment_size: 20,
            segment_align: 16,
            offset: 0,
        };
        assert_eq!(symbol.thread_pointer_offset(TlsVariant::Below), Some(-28));
        assert_eq!(symbol.thread_pointer_offset(TlsVariant::Above), Some(20));
        let bad = TlsSymbol {
            segment_align: 12,
            ..symbol
        };
        assert_eq!(bad.thread_pointer_offset(TlsVariant::Below), None);
    }
}
