//! `hostprof record` end to end: the real eBPF sampler on real programs.
mod common;

use std::{process::Command, time::Duration};

use common::{
    running::{KillOnDrop, wait_for},
    *,
};

/// Copies a built test program under another name, so its comm differs.
fn renamed(program: &std::path::Path, name: &str) -> std::path::PathBuf {
    let copy = work_dir().join(name);
    std::fs::copy(program, &copy).expect("copy test program");
    copy
}

fn cpu_split() -> std::path::PathBuf {
    build_c(
        "cpu_split.c",
        "cpu_split",
        &["-O0", "-fno-omit-frame-pointer", "-g"],
    )
}

fn record_folded(args: &[&str]) -> Vec<(Vec<String>, u64)> {
    let output = run_ok(hostprof().arg("record").args(["-o", "-"]).args(args));
    parse_folded(&String::from_utf8_lossy(&output.stdout))
}

fn samples_of(stacks: &[(Vec<String>, u64)], comm: &str) -> u64 {
    stacks
        .iter()
        .filter(|(frames, _)| frames[0] == comm)
        .map(|(_, count)| count)
        .sum()
}

#[test]
fn hot_function_holds_its_designed_share() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = renamed(&cpu_split(), "split_cmd");
    let stacks = record_folded(&["-F", "999", "--", program.to_str().unwrap(), "3"]);
    let total = samples_of(&stacks, "split_cmd");
    assert!(total >= 300, "only {total} samples in 3 s at 999 Hz");
    let hot = leaf_share(&stacks, "split_cmd", "hot_work");
    let cold = leaf_share(&stacks, "split_cmd", "cold_work");
    assert!(
        (hot - 0.75).abs() < 0.08,
        "hot_work share {hot:.3}, designed 0.75"
    );
    assert!(
        (cold - 0.25).abs() < 0.08,
        "cold_work share {cold:.3}, designed 0.25"
    );
    // Frame-pointer stacks are complete: main is below the hot functions.
    let with_main: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames[0] == "split_cmd" && frames.iter().any(|f| f == "main"))
        .map(|(_, count)| count)
        .sum();
    assert!(
        with_main as f64 >= 0.95 * total as f64,
        "{with_main} of {total} samples reach main"
    );
}

#[test]
fn syscall_heavy_program_shows_kernel_frames() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = build_c(
        "syscall_heavy.c",
        "syscall_heavy",
        &["-O0", "-fno-omit-frame-pointer", "-g"],
    );
    let stacks = record_folded(&["-F", "999", "--", program.to_str().unwrap(), "2"]);
    let total = samples_of(&stacks, "syscall_heavy");
    assert!(total >= 200, "only {total} samples");
    let in_kernel: Vec<_> = stacks
        .iter()
        .filter(|(frames, _)| {
            frames[0] == "syscall_heavy" && frames.last().unwrap().ends_with("_[k]")
        })
        .collect();
    let kernel_samples: u64 = in_kernel.iter().map(|(_, count)| count).sum();
    assert!(
        kernel_samples as f64 >= 0.4 * total as f64,
        "{kernel_samples} of {total} samples in the kernel"
    );
    // Kernel frames are named, and the user stack under them is still there
    // (libc's write wrapper has no frame pointer, so its caller is skipped:
    // perf shows the same; main is reached through the wrapper's caller's frame).
    assert!(in_kernel.iter().any(|(frames, _)| {
        frames
            .iter()
            .any(|f| f.contains("write") && f.ends_with("_[k]"))
    }));
    let complete: u64 = in_kernel
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f == "main"))
        .map(|(_, count)| count)
        .sum();
    assert!(
        complete as f64 >= 0.9 * kernel_samples as f64,
        "{complete} of {kernel_samples} kernel samples have their user stack"
    );
}

