//! Node.js (V8) processes: finds V8 in a process (a `node` binary or
//! `libnode.so` exporting V8's postmortem constants), tells the kernel
//! where its builtins and fields are (the `V8_PROCS` map, and the code
//! the unwind service marks: every anonymous executable mapping, V8's
//! code space, and the embedded builtins inside the binary), and names
//! the JavaScript frames the kernel recorded ([`names`]), an interpreted
//! frame at the line of the code it was running ([`positions`]), a
//! compiled one too when V8's code says ([`compiled`]).
mod baseline;
mod code_search;
mod compiled;
mod layout;
mod names;
mod positions;
#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use hostprof_common::{
    runtime::{self, tag},
    v8,
};

use super::{
    Registry, Runtime, RuntimeCode,
    elf::{self, ByFile},
    recent::Recent,
};
use crate::{
    model::{CodeRange, Frame, FrameKind, Line, Mapping},
    procs::memory::{self, Memory},
};
use layout::{Layout, Symbols};
use names::{Heap, Named};
use positions::{Found, Table};

/// The kernel map of V8 processes.
pub type ProcessMap = BpfHashMap<MapData, u32, v8::Process>;

/// How often a process without V8 found is looked at again (a `node`
/// binary is seen at once; this is for ones not yet mapped).
const RECHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long a function's name is trusted before its `SharedFunctionInfo`
/// is checked again (the garbage collector moves and frees them).
const NAME_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// Names kept per process; past it the cache starts over.
const MAX_NAMES: usize = 65536;
/// Functions whose source position tables are kept per process, and their
/// entries in all (24 bytes each); past either the cache starts over.
const MAX_TABLES: usize = 16384;
const MAX_TABLE_ENTRIES: usize = 1 << 20;
/// Scripts whose line ends are kept per process.
const MAX_SCRIPTS: usize = 1024;
/// Binaries whose symbols are kept (by content: see [`elf::FileKey`]).
const MAX_BINARIES: usize = 16;
/// A frame the kernel recorded that could not be named.
const UNNAMED: &str = "[unknown JavaScript frame]";

