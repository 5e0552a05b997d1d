//! Symbolization end to end on live processes: stripped binaries with debug
//! files, inlined functions, C++/Rust/Go names, private mount namespaces,
//! chroots, deleted binaries and JIT perf maps. These call the library
//! directly; no eBPF is involved.
mod common;

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Arc,
};

use common::{
    build_c, has_section,
    llvm::{Comparison, Symbols, compare, pick_addresses, summary},
    program_source, require_tool, run_ok, split_debug_by_build_id, work_dir,
};
use hostprof::{
    model::{Frame, FrameKind},
    procs::ProcessTable,
    symbolize::{Symbolizer, SymbolizerOptions},
};

/// A test program that printed one address and waits for stdin to close.
struct Target {
    child: Child,
    address: u64,
}

impl Target {
    fn start(command: &mut Command) -> Target {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("start {command:?}: {err}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read address");
        let address = u64::from_str_radix(line.trim().trim_start_matches("0x"), 16)
            .unwrap_or_else(|_| panic!("{command:?} printed {line:?}, not an address"));
        Target { child, address }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Symbolizes `address` of this process as the pipeline would.
    fn symbolize(&self, symbolizer: &Symbolizer, address: u64) -> Frame {
        let (mapping, file_offset) = ProcessTable::new()
            .mapping_of(self.pid(), "target", 0, address)
            .unwrap_or_else(|| panic!("{address:#x} is not mapped in {}", self.pid()));
        let mut frame = Frame {
            kind: FrameKind::Native,
            address,
            mapping: Some(mapping),
            file_offset,
            lines: hostprof::model::no_lines(),
        };
        symbolizer.symbolize(self.pid(), &mut frame, false);
        frame
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // Closing stdin ends the program; kill in case it does not.
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        let why = "namespace and chroot tests need root";
        if std::env::var("CI").is_ok_and(|ci| ci == "true") {
            panic!("{why}, and CI=true forbids skipping them");
        }
        eprintln!("skipping: {why}");
    }
    root
}

/// A fresh directory in the work dir.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = work_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create dir");
    dir
}

/// The innermost-first function names of a frame.
fn names(frame: &Frame) -> Vec<&str> {
    frame.lines.iter().map(|line| &*line.function).collect()
}

#[test]
fn stripped_binary_resolves_from_a_build_id_debug_dir_with_inlines() {
    let dir = fresh_dir("build-id");
    let binary = build_c(
        "sym_target.c",
        "sym_target_stripped",
        &["-g", "-O2", "-Wl,--build-id"],
    );
    let debug_dir = dir.join("debug");
    split_debug_by_build_id(&binary, &debug_dir);
    let target = Target::start(&mut Command::new(&binary));

    // Without the debug dir, a fully stripped binary has no name for it.
    let bare = target.symbolize(&Symbolizer::new(), target.address);
    assert!(
        bare.lines.is_empty(),
        "stripped binary named: {:?}",
        bare.lines
    );

    let symbolizer = Symbolizer::with_options(SymbolizerOptions {
        debug_dirs: vec![debug_dir],
        ..SymbolizerOptions::default()
    });
    let frame = target.symbolize(&symbolizer, target.address);
    let outer = frame.lines.last().expect("named from the debug file");
    assert_eq!(&*outer.function, "outer_function");
    assert!(
        outer
            .file
            .as_deref()
            .is_some_and(|f| f.ends_with("sym_target.c")),
        "{outer:?}"
    );
    assert!(outer.line > 0);

    // Somewhere in outer_function's body runs the inlined helper's loop: that
    // address must show the helper as its own, innermost line.
    let inlined = (target.address..target.address + 256)
        .map(|address| target.symbolize(&symbolizer, address))
        .find(|frame| frame.lines.len() >= 2)
        .expect("an address inside the inlined helper");
    assert_eq!(names(&inlined), ["inlined_helper", "outer_function"]);
    assert!(inlined.lines[0].line > inlined.lines[1].line.saturating_sub(100));
    assert!(inlined.lines.iter().all(|line| line.line > 0));
}

