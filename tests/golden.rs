//! The golden comparison: hostprof's symbolizer against llvm-symbolizer on
//! a few thousand addresses inside real binaries (this machine's libc with
//! its Debian debug file, libstdc++, python3, a line-tables-only Rust
//! binary, a C++ program with heavy inlining, a Go program), frame by frame:
//! function, start line, file, line, and the inline chain.
//!
//! Each binary's agreement is printed with every kind of difference
//! (`GOLDEN_SHOW=1` prints the first few of each kind whole), and each must
//! have at least 99.5% of its frames identical to llvm-symbolizer 19's. libc
//! is compared with its debug file (Debian's libc6-dbg). The kinds of
//! difference the report tells apart, none of which occurred in the last
//! run (100.00% on every binary):
//! - *GCC clone*: one tool names the outermost function by its symbol
//!   (`f.isra.0`, `f.cold`), the other by DWARF's `f`;
//! - *alias*: several symbols name the same code (`uselocale` and
//!   `__uselocale`, a constructor's `C1` and `C2`) and the tools picked
//!   different ones;
//! - *path spelling*: the same file spelled two ways (LLVM 14 wrote glibc's
//!   `./stdlib/abort.c` as `./stdlib/./stdlib/abort.c`);
//! - *unit name as file*: where no line row covers an address, one tool
//!   gives the local symbol's `STT_FILE` name as the file, the other none.
mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use common::{
    llvm::{Comparison, Difference, Symbols, compare, pick_addresses},
    program_source, require_tool, run_ok, work_dir,
};

/// How one address's answers differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Identical,
    GccClone,
    Alias,
    PathSpelling,
    UnitNameAsFile,
    Other,
}

/// A path without `.` components and with a repeated leading directory
/// collapsed (`./stdlib/./stdlib/abort.c` → `stdlib/abort.c`).
fn normalized(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|part| *part != ".").collect();
    let mut out: Vec<&str> = Vec::new();
    for part in parts {
        out.push(part);
        let n = out.len();
        // `a/b/a/b` → `a/b`: the directory said twice.
        for half in 1..=n / 2 {
            if out[n - 2 * half..n - half] == out[n - half..] {
                out.truncate(n - half);
                break;
            }
        }
    }
    out.join("/")
}

/// `comparison` with the differences of spelling taken out: paths
/// normalized, and llvm-symbolizer's unit name dropped where hostprof has
/// no file (no line row); true if anything changed.
fn respelled(comparison: &Comparison) -> (Comparison, bool, bool) {
    let (mut paths, mut units) = (false, false);
    let mut llvm = comparison.llvm.clone();
    let mut ours = comparison.hostprof.clone();
    for (a, b) in llvm.iter_mut().zip(ours.iter_mut()) {
        if a.line == 0 && b.line == 0 && b.file.is_empty() && !a.file.is_empty() {
            a.file.clear();
            units = true;
        }
        let (na, nb) = (normalized(&a.file), normalized(&b.file));
        if a.file != b.file && na == nb {
            paths = true;
        }
        a.file = na;
        b.file = nb;
    }
    let respelled = Comparison {
        address: comparison.address,
        llvm,
        hostprof: ours,
    };
    (respelled, paths, units)
}

fn kind(comparison: &Comparison, symbols: &Symbols) -> Kind {
    let (respelled, paths, units) = respelled(comparison);
    match respelled.frame_explained(symbols) {
        Some(Difference::Same) if !paths && !units => Kind::Identical,
        Some(Difference::Same) if paths => Kind::PathSpelling,
        Some(Difference::Same) => Kind::UnitNameAsFile,
        Some(Difference::Clone) => Kind::GccClone,
        Some(Difference::Alias) => Kind::Alias,
        None => Kind::Other,
    }
}

/// Agreement on one binary.
struct Report {
    addresses: usize,
    frames: usize,
    identical_frames: usize,
    /// Identical once paths are spelled alike.
    respelled_frames: usize,
    kinds: BTreeMap<Kind, usize>,
    others: Vec<u64>,
}