/// Why V8 cannot be walked in a process.
#[derive(Debug, thiserror::Error)]
pub enum V8Error {
    #[error("cannot read the binary: {0}")]
    Elf(String),
    #[error("the binary has no V8 constants")]
    NotV8,
    #[error("V8 constant {0} missing")]
    MissingConstant(&'static str),
    #[error("V8 constant {0} out of range")]
    Implausible(&'static str),
}

/// A binary's V8 symbols and segments, read once per file.
struct Binary {
    symbols: Symbols,
    segments: Vec<(u64, u64, u64)>,
    /// `interpreter::Bytecodes::kBytecodeSizes`: its address and size.
    bytecode_sizes: Option<(u64, u64)>,
}

impl Binary {
    fn read(data: &crate::files::FileData) -> Result<Arc<Binary>, V8Error> {
        use object::{Object, ObjectSymbol};
        let file = object::File::parse(&**data).map_err(|err| V8Error::Elf(err.to_string()))?;
        let mut symbols = Symbols::new();
        let mut bytecode_sizes = None;
        for symbol in file.dynamic_symbols().chain(file.symbols()) {
            if symbol.name() == Ok(BYTECODE_SIZES) && bytecode_sizes.is_none() {
                bytecode_sizes = Some((symbol.address(), symbol.size()));
            }
            if let Ok(name) = symbol.name()
                && let Some(wanted) = layout::SYMBOLS.iter().find(|wanted| **wanted == name)
            {
                symbols.entry(wanted).or_insert(symbol.address());
            }
        }
        if !symbols.contains_key("v8dbg_off_fp_function") {
            return Err(V8Error::NotV8);
        }
        Ok(Arc::new(Binary {
            symbols,
            segments: elf::segments(&file),
            bytecode_sizes,
        }))
    }
}

/// The symbol of the bytecodes' lengths (Sparkplug's pc maps need them).
const BYTECODE_SIZES: &str = "_ZN2v88internal11interpreter9Bytecodes14kBytecodeSizesE";

/// One V8 process.
struct Node {
    layout: Layout,
    /// The binary's device and inode (to tell its mappings in this
    /// process, not to share what was read of it), and the file range of
    /// its builtins.
    binary: (u64, u64),
    blob_file: (u64, u64),
    /// Where the builtins are mapped now (the kernel tells the first
    /// `v8::MAX_BLOBS` apart: interpreted frames in others are recorded
    /// as builtins).
    blobs: Vec<(u64, u64)>,
    names: HashMap<u64, (Option<Arc<Named>>, u64, Instant)>,
    /// By `SharedFunctionInfo`, and the entries they hold in all.
    tables: HashMap<u64, CachedTable>,
    table_entries: usize,
    scripts: HashMap<u64, Arc<Vec<u32>>>,
    /// By `Code` object, and the table entries they hold in all.
    codes: HashMap<u64, compiled::CachedCode>,
    code_entries: usize,
    /// Code found from pcs in it.
    found: code_search::FoundCode,
    /// The bytecodes' lengths (`None`: not found; Sparkplug frames keep
    /// their first line).
    bytecode_sizes: Option<Arc<baseline::BytecodeSizes>>,
    /// Frames named lately, by recorded frame (its function and pc, or
    /// shared info and bytecode offset) and leafness, with the line
    /// sources their naming counted.
    recent: Recent<(u64, u64, bool), (Frame, [u8; LINE_SOURCES])>,
}

/// A function's bytecode position table (`Err`: none collected yet, or
/// none readable), the bytecode and table addresses it was read at, when
/// they were last checked.
type CachedTable = (Result<Arc<Table>, LineSource>, (u64, u64), Instant);

/// Where a JavaScript frame's line came from, counted for `record`'s
/// report: the running line, or the function's first line and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineSource {
    /// An interpreted frame at its running line.
    Interpreted,
    /// An interpreted frame whose function V8 had collected no source
    /// positions for (it does so lazily).
    NoPositions,
    /// An interpreted frame whose bytecode or position table could not be
    /// read (freed or moved by the collector, or not V8's).
    Unreadable,
    /// A compiled frame at its running line.
    Compiled,
    /// A frame of Sparkplug code whose pc could not be mapped (no
    /// bytecode lengths, or its tables unreadable or ending before it).
    CompiledBaseline,
    /// A frame whose pc is in no code found: not its function's current
    /// code, nor code found from the pc.
    CompiledOtherCode,
    /// A frame in code inlined from another function whose inlining could
    /// not be read (its frames are not expanded).
    CompiledInlined,
    /// A compiled frame whose code or table could not be read.
    CompiledUnreadable,
    /// A compiled frame of a V8 whose code layout the agent does not know.
    CompiledUnknown,
    /// A frame (interpreted or compiled) whose script has no line table
    /// the agent can read (no line ends made by V8, and a source it cannot
    /// read: an "uncached" external string, whose characters only the
    /// embedder's object knows): at its function's first line, or none.
    ScriptWithoutLines,
    /// A compiled frame at its running line, in code found from its pc:
    /// not its function's current code (on-stack replacement code, or
    /// replaced since), or any from V8 13 on (whose functions do not point
    /// at their code).
    CompiledFoundByPc,
    /// A frame of optimized code V8 kept no source positions for: from V8 13 on,
    /// Maglev code has them only while a profiler or debugger runs.
    CompiledNoPositions,
    /// An interpreted frame of a V8 newer than those whose lines were
    /// checked against `--cpu-prof`'s (V8 15 and later: V8 14 changed how
    /// its position tables are encoded, and a later V8 may again).
    NewerV8,
}

/// How many of each [`LineSource`].
pub const LINE_SOURCES: usize = 13;
static LINES: [AtomicU64; LINE_SOURCES] = [const { AtomicU64::new(0) }; LINE_SOURCES];

fn count(source: LineSource) {
    LINES[source as usize].fetch_add(1, Ordering::Relaxed);
}

/// Counts again what one naming counted (a reused frame).
fn recount(counted: &[u8; LINE_SOURCES]) {
    for (line, &n) in LINES.iter().zip(counted) {
        if n > 0 {
            line.fetch_add(u64::from(n), Ordering::Relaxed);
        }
    }
}

/// The frames named from each [`LineSource`] (by its index) since the
/// agent started.
pub fn line_counts() -> [u64; LINE_SOURCES] {
    std::array::from_fn(|at| LINES[at].load(Ordering::Relaxed))
}

/// The count of frames named from `source`.
pub fn line_count(counts: &[u64; LINE_SOURCES], source: LineSource) -> u64 {
    counts[source as usize]
}

/// What is known of a process.
enum State {
    Node(Box<Node>),
    NotYet(Instant),
    Unsupported,
}

/// The V8 processes seen (the attribution thread owns it).
pub struct V8 {
    code: RuntimeCode,
    processes: Registry<State, v8::Process>,
    /// Each node binary read, by what it is (not where it is mapped).
    binaries: ByFile<Arc<Binary>>,
}

impl V8 {
    /// With the kernel's map (none: nothing is registered, e.g. tests or a
    /// kernel without runtime walks) and where to publish the code ranges.
    pub fn new(map: Option<ProcessMap>, code: RuntimeCode) -> Self {
        V8 {
            code,
            processes: Registry::new(map, "its V8", |state| matches!(state, State::Node(_)))
                .read_by_the_whole_program(),
            binaries: ByFile::new(MAX_BINARIES),
        }
    }

