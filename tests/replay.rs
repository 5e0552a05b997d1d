//! Replay of recorded stacks through the kernel's unwinder core on the host:
//! x86_64 and aarch64 programs built without frame pointers crash on purpose
//! under qemu-user, which writes an ELF core; the registers and stack of
//! that core are unwound by `hostprof_unwind` with tables built from the
//! program, exactly as the eBPF program would.
mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::*;
use hostprof::unwind::replay::{self, Snapshot, SnapshotMapping};
use hostprof_unwind::reason;
use object::{Object, ObjectSegment, ObjectSymbol};

fn unique() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Builds `unwind_replay.c` statically for `arch` (fixed addresses: the
/// binary is its only mapping).
fn build(arch: &str) -> Option<PathBuf> {
    let compiler = match arch {
        "x86_64" => "gcc",
        _ => "aarch64-linux-gnu-gcc",
    };
    if !require_tool(compiler) || !require_tool(&format!("qemu-{arch}-static")) {
        return None;
    }
    // One build per call: tests run in parallel.
    let out = work_dir().join(format!("unwind_replay_{arch}_{}", unique()));
    run_ok(
        Command::new(compiler)
            .args(["-O2", "-fomit-frame-pointer", "-g", "-static", "-o"])
            .arg(&out)
            .arg(program_source("unwind_replay.c")),
    );
    Some(out)
}

/// Runs the program under qemu-user until it crashes; returns its core.
fn crash(arch: &str, program: &Path, mode: &str) -> Vec<u8> {
    let dir = work_dir().join(format!("replay-{arch}-{mode}-{}", unique()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // qemu writes qemu_<name>_<date>_<pid>.core in its working directory;
    // the kernel may add a core of qemu itself, which we ignore.
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -c unlimited; exec qemu-{arch}-static \"$0\" {mode}"
        ))
        .arg(program)
        .current_dir(&dir)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run qemu");
    assert!(!status.success(), "the program was meant to crash");
    let core = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with("qemu_"))
        })
        .expect("qemu wrote a core file");
    let bytes = std::fs::read(&core).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

/// The static binary's executable segment as the snapshot's one mapping.
fn mappings(program: &Path) -> Vec<SnapshotMapping> {
    let data = std::fs::read(program).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.segments()
        .filter(|segment| {
            matches!(segment.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0)
        })
        .map(|segment| {
            let (offset, size) = segment.file_range();
            SnapshotMapping {
                start: segment.address() & !0xfff,
                end: segment.address() + size,
                file_offset: offset & !0xfff,
                path: program.to_path_buf(),
            }
        })
        .collect()
}

/// Function names of `frames` (leaf first), from the binary's symbols;
/// return addresses are looked up one byte back, inside their call.
fn names(program: &Path, frames: &[u64]) -> Vec<String> {
    let data = std::fs::read(program).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let mut symbols: Vec<_> = file
        .symbols()
        .filter(|symbol| symbol.kind() == object::SymbolKind::Text)
        .map(|symbol| {
            (
                symbol.address(),
                symbol.size(),
                symbol.name().unwrap_or("?").to_string(),
            )
        })
        .collect();
    symbols.sort();
    frames
        .iter()
        .enumerate()
        .map(|(i, &pc)| {
            let inside = if i == 0 { pc } else { pc - 1 };
            symbols
                .iter()
                .find(|(start, size, _)| *start <= inside && inside < start + size)
                // A signal trampoline is "returned" to at its first byte.
                .or_else(|| symbols.iter().find(|(start, _, _)| *start == pc))
                .map(|(_, _, name)| name.clone())
                .unwrap_or_else(|| format!("{pc:#x}"))
        })
        .collect()
}

/// `expected` appear in `names` in this order (others may sit between).
fn assert_in_order(names: &[String], expected: &[&str]) {
    let mut at = 0;
    for want in expected {
        match names[at..].iter().position(|name| name == want) {
            Some(found) => at += found + 1,
            None => panic!("{want} missing (or out of order) in {names:?}"),
        }
    }
}

fn replay(arch: &str, mode: &str) -> Option<(Vec<String>, u32)> {
    let program = build(arch)?;
    let core = crash(arch, &program, mode);
    let snapshot = Snapshot::from_core(&core, mappings(&program)).expect("read the core");
    let (frames, why) = replay::unwind(&snapshot, hostprof_common::MAX_USER_STACK_DEPTH);
    Some((names(&program, &frames), why))
}

#[test]
fn x86_64_signal_frame_is_unwound_to_main() {
    let Some((names, why)) = replay("x86_64", "signal") else {
        return;
    };
    // Through the handler, glibc's __restore_rt trampoline, raise and back
    // to main and _start.
    assert_in_order(
        &names,
        &[
            "crash_here",
            "in_handler",
            "on_signal",
            "__restore_rt",
            "raise_it",
            "outer",
            "main",
        ],
    );
    assert_eq!(why, reason::COMPLETE, "{names:?}");
}

#[test]
fn aarch64_signal_frame_is_unwound_to_main() {
    let Some((names, why)) = replay("aarch64", "signal") else {
        return;
    };
    // crash_here is a leaf: its caller comes from LR. qemu's sigreturn
    // trampoline has no symbol; its frame is recognised by its code.
    assert_in_order(
        &names,
        &[
            "crash_here",
            "in_handler",
            "on_signal",
            "raise_it",
            "outer",
            "main",
        ],
    );
    assert_eq!(why, reason::COMPLETE, "{names:?}");
}

#[test]
fn aarch64_leaf_return_address_comes_from_the_link_register() {
    let Some((names, why)) = replay("aarch64", "leaf") else {
        return;
    };
    assert_eq!(names[0], "crash_here", "{names:?}");
    assert_eq!(names[1], "outer", "{names:?}");
    assert_in_order(&names, &["crash_here", "outer", "main"]);
    assert_eq!(why, reason::COMPLETE, "{names:?}");
}

/// A sample landing in a PLT stub: the stub touches neither the stack
/// pointer nor the link register, so the registers at the entry of the
/// function it jumps to (here `crash_here`, a leaf that crashed before
/// changing either) are those of a thread inside the stub: replay them
/// with the pc moved into the binary's `.plt`.
fn replay_in_plt(arch: &str) -> Option<(Vec<String>, u32)> {
    let program = build(arch)?;
    let core = crash(arch, &program, "leaf");
    let mut snapshot = Snapshot::from_core(&core, mappings(&program)).expect("read the core");
    let data = std::fs::read(&program).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let plt = object::ObjectSection::address(&file.section_by_name(".plt").expect("a .plt"));
    // The second stub: the first may be a resolver stub in lazy PLTs.
    snapshot.regs.pc = plt + 16 + 4;
    let (frames, why) = replay::unwind(&snapshot, hostprof_common::MAX_USER_STACK_DEPTH);
    Some((names(&program, &frames), why))
}

#[test]
fn plt_stubs_are_unwound_on_both_architectures() {
    for arch in ["x86_64", "aarch64"] {
        let Some((names, why)) = replay_in_plt(arch) else {
            return;
        };
        assert_eq!(names[1], "outer", "{arch}: {names:?}");
        assert_in_order(&names, &["outer", "main"]);
        assert_eq!(why, reason::COMPLETE, "{arch}: {names:?}");
    }
}
