//! CPython: finds the interpreter in a process, tells the kernel sampler
//! where its structures are, names the interpreter frames it recorded and
//! puts them in place of the evaluation loop's native frames.
//!
//! - `layout`: per-version offsets (3.11, 3.12 measured; 3.13+ from
//!   `_Py_DebugOffsets`);
//! - `code`: code objects read from the process, lines from location tables;
//!
//! A process is Python when one of its executable mappings named like
//! `python3.X` or `libpython3.X.so` defines `_PyRuntime`; the version comes
//! from `Py_Version` in its memory.
mod code;
mod layout;

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use hostprof_common::python::{self as py, FRAME_ENTRY};

pub use code::{Code, line_at};
pub use layout::{CodeLayout, Layout};

use crate::{
    model::{Frame, FrameKind, Line, Mapping},
    runtime::{elf, memory},
};

/// The kernel map of Python processes.
pub type ProcessMap = BpfHashMap<MapData, u32, py::Process>;

/// What the agent knows of one Python process.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// `3.X`.
    pub minor: u8,
    pub layout: Layout,
    /// Where `_PyEval_EvalFrameDefault` is in the process: its native
    /// frames stand for the interpreter frames they ran.
    pub eval: Vec<(u64, u64)>,
    /// Address of `PyCode_Type`: code objects are checked by their type.
    pub code_type: u64,
    /// Function ranges of the binary (link-time addresses) and its load bias.
    functions: Arc<Vec<(u64, u64)>>,
    bias: u64,
}

impl Interpreter {
    fn is_eval(&self, address: u64) -> bool {
        self.eval
            .iter()
            .any(|&(start, end)| (start..end).contains(&address))
    }
}

impl crate::runtime::Runtime for Python {
    /// Registers a Python process; its mappings need no reload (the walk
    /// starts from `_PyRuntime`, not from code the unwinder meets).
    fn attach(&mut self, pid: u32, mappings: &[Arc<Mapping>]) -> bool {
        self.interpreter(pid, mappings.iter());
        false
    }

    /// Puts each call of the evaluation loop's interpreter frames in place
    /// of its native frame.
    fn add_frames(&mut self, pid: u32, stack: &py::Stack, frames: &mut Vec<Frame>) {
        let Some(Ok(interpreter)) = self.processes.get(&pid).cloned() else {
            return;
        };
        let groups = self.frames(pid, &interpreter, stack);
        self.merge(pid, &interpreter, frames, groups);
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
    version: u64,
    code_type: u64,
    eval: Vec<(u64, u64)>,
    /// (file offset, size, address) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
    /// Every function's range by `.eh_frame`, sorted: a frame found to be the
    /// loop's by its call gives the range of the part it is in.
    functions: Arc<Vec<(u64, u64)>>,
}

type CachedCode = (Arc<Code>, [u8; 8]);

/// How often a process found without Python is looked at again.
const RECHECK_INTERVAL: Duration = Duration::from_millis(250);

/// Code objects cached before starting over.
const MAX_CODES: usize = 1 << 16;

/// Python processes and their code objects (the pipeline's attribution
/// thread owns one).
#[derive(Default)]
pub struct Python {
    map: Option<ProcessMap>,
    /// pid -> its interpreter, or when it was found to have none.
    processes: HashMap<u32, Result<Arc<Interpreter>, Instant>>,
    files: HashMap<(u64, u64), Option<Arc<PythonElf>>>,
    /// (pid, address) -> the code object there and its fingerprint.
    codes: HashMap<(u32, u64), Option<CachedCode>>,
    /// (pid, return address) -> whether the call before it is to the loop.
    calls: HashMap<(u32, u64), bool>,
    /// pid -> parts of the loop found outside its symbol's range.
    learned: HashMap<u32, Vec<(u64, u64)>>,
}

impl Python {
    /// With the kernel's map: processes found are registered for walking.
    pub fn new(map: Option<ProcessMap>) -> Self {
        Python {
            map,
            ..Default::default()
        }
    }