    /// The binary `mapping` maps, read once per content (a NotV8 file
    /// is not remembered: only `node`-named files are tried).
    fn binary(&mut self, pid: u32, mapping: &Mapping) -> Result<Arc<Binary>, V8Error> {
        let unreadable = |err: crate::files::FileError| V8Error::Elf(err.to_string());
        self.binaries.read(pid, mapping, unreadable, Binary::read)
    }

    fn start(&mut self, pid: u32, mapping: &Mapping) -> Result<Node, V8Error> {
        let binary = self.binary(pid, mapping)?;
        let bias = elf::load_bias(&binary.segments, mapping)
            .ok_or_else(|| V8Error::Elf("no segment holds the mapping".into()))?;
        let memory = memory::Process(pid);
        let layout = Layout::read(&memory, &binary.symbols, bias)?;
        // The builtins' code: `v8_Default_embedded_blob_code_` itself, or
        // (V8 10 and older) the data it points to, named `…_data_`.
        let code = [
            "v8_Default_embedded_blob_code_data_",
            "v8_Default_embedded_blob_code_",
        ]
        .iter()
        .find_map(|name| binary.symbols.get(name));
        let blob_file = code
            .zip(binary.symbols.get("v8_Default_embedded_blob_code_size_"))
            .and_then(|(&code, &size)| {
                let size = memory.read_u32(size.wrapping_add(bias))?;
                let offset = file_offset(&binary.segments, code)?;
                Some((offset, offset + u64::from(size)))
            })
            .unwrap_or((0, 0));
        // Three scales of bytes, a few hundred bytecodes.
        let bytecode_sizes = binary
            .bytecode_sizes
            .filter(|&(_, size)| size <= 3 * 1024)
            .and_then(|(address, size)| memory.read_vec(address.wrapping_add(bias), size as usize))
            .and_then(|bytes| baseline::BytecodeSizes::new(&bytes))
            .map(Arc::new);
        Ok(Node {
            layout,
            binary: (mapping.dev, mapping.inode),
            blob_file,
            blobs: Vec::new(),
            names: HashMap::new(),
            tables: HashMap::new(),
            table_entries: 0,
            scripts: HashMap::new(),
            codes: HashMap::new(),
            code_entries: 0,
            found: Default::default(),
            bytecode_sizes,
            recent: Recent::default(),
        })
    }

