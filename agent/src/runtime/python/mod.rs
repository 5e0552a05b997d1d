//! CPython: finds the interpreter in a process, tells the kernel sampler
//! where its structures are, names the interpreter frames it recorded and
//! puts them in place of the evaluation loop's native frames.
//!
//! - `layout`: per-version offsets (3.11, 3.12 measured; 3.13+ from
//!   `_Py_DebugOffsets`);
//! - `code`: code objects read from the process; `lines`: their location
//!   tables, decoded once; `cache`: them by address, within a byte budget;
//! - `limits`: the caps on what is read of a process, and what was refused;
//! - `legacy`: 3.8 to 3.10 (frame objects, older line tables);
//! - `threads`: each process's thread states, in the kernel's thread map.
//!
//! A process is Python when one of its executable mappings named like
//! `python3.X` or `libpython3.X.so` defines `_PyRuntime`; the version comes
//! from `Py_Version` in its memory (3.11+), else from the file's name.
mod cache;
pub mod code;
pub mod eval;
pub mod layout;
mod legacy;
pub mod limits;
pub mod lines;
mod threads;

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use hostprof_common::python::{self as py, FRAME_ENTRY};

pub use code::Code;
pub use layout::{CodeLayout, Layout};
pub use limits::{Refusals, refusals};
pub use lines::{Lines, line_at};
pub use threads::ThreadMap;

use crate::{
    files::{FileData, FileError},
    model::{CodeRange, Frame, FrameKind, Line, Mapping},
    procs::memory,
    runtime::{
        Registry, RuntimeCode,
        elf::{self, ByFile},
    },
};
use cache::CodeCache;
use hostprof_common::runtime::{Runtime, mark};
use hostprof_unwind::stack_mark as marked_as;
use layout::DebugOffsetsError;
use limits::Refusal;

/// The kernel map of Python processes.
pub type ProcessMap = BpfHashMap<MapData, u32, py::Process>;

/// What the agent knows of one Python process.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// `3.X`.
    pub minor: u8,
    pub layout: Layout,
    /// Where the evaluation loop is in the process (`eval`): the kernel
    /// marks its native frames, which stand for the interpreter frames
    /// they ran.
    pub eval: Vec<(u64, u64)>,
    /// Address of `PyCode_Type`: code objects are checked by their type.
    pub code_type: u64,
}

impl crate::runtime::Runtime for Python {
    /// Registers a Python process; found just now, its mappings load
    /// again, with its evaluation loop marked.
    fn attach(&mut self, pid: u32, mappings: &[Arc<Mapping>]) -> bool {
        let known = matches!(self.processes.get(pid), Some(Ok(_)));
        self.interpreter(pid, mappings.iter()).is_some() && !known
    }

    /// Puts each call of the evaluation loop's interpreter frames in place
    /// of its native frame.
    fn add_frames(&mut self, pid: u32, stack: &py::Stack, frames: &mut Vec<Frame>) {
        let Some(Ok(interpreter)) = self.processes.get(pid).cloned() else {
            return;
        };
        // A thread older than the kernel's search reaches: its state goes
        // into the thread map, for the thread's next samples.
        if stack.reason == py::reason::THREAD_LIMIT {
            self.threads.refresh(pid, &interpreter.layout.kernel);
        }
        let groups = self.frames(pid, &interpreter, stack);
        merge(frames, groups);
    }

    fn pids(&self) -> Vec<u32> {
        self.processes.pids()
    }

    fn retain(&mut self, alive: &mut dyn FnMut(u32) -> bool) {
        Python::retain(self, alive);
    }

    fn forget(&mut self, pid: u32) {
        Python::retain(self, |other| other != pid);
    }
}

/// Symbols of a Python binary, as link-time addresses.
#[derive(Clone, Debug)]
struct PythonElf {
    runtime: u64,
    /// `Py_Version` (3.11+).
    version: Option<u64>,
    code_type: u64,
    /// The evaluation loop's ranges: its symbols' and its parts'.
    eval: Vec<(u64, u64)>,
    /// (file offset, size, address) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
}

/// How often a process found without Python is looked at again.
const RECHECK_INTERVAL: Duration = Duration::from_millis(250);

