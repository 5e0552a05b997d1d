//! Symbolizer tests on this very test process: its own code, its own perf map.
use super::*;
use crate::procs::ProcessTable;

#[inline(never)]
fn marker_function_for_symbolizer_tests() -> u64 {
    std::hint::black_box(42)
}

fn frame_at(address: u64) -> Frame {
    let pid = std::process::id();
    let (mapping, file_offset) = ProcessTable::new()
        .mapping_of(pid, "test", 0, address)
        .expect("address is mapped");
    Frame {
        kind: FrameKind::Native,
        address,
        mapping: Some(mapping),
        file_offset,
        lines: crate::model::no_lines(),
    }
}

#[test]
fn names_our_own_function_with_its_source_line() {
    std::hint::black_box(marker_function_for_symbolizer_tests());
    let address = marker_function_for_symbolizer_tests as *const () as u64;
    // The unit-test binary's DWARF (~230 MiB) is over half the default
    // cache, which would leave it named from its symbol table only.
    let symbolizer = Symbolizer::with_options(SymbolizerOptions {
        cache_bytes: 2 << 30,
        ..SymbolizerOptions::default()
    });
    let mut frame = frame_at(address);
    symbolizer.symbolize(std::process::id(), &mut frame, false);
    let outer = frame.lines.last().expect("symbolized");
    assert!(
        outer
            .function
            .ends_with("symbolize::tests::marker_function_for_symbolizer_tests"),
        "{:?}",
        frame.lines
    );
    assert_ne!(
        outer.function, outer.system_name,
        "raw name is kept mangled"
    );
    // Test binaries carry DWARF: the line must point into this file.
    assert!(
        outer
            .file
            .as_deref()
            .is_some_and(|file| file.ends_with("tests.rs")),
        "{outer:?}"
    );
    assert!(outer.line > 0);

    // Second time: from the results cache, same answer.
    let mut again = frame_at(address);
    symbolizer.symbolize(std::process::id(), &mut again, false);
    assert_eq!(again.lines, frame.lines);
    let (modules, results) = symbolizer.cache_usage();
    assert!(modules > 0 && results > 0);
}

#[test]
fn our_executable_has_build_ids() {
    let address = marker_function_for_symbolizer_tests as *const () as u64;
    let frame = frame_at(address);
    let symbolizer = Symbolizer::new();
    let ids = symbolizer
        .build_ids(std::process::id(), frame.mapping.as_ref().unwrap())
        .expect("own executable readable");
    assert_eq!(ids.htlhash.as_deref().map(str::len), Some(32));
    assert!(ids.gnu.is_some());
    assert!(ids.go.is_none());
}

#[test]
fn perf_map_names_anonymous_code() {
    let pid = std::process::id();
    let path = format!("/tmp/perf-{}.map", perfmap::namespaced_pid(pid));
    std::fs::write(&path, "7f0000001000 100 jitted_function_one\n").unwrap();
    let mapping = Arc::new(Mapping {
        start: 0x7f0000000000,
        end: 0x7f0000100000,
        file_offset: 0,
        path: "".into(),
        dev: 0,
        inode: 0,
        build_ids: BuildIds::default(),
    });
    let mut frame = Frame {
        kind: FrameKind::Native,
        address: 0x7f0000001080,
        mapping: Some(mapping),
        file_offset: 0x1080,
        lines: crate::model::no_lines(),
    };
    Symbolizer::new().symbolize(pid, &mut frame, false);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(frame.lines.len(), 1);
    assert_eq!(&*frame.lines[0].function, "jitted_function_one");
}

/// A fuzzing seed: `tests/programs/sym_target.c`, -Os, DWARF 5, built by
/// `fuzz/make_seeds.sh`.
const SEED_DWARF5: &[u8] = include_bytes!("../../../fuzz/corpus/elf_symbolize/sym_dwarf5.so");

#[test]
fn module_from_bytes_names_functions_with_lines() {
    let module = Module::from_bytes(SEED_DWARF5, &[]).unwrap();
    assert!(module.has_dwarf());
    assert!(module.build_ids().gnu.is_some());
    assert_eq!(
        module.build_ids().htlhash.as_deref().map(str::len),
        Some(32)
    );
    let object = object::File::parse(SEED_DWARF5).unwrap();
    let address = object::Object::symbols(&object)
        .find(|symbol| object::ObjectSymbol::name(symbol) == Ok("outer_function"))
        .map(|symbol| object::ObjectSymbol::address(&symbol))
        .unwrap();
    let lines = module.lookup_address(address);
    let outer = lines.last().unwrap();
    assert_eq!(&*outer.function, "outer_function");
    assert!(outer.file.as_deref().unwrap().ends_with("sym_target.c"));
    assert!(outer.line > 0);
}