    /// Tells the kernel and the unwind service about `node`'s code.
    fn register(&mut self, pid: u32, node: &Node) {
        self.processes
            .register(pid, node.layout.kernel_process(&node.blobs));
        self.code.set(pid, runtime::Runtime::V8, code_ranges(node));
    }
}

/// Where `node`'s code is, for the unwind service: any anonymous memory (its
/// JIT code) and its builtins' copies in files.
fn code_ranges(node: &Node) -> Vec<CodeRange> {
    let mut code = vec![CodeRange::anonymous(0, u64::MAX, tag::V8)];
    code.extend(
        node.blobs
            .iter()
            .map(|&(low, high)| CodeRange::in_files(low, high, tag::V8)),
    );
    code
}

/// The file offset of link-time address `address`.
fn file_offset(segments: &[(u64, u64, u64)], address: u64) -> Option<u64> {
    segments.iter().find_map(|&(offset, size, start)| {
        (start <= address && address < start + size).then(|| offset + (address - start))
    })
}

/// Where the builtins (file range `blob`) of binary `binary` are mapped.
fn blob_ranges(mappings: &[Arc<Mapping>], binary: (u64, u64), blob: (u64, u64)) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = mappings
        .iter()
        .filter(|mapping| (mapping.dev, mapping.inode) == binary && blob.0 < blob.1)
        .filter_map(|mapping| {
            let file_end = mapping.file_offset + (mapping.end - mapping.start);
            let low = blob.0.max(mapping.file_offset);
            let high = blob.1.min(file_end);
            (low < high).then(|| {
                let at = |offset: u64| mapping.start + (offset - mapping.file_offset);
                (at(low), at(high))
            })
        })
        .collect();
    ranges.sort_unstable();
    ranges
}

/// True for a binary that may hold V8: `node`, `nodejs`, `libnode.so.*`.
fn may_be_node(mapping: &Mapping) -> bool {
    let name = mapping.file_name();
    mapping.inode != 0 && (name.starts_with("node") || name.starts_with("libnode"))
}

impl Runtime for V8 {
    fn attach(&mut self, pid: u32, mappings: &[Arc<Mapping>]) -> bool {
        match self.processes.get_mut(pid) {
            Some(State::Unsupported) => return false,
            Some(State::NotYet(at)) if at.elapsed() < RECHECK_INTERVAL => return false,
            Some(State::Node(node)) => {
                // V8 maps a copy of its builtins next to its code space
                // once it starts: hand it to the walker too.
                let blobs = blob_ranges(mappings, node.binary, node.blob_file);
                if blobs == node.blobs {
                    return false;
                }
                node.blobs = blobs;
                let record = node.layout.kernel_process(&node.blobs);
                let code = code_ranges(node);
                self.processes.register(pid, record);
                self.code.set(pid, runtime::Runtime::V8, code);
                return true;
            }
            _ => {}
        }
        if !self.processes.has_map() {
            return false;
        }
        let Some(binary) = mappings.iter().find(|mapping| may_be_node(mapping)) else {
            self.processes.set(pid, State::NotYet(Instant::now()));
            return false;
        };
        let mut node = match self.start(pid, binary) {
            Ok(node) => node,
            Err(V8Error::NotV8) => {
                self.processes.set(pid, State::Unsupported);
                return false;
            }
            Err(err) => {
                crate::runtime::not_walked(pid, "JavaScript", err);
                self.processes.set(pid, State::Unsupported);
                return false;
            }
        };
        node.blobs = blob_ranges(mappings, node.binary, node.blob_file);
        let (major, minor, patch) = node.layout.version;
        tracing::debug!("pid {pid}: V8 {major}.{minor}.{patch}: its frames are walked");
        self.register(pid, &node);
        self.processes.set(pid, State::Node(Box::new(node)));
        true
    }

    fn add_frames(&mut self, pid: u32, stack: &runtime::Stack, frames: &mut Vec<Frame>) {
        let Some(State::Node(node)) = self.processes.get_mut(pid) else {
            return;
        };
        let memory = memory::Process(pid);
        super::replace_marks(tag::V8, stack, frames, |recorded, leaf| {
            node.named_frame(&memory, recorded, leaf)
        });
    }

    fn pids(&self) -> Vec<u32> {
        self.processes.pids()
    }