    /// The interpreter of `pid`, looked for the first time it is asked
    /// (in its executable `mappings`), and registered in the kernel.
    pub fn interpreter<'a>(
        &mut self,
        pid: u32,
        mappings: impl Iterator<Item = &'a Arc<Mapping>>,
    ) -> Option<Arc<Interpreter>> {
        match self.processes.get(&pid) {
            Some(Ok(interpreter)) => return Some(interpreter.clone()),
            // Looked again now and then: the process may exec Python since
            // (`record -- python3 …` is sampled before its exec).
            Some(Err(at)) if at.elapsed() < RECHECK_INTERVAL => return None,
            _ => {}
        }
        let found = self.find(pid, mappings).map(Arc::new);
        if let (Some(interpreter), Some(map)) = (&found, &mut self.map)
            && let Err(err) = register(map, pid, interpreter)
        {
            tracing::info!("pid {pid}: cannot register its Python interpreter: {err}");
        }
        self.processes
            .insert(pid, found.clone().ok_or_else(Instant::now));
        found
    }

    /// Forgets processes for which `alive` is false.
    pub fn retain(&mut self, alive: impl FnMut(u32) -> bool) {
        for pid in crate::runtime::gone(&self.processes, alive) {
            if let (Some(Ok(_)), Some(map)) = (self.processes.remove(&pid), &mut self.map) {
                let _ = map.remove(&pid);
            }
            self.codes.retain(|&(owner, _), _| owner != pid);
            self.calls.retain(|&(owner, _), _| owner != pid);
            self.learned.remove(&pid);
        }
    }