/// Python binaries remembered, by what they are (see [`elf::FileKey`]),
/// before the cache starts over: a replaced binary is a new entry, so
/// upgrades must not make the cache grow without end.
const MAX_FILES: usize = 256;

/// Python processes and their code objects (the pipeline's attribution
/// thread owns one).
pub struct Python {
    /// pid -> its interpreter, or when it was found to have none; those
    /// with one are in the kernel's map.
    processes: Registry<Result<Arc<Interpreter>, Instant>, py::Process>,
    threads: threads::Threads,
    /// Each Python binary read -> its symbols, if it is one.
    files: ByFile<Option<Arc<PythonElf>>>,
    /// Processes whose `_Py_DebugOffsets` were refused: not looked at again.
    refused: HashSet<u32>,
    codes: CodeCache,
    /// Where each process's evaluation loop is, for the unwind service.
    code: RuntimeCode,
}

impl Python {
    /// With the kernel's maps: processes found are registered for walking,
    /// with their threads, and their evaluation loops published in `code`.
    pub fn new(map: Option<ProcessMap>, threads: Option<ThreadMap>, code: RuntimeCode) -> Self {
        Python {
            processes: Registry::new(map, "its Python interpreter", Result::is_ok)
                .marks_present(hostprof_common::present::PYTHON),
            threads: threads::Threads::new(threads),
            files: ByFile::new(MAX_FILES),
            refused: HashSet::new(),
            codes: CodeCache::default(),
            code,
        }
    }

    /// The interpreter of `pid`, looked for the first time it is asked
    /// (in its executable `mappings`), and registered in the kernel.
    pub fn interpreter<'a>(
        &mut self,
        pid: u32,
        mappings: impl Iterator<Item = &'a Arc<Mapping>>,
    ) -> Option<Arc<Interpreter>> {
        match self.processes.get(pid) {
            Some(Ok(interpreter)) => return Some(interpreter.clone()),
            // Looked again now and then: the process may exec Python since
            // (`record -- python3 …` is sampled before its exec).
            Some(Err(at)) if at.elapsed() < RECHECK_INTERVAL => return None,
            _ if self.refused.contains(&pid) => return None,
            _ => {}
        }
        let found = match self.find(pid, mappings) {
            Ok(found) => found.map(Arc::new),
            Err(refusal) => {
                limits::refused(pid, &refusal);
                self.refused.insert(pid);
                None
            }
        };
        self.processes
            .set(pid, found.clone().ok_or_else(Instant::now));
        if let Some(interpreter) = &found
            && self.processes.register(pid, interpreter.layout.kernel)
        {
            crate::runtime::want_python_walk();
            self.threads.refresh(pid, &interpreter.layout.kernel);
            let eval = interpreter.eval.iter();
            self.code.set(
                pid,
                Runtime::Cpython,
                eval.map(|&(low, high)| CodeRange::marked(low, high, mark::CPYTHON))
                    .collect(),
            );
        }
        found
    }

    /// Forgets processes for which `alive` is false.
    pub fn retain(&mut self, alive: impl FnMut(u32) -> bool) {
        let gone: HashSet<u32> = self.processes.gone(alive).into_iter().collect();
        if gone.is_empty() {
            return;
        }
        for &pid in &gone {
            self.processes.forget(pid);
            self.threads.forget(pid);
            self.refused.remove(&pid);
            self.codes.forget(pid);
            self.code.set(pid, Runtime::Cpython, Vec::new());
        }
    }

    /// The interpreter in the first Python binary among `mappings`; `Err`
    /// when its offsets were refused.
    fn find<'a>(
        &mut self,
        pid: u32,
        mappings: impl Iterator<Item = &'a Arc<Mapping>>,
    ) -> Result<Option<Interpreter>, Refusal> {
        for mapping in mappings {
            let name = mapping.file_name();
            if !(name.starts_with("libpython3") || name.starts_with("python3")) {
                continue;
            }
            let unreadable = |err: FileError| {
                tracing::debug!("pid {pid}: cannot read {}: {err}", mapping.path);
            };
            let elf = self.files.read(pid, mapping, unreadable, |data| {
                Ok(read_elf(pid, mapping, data).map(Arc::new))
            });
            let Ok(Some(elf)) = elf else { continue };
            let Some(bias) = elf::load_bias(&elf.segments, mapping) else {
                continue;
            };
            return interpreter_at(pid, &elf, named_minor(mapping), bias);
        }
        Ok(None)
    }

    /// The named interpreter frames of a sample, innermost first, in
    /// groups: one per call of the evaluation loop, innermost call first.
    pub fn frames(
        &mut self,
        pid: u32,
        interpreter: &Interpreter,
        stack: &py::Stack,
    ) -> Vec<Vec<Frame>> {
        let len = (stack.len as usize).min(stack.frames.len());
        let mut groups = vec![Vec::new()];
        for raw in &stack.frames[..len] {
            let address = raw.code & !FRAME_ENTRY;
            if let Some(code) = self.code(pid, interpreter, address) {
                let line = line_of(&code, &interpreter.layout.code, address, raw.instr);
                groups.last_mut().expect("never empty").push(Frame {
                    kind: FrameKind::Python,
                    address: 0,
                    mapping: None,
                    file_offset: 0,
                    lines: Arc::new([Line {
                        function: code.qualname.clone(),
                        system_name: code.qualname.clone(),
                        file: Some(code.filename.clone()),
                        line,
                        column: 0,
                        start_line: code.first_line,
                    }]),
                });
            }
            if raw.code & FRAME_ENTRY != 0 {
                groups.push(Vec::new());
            }
        }
        groups.retain(|group| !group.is_empty());
        groups
    }

    /// The code object at `address`, read once per process and address
    /// while its type, name and file pointers stay the same.
    fn code(&mut self, pid: u32, interpreter: &Interpreter, address: u64) -> Option<Arc<Code>> {
        let layout = &interpreter.layout.code;
        let process = memory::Process(pid);
        let fingerprint = Code::fingerprint(&process, address, layout)?;
        if let Some(code) = self.codes.get(pid, address, fingerprint) {
            return code;
        }
        let code = match Code::read(&process, address, interpreter.code_type, layout) {
            Ok(code) => code.map(Arc::new),
            Err(refusal) => {
                limits::refused(pid, &refusal);
                None
            }
        };
        self.codes.insert(pid, address, fingerprint, code.clone());
        code
    }
}