    fn forget(&mut self, pid: u32) {
        self.processes.forget(pid);
        self.code.set(pid, runtime::Runtime::V8, Vec::new());
    }
}

impl Node {
    /// The frame of `recorded` (`leaf`: where the CPU was), named once per
    /// [`super::recent::REUSE`] (naming one reads the process's memory a few
    /// times), its line sources counted again at each reuse.
    fn named_frame(&mut self, memory: &impl Memory, recorded: runtime::Frame, leaf: bool) -> Frame {
        let key = (recorded.code, recorded.instr, leaf);
        if let Some((frame, counted)) = self.recent.get(&key) {
            recount(counted);
            return frame.clone();
        }
        let before = line_counts();
        let frame = self.frame(memory, recorded, leaf);
        let after = line_counts();
        let counted = std::array::from_fn(|at| (after[at] - before[at]).min(255) as u8);
        self.recent.insert(key, (frame.clone(), counted));
        frame
    }

    /// The frame of `recorded` (`leaf`: where the CPU was), named.
    fn frame(&mut self, memory: &impl Memory, recorded: runtime::Frame, leaf: bool) -> Frame {
        let address = recorded.code & tag::ADDRESS_MASK;
        let kind = tag::of(recorded.code) & !tag::RUNTIME_MASK;
        // A compiled frame is its `JSFunction`; others their shared info.
        let compiled = kind == v8::kind::COMPILED || kind == v8::kind::COMPILED_CALL;
        let shared = if compiled {
            self.shared_of(memory, address)
        } else {
            Some(address)
        };
        let named = shared.and_then(|shared| self.name(memory, shared));
        let start = named
            .as_deref()
            .and_then(|named| self.line(memory, named.script, named.start?))
            .unwrap_or(0);
        let mut inlined = Vec::new();
        let line = match (named.as_deref(), shared) {
            (Some(named), Some(shared)) if kind == v8::kind::INTERPRETED => self
                .running_line(memory, shared, named.script, recorded.instr)
                .unwrap_or(start),
            // Stopped in a frameless builtin: `instr` is the return
            // address into the frame's code, looked up as a caller's.
            (Some(named), Some(shared)) if compiled => self
                .compiled_line(
                    memory,
                    address,
                    shared,
                    named.script,
                    recorded.instr,
                    leaf && kind == v8::kind::COMPILED,
                )
                .map_or(start, |lines| {
                    inlined = lines.inlined;
                    lines.line.unwrap_or(start)
                }),
            _ => start,
        };
        inlined.push(javascript_line(named.as_deref(), line, start));
        let mut frame = javascript_frame(recorded, inlined);
        if let Some(shared) = shared {
            frame.address = shared;
        }
        frame
    }

    /// The name of the function whose `SharedFunctionInfo` is at `shared`,
    /// cached, and checked again now and then: the collector moves and
    /// frees these objects.
    fn name(&mut self, memory: &impl Memory, shared: u64) -> Option<Arc<Named>> {
        let token = || memory.read_u64(shared + self.layout.shared_name);
        if let Some((named, seen, at)) = self.names.get_mut(&shared) {
            if at.elapsed() < NAME_CHECK_INTERVAL {
                return named.clone();
            }
            if token() == Some(*seen) {
                *at = Instant::now();
                return named.clone();
            }
        }
        let heap = Heap {
            memory,
            layout: &self.layout,
        };
        let named = heap.name(shared).map(Arc::new);
        if self.names.len() >= MAX_NAMES {
            self.names.clear();
        }
        self.names.insert(
            shared,
            (named.clone(), token().unwrap_or(0), Instant::now()),
        );
        named
    }

    /// The line of `script` holding source position `position`.
    fn line(&mut self, memory: &impl Memory, script: u64, position: u32) -> Option<u32> {
        if script == 0 {
            return None;
        }
        let ends = match self.scripts.get(&script) {
            Some(ends) => ends.clone(),
            None => {
                let heap = Heap {
                    memory,
                    layout: &self.layout,
                };
                let ends = Arc::new(heap.line_ends(script).unwrap_or_default());
                if self.scripts.len() >= MAX_SCRIPTS {
                    self.scripts.clear();
                }
                self.scripts.insert(script, ends.clone());
                ends
            }
        };
        (!ends.is_empty()).then(|| names::line_at(&ends, position))
    }

