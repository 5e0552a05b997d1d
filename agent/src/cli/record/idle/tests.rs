use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use super::*;

/// A fake `/proc`, removed when dropped.
struct FakeProc(PathBuf);

impl FakeProc {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("hostprof-idle-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        FakeProc(dir)
    }

    fn procfs(&self) -> ProcFs {
        ProcFs {
            root: self.0.clone(),
            tick_hz: 100,
        }
    }

    /// Process `pid` with `ticks` of CPU; `children` writes its main
    /// thread's children file (`None`: a kernel without them).
    fn process(&self, pid: u32, comm: &str, ppid: u32, ticks: u64, children: Option<&[u32]>) {
        self.process_started(pid, comm, ppid, ticks, 1000, children);
    }

    fn process_started(
        &self,
        pid: u32,
        comm: &str,
        ppid: u32,
        ticks: u64,
        start: u64,
        children: Option<&[u32]>,
    ) {
        let dir = self.0.join(pid.to_string());
        let task = dir.join("task").join(pid.to_string());
        std::fs::create_dir_all(&task).unwrap();
        let (utime, stime) = (ticks - ticks / 4, ticks / 4);
        std::fs::write(
            dir.join("stat"),
            format!(
                "{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194304 100 0 0 0 {utime} {stime} \
                 0 0 20 0 1 0 {start} 2588672 200 18446744073709551615\n"
            ),
        )
        .unwrap();
        if let Some(children) = children {
            let text: Vec<String> = children.iter().map(|pid| format!("{pid} ")).collect();
            std::fs::write(task.join("children"), text.concat()).unwrap();
        }
    }

    fn exit(&self, pid: u32) {
        std::fs::remove_dir_all(self.0.join(pid.to_string())).unwrap();
    }
}

impl Drop for FakeProc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// sh (100) started java (101), which used `java_ticks` over the recording.
fn shell_and_child(proc: &FakeProc, children: bool, java_ticks: u64) -> (Snapshot, Snapshot) {
    let list = |pids: &'static [u32]| children.then_some(pids);
    proc.process(1, "init", 0, 5, list(&[100]));
    proc.process(100, "sh", 1, 2, list(&[101]));
    proc.process(101, "java", 100, 50, list(&[]));
    proc.process(200, "stranger", 1, 50, list(&[]));
    let before = proc.procfs().snapshot(&[100]);
    proc.process(101, "java", 100, 50 + java_ticks, list(&[]));
    proc.process(200, "stranger", 1, 500, list(&[]));
    (before, proc.procfs().snapshot(&[100]))
}

#[test]
fn stat_line_with_parentheses_and_spaces_in_the_command() {
    let stat = parse_stat(
        "4242 (a) (b c) R 17 4242 4242 0 -1 4194304 9 0 0 0 30 12 0 0 20 0 1 0 777 1 2 3\n",
    )
    .unwrap();
    assert_eq!(
        stat,
        Stat {
            comm: "a) (b c".into(),
            ppid: 17,
            ticks: 42,
            start: 777,
        }
    );
    assert_eq!(parse_stat("4242 (short) R 17"), None);
}

#[test]
fn idle_shell_names_its_busy_child() {
    let proc = FakeProc::new("child");
    let (before, after) = shell_and_child(&proc, true, 190);
    assert_eq!(
        idle_note(&before, &after, &[100], 0, 99).as_deref(),
        Some(
            "hostprof: pid 100 (sh) did not run; its child 101 (java) used 1.9 s of CPU: \
             try -p 101 (or add --children)"
        )
    );
    // A few samples of the shell are still "almost none".
    let note = idle_note(&before, &after, &[100], 3, 99).unwrap();
    assert!(
        note.contains("pid 100 (sh) barely ran (3 samples)"),
        "{note}"
    );
}