/// Replaces each native frame of the evaluation loop in `frames` (leaf
/// first), which the kernel marked ([`mark::CPYTHON`]), by the interpreter
/// frames that call ran (`groups`, innermost call first); groups left over
/// (the native unwind ended before their call, or the process's mappings
/// were loaded before its interpreter was found) go below the last frame.
pub fn merge(frames: &mut Vec<Frame>, groups: Vec<Vec<Frame>>) {
    if groups.is_empty() {
        return;
    }
    let mut groups = groups.into_iter().peekable();
    let mut merged = Vec::with_capacity(frames.len() + 16);
    for frame in frames.drain(..) {
        let marked = frame.kind == FrameKind::Native && marked_as(frame.address) == mark::CPYTHON;
        match groups.next_if(|_| marked) {
            Some(group) => merged.extend(group),
            None => merged.push(frame),
        }
    }
    merged.extend(groups.flatten());
    *frames = merged;
}

/// The line of the instruction `instr` (as the kernel read it) of the code
/// object `code` at `address`.
fn line_of(code: &Code, layout: &CodeLayout, address: u64, instr: u64) -> u32 {
    match layout.line_table {
        layout::LineTable::Locations => {
            let bytecode = address.saturating_add(layout.code_adaptive);
            code.line_at(instr.saturating_sub(bytecode))
        }
        table => legacy::lasti_offset(table, instr)
            .map_or(code.first_line, |offset| code.line_at(offset)),
    }
}