/// Found by fuzzing: addr2line probes `address + 1`, which overflowed.
#[test]
fn dwarf_lookup_at_the_last_address() {
    let module = Module::from_bytes(SEED_DWARF5, &[]).unwrap();
    assert!(module.lookup_address(u64::MAX).is_empty());
}

#[test]
fn module_from_bytes_rejects_garbage() {
    assert!(Module::from_bytes(b"not an ELF file", &[]).is_err());
}

/// Found by fuzzing: a compressed debug section whose header claims 16 GiB
/// made a 6 KB file allocate (and zero) all of it. Now its DWARF is ignored.
#[test]
fn compressed_section_claiming_gigabytes_is_refused() {
    let seed = include_bytes!("../../../fuzz/corpus/elf_symbolize/sym_dwarf4_zlib.so");
    let object = object::File::parse(&seed[..]).unwrap();
    let section = object::Object::section_by_name(&object, ".debug_info").unwrap();
    let (offset, _) = object::ObjectSection::file_range(&section).unwrap();
    // Elf64_Chdr: ch_type, ch_reserved, then ch_size.
    let mut data = seed.to_vec();
    let at = offset as usize + 8;
    data[at..at + 8].copy_from_slice(&(16u64 << 30).to_le_bytes());
    let module = Module::from_bytes(&data, &[]).unwrap();
    assert!(!module.has_dwarf());
    // The symbol table still names functions.
    let unpatched = Module::from_bytes(seed, &[]).unwrap();
    assert!(unpatched.has_dwarf());
}

/// A file too heavy for the cache even without DWARF is used for the frame
/// at hand, then left alone instead of being parsed again on every sample.
#[test]
fn a_file_heavier_than_the_cache_is_not_parsed_per_sample() {
    std::hint::black_box(marker_function_for_symbolizer_tests());
    let address = marker_function_for_symbolizer_tests as *const () as u64;
    let symbolizer = Symbolizer::with_options(SymbolizerOptions {
        cache_bytes: 64 << 10,
        ..SymbolizerOptions::default()
    });
    let mut frame = frame_at(address);
    symbolizer.symbolize(std::process::id(), &mut frame, false);
    let outer = frame.lines.last().expect("named from the symbol table");
    assert!(
        outer
            .function
            .ends_with("marker_function_for_symbolizer_tests")
    );
    // No line: DWARF's would say this file and line (the symbol table's
    // `STT_FILE` names only the codegen unit, with no line).
    assert_eq!(outer.line, 0, "DWARF over the limit was loaded: {outer:?}");
    assert!(!outer.file.as_deref().unwrap_or("").ends_with(".rs"));
    assert_eq!(symbolizer.cache_usage().0, 0);
    let mut again = frame_at(address);
    symbolizer.symbolize(std::process::id(), &mut again, false);
    assert!(again.lines.is_empty(), "parsed again: {:?}", again.lines);
}

/// A module and its results that no frame used for a whole period are
/// let go, and named again (the file read anew) when a frame needs them.
#[test]
fn what_no_frame_used_for_a_period_is_let_go() {
    std::hint::black_box(marker_function_for_symbolizer_tests());
    let address = marker_function_for_symbolizer_tests as *const () as u64;
    // Symbol tables only (the test binary's DWARF is over half of this).
    let symbolizer = Symbolizer::with_options(SymbolizerOptions {
        cache_bytes: 256 << 20,
        ..SymbolizerOptions::default()
    });
    let named = |symbolizer: &Symbolizer| {
        let mut frame = frame_at(address);
        symbolizer.symbolize(std::process::id(), &mut frame, false);
        frame.lines.last().map(|line| line.function.to_string())
    };
    let name = named(&symbolizer).expect("named");
    assert!(name.ends_with("marker_function_for_symbolizer_tests"));
    let (modules, results) = symbolizer.cache_usage();
    assert!(modules > 0 && results > 0);
    // Used in this period, then in the next: kept.
    assert_eq!(symbolizer.release_idle(Duration::ZERO), 0);
    assert_eq!(named(&symbolizer).as_ref(), Some(&name));
    assert_eq!(symbolizer.release_idle(Duration::ZERO), 0);
    assert_eq!(symbolizer.cache_usage(), (modules, results));
    // A period without a frame: both go.
    assert_eq!(symbolizer.release_idle(Duration::ZERO), 1);
    assert_eq!(symbolizer.cache_usage(), (0, 0));
    // Named again as before when a frame comes.
    assert_eq!(named(&symbolizer).as_ref(), Some(&name));
    assert_eq!(symbolizer.cache_usage().0, modules);
    // Within a period, nothing goes.
    assert_eq!(symbolizer.release_idle(Duration::from_secs(3600)), 0);
}