#[test]
fn cpp_names_are_demangled() {
    let binary = work_dir().join("cpp_target");
    run_ok(
        Command::new("g++")
            .args(["-g", "-O1", "-o"])
            .arg(&binary)
            .arg(program_source("cpp_target.cpp")),
    );
    let target = Target::start(&mut Command::new(&binary));
    let frame = target.symbolize(&Symbolizer::new(), target.address);
    let line = frame.lines.last().expect("symbolized");
    assert_eq!(&*line.function, "shapes::area(double, int)");
    assert_eq!(&*line.system_name, "_ZN6shapes4areaEdi");
}

#[test]
fn rust_names_are_demangled_in_both_manglings() {
    // Stable rustc only lets v0 be chosen; the default is legacy (`_ZN…17h…E`)
    // until v0 becomes the default, so the default build covers either.
    for (mangling, prefixes) in [("default", &["_ZN", "_R"][..]), ("v0", &["_R"][..])] {
        let binary = work_dir().join(format!("rust_target_{mangling}"));
        let mut rustc = Command::new("rustc");
        rustc.args(["-O", "-g", "--crate-name", "rust_target"]);
        if mangling != "default" {
            rustc.arg(format!("-Csymbol-mangling-version={mangling}"));
        }
        run_ok(
            rustc
                .arg("-o")
                .arg(&binary)
                .arg(program_source("rust_target.rs")),
        );
        let target = Target::start(&mut Command::new(&binary));
        let frame = target.symbolize(&Symbolizer::new(), target.address);
        let line = frame.lines.last().expect("symbolized");
        assert_eq!(&*line.function, "rust_target::worker::spin", "{mangling}");
        assert!(
            prefixes
                .iter()
                .any(|prefix| line.system_name.starts_with(prefix)),
            "{mangling}: {line:?}"
        );
    }
}

#[test]
fn stripped_go_binary_resolves_from_gopclntab() {
    let binary = work_dir().join("go_target");
    let cache = work_dir().join("go-cache");
    run_ok(
        Command::new("go")
            .args(["build", "-ldflags=-s -w", "-o"])
            .arg(&binary)
            .arg("main.go")
            .current_dir(program_source("go_target"))
            .env("GOCACHE", &cache)
            .env("GOPATH", work_dir().join("go-path"))
            .env("GO111MODULE", "off"),
    );
    assert!(!has_section(&binary, ".symtab") && !has_section(&binary, ".debug_info"));
    let target = Target::start(&mut Command::new(&binary));
    let symbolizer = Symbolizer::new();
    let frame = target.symbolize(&symbolizer, target.address + 4);
    assert_eq!(names(&frame), ["main.busyWork"]);
    assert_eq!(frame.kind, FrameKind::Go);
    let ids = symbolizer
        .build_ids(target.pid(), frame.mapping.as_ref().expect("mapped"))
        .expect("build ids");
    assert!(
        ids.go.is_some_and(|id| id.contains('/')),
        "Go build id missing"
    );
}

#[test]
fn binary_in_a_private_mount_namespace_resolves() {
    if !is_root() {
        return;
    }
    let binary = build_c("sym_target.c", "sym_target_ns", &["-g", "-O2"]);
    let hidden = fresh_dir("ns-mount");
    // The tmpfs and the copy inside it exist only in the child's namespace.
    let script = format!(
        "mount -t tmpfs none {dir} && cp {binary} {dir}/hidden_target && exec {dir}/hidden_target",
        dir = hidden.display(),
        binary = binary.display()
    );
    let target = Target::start(Command::new("unshare").args([
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]));
    assert!(
        !hidden.join("hidden_target").exists(),
        "the mount leaked to the host"
    );
    let frame = target.symbolize(&Symbolizer::new(), target.address);
    assert_eq!(names(&frame), ["outer_function"]);
    assert!(
        frame
            .mapping
            .as_ref()
            .is_some_and(|m| m.path.ends_with("hidden_target")),
        "{:?}",
        frame.mapping
    );
}