#[test]
fn pid_filter_keeps_only_the_selected_processes() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = cpu_split();
    let mut wanted = Command::new(renamed(&program, "split_wanted"))
        .arg("4")
        .spawn()
        .unwrap();
    let mut other = Command::new(renamed(&program, "split_other"))
        .arg("4")
        .spawn()
        .unwrap();
    let pid = wanted.id().to_string();
    let stacks = record_folded(&["-F", "499", "-d", "2", "-p", &pid]);
    let _ = (wanted.kill(), other.kill(), wanted.wait(), other.wait());
    assert!(
        samples_of(&stacks, "split_wanted") >= 100,
        "too few samples of the selected process"
    );
    let strangers: Vec<_> = stacks
        .iter()
        .filter(|(frames, _)| frames[0] != "split_wanted")
        .collect();
    assert!(
        strangers.is_empty(),
        "samples of other processes: {strangers:?}"
    );
}

#[test]
fn host_wide_profile_attributes_a_process_started_later() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = renamed(&cpu_split(), "split_late");
    let (recorder, mut stderr) = running::start_recording(
        hostprof()
            .args(["record", "-F", "499", "-o", "-"])
            .stdout(std::process::Stdio::piped()),
    );
    // Started after the recording, and gone before it ends.
    run_ok(Command::new(&program).arg("1"));
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) };
    let output = recorder.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr.finish());
    let stacks = parse_folded(&String::from_utf8_lossy(&output.stdout));
    let total = samples_of(&stacks, "split_late");
    assert!(total >= 50, "only {total} samples of the late process");
    let named: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames[0] == "split_late")
        .filter(|(frames, _)| {
            matches!(
                frames.last().map(String::as_str),
                Some("hot_work" | "cold_work" | "main")
            )
        })
        .map(|(_, count)| count)
        .sum();
    assert!(
        named as f64 >= 0.9 * total as f64,
        "{named} of {total} samples symbolized"
    );
}