impl Report {
    fn of(binary: &Path, addresses: &[u64]) -> Report {
        let comparisons = compare(binary, addresses);
        let symbols = Symbols::of(binary);
        let mut report = Report {
            addresses: comparisons.len(),
            frames: 0,
            identical_frames: 0,
            respelled_frames: 0,
            kinds: BTreeMap::new(),
            others: Vec::new(),
        };
        for comparison in &comparisons {
            let kind = kind(comparison, &symbols);
            *report.kinds.entry(kind).or_default() += 1;
            if kind == Kind::Other {
                report.others.push(comparison.address);
            }
            // GOLDEN_SHOW=1: the first few addresses of every kind of difference, whole.
            if kind != Kind::Identical
                && std::env::var_os("GOLDEN_SHOW").is_some()
                && report.kinds[&kind] <= 3
            {
                eprintln!("{kind:?}: {comparison:#?}");
            }
            let (llvm, ours) = (&comparison.llvm, &comparison.hostprof);
            report.frames += llvm.len().max(ours.len());
            report.identical_frames += llvm.iter().zip(ours).filter(|(a, b)| a == b).count();
            let (respelled, _, _) = respelled(comparison);
            report.respelled_frames += respelled
                .llvm
                .iter()
                .zip(&respelled.hostprof)
                .filter(|(a, b)| a == b)
                .count();
        }
        report
    }

    /// Share of frames identical to llvm-symbolizer's, in percent.
    fn frame_agreement(&self) -> f64 {
        100.0 * self.identical_frames as f64 / self.frames.max(1) as f64
    }

    /// [`Report::frame_agreement`] with paths spelled alike.
    fn respelled_agreement(&self) -> f64 {
        100.0 * self.respelled_frames as f64 / self.frames.max(1) as f64
    }

    /// Share of addresses whose frames are identical or differ only in one
    /// of the known ways (clone suffix, alias, path spelling, unit name).
    fn explained(&self) -> f64 {
        let other = self.kinds.get(&Kind::Other).copied().unwrap_or(0);
        100.0 * (self.addresses - other) as f64 / self.addresses.max(1) as f64
    }
}

/// The binaries compared, by name.
fn binaries() -> Vec<(&'static str, PathBuf)> {
    let lib = |name: &str| {
        std::fs::canonicalize(Path::new("/usr/lib/x86_64-linux-gnu").join(name))
            .unwrap_or_else(|err| panic!("{name}: {err}"))
    };
    let rust = work_dir().join("golden_rswork");
    run_ok(
        Command::new("rustc")
            .args(["-O", "-C", "debuginfo=line-tables-only"])
            .args(["--crate-name", "rswork", "-o"])
            .arg(&rust)
            .arg(program_source("rswork.rs")),
    );
    let cpp = work_dir().join("golden_cpp_o3");
    run_ok(
        Command::new("g++")
            .args(["-g", "-O3", "-o"])
            .arg(&cpp)
            .arg(program_source("names_cpp.cpp")),
    );
    let go = work_dir().join("golden_go");
    run_ok(
        Command::new("go")
            .args(["build", "-o"])
            .arg(&go)
            .arg("main.go")
            .current_dir(program_source("go_target"))
            .env("GOCACHE", work_dir().join("go-cache"))
            .env("GOPATH", work_dir().join("go-path"))
            .env("GO111MODULE", "off"),
    );
    vec![
        ("libc", lib("libc.so.6")),
        ("libstdc++", lib("libstdc++.so.6")),
        (
            "python3",
            std::fs::canonicalize("/usr/bin/python3").expect("python3"),
        ),
        ("rust line-tables-only", rust),
        ("c++ -O3", cpp),
        ("go", go),
    ]
}

#[test]
fn frames_agree_with_llvm_symbolizer_on_real_binaries() {
    if !require_tool(common::llvm::LLVM_SYMBOLIZER) || !require_tool("go") {
        return;
    }
    let mut failures = Vec::new();
    for (name, binary) in binaries() {
        let report = Report::of(&binary, &pick_addresses(&binary, 2000));
        eprintln!(
            "{name} ({}): {} addresses, {} frames; identical frames {:.2}% \
             ({:.2}% with paths spelled alike); addresses identical or explained {:.2}%; \
             by kind {:?}; first others {:x?}",
            binary.display(),
            report.addresses,
            report.frames,
            report.frame_agreement(),
            report.respelled_agreement(),
            report.explained(),
            report.kinds,
            &report.others[..report.others.len().min(5)],
        );
        if report.frame_agreement() < 99.5 {
            failures.push(name);
        }
    }
    assert!(
        failures.is_empty(),
        "below 99.5% of frames identical to llvm-symbolizer's: {failures:?}"
    );
}