#[test]
fn chrooted_binary_finds_its_debug_file_inside_its_root() {
    if !is_root() {
        return;
    }
    let root = fresh_dir("chroot");
    let binary = build_c(
        "sym_target.c",
        "sym_target_static",
        &["-g", "-O2", "-static", "-Wl,--build-id"],
    );
    let inside = root.join("target");
    std::fs::copy(&binary, &inside).expect("copy into chroot");
    // Debug file in the chroot's own /usr/lib/debug, not passed as a debug dir.
    split_debug_by_build_id(&inside, &root.join("usr/lib/debug"));
    let target = Target::start(Command::new("chroot").arg(&root).arg("/target"));
    let frame = target.symbolize(&Symbolizer::new(), target.address);
    let outer = frame
        .lines
        .last()
        .expect("named from the chroot's debug file");
    assert_eq!(&*outer.function, "outer_function");
    assert!(outer.line > 0, "{outer:?}");
}

#[test]
fn binary_deleted_after_start_still_resolves() {
    let binary = build_c("sym_target.c", "sym_target_deleted", &["-g", "-O2"]);
    let target = Target::start(&mut Command::new(&binary));
    std::fs::remove_file(&binary).expect("delete binary");
    let frame = target.symbolize(&Symbolizer::new(), target.address);
    assert_eq!(names(&frame), ["outer_function"]);
}

#[test]
fn perf_map_names_jit_frames() {
    let binary = build_c("jit_target.c", "jit_target", &["-O1"]);
    let target = Target::start(&mut Command::new(&binary));
    let frame = target.symbolize(&Symbolizer::new(), target.address);
    let mapping: &Arc<_> = frame.mapping.as_ref().expect("anonymous mapping found");
    assert_eq!(mapping.inode, 0);
    assert_eq!(names(&frame), ["jit_compiled_function"]);
    // Outside the described range: no name.
    let outside = target.symbolize(&Symbolizer::new(), target.address + 0x100);
    assert!(outside.lines.is_empty(), "{:?}", outside.lines);
}

/// Builds `tests/programs/rswork.rs` as `debug = "line-tables-only"` does.
fn build_line_tables_only_rust() -> PathBuf {
    let binary = work_dir().join("rswork");
    run_ok(
        Command::new("rustc")
            .args(["-O", "-C", "debuginfo=line-tables-only"])
            .args(["--crate-name", "rswork", "-o"])
            .arg(&binary)
            .arg(program_source("rswork.rs")),
    );
    binary
}

/// Every 4th byte of the functions of `binary` whose demangled name starts
/// with `prefix`.
fn addresses_of_functions(binary: &std::path::Path, prefix: &str) -> Vec<u64> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(binary).expect("read binary");
    let file = object::File::parse(&*data).expect("parse binary");
    file.symbols()
        .filter(|symbol| symbol.kind() == object::SymbolKind::Text)
        .filter(|symbol| {
            symbol
                .name()
                .is_ok_and(|name| hostprof::symbolize::demangle(name).starts_with(prefix))
        })
        .flat_map(|symbol| (symbol.address()..symbol.address() + symbol.size()).step_by(4))
        .collect()
}

/// Panics listing the first addresses where hostprof and llvm-symbolizer
/// differ, except in the ways hostprof chooses to (see
/// [`Comparison::explained`]), if any.
fn assert_agreement(binary: &std::path::Path, comparisons: &[Comparison]) {
    let symbols = Symbols::of(binary);
    let summary = summary(binary, comparisons, &symbols);
    eprintln!("{summary}");
    let different: Vec<_> = comparisons
        .iter()
        .filter(|c| c.explained(&symbols).is_none())
        .collect();
    assert!(
        different.is_empty(),
        "{summary}\nfirst differences:\n{:#?}",
        &different[..different.len().min(5)]
    );
}

