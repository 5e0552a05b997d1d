//! Shared helpers for hostprof's integration tests.
//!
//! Tests that load the real eBPF program call [`require_ebpf`] first: without
//! root they are skipped with a message locally, and fail under `CI=true`,
//! where a skipped eBPF test would hide a broken product.
#![allow(dead_code)]

pub mod cgroup;
pub mod collector;
pub mod docker;
pub mod jfr;
pub mod llvm;
pub mod running;
pub mod tmux;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{Mutex, MutexGuard, OnceLock},
};

/// The hostprof binary cargo built for this test run.
pub fn hostprof() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hostprof"))
}

/// Returns `None` (after saying why) when eBPF tests cannot run here; panics
/// instead under `CI=true`. The guard runs eBPF tests of one binary one at a
/// time: each measures CPU-bound programs on a 2-CPU machine, and running
/// them together would starve the programs they measure.
pub fn require_ebpf() -> Option<MutexGuard<'static, ()>> {
    static SERIAL: Mutex<()> = Mutex::new(());
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        // A failed test poisons the lock; the next test is still valid.
        return Some(
            SERIAL
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
    }
    let why = "eBPF tests need root (or CAP_BPF + CAP_PERFMON)";
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("{why}, and CI=true forbids skipping them");
    }
    eprintln!("skipping: {why}");
    None
}

/// Returns false (after saying why) when `command` is not installed; panics
/// instead under `CI=true`, where `cargo xtask setup` must have installed it.
pub fn require_tool(command: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {command}")])
        .output();
    if found.is_ok_and(|out| out.status.success()) {
        return true;
    }
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("{command} is missing, and CI=true forbids skipping: run `cargo xtask setup`");
    }
    eprintln!("skipping: {command} is not installed (cargo xtask setup installs it)");
    false
}

/// Directory for this test run's build products.
pub fn work_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hostprof-tests");
        std::fs::create_dir_all(&dir).expect("create test dir");
        dir
    })
}

/// Source file of a test program in `tests/programs/`.
pub fn program_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/programs")
        .join(name)
}

/// Compiles `tests/programs/<source>` with `cc` and `flags` into `output`
/// (in the work dir) and returns its path.
pub fn build_c(source: &str, output: &str, flags: &[&str]) -> PathBuf {
    let out = work_dir().join(output);
    let status = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(program_source(source))
        .status()
        .expect("run cc (install gcc)");
    assert!(status.success(), "cc failed for {source}");
    out
}

/// Flags of the OTEP 4947 writer (`tests/programs/otel_thread_ctx.c`)
/// with its variable in the executable, exported for readers.
pub const OTEL_WRITER_FLAGS: [&str; 4] = [
    "-O1",
    "-Wall",
    "-pthread",
    "-Wl,--export-dynamic-symbol=otel_thread_ctx_v1",
];

/// That writer, built.
pub fn build_otel_writer() -> PathBuf {
    build_c("otel_thread_ctx.c", "otel_thread_ctx", &OTEL_WRITER_FLAGS)
}

/// The same writer in Rust (`tests/programs/otel_thread_ctx.rs`), built
/// by `rustc` alone (`RUSTC` when set, as cargo names its compiler), its
/// variable in the executable's static TLS, exported for readers.
pub fn build_rust_otel_writer() -> PathBuf {
    let out = work_dir().join("otel_thread_ctx_rs");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    run_ok(
        Command::new(rustc)
            .args(["--edition", "2024", "--crate-name", "otel_thread_ctx_rs"])
            .args(["-C", "opt-level=1", "-C", "force-frame-pointers=no"])
            .args([
                "-C",
                "link-arg=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1",
            ])
            .arg("-o")
            .arg(&out)
            .arg(program_source("otel_thread_ctx.rs")),
    );
    out
}

/// Runs a command, panicking with its stderr when it fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let output = cmd.output().expect("start command");
    assert!(
        output.status.success(),
        "{cmd:?} failed with {}:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// CPU time (user + system, in seconds) process `pid` has used so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    try_cpu_seconds(pid).expect("read /proc/PID/stat")
}