    /// The line an interpreted frame of the function at `shared` (in
    /// `script`) was running, at `slot`, the frame's bytecode offset slot
    /// (V8 keeps the offset from the tagged `BytecodeArray`, header
    /// included); `None` when V8 has no source positions for it (counted).
    fn running_line(
        &mut self,
        memory: &impl Memory,
        shared: u64,
        script: u64,
        slot: u64,
    ) -> Option<u32> {
        if !self.layout.lines_checked() {
            count(LineSource::NewerV8);
            return None;
        }
        let offset = (slot as i64).checked_sub(self.layout.bytecode_data as i64 - 1)?;
        let table = match self.table(memory, shared) {
            Ok(table) => table,
            Err(why) => {
                count(why);
                return None;
            }
        };
        let position = table.script_offset_at(offset)?;
        let Some(line) = self.line(memory, script, position) else {
            count(LineSource::ScriptWithoutLines);
            return None;
        };
        count(LineSource::Interpreted);
        Some(line)
    }

    /// The position table of the bytecode of the function at `shared`,
    /// cached, and checked again now and then (the collector moves
    /// objects, V8 flushes old bytecode and collects positions lazily):
    /// read again when the bytecode's or the table's address changed.
    pub(super) fn table(
        &mut self,
        memory: &impl Memory,
        shared: u64,
    ) -> Result<Arc<Table>, LineSource> {
        let heap = Heap {
            memory,
            layout: &self.layout,
        };
        let token = || -> (u64, u64) {
            let bytecode = heap.bytecode_array(shared).unwrap_or(0);
            let table = heap
                .word(bytecode.wrapping_add(self.layout.bytecode_positions))
                .filter(|_| bytecode != 0)
                .unwrap_or(0);
            (bytecode, table)
        };
        if let Some((table, seen, at)) = self.tables.get_mut(&shared) {
            if at.elapsed() < NAME_CHECK_INTERVAL {
                return table.clone();
            }
            if token() == *seen {
                *at = Instant::now();
                return table.clone();
            }
        }
        let seen = token();
        let found = match seen.0 {
            0 => Found::Unreadable,
            bytecode => heap.position_table(bytecode),
        };
        let table = match found {
            Found::Table(bytes) => Ok(Arc::new(Table::decode(&bytes, self.layout.encoding()))),
            Found::Absent => Err(LineSource::NoPositions),
            Found::Unreadable => Err(LineSource::Unreadable),
        };
        let entries = table.as_ref().map_or(0, |table| table.len());
        if self.tables.len() >= MAX_TABLES || self.table_entries + entries > MAX_TABLE_ENTRIES {
            self.tables.clear();
            self.table_entries = 0;
        }
        let replaced = self
            .tables
            .insert(shared, (table.clone(), seen, Instant::now()));
        let replaced = replaced
            .and_then(|(old, _, _)| old.ok())
            .map_or(0, |old| old.len());
        self.table_entries = self.table_entries + entries - replaced;
        table
    }
}

/// The line of a JavaScript frame at `line` of a function whose
/// definition starts on `start_line`.
fn javascript_line(named: Option<&Named>, line: u32, start_line: u32) -> Line {
    match named {
        Some(named) => Line {
            system_name: named.function.as_str().into(),
            function: named.function.as_str().into(),
            file: named.file.as_deref().map(Arc::from),
            line,
            column: 0,
            start_line,
        },
        None => Line::named(UNNAMED.into(), UNNAMED.into()),
    }
}

/// The frame of a recorded JavaScript frame running `lines` (innermost
/// first: the functions its code inlined, then its own).
fn javascript_frame(recorded: runtime::Frame, lines: Vec<Line>) -> Frame {
    Frame {
        kind: FrameKind::JavaScript,
        address: recorded.code & tag::ADDRESS_MASK,
        mapping: None,
        file_offset: recorded.instr,
        lines: lines.into(),
    }
}