#[test]
fn line_tables_only_rust_names_are_qualified_as_llvm_symbolizer_says() {
    if !require_tool(common::llvm::LLVM_SYMBOLIZER) {
        return;
    }
    let binary = build_line_tables_only_rust();
    assert!(
        has_section(&binary, ".debug_line"),
        "built without line tables"
    );

    // The live process, as the pipeline names it.
    let target = Target::start(&mut Command::new(&binary));
    let frame = target.symbolize(&Symbolizer::new(), target.address);
    let outer = frame.lines.last().expect("symbolized");
    assert_eq!(&*outer.function, "rswork::hot_path", "{:?}", frame.lines);
    assert!(
        outer
            .file
            .as_deref()
            .is_some_and(|f| f.ends_with("rswork.rs"))
            && outer.line > 0,
        "DWARF's line is kept: {outer:?}"
    );

    // The program's own functions, byte by byte, and a sample of the rest
    // (std), all as llvm-symbolizer names them.
    let mut addresses = addresses_of_functions(&binary, "rswork::");
    addresses.extend(addresses_of_functions(&binary, "<rswork::"));
    addresses.extend(pick_addresses(&binary, 3000));
    addresses.sort_unstable();
    addresses.dedup();
    let comparisons = compare(&binary, &addresses);
    assert_agreement(&binary, &comparisons);

    // Qualified names, outermost, for every function of the program.
    let module = Symbolizer::new().module_for_path(&binary).expect("load");
    let outermost: std::collections::BTreeSet<String> = addresses
        .iter()
        .filter_map(|&address| Some(module.lookup_address(address).last()?.function.to_string()))
        .collect();
    for name in [
        "rswork::hot_path",
        "rswork::main",
        "rswork::stats::histogram",
        "<rswork::Square as rswork::Shape>::area",
    ] {
        assert!(outermost.contains(name), "{name} missing: {outermost:?}");
    }
}

/// The shared C library this test process runs with.
fn our_libc() -> PathBuf {
    std::fs::read_to_string("/proc/self/maps")
        .expect("read our maps")
        .lines()
        .filter_map(|line| line.split_ascii_whitespace().nth(5))
        .find(|path| {
            path.rsplit('/')
                .next()
                .is_some_and(|name| name.starts_with("libc.so"))
        })
        .map(PathBuf::from)
        .expect("libc is mapped")
}

#[test]
fn c_cpp_and_libc_names_agree_with_llvm_symbolizer() {
    if !require_tool(common::llvm::LLVM_SYMBOLIZER) {
        return;
    }
    let c = build_c("sym_target.c", "names_c", &["-g", "-O2"]);
    let cpp = work_dir().join("names_cpp");
    run_ok(
        Command::new("g++")
            .args(["-g", "-O2", "-o"])
            .arg(&cpp)
            .arg(program_source("names_cpp.cpp")),
    );
    for binary in [c, cpp, our_libc()] {
        let comparisons = compare(&binary, &pick_addresses(&binary, 3000));
        assert_agreement(&binary, &comparisons);
    }
}

/// A BPF program the test loaded: where the kernel put its code, its tag.
struct LoadedBpfProgram {
    child: Child,
    address: u64,
    length: u64,
    tag: String,
    name: String,
}

impl LoadedBpfProgram {
    fn load() -> LoadedBpfProgram {
        let binary = build_c("bpf_prog_named.c", "bpf_prog_named", &["-O1"]);
        let mut child = Command::new(&binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start bpf_prog_named");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read program info");
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let [address, length, tag, name] = fields[..] else {
            panic!("bpf_prog_named printed {line:?}");
        };
        LoadedBpfProgram {
            address: u64::from_str_radix(address, 16).expect("hex address"),
            length: length.parse().expect("decimal length"),
            tag: tag.to_string(),
            name: name.to_string(),
            child,
        }
    }
}