#[test]
fn summary_reports_samples_losses_and_top_functions() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = renamed(&cpu_split(), "split_summary");
    let output =
        run_ok(hostprof().args(["record", "-F", "199", "--", program.to_str().unwrap(), "1"]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(" samples from 1 processes"), "{stderr}");
    assert!(stderr.contains("lost 0 samples"), "{stderr}");
    // What it cost in memory, its own and the kernel's (tests/agent.rs
    // checks the kernel's figure against /proc).
    let maps = stderr
        .lines()
        .find_map(|line| line.strip_prefix("hostprof: memory: peak RSS "))
        .and_then(|line| line.split("; BPF maps ").nth(1))
        .and_then(|rest| rest.split(' ').next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no memory line: {stderr}"));
    assert!(maps > 1.0, "{stderr}");
    let self_section = stderr
        .split("top functions by self share:")
        .nth(1)
        .expect("self section");
    let first = self_section.lines().nth(1).expect("a top function");
    assert!(first.ends_with("hot_work"), "top self function: {first}");
}

fn one_error_line(args: &[&str]) -> String {
    let output = hostprof().args(args).output().unwrap();
    assert!(!output.status.success(), "{args:?} succeeded");
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    assert_eq!(stderr.lines().count(), 1, "{args:?} printed: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn bad_input_gives_one_clear_line() {
    let unknown = one_error_line(&["record", "-p", "4000000"]);
    assert!(unknown.contains("no process with pid 4000000"), "{unknown}");
    let format = one_error_line(&["record", "-d", "1", "-o", "profile.txt"]);
    assert!(format.contains("output format"), "{format}");
    let missing = one_error_line(&["record", "--", "/nonexistent/program"]);
    assert!(missing.contains("no such command"), "{missing}");
    // clap's own errors: non-zero exit and no panic.
    let output = hostprof().args(["record", "-F", "0"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--frequency"));
}

#[test]
fn unprivileged_user_is_told_what_to_do() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    // As nobody, with no capabilities: loading eBPF must be refused cleanly.
    let output = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(env!("CARGO_BIN_EXE_hostprof"))
        .args(["record", "-d", "1"])
        .output()
        .expect("run setpriv (util-linux)");
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    assert!(!output.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("permission denied") && stderr.contains("CAP_BPF"),
        "{stderr}"
    );
}

#[test]
fn version_is_printed() {
    let output = run_ok(hostprof().arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("hostprof {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn command_profile_follows_children_and_grandchildren() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = build_c(
        "forking.c",
        "forking",
        &["-O0", "-fno-omit-frame-pointer", "-g"],
    );
    let output = run_ok(hostprof().args([
        "record",
        "-F",
        "499",
        "-o",
        "-",
        "--",
        program.to_str().unwrap(),
        "1.5",
    ]));
    let stacks = parse_folded(&String::from_utf8_lossy(&output.stdout));
    // Every worker, the grandchild included, was profiled from its start:
    // each holds a fair part of the samples and spends them in child_work.
    let total: u64 = stacks.iter().map(|(_, count)| count).sum();
    for worker in ["child_a", "child_b", "grandchild"] {
        let samples = samples_of(&stacks, worker);
        assert!(
            samples as f64 >= 0.15 * total as f64,
            "{worker}: {samples} of {total} samples"
        );
        assert!(
            leaf_share(&stacks, worker, "child_work") > 0.9,
            "{worker} is not in child_work"
        );
    }
}

#[test]
fn ctrl_c_ends_the_recording_and_writes_the_profile() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = renamed(&cpu_split(), "split_sigint");
    // Killed once the test is done with it.
    let mut busy = Command::new(&program).arg("60").spawn().unwrap();
    let out = work_dir().join("sigint.folded");
    let _ = std::fs::remove_file(&out);
    let (recorder, mut stderr) =
        running::start_recording(hostprof().args(["record", "-F", "499", "-o"]).arg(&out));
    // Interrupted once the busy program ran half a second under sampling
    // (~250 samples at 499 Hz), however slowly the machine gets it there.
    let ran = cpu_seconds(busy.id());
    running::wait_for(Duration::from_secs(60), || {
        (cpu_seconds(busy.id()) >= ran + 0.5).then_some(())
    })
    .expect("the busy program does not run");
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) };
    let status = recorder.wait_with_output().unwrap().status;
    let _ = (busy.kill(), busy.wait());
    let stderr = stderr.finish();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("(interrupted)"), "{stderr}");
    let stacks = parse_folded(&std::fs::read_to_string(&out).expect("profile written"));
    assert!(samples_of(&stacks, "split_sigint") >= 100);
}

#[test]
fn debug_dir_names_a_stripped_binary() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let dir = work_dir().join("record-debug-dir");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let program = build_c(
        "cpu_split.c",
        "split_stripped",
        &["-O0", "-fno-omit-frame-pointer", "-g", "-Wl,--build-id"],
    );
    split_debug_by_build_id(&program, &dir);
    let run = |extra: &[&str]| {
        let mut args = vec!["-F", "499"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", program.to_str().unwrap(), "1"]);
        record_folded(&args)
    };
    let without = run(&[]);
    assert_eq!(
        leaf_share(&without, "split_stripped", "hot_work"),
        0.0,
        "a stripped binary has no names"
    );
    let with = run(&["--debug-dir", dir.to_str().unwrap()]);
    let hot = leaf_share(&with, "split_stripped", "hot_work");
    assert!(
        (hot - 0.75).abs() < 0.1,
        "hot_work share {hot:.3} with --debug-dir"
    );
}

/// The child of `parent` that runs `comm` (after its exec), from a scan of
/// `/proc/*/stat`.
fn child_running(parent: u32, comm: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent && head.ends_with(&format!("({comm}"))).then_some(pid)
        })
}

/// Kills a process by pid when dropped (a shell's background child).
struct KillPid(u32);