#[test]
fn without_children_files_the_parents_are_scanned() {
    let proc = FakeProc::new("scan");
    let (before, after) = shell_and_child(&proc, false, 190);
    let note = idle_note(&before, &after, &[100], 0, 99).unwrap();
    assert!(note.contains("its child 101 (java) used 1.9 s"), "{note}");
    assert!(!note.contains("stranger"), "{note}");
}

#[test]
fn no_note_when_the_selected_process_ran_or_its_children_idled() {
    let proc = FakeProc::new("quiet");
    // The child used only 0.05 s.
    let (before, after) = shell_and_child(&proc, true, 5);
    assert_eq!(idle_note(&before, &after, &[100], 0, 99), None);
    // Samples as many as the child's CPU gives.
    let (before, after) = shell_and_child(&proc, true, 190);
    assert_eq!(idle_note(&before, &after, &[100], 150, 99), None);
    // The shell itself ran a good part of that.
    proc.process(100, "sh", 1, 60, Some(&[101]));
    let after = proc.procfs().snapshot(&[100]);
    assert_eq!(idle_note(&before, &after, &[100], 0, 99), None);
}

#[test]
fn grandchildren_and_new_processes_count_busiest_first() {
    let proc = FakeProc::new("tree");
    proc.process(10, "make", 1, 7, Some(&[11]));
    proc.process(11, "sh", 10, 1, Some(&[12]));
    proc.process(12, "cc", 11, 40, Some(&[]));
    proc.process(13, "old", 11, 40, Some(&[]));
    let before = proc.procfs().snapshot(&[10]);
    // cc ran 0.5 s; ld started during the recording and ran 2 s; pid 13
    // was reused by a new process that ran 0.3 s; a short one exited.
    proc.process(11, "sh", 10, 1, Some(&[12, 13, 14]));
    proc.process(12, "cc", 11, 90, Some(&[]));
    proc.process_started(13, "as", 11, 30, 5000, Some(&[]));
    proc.process(14, "ld", 11, 200, Some(&[]));
    let after = proc.procfs().snapshot(&[10]);
    assert_eq!(
        idle_note(&before, &after, &[10], 0, 99).as_deref(),
        Some(
            "hostprof: pid 10 (make) did not run; its descendants 14 (ld), 12 (cc) and 13 (as) \
             used 2.8 s of CPU: try -p 14 -p 12 -p 13 (or add --children)"
        )
    );
    // A selected process that exited says nothing of itself.
    proc.exit(10);
    let after = proc.procfs().snapshot(&[10]);
    assert_eq!(idle_note(&before, &after, &[10], 0, 99), None);
}

#[test]
fn busy_processes_selected_too_are_not_suggested() {
    let proc = FakeProc::new("selected");
    let (before, after) = shell_and_child(&proc, true, 190);
    assert_eq!(idle_note(&before, &after, &[100, 101], 0, 99), None);
}

/// `sh -c 'sleep 30 & wait'`, killed with its child when dropped.
struct Shell(Child);

impl Drop for Shell {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; the group is the shell's.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

fn wait_for_child(shell: u32) -> u32 {
    let start = Instant::now();
    loop {
        let parents = ProcFs::new().parents();
        let child = parents.iter().find(|&(_, &parent)| parent == shell);
        if let Some((&child, _)) = child
            && ProcFs::new().stat(child).is_some_and(|s| s.comm == "sleep")
        {
            return child;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no child");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn real_proc_lists_the_children_of_a_shell() {
    use std::os::unix::process::CommandExt;
    let shell = Shell(
        Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let pid = shell.0.id();
    let child = wait_for_child(pid);
    let procfs = ProcFs::new();
    let snapshot = procfs.snapshot(&[pid]);
    let (stat, depth) = &snapshot.processes[&child];
    assert_eq!((stat.comm.as_str(), stat.ppid, *depth), ("sleep", pid, 1));
    assert_eq!(snapshot.processes[&pid].1, 0);
    if Path::new(&format!("/proc/{pid}/task/{pid}/children")).exists() {
        assert_eq!(procfs.children(pid), Some(vec![child]));
    }
}