/// [`cpu_seconds`], or `None` once the process is gone.
pub fn try_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces), from field 3 on.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().ok()? + fields[12].parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    Some(ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// Parses folded stacks into (frames root first, count).
pub fn parse_folded(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .filter_map(|line| {
            let (stack, count) = line.rsplit_once(' ')?;
            Some((
                stack.split(';').map(str::to_string).collect(),
                count.parse().ok()?,
            ))
        })
        .collect()
}

/// One failure message for a runtime test: what failed, then the `stacks`
/// (frames root first, count) seen most often, so a failing CI log shows
/// what hostprof made of the program without the folded file at hand.
pub fn failure_report(
    name: &str,
    failures: &[String],
    what: &str,
    folded: &Path,
    stacks: &[&(Vec<String>, u64)],
) -> String {
    let mut commonest = stacks.to_vec();
    commonest.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    let examples: Vec<String> = commonest
        .iter()
        .take(5)
        .map(|(frames, count)| format!("  {count} {}", frames.join(";")))
        .collect();
    format!(
        "{name}:\n{}\ncommonest {what} stacks ({}):\n{}",
        failures.join("\n"),
        folded.display(),
        examples.join("\n")
    )
}

/// The fewest samples a share is judged on: below, one sample moves it by
/// more than 0.01, and a test's bounds would catch noise, not a bug. Tests
/// wait for these (or run workloads bounded by their own CPU time), so a
/// busy machine slows them instead of failing them.
pub const MIN_SHARE_SAMPLES: u64 = 100;

/// Share (0..=1) of samples whose leaf frame is `function`, among stacks whose
/// first element (comm) is `comm`; there must be [`MIN_SHARE_SAMPLES`].
pub fn leaf_share(stacks: &[(Vec<String>, u64)], comm: &str, function: &str) -> f64 {
    let of_comm: Vec<_> = stacks
        .iter()
        .filter(|(frames, _)| frames[0] == comm)
        .collect();
    let total: u64 = of_comm.iter().map(|(_, count)| count).sum();
    let hits: u64 = of_comm
        .iter()
        .filter(|(frames, _)| frames.last().is_some_and(|leaf| leaf == function))
        .map(|(_, count)| count)
        .sum();
    assert!(
        total >= MIN_SHARE_SAMPLES,
        "{comm}: only {total} samples, too few to judge {function}'s share on"
    );
    hits as f64 / total as f64
}

/// Whether `frames` (root first, as names) hold `path` in order.
pub fn holds_path<'a>(mut frames: impl Iterator<Item = &'a str>, path: &[&str]) -> bool {
    path.iter().all(|step| frames.any(|frame| frame == *step))
}

pub fn gnu_build_id(path: &Path) -> String {
    use object::Object;
    let data = std::fs::read(path).expect("read binary");
    let file = object::File::parse(&*data).expect("parse binary");
    let id = file
        .build_id()
        .ok()
        .flatten()
        .expect("binary has a build-id");
    id.iter().map(|byte| format!("{byte:02x}")).collect()
}

pub fn has_section(path: &Path, name: &str) -> bool {
    use object::Object;
    let data = std::fs::read(path).expect("read binary");
    object::File::parse(&*data)
        .expect("parse binary")
        .section_by_name(name)
        .is_some()
}

/// Moves the debug info of `binary` into `debug_root/.build-id/xx/rest.debug`
/// and strips the binary completely (no .symtab either).
pub fn split_debug_by_build_id(binary: &Path, debug_root: &Path) {
    let id = gnu_build_id(binary);
    let dir = debug_root.join(".build-id").join(&id[..2]);
    std::fs::create_dir_all(&dir).expect("create build-id dir");
    let debug = dir.join(format!("{}.debug", &id[2..]));
    run_ok(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(binary)
            .arg(&debug),
    );
    run_ok(Command::new("strip").arg("--strip-all").arg(binary));
    assert!(!has_section(binary, ".symtab") && !has_section(binary, ".debug_info"));
}

/// The process whose executable's name starts with `program`: `pid`
/// itself, or its first descendant (unshare → chroot'd program).
#[allow(dead_code)]
pub fn descendant_running(pid: u32, program: &str) -> u32 {
    try_descendant_running(pid, program)
        .unwrap_or_else(|| panic!("no {program} process under pid {pid}"))
}

/// [`descendant_running`], or None while there is none (yet).
#[allow(dead_code)]
pub fn try_descendant_running(pid: u32, program: &str) -> Option<u32> {
    let mut current = pid;
    for _ in 0..4 {
        let exe = std::fs::read_link(format!("/proc/{current}/exe")).unwrap_or_default();
        let name = exe.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with(program) {
            return Some(current);
        }
        let children = std::fs::read_to_string(format!("/proc/{current}/task/{current}/children"))
            .unwrap_or_default();
        current = children.split_whitespace().next()?.parse().ok()?;
    }
    None
}