impl Drop for KillPid {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

#[test]
fn pid_of_an_idle_shell_names_its_busy_child() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let busy = renamed(&cpu_split(), "busy_child");
    // Dropped last: the shell reaps its killed child, then is killed.
    let shell = KillOnDrop(
        Command::new("sh")
            .args(["-c", r#""$0" 30 & wait"#])
            .arg(&busy)
            .spawn()
            .unwrap(),
    );
    let sh = shell.0.id();
    let child = wait_for(Duration::from_secs(10), || child_running(sh, "busy_child"))
        .expect("the shell started its busy child");
    let _child = KillPid(child);
    let record = |args: &[&str]| {
        let output = run_ok(
            hostprof()
                .args(["record", "-F", "499", "-d", "2", "-o", "-"])
                .args(args),
        );
        let stacks = parse_folded(&String::from_utf8_lossy(&output.stdout));
        (stacks, String::from_utf8_lossy(&output.stderr).into_owned())
    };

    let (stacks, stderr) = record(&["-p", &sh.to_string()]);
    assert_eq!(samples_of(&stacks, "busy_child"), 0, "{stderr}");
    let note = stderr
        .lines()
        .find(|line| line.contains("try -p"))
        .unwrap_or_else(|| panic!("no hint to pass the child:\n{stderr}"));
    assert!(
        note.starts_with(&format!(
            "hostprof: pid {sh} (sh) did not run; its child {child} (busy_child) used "
        )) && note.contains(&format!(" s of CPU: try -p {child} (or add --children)")),
        "{note}"
    );

    // The busy child itself, and the shell with its children: no hint.
    let (child, sh) = (child.to_string(), sh.to_string());
    let runs: [&[&str]; 2] = [&["-p", &child], &["-p", &sh, "--children"]];
    for args in runs {
        let (stacks, stderr) = record(args);
        assert!(!stderr.contains("try -p"), "{args:?}:\n{stderr}");
        let samples = samples_of(&stacks, "busy_child");
        assert!(samples >= 200, "{args:?}: {samples} samples of the child");
    }
}

/// The niceness (field 19 of a `stat` line) of each line of `text`.
fn nice_values(text: &str) -> Vec<i32> {
    text.lines()
        .filter_map(|line| {
            // After the comm's closing parenthesis: state is field 3.
            let rest = &line[line.rfind(')')? + 2..];
            rest.split(' ').nth(16)?.parse().ok()
        })
        .collect()
}

#[test]
fn record_runs_ahead_of_the_host_and_its_command_at_the_user_s_priority() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let ours = nice_values(&std::fs::read_to_string("/proc/self/stat").unwrap());
    let out = work_dir().join("nice.txt");
    // The command: its own stat line, then those of record's threads
    // (its parent), all started by then.
    let script = format!(
        "cat /proc/self/stat > {out}; cat /proc/$PPID/task/*/stat >> {out}",
        out = out.display()
    );
    run_ok(hostprof().args(["record", "-d", "1", "-o", "-", "--", "sh", "-c", &script]));
    let nice = nice_values(&std::fs::read_to_string(&out).unwrap());
    assert!(nice.len() >= 3, "{nice:?}");
    assert_eq!(nice[0], ours[0], "the command's priority: {nice:?}");
    // Root may raise it: every thread of record runs at nice -10 but the
    // unwind table thread, at -20 (`unwind::TABLES_NICE`; its large files'
    // lane, named alike, stays at -10).
    let text = std::fs::read_to_string(&out).unwrap();
    let threads: Vec<(&str, i32)> = text
        .lines()
        .skip(1)
        .filter_map(|line| {
            let name = line.split_once('(')?.1.rsplit_once(')')?.0;
            Some((name, *nice_values(line).first()?))
        })
        .collect();
    assert_eq!(threads.len(), nice.len() - 1, "{text}");
    let raised: Vec<&(&str, i32)> = threads.iter().filter(|(_, nice)| *nice != -10).collect();
    assert_eq!(
        raised,
        [&("hostprof-unwind", -20)],
        "record's threads: {threads:?}"
    );
}