/// A Python binary's symbols, from `data`, the file `mapping` of `pid`
/// maps (code is read from it); `None` when it has no `_PyRuntime`.
fn read_elf(pid: u32, mapping: &Mapping, data: &FileData) -> Option<PythonElf> {
    use object::{Object, ObjectSymbol};
    let file = object::File::parse(&**data).ok()?;
    let (mut runtime, mut version, mut code_type) = (None, None, None);
    let mut eval = Vec::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        match symbol.name() {
            Ok("_PyRuntime") => runtime = Some(symbol.address()),
            Ok("Py_Version") => version = Some(symbol.address()),
            Ok("PyCode_Type") => code_type = Some(symbol.address()),
            Ok(name)
                if name == "_PyEval_EvalFrameDefault"
                    || name.starts_with("_PyEval_EvalFrameDefault.") =>
            {
                let end = symbol.address().saturating_add(symbol.size().max(1));
                let range = (symbol.address(), end);
                if !eval.contains(&range) {
                    eval.push(range);
                }
            }
            _ => {}
        }
    }
    let functions = function_ranges(&file);
    let isa = match file.architecture() {
        object::Architecture::X86_64 => Some(eval::Isa::X86_64),
        object::Architecture::Aarch64 => Some(eval::Isa::Aarch64),
        _ => None,
    };
    if let Some(isa) = isa
        && let Ok(opened) = elf::open(pid, mapping)
    {
        let found = eval::loop_ranges(isa, &eval, &functions, |start, end| {
            elf::code_at(&file, &opened, start, end)
        });
        if found.capped {
            limits::refused(
                pid,
                &Refusal::LoopCapped {
                    path: mapping.path.to_string(),
                    parts: found.ranges.len(),
                    decoded: found.decoded,
                },
            );
        }
        eval = found.ranges;
    }
    let segments = elf::segments(&file);
    Some(PythonElf {
        runtime: runtime?,
        version,
        code_type: code_type?,
        eval,
        segments,
    })
}

/// The `X` of the mapped file's name (`python3.X`, `libpython3.X.so`):
/// the mapping's, not the file's (whose bytes may be shared by another
/// name).
fn named_minor(mapping: &Mapping) -> Option<u8> {
    mapping
        .file_name()
        .split_once("python3.")
        .and_then(|(_, rest)| {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            rest[..digits].parse().ok()
        })
}

/// Every function's range by the file's `.eh_frame`, sorted.
fn function_ranges(file: &object::File) -> Vec<(u64, u64)> {
    use gimli::UnwindSection;
    use object::{Object, ObjectSection};
    let Some(section) = file.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(data) = section.data() else {
        return Vec::new();
    };
    let eh_frame = gimli::EhFrame::new(data, gimli::LittleEndian);
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let mut ranges = Vec::new();
    let mut entries = eh_frame.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry
            && let Ok(fde) =
                partial.parse(|section, bases, offset| section.cie_from_offset(bases, offset))
        {
            let end = fde.initial_address().saturating_add(fde.len());
            ranges.push((fde.initial_address(), end));
        }
    }
    ranges.sort_unstable();
    ranges
}

/// The interpreter of a process whose Python binary is loaded at `bias`
/// (`named_minor`: its name's version, for one without `Py_Version`);
/// `Err` when its `_Py_DebugOffsets` are out of range.
fn interpreter_at(
    pid: u32,
    elf: &PythonElf,
    named_minor: Option<u8>,
    bias: u64,
) -> Result<Option<Interpreter>, Refusal> {
    let runtime = elf.runtime.wrapping_add(bias);
    let (major, minor) = match elf.version {
        Some(version) => {
            let Some(version) = memory::read_u32(pid, version.wrapping_add(bias)) else {
                return Ok(None);
            };
            (version >> 24, ((version >> 16) & 0xff) as u8)
        }
        None => match named_minor {
            Some(minor) => (3, minor),
            None => return Ok(None),
        },
    };
    if major != 3 || minor < 8 {
        crate::runtime::not_walked(
            pid,
            "Python",
            format_args!("Python {major}.{minor} is not supported (3.8 and later are)"),
        );
        return Ok(None);
    }
    let layout = match layout::fixed(minor) {
        Some(layout) => Ok(layout),
        None => memory::read_vec(pid, runtime, layout::DEBUG_OFFSETS_BYTES)
            .map_or(Err(DebugOffsetsError::Unknown), |blob| {
                layout::from_debug_offsets(minor, &blob)
            }),
    };
    let mut layout = match layout {
        Ok(layout) => layout,
        Err(DebugOffsetsError::Refused(refusal)) => return Err(refusal),
        Err(DebugOffsetsError::Unknown) => {
            crate::runtime::not_walked(
                pid,
                "Python",
                format_args!("Python 3.{minor} has no layout hostprof knows (3.8 to 3.14 are)"),
            );
            return Ok(None);
        }
    };
    let Some((dev, ino)) = pid_namespace(pid) else {
        return Ok(None);
    };
    layout.kernel.runtime = runtime;
    if layout.kernel.thread_native_id == py::ABSENT {
        let Some(offset) = legacy::find_pthread_tid(pid, &layout.kernel) else {
            crate::runtime::not_walked(
                pid,
                "Python",
                format_args!(
                    "Python 3.{minor}: cannot tell its threads apart (no thread id found in its C \
                     library's thread structures)"
                ),
            );
            return Ok(None);
        };
        layout.kernel.pthread_tid = offset;
    }
    layout.kernel.pidns_dev = dev;
    layout.kernel.pidns_ino = ino;
    tracing::debug!(
        "pid {pid}: Python 3.{minor}, _PyRuntime at {runtime:#x}, its evaluation loop in {:#x?}",
        elf.eval
    );
    Ok(Some(Interpreter {
        minor,
        layout,
        eval: elf
            .eval
            .iter()
            .map(|&(start, end)| (start.wrapping_add(bias), end.wrapping_add(bias)))
            .collect(),
        code_type: elf.code_type.wrapping_add(bias),
    }))
}