impl Drop for LoadedBpfProgram {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kernel_name(symbolizer: &Symbolizer, address: u64) -> Option<String> {
    symbolizer
        .kernel_symbol(address)
        .map(|line| line.function.to_string())
}

#[test]
fn bpf_programs_loaded_after_start_are_named_with_tag_and_name() {
    if !is_root() {
        return;
    }
    // Symbols read before the program exists; it must be found by reading
    // them again (here on every lookup outside the kernel image).
    let symbolizer = Symbolizer::new().with_kernel_recheck(std::time::Duration::ZERO);
    let program = LoadedBpfProgram::load();
    assert!(
        program.length > 0 && program.address > 0,
        "not JIT-compiled?"
    );
    let expected = format!("bpf_prog_{}_{} [bpf]", program.tag, program.name);
    for address in [
        program.address,
        program.address + program.length / 2,
        program.address + program.length - 1,
    ] {
        assert_eq!(
            kernel_name(&symbolizer, address).as_deref(),
            Some(&*expected),
            "{address:#x}"
        );
    }
}

#[test]
fn module_symbols_are_named_with_their_module() {
    if !is_root() {
        return;
    }
    // Keep a BPF program loaded, so that there is at least one symbol
    // outside the kernel image even on kernels without modules.
    let program = LoadedBpfProgram::load();
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").expect("read kallsyms");
    let symbolizer = Symbolizer::new();
    let mut starts: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut module_symbols = Vec::new();
    for line in kallsyms.lines() {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let Ok(address) = u64::from_str_radix(fields[0], 16) else {
            continue;
        };
        if !matches!(fields[1], "t" | "T") {
            continue;
        }
        *starts.entry(address).or_default() += 1;
        // Other BPF programs come and go as other tools run: only ours.
        if let [_, _, name, module] = fields[..]
            && (module != "[bpf]" || name.ends_with(&program.name))
        {
            module_symbols.push((address, format!("{name} {module}")));
        }
    }
    // Symbols alone at their address (of two at one address, either may be
    // kept), one per module.
    module_symbols.retain(|(address, _)| starts[address] == 1);
    module_symbols.sort_by(|a, b| a.1.rsplit(' ').next().cmp(&b.1.rsplit(' ').next()));
    module_symbols.dedup_by(|a, b| a.1.rsplit(' ').next() == b.1.rsplit(' ').next());
    assert!(
        !module_symbols.is_empty(),
        "no symbol with a [module] in /proc/kallsyms"
    );
    for (address, expected) in &module_symbols {
        eprintln!("{address:#x}: {expected}");
        assert_eq!(
            kernel_name(&symbolizer, *address).as_deref(),
            Some(&**expected)
        );
    }
}

/// A `.symtab` left with only file symbols (`objcopy --strip-all
/// --keep-file-symbols`) names no function: the dynamic symbols do.
#[test]
fn dynamic_symbols_serve_when_the_symbol_table_names_no_function() {
    let binary = build_c(
        "sym_target.c",
        "sym_target_file_symbols",
        &["-O2", "-rdynamic"],
    );
    run_ok(
        Command::new("objcopy")
            .args(["--strip-all", "--keep-file-symbols"])
            .arg(&binary),
    );
    let (outer, in_symtab) = {
        use object::{Object, ObjectSymbol};
        let data = std::fs::read(&binary).expect("read binary");
        let file = object::File::parse(&*data).expect("parse binary");
        let outer = file
            .dynamic_symbols()
            .find(|symbol| symbol.name() == Ok("outer_function"))
            .expect("outer_function in .dynsym")
            .address();
        (outer, file.symbols().count())
    };
    assert!(in_symtab > 0, "objcopy left no .symtab at all");
    let module = Symbolizer::new()
        .module_for_path(&binary)
        .expect("load the binary");
    let lines = module.lookup_address(outer + 1);
    assert_eq!(
        lines.last().map(|line| &*line.function),
        Some("outer_function"),
        "{lines:?}"
    );
}