    fn find<'a>(
        &mut self,
        pid: u32,
        mappings: impl Iterator<Item = &'a Arc<Mapping>>,
    ) -> Option<Interpreter> {
        for mapping in mappings {
            let name = mapping.file_name();
            if !(name.starts_with("libpython3") || name.starts_with("python3")) {
                continue;
            }
            let key = (mapping.dev, mapping.inode);
            let elf = match self.files.get(&key) {
                Some(elf) => elf.clone(),
                None => {
                    let elf = read_elf(pid, mapping).map(Arc::new);
                    self.files.insert(key, elf.clone());
                    elf
                }
            };
            let Some(elf) = elf else { continue };
            let Some(bias) = elf::load_bias(&elf.segments, mapping) else {
                continue;
            };
            return interpreter_at(pid, &elf, bias);
        }
        None
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
                let offset = raw
                    .instr
                    .saturating_sub(address + interpreter.layout.code.code_adaptive);
                let line = code.line_at(offset);
                groups.last_mut().expect("never empty").push(Frame {
                    kind: FrameKind::Python,
                    address: 0,
                    mapping: None,
                    file_offset: 0,
                    lines: vec![Line {
                        function: code.qualname.clone(),
                        system_name: code.qualname.clone(),
                        file: Some(code.filename.clone()),
                        line,
                        column: 0,
                        start_line: code.first_line,
                    }],
                });
            }
            if raw.code & FRAME_ENTRY != 0 {
                groups.push(Vec::new());
            }
        }
        groups.retain(|group| !group.is_empty());
        groups
    }

    /// Replaces each native frame of the evaluation loop in `frames` (leaf
    /// first) by the interpreter frames that call ran; groups left over
    /// (the native unwind ended early) go below the last frame.
    ///
    /// A frame is the loop's when its address is in `_PyEval_EvalFrameDefault`
    /// or its caller's return address follows a call to it: compilers split
    /// the loop's body out of the symbol's range (Debian's 3.14).
    pub fn merge(
        &mut self,
        pid: u32,
        interpreter: &Interpreter,
        frames: &mut Vec<Frame>,
        groups: Vec<Vec<Frame>>,
    ) {
        if groups.is_empty() {
            return;
        }
        let eval: Vec<bool> = (0..frames.len())
            .map(|index| {
                let frame = &frames[index];
                frame.kind == FrameKind::Native
                    && (self.is_eval(pid, interpreter, frame.address)
                        || frames.get(index + 1).is_some_and(|caller| {
                            caller.kind == FrameKind::Native
                                && self.calls_eval(pid, interpreter, caller.address)
                        }))
            })
            .collect();
        self.learn_eval(pid, interpreter, frames, &eval);
        let mut groups = groups.into_iter().peekable();
        let mut merged = Vec::with_capacity(frames.len() + 16);
        for (frame, eval) in frames.drain(..).zip(eval) {
            match (eval, groups.next_if(|_| eval)) {
                (true, Some(group)) => merged.extend(group),
                _ => merged.push(frame),
            }
        }
        merged.extend(groups.flatten());
        *frames = merged;
    }

    /// Remembers the function part of each loop frame found by its call
    /// (outside the symbol's range), so the next samples know it by address:
    /// a loop frame called by a tail call has no call before it to see.
    fn learn_eval(&mut self, pid: u32, interpreter: &Interpreter, frames: &[Frame], eval: &[bool]) {
        for (frame, _) in frames
            .iter()
            .zip(eval)
            .filter(|(frame, eval)| **eval && !interpreter.is_eval(frame.address))
        {
            let address = frame.address.wrapping_sub(interpreter.bias);
            let functions = &interpreter.functions;
            let index = functions.partition_point(|&(start, _)| start <= address);
            let Some(&(start, end)) = index.checked_sub(1).and_then(|i| functions.get(i)) else {
                continue;
            };
            if address < end {
                let range = (
                    start.wrapping_add(interpreter.bias),
                    end.wrapping_add(interpreter.bias),
                );
                let learned = self.learned.entry(pid).or_default();
                if !learned.contains(&range) && learned.len() < 16 {
                    learned.push(range);
                }
            }
        }
    }

    fn is_eval(&self, pid: u32, interpreter: &Interpreter, address: u64) -> bool {
        interpreter.is_eval(address)
            || self.learned.get(&pid).is_some_and(|ranges| {
                ranges
                    .iter()
                    .any(|&(start, end)| (start..end).contains(&address))
            })
    }

    /// True when the instruction before return address `address` is a
    /// direct call to the evaluation loop (x86_64 `call rel32`; cached).
    fn calls_eval(&mut self, pid: u32, interpreter: &Interpreter, address: u64) -> bool {
        if !cfg!(target_arch = "x86_64") {
            return false;
        }
        if let Some(&known) = self.calls.get(&(pid, address)) {
            return known;
        }
        let mut call = [0u8; 5];
        let calls = memory::read(pid, address.wrapping_sub(5), &mut call) && call[0] == 0xe8 && {
            let relative = i32::from_le_bytes([call[1], call[2], call[3], call[4]]);
            let target = address.wrapping_add_signed(i64::from(relative));
            interpreter.eval.iter().any(|&(start, _)| start == target)
        };
        if self.calls.len() >= MAX_CODES {
            self.calls.clear();
        }
        self.calls.insert((pid, address), calls);
        calls
    }

    /// The code object at `address`, read once per process and address
    /// while its type, name and file pointers stay the same.
    fn code(&mut self, pid: u32, interpreter: &Interpreter, address: u64) -> Option<Arc<Code>> {
        let layout = &interpreter.layout.code;
        let fingerprint = fingerprint(pid, address, layout)?;
        if let Some(Some((code, seen))) = self.codes.get(&(pid, address))
            && *seen == fingerprint
        {
            return Some(code.clone());
        }
        if self.codes.len() >= MAX_CODES {
            self.codes.clear();
        }
        let code = Code::read(pid, address, interpreter.code_type, layout).map(Arc::new);
        self.codes
            .insert((pid, address), code.clone().map(|code| (code, fingerprint)));
        code
    }
}

/// A cheap identity of the object at `address`: its type pointer xor its
/// name, file and table pointers. A code object freed and another put in
/// its place changes it.
fn fingerprint(pid: u32, address: u64, layout: &CodeLayout) -> Option<[u8; 8]> {
    let end = layout.qualname.max(layout.filename).max(layout.linetable) + 8;
    let bytes = memory::read_vec(pid, address, end as usize)?;
    let at = |offset: u64| {
        let offset = offset as usize;
        u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
    };
    let value = at(8)
        ^ at(layout.qualname)
        ^ at(layout.filename).rotate_left(17)
        ^ at(layout.linetable).rotate_left(31);
    Some(value.to_le_bytes())
}