/// Device (in the kernel's own encoding, which `bpf_get_ns_current_pid_tgid`
/// compares) and inode of the pid namespace of `pid`.
fn pid_namespace(pid: u32) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    let dev = meta.dev();
    let kernel_dev = (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev));
    Some((kernel_dev, meta.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(address: u64) -> Frame {
        Frame {
            kind: FrameKind::Native,
            address,
            mapping: None,
            file_offset: 0,
            lines: crate::model::no_lines(),
        }
    }

    fn python(name: &str) -> Frame {
        let name: Arc<str> = name.into();
        Frame {
            kind: FrameKind::Python,
            address: 0,
            mapping: None,
            file_offset: 0,
            lines: vec![Line::named(name.clone(), name)].into(),
        }
    }

    fn names(frames: &[Frame]) -> Vec<String> {
        frames
            .iter()
            .map(|frame| match frame.lines.first() {
                Some(line) => line.function.to_string(),
                None => format!("{:#x}", frame.address),
            })
            .collect()
    }

    /// A native frame the kernel marked as the evaluation loop's.
    fn marked(address: u64) -> Frame {
        native(address | (u64::from(mark::CPYTHON) << hostprof_unwind::STACK_MARK_SHIFT))
    }

    #[test]
    fn each_marked_loop_frame_gives_way_to_its_calls_frames() {
        // Leaf first: a C function called from Python, the loop, sorted()
        // (C), the loop again (the key callback's caller), main.
        let mut frames = vec![
            native(0x5000),
            marked(0x1100),
            native(0x6000),
            marked(0x1200),
            native(0x7000),
        ];
        let groups = vec![
            vec![python("hot_path"), python("by_key")],
            vec![python("stage"), python("run"), python("<module>")],
        ];
        merge(&mut frames, groups);
        assert_eq!(
            names(&frames),
            [
                "0x5000", "hot_path", "by_key", "0x6000", "stage", "run", "<module>", "0x7000"
            ]
        );

        // A native stack cut short: what is left goes below it.
        let mut frames = vec![marked(0x1100), native(0x6000)];
        let groups = vec![vec![python("hot_path")], vec![python("<module>")]];
        merge(&mut frames, groups);
        assert_eq!(names(&frames), ["hot_path", "0x6000", "<module>"]);

        // A mark of another runtime, or none: frames stay, groups go below.
        let other = native(0x1100 | (2 << hostprof_unwind::STACK_MARK_SHIFT));
        let mut frames = vec![other.clone(), native(0x1200)];
        merge(&mut frames, vec![vec![python("<module>")]]);
        assert_eq!(frames.len(), 3);
        assert_eq!(frames[0].address, other.address);
        assert_eq!(names(&frames[2..]), ["<module>"]);
    }
}
