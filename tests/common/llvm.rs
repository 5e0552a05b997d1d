//! llvm-symbolizer as the reference for names: what it says for addresses of
//! a binary, next to what hostprof's symbolizer says for the same addresses.
use std::{
    collections::BTreeSet,
    io::Write,
    path::Path,
    process::{Command, Stdio},
};

use hostprof::symbolize::{Module, Symbolizer};
use object::{Object, ObjectSymbol, SymbolKind};

/// The reference: LLVM 19's llvm-symbolizer (Debian's `llvm-19`, installed by
/// `cargo xtask setup`). Bookworm's default, LLVM 14, joins a DWARF 5 line
/// table's directory 0 to the compilation directory a second time
/// (`./stdlib/./stdlib/abort.c` for glibc's `./stdlib/abort.c`), which later
/// LLVMs fixed: the comparison is with what the tool says today.
pub const LLVM_SYMBOLIZER: &str = "llvm-symbolizer-19";

/// One function of an address's answer: its raw (mangled) name, the line
/// its definition starts at (0 when unknown), and the source file and line
/// executing in it (empty and 0 when unknown).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub start_line: u32,
    pub file: String,
    pub line: u32,
}

/// The functions at one address, innermost first, by each tool.
#[derive(Debug)]
pub struct Comparison {
    pub address: u64,
    pub llvm: Vec<Named>,
    pub hostprof: Vec<Named>,
}

impl Comparison {
    /// Same functions (raw names), innermost first.
    pub fn names_agree(&self) -> bool {
        self.llvm.len() == self.hostprof.len()
            && self
                .llvm
                .iter()
                .zip(&self.hostprof)
                .all(|(a, b)| a.name == b.name)
    }

    /// Same functions and the same start lines.
    pub fn agrees(&self) -> bool {
        self.llvm.len() == self.hostprof.len()
            && self
                .llvm
                .iter()
                .zip(&self.hostprof)
                .all(|(a, b)| (&a.name, a.start_line) == (&b.name, b.start_line))
    }

    /// Same functions, start lines, files and lines: identical frames.
    pub fn frames_agree(&self) -> bool {
        self.llvm == self.hostprof
    }

    /// Why the answers differ when they differ only in the outermost
    /// function's name, in one of the two ways hostprof chooses to:
    /// - `Clone`: llvm-symbolizer names a GCC clone by its symbol
    ///   (`f.isra.0`, `f.cold`) where hostprof keeps DWARF's `f`;
    /// - `Alias`: several symbols name the same code (merged functions,
    ///   `malloc`/`__libc_malloc`) and the tools picked different ones.
    ///
    /// `None` for any other difference.
    pub fn explained(&self, symbols: &Symbols) -> Option<Difference> {
        self.difference(symbols, false)
    }

    /// [`Comparison::explained`] of whole frames: files and lines must be
    /// the same too.
    pub fn frame_explained(&self, symbols: &Symbols) -> Option<Difference> {
        self.difference(symbols, true)
    }

    fn difference(&self, symbols: &Symbols, frames: bool) -> Option<Difference> {
        if (frames && self.frames_agree()) || (!frames && self.agrees()) {
            return Some(Difference::Same);
        }
        let (Some((llvm, llvm_inlined)), Some((ours, our_inlined))) =
            (self.llvm.split_last(), self.hostprof.split_last())
        else {
            return None;
        };
        let same = |a: &[Named], b: &[Named]| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(a, b)| (&a.name, a.start_line) == (&b.name, b.start_line))
        };
        if !same(llvm_inlined, our_inlined) || llvm.start_line != ours.start_line {
            return None;
        }
        if frames
            && (llvm_inlined != our_inlined || (&llvm.file, llvm.line) != (&ours.file, ours.line))
        {
            return None;
        }
        if is_clone_of(&llvm.name, &ours.name) {
            return Some(Difference::Clone);
        }
        let llvm_at = symbols.addresses(&llvm.name);
        if symbols
            .addresses(&ours.name)
            .iter()
            .any(|address| llvm_at.contains(address))
        {
            return Some(Difference::Alias);
        }
        None
    }
}

/// How hostprof's answer compares with llvm-symbolizer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Difference {
    Same,
    Clone,
    Alias,
}