/// MiniDebugInfo made the way distributions make it (Fedora's recipe, cut
/// down): the symbol table of the unstripped library, xz-compressed by the
/// real `xz`, added as `.gnu_debugdata` to the stripped one. Only that
/// section can name the library's static function.
#[test]
fn minidebuginfo_names_a_static_function_of_a_stripped_library() {
    let dir = std::env::temp_dir().join(format!("hostprof-minidebuginfo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |program: &str, args: &[&str]| {
        let status = std::process::Command::new(program)
            .args(args)
            .current_dir(&dir)
            .status()
            .unwrap_or_else(|err| panic!("cannot run {program} (cargo xtask setup): {err}"));
        assert!(status.success(), "{program} {args:?} failed");
    };
    std::fs::write(
        dir.join("lib.c"),
        "__attribute__((noinline)) static int mini_local_function(int x) { return x * 3 + 1; }\n\
         int exported_function(int x) { return mini_local_function(x) + 2; }\n",
    )
    .unwrap();
    run("cc", &["-O1", "-shared", "-fPIC", "-o", "full.so", "lib.c"]);
    run("objcopy", &["--only-keep-debug", "full.so", "mini"]);
    run("xz", &["-k", "mini"]);
    run("strip", &["--strip-all", "full.so", "-o", "stripped.so"]);
    run(
        "objcopy",
        &[
            "--add-section",
            ".gnu_debugdata=mini.xz",
            "stripped.so",
            "with_mini.so",
        ],
    );
    let full = std::fs::read(dir.join("full.so")).unwrap();
    let object = object::File::parse(&full[..]).unwrap();
    let address = object::Object::symbols(&object)
        .find(|symbol| object::ObjectSymbol::name(symbol) == Ok("mini_local_function"))
        .map(|symbol| object::ObjectSymbol::address(&symbol))
        .expect("the unstripped library has the static function");
    let name_in = |file: &str| {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let module = Module::from_bytes(&bytes, &[]).unwrap();
        module
            .lookup_address(address)
            .last()
            .map(|line| line.function.to_string())
    };
    assert_ne!(
        name_in("stripped.so").as_deref(),
        Some("mini_local_function")
    );
    assert_eq!(
        name_in("with_mini.so").as_deref(),
        Some("mini_local_function")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A frame in a process's `[vdso]` is named from the vDSO image (there is
/// no file behind it): here this process's own `clock_gettime`, found
/// through the auxiliary vector's image, not through the symbolizer.
#[test]
fn vdso_frames_are_named() {
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    assert_ne!(base, 0, "no vDSO in this process");
    let image = crate::files::own_vdso().expect("the vDSO image");
    let elf = object::File::parse(&*image).expect("the vDSO is an ELF file");
    let (symbol, address) = object::Object::dynamic_symbols(&elf)
        .filter_map(|symbol| {
            let name = object::ObjectSymbol::name(&symbol).ok()?;
            (name.ends_with("clock_gettime") && object::ObjectSymbol::size(&symbol) > 4)
                .then(|| (name.to_string(), object::ObjectSymbol::address(&symbol)))
        })
        .next()
        .expect("clock_gettime in the vDSO");
    // Symbol addresses are link-time ones: the image's first segment is
    // mapped at its base.
    let linked = object::Object::segments(&elf)
        .map(|segment| object::ObjectSegment::address(&segment))
        .min()
        .expect("a loaded segment");
    let runtime = base + (address - linked) + 2;
    let mut frame = frame_at(runtime);
    assert_eq!(
        frame.mapping.as_ref().map(|mapping| &*mapping.path),
        Some("[vdso]")
    );
    let symbolizer = Symbolizer::new();
    symbolizer.symbolize(std::process::id(), &mut frame, false);
    let outer = frame.lines.last().expect("a vDSO frame is named");
    assert!(
        outer.function.ends_with("clock_gettime"),
        "{} named {:?}",
        symbol,
        frame.lines
    );
    let mapping = frame.mapping.as_ref().unwrap();
    let ids = symbolizer
        .build_ids(std::process::id(), mapping)
        .expect("the vDSO's build id");
    assert!(ids.gnu.is_some(), "{ids:?}");
}