/// Reads a Python binary's symbols; `None` when it has no `_PyRuntime`.
fn read_elf(pid: u32, mapping: &Mapping) -> Option<PythonElf> {
    use object::{Object, ObjectSymbol};
    let data = match elf::read(pid, mapping) {
        Ok(data) => data,
        Err(err) => {
            tracing::debug!("pid {pid}: cannot read {}: {err}", mapping.path);
            return None;
        }
    };
    let file = object::File::parse(&*data).ok()?;
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
                let range = (symbol.address(), symbol.address() + symbol.size().max(1));
                if !eval.contains(&range) {
                    eval.push(range);
                }
            }
            _ => {}
        }
    }
    let segments = elf::segments(&file);
    Some(PythonElf {
        functions: Arc::new(function_ranges(&file)),
        runtime: runtime?,
        version: version?,
        code_type: code_type?,
        eval,
        segments,
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
            ranges.push((fde.initial_address(), fde.initial_address() + fde.len()));
        }
    }
    ranges.sort_unstable();
    ranges
}

/// The interpreter of a process whose Python binary is loaded at `bias`.
fn interpreter_at(pid: u32, elf: &PythonElf, bias: u64) -> Option<Interpreter> {
    let runtime = elf.runtime.wrapping_add(bias);
    let version = memory::read_u32(pid, elf.version.wrapping_add(bias))?;
    let (major, minor) = (version >> 24, ((version >> 16) & 0xff) as u8);
    if major != 3 || minor < 11 {
        tracing::info!(
            "pid {pid}: Python {major}.{minor} is not supported (3.11 and later are): its native frames only"
        );
        return None;
    }
    let layout = match layout::fixed(minor) {
        Some(layout) => Some(layout),
        None => memory::read_vec(pid, runtime, layout::DEBUG_OFFSETS_BYTES)
            .and_then(|blob| layout::from_debug_offsets(minor, &blob)),
    };
    let Some(mut layout) = layout else {
        tracing::info!(
            "pid {pid}: Python 3.{minor} has no layout hostprof knows (3.11 to 3.14 are): its native frames only"
        );
        return None;
    };
    let (dev, ino) = pid_namespace(pid)?;
    layout.kernel.runtime = runtime;
    layout.kernel.pidns_dev = dev;
    layout.kernel.pidns_ino = ino;
    tracing::debug!("pid {pid}: Python 3.{minor}, _PyRuntime at {runtime:#x}");
    Some(Interpreter {
        minor,
        layout,
        eval: elf
            .eval
            .iter()
            .map(|&(start, end)| (start.wrapping_add(bias), end.wrapping_add(bias)))
            .collect(),
        code_type: elf.code_type.wrapping_add(bias),
        functions: elf.functions.clone(),
        bias,
    })
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

fn register(map: &mut ProcessMap, pid: u32, interpreter: &Interpreter) -> Result<(), String> {
    map.insert(pid, interpreter.layout.kernel, 0)
        .map_err(|err| {
            crate::runtime::count_if_full(&err);
            err.to_string()
        })
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
            lines: Vec::new(),
        }
    }

    fn python(name: &str) -> Frame {
        let name: Arc<str> = name.into();
        Frame {
            kind: FrameKind::Python,
            address: 0,
            mapping: None,
            file_offset: 0,
            lines: vec![Line::named(name.clone(), name)],
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

    #[test]
    fn each_loop_frame_gives_way_to_its_calls_frames() {
        let interpreter = Interpreter {
            minor: 12,
            layout: layout::fixed(12).unwrap(),
            eval: vec![(0x1000, 0x2000)],
            code_type: 0,
            functions: Arc::new(Vec::new()),
            bias: 0,
        };
        // Leaf first: a C function called from Python, the loop, sorted()
        // (C), the loop again (the key callback's caller), main.
        let mut frames = vec![
            native(0x5000),
            native(0x1100),
            native(0x6000),
            native(0x1200),
            native(0x7000),
        ];
        let groups = vec![
            vec![python("hot_path"), python("by_key")],
            vec![python("stage"), python("run"), python("<module>")],
        ];
        // Our own pid: the addresses are not readable, so no call is seen.
        let pid = std::process::id();
        let mut state = Python::default();
        state.merge(pid, &interpreter, &mut frames, groups);
        assert_eq!(
            names(&frames),
            [
                "0x5000", "hot_path", "by_key", "0x6000", "stage", "run", "<module>", "0x7000"
            ]
        );

        // A native stack cut short: what is left goes below it.
        let mut frames = vec![native(0x1100), native(0x6000)];
        let groups = vec![vec![python("hot_path")], vec![python("<module>")]];
        state.merge(pid, &interpreter, &mut frames, groups);
        assert_eq!(names(&frames), ["hot_path", "0x6000", "<module>"]);
    }
}