/// `clone` is `function` with GCC clone suffixes: `.isra.0`, `.cold`, …
fn is_clone_of(clone: &str, function: &str) -> bool {
    clone.strip_prefix(function).is_some_and(|suffix| {
        suffix.starts_with('.')
            && suffix.split('.').skip(1).all(|part| {
                matches!(
                    part,
                    "isra" | "constprop" | "part" | "cold" | "lto_priv" | "localalias"
                ) || (!part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
            })
    })
}

/// The code symbols of a binary and of its debug file, by name.
pub struct Symbols(std::collections::HashMap<String, Vec<u64>>);

impl Symbols {
    /// Reads `binary`'s symbol tables and those of its debug file in
    /// `/usr/lib/debug/.build-id`, if any.
    pub fn of(binary: &Path) -> Symbols {
        let mut by_name: std::collections::HashMap<String, Vec<u64>> = Default::default();
        let data = std::fs::read(binary).expect("read binary");
        let file = object::File::parse(&*data).expect("parse binary");
        let debug = file.build_id().ok().flatten().and_then(|id| {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            std::fs::read(format!(
                "/usr/lib/debug/.build-id/{}/{}.debug",
                &hex[..2],
                &hex[2..]
            ))
            .ok()
        });
        let debug = debug
            .as_deref()
            .and_then(|data| object::File::parse(data).ok());
        for file in std::iter::once(&file).chain(debug.as_ref()) {
            for symbol in file.symbols().chain(file.dynamic_symbols()) {
                if symbol.kind() == SymbolKind::Text
                    && let Ok(name) = symbol.name()
                {
                    by_name
                        .entry(name.to_string())
                        .or_default()
                        .push(symbol.address());
                }
            }
        }
        Symbols(by_name)
    }

    fn addresses(&self, name: &str) -> &[u64] {
        self.0.get(name).map_or(&[], Vec::as_slice)
    }
}

/// `count` distinct addresses inside the sized functions of `binary`'s symbol
/// tables, picked by a fixed-seed generator (every run sees the same set).
pub fn pick_addresses(binary: &Path, count: usize) -> Vec<u64> {
    let data = std::fs::read(binary).expect("read binary");
    let file = object::File::parse(&*data).expect("parse binary");
    let mut functions: Vec<(u64, u64)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.size() > 0)
        .map(|symbol| (symbol.address(), symbol.size()))
        .collect();
    functions.sort_unstable();
    functions.dedup();
    assert!(
        !functions.is_empty(),
        "{} has no functions",
        binary.display()
    );
    let code: u64 = functions.iter().map(|(_, size)| size).sum();
    let count = count.min(usize::try_from(code / 2).unwrap_or(usize::MAX));
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut picked = BTreeSet::new();
    while picked.len() < count {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let random = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let (start, size) = functions[(random % functions.len() as u64) as usize];
        picked.insert(start + (random >> 32) % size);
    }
    picked.into_iter().collect()
}

/// llvm-symbolizer's functions (raw names, inlined ones first) at each of
/// `addresses` of `binary`.
pub fn llvm_symbolizer(binary: &Path, addresses: &[u64]) -> Vec<Vec<Named>> {
    let mut child = Command::new(LLVM_SYMBOLIZER)
        .arg(format!("--obj={}", binary.display()))
        .args(["--no-demangle", "--inlining", "--verbose"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run llvm-symbolizer");
    let input: String = addresses.iter().map(|a| format!("{a:#x}\n")).collect();
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().expect("llvm-symbolizer output");
    writer.join().expect("writer").expect("write addresses");
    assert!(output.status.success(), "llvm-symbolizer failed");
    let text = String::from_utf8(output.stdout).expect("utf-8 output");
    let answers = parse_verbose(&text);
    assert_eq!(answers.len(), addresses.len(), "one answer per address");
    answers
}

/// Parses `--verbose` output: one block per address, blank-line separated;
/// each function a name line followed by indented `Key: value` lines.
fn parse_verbose(text: &str) -> Vec<Vec<Named>> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut functions: Vec<Named> = Vec::new();
            for line in block.lines() {
                if let Some(field) = line.strip_prefix("  ") {
                    let Some(function) = functions.last_mut() else {
                        continue;
                    };
                    let number = |value: &str| value.trim().parse().expect("a line number");
                    if let Some(value) = field.strip_prefix("Function start line: ") {
                        function.start_line = number(value);
                    } else if let Some(value) = field.strip_prefix("Line: ") {
                        function.line = number(value);
                    } else if let Some(value) = field.strip_prefix("Filename: ")
                        && value != "??"
                    {
                        function.file = value.to_string();
                    }
                } else {
                    functions.push(Named {
                        name: line.to_string(),
                        start_line: 0,
                        file: String::new(),
                        line: 0,
                    });
                }
            }
            // `??` alone: no name at all.
            functions.retain(|function| function.name != "??");
            functions
        })
        .collect()
}

/// hostprof's and llvm-symbolizer's functions at each of `addresses`.
pub fn compare(binary: &Path, addresses: &[u64]) -> Vec<Comparison> {
    let module = Symbolizer::new()
        .module_for_path(binary)
        .unwrap_or_else(|err| panic!("load {}: {err}", binary.display()));
    compare_module(binary, &module, addresses)
}

/// llvm-symbolizer's functions at `addresses` of `reference`, next to what
/// hostprof's `module` (the same code, its debug info perhaps elsewhere or
/// rewritten, as by dwz) says.
pub fn compare_module(reference: &Path, module: &Module, addresses: &[u64]) -> Vec<Comparison> {
    llvm_symbolizer(reference, addresses)
        .into_iter()
        .zip(addresses)
        .map(|(llvm, &address)| Comparison {
            address,
            llvm,
            hostprof: module
                .lookup_address(address)
                .iter()
                .map(|line| Named {
                    name: line.system_name.to_string(),
                    start_line: line.start_line,
                    file: line.file.as_deref().unwrap_or_default().to_string(),
                    line: line.line,
                })
                .collect(),
        })
        .collect()
}

/// A one-line summary: how many addresses agree, and how the others differ.
pub fn summary(binary: &Path, comparisons: &[Comparison], symbols: &Symbols) -> String {
    let count = |kind| {
        comparisons
            .iter()
            .filter(|c| c.explained(symbols) == Some(kind))
            .count()
    };
    let names = comparisons.iter().filter(|c| c.names_agree()).count();
    let unexplained = comparisons
        .iter()
        .filter(|c| c.explained(symbols).is_none())
        .count();
    format!(
        "{}: {} addresses; same functions and start lines as llvm-symbolizer: {} \
         (same names: {names}); outermost differs by a GCC clone suffix: {}, \
         by an alias of the same code: {}; other differences: {unexplained}",
        binary.display(),
        comparisons.len(),
        count(Difference::Same),
        count(Difference::Clone),
        count(Difference::Alias),
    )
}
