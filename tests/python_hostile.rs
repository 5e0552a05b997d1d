//! A process that claims to be CPython 3.13 and lies
//! (tests/programs/fake_python.c): `hostprof record -p` on it must finish
//! on time, keep the process's native frames, name no Python frame, and say
//! what it refused.
mod common;

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use common::*;

/// CPU seconds the fake interpreter spins while recorded: ~200 samples at
/// 199 Hz, however long the machine takes to give it that time.
const CPU_SECONDS: f64 = 1.0;

/// The fake interpreter, started in `mode`, once its structures are set.
struct Fake(Child);

impl Fake {
    fn start(mode: &str) -> Fake {
        std::fs::create_dir_all(work_dir().join("fake-python")).expect("make the directory");
        // Named like CPython's binary: the agent looks only at those.
        let binary = build_c("fake_python.c", "fake-python/python3.13", &["-O1", "-g"]);
        let mut child = Command::new(binary)
            .arg(mode)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the fake interpreter");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("read its output");
        assert_eq!(line.trim(), "ready", "{mode}: the fake did not start");
        Fake(child)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Records the fake in `mode` until it ran [`CPU_SECONDS`]: its stacks and
/// hostprof's stderr.
fn record(mode: &str) -> (Vec<(Vec<String>, u64)>, String) {
    let fake = Fake::start(mode);
    let pid = fake.0.id();
    let folded = work_dir().join(format!("fake-python-{mode}-{pid}.folded"));
    let (mut recording, mut log) = running::start_recording(
        hostprof()
            .args(["record", "--frequency", "199", "--pid"])
            .arg(pid.to_string())
            .arg("--output")
            .arg(&folded),
    );
    let ran = cpu_seconds(pid);
    let enough = running::wait_for(Duration::from_secs(120), || {
        try_cpu_seconds(pid).and_then(|now| (now >= ran + CPU_SECONDS).then_some(()))
    });
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(recording.id() as i32, libc::SIGINT) };
    // Bounded: a walk or a read that never ends would show here.
    let status = running::wait_for(Duration::from_secs(60), || {
        recording.try_wait().expect("wait for hostprof")
    });
    drop(fake);
    let log = log.finish();
    assert!(enough.is_some(), "{mode}: the fake did not run");
    assert!(
        status.is_some_and(|status| status.success()),
        "{mode}: hostprof did not end cleanly ({status:?}):\n{log}"
    );
    let stacks = parse_folded(&std::fs::read_to_string(&folded).expect("read folded"));
    (stacks, log)
}

/// Its samples, and those through its spinning function by name.
fn native_share(stacks: &[(Vec<String>, u64)]) -> (u64, u64) {
    let total = stacks.iter().map(|(_, count)| count).sum();
    let named = stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f == "_PyEval_EvalFrameDefault"))
        .map(|(_, count)| count)
        .sum();
    (total, named)
}

/// Frames labelled as Python ones are (`name (file:line)`).
fn python_frames(stacks: &[(Vec<String>, u64)]) -> Vec<&str> {
    stacks
        .iter()
        .flat_map(|(frames, _)| frames.iter())
        .filter(|frame| {
            frame
                .rsplit_once(" (")
                .is_some_and(|(_, location)| location.ends_with(')') && location.contains(':'))
        })
        .map(String::as_str)
        .collect()
}

/// [`record`] in `mode`, checking that at least 0.95 of at least 100
/// samples keep the native `_PyEval_EvalFrameDefault` and none is named as
/// Python; hostprof's stderr.
fn record_native_only(mode: &str) -> String {
    let (stacks, log) = record(mode);
    let (total, named) = native_share(&stacks);
    assert!(
        total >= 100 && named as f64 >= 0.95 * total as f64,
        "{named} of {total} samples through _PyEval_EvalFrameDefault\n{log}"
    );
    assert!(
        python_frames(&stacks).is_empty(),
        "{:?}",
        python_frames(&stacks)
    );
    log
}

#[test]
fn huge_debug_offsets_are_refused_and_the_process_keeps_its_native_frames() {
    let Some(_guard) = require_ebpf() else { return };
    let log = record_native_only("offsets");
    // One line says why, naming the field.
    assert!(
        log.contains("_Py_DebugOffsets gives sizeof(_PyRuntimeState) = 0x10000000000"),
        "no refusal line:\n{log}"
    );
    assert!(!log.contains("Python stacks:"), "walked anyway:\n{log}");
    assert!(
        log.contains("Python values past hostprof's caps: 1 processes not walked"),
        "not counted:\n{log}"
    );
}

#[test]
fn cyclic_frames_and_huge_code_objects_are_bounded_and_left_unnamed() {
    let Some(_guard) = require_ebpf() else { return };
    let log = record_native_only("cyclic");
    // The kernel walked the cycle to its bound (128 frames), every time.
    let count = python_line_counter(&log);
    let walked = count("Python stacks: ");
    assert!(walked >= 100, "{log}");
    assert_eq!(count("depth limit "), walked, "{log}");
    // Its code object was refused (once: the refusal is cached with it).
    assert!(
        log.contains("processes not walked (offsets), 1 code objects left out (too long 1"),
        "code object not refused:\n{log}"
    );
    // Its memory stayed small: nothing sized by the claimed 2^40 bytes.
    let rss = log
        .lines()
        .find_map(|line| line.strip_prefix("hostprof: memory: peak RSS "))
        .and_then(|rest| rest.split(' ').next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no memory line:\n{log}"));
    assert!(rss < 200.0, "peak RSS {rss} MiB\n{log}");
}

/// A program that maps an interpreter it never started (perf links
/// libpython): its walks find no thread, and are not read faults, the
/// count meant for memory that moved or a bad offset.
#[test]
fn an_interpreter_never_started_has_no_thread_rather_than_a_read_fault() {
    let Some(_guard) = require_ebpf() else { return };
    let log = record_native_only("idle");
    let count = python_line_counter(&log);
    let walked = count("Python stacks: ");
    assert!(walked >= 100, "{log}");
    assert_eq!(count("no thread "), walked, "{log}");
    assert_eq!(count("read fault "), 0, "{log}");
}

/// Reads the number after `label` on record's `Python stacks:` line.
fn python_line_counter(log: &str) -> impl Fn(&str) -> u64 + '_ {
    let line = log
        .lines()
        .find(|line| line.starts_with("hostprof: Python stacks:"))
        .unwrap_or_else(|| panic!("no Python line:\n{log}"));
    move |label: &str| -> u64 {
        line.split(label)
            .nth(1)
            .and_then(|rest| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .find(|s| !s.is_empty())
            })
            .and_then(|digits| digits.parse().ok())
            .unwrap_or_else(|| panic!("no `{label}` in {line}"))
    }
}
