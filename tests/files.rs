//! Files a tenant controls, read by the real agent: a perf map that is a
//! FIFO or a symlink to /dev/zero, a debug file that is an absolute symlink
//! out of a container, a library truncated while the agent reads it, and
//! two binaries claiming the same build id. None may hang, grow, crash or
//! mislead the agent.
mod common;

use std::{
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use common::{
    build_c, hostprof, parse_folded, run_ok,
    running::{Agent, Spinner, wait_for},
    work_dir,
};

/// How long a 2-second recording may take before it counts as hung.
const RECORD_DEADLINE: Duration = Duration::from_secs(90);

/// A test program that prints "ready" when its hostile files are in place.
struct Target(Child);

impl Target {
    fn start(command: &mut Command) -> Target {
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("start {command:?}: {err}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "{command:?}");
        Target(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A finished (or killed) `hostprof record`.
struct Recording {
    /// `None`: still running at the deadline, then killed.
    exit_code: Option<i32>,
    folded: String,
    stderr: String,
    /// Peak resident memory, KiB (getrusage of the child).
    max_rss_kib: i64,
}

/// Runs `hostprof record ARGS -o FILE` with at most 4 GiB of address space
/// (a reader of /dev/zero fails instead of taking the host's memory), and
/// waits for it until [`RECORD_DEADLINE`].
fn record(name: &str, args: &[&str]) -> Recording {
    let output = work_dir().join(format!("{name}.folded"));
    let stderr_path = work_dir().join(format!("{name}.stderr"));
    let _ = std::fs::remove_file(&output);
    let mut command = hostprof();
    command
        .arg("record")
        .args(args)
        .arg("-o")
        .arg(&output)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap());
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 4 << 30,
                rlim_max: 4 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Reaped below by wait4, which also gives its peak memory.
    #[allow(clippy::zombie_processes)]
    let child = command.spawn().expect("start hostprof record");
    let pid = child.id() as i32;
    let started = Instant::now();
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid value to be overwritten.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut exit_code = None;
    loop {
        // SAFETY: our own child; status and usage are valid pointers.
        let done = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if done == pid {
            exit_code = Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
            break;
        }
        if started.elapsed() > RECORD_DEADLINE {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::wait4(pid, &mut status, 0, &mut usage);
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Recording {
        exit_code,
        folded: std::fs::read_to_string(&output).unwrap_or_default(),
        stderr: std::fs::read_to_string(&stderr_path).unwrap_or_default(),
        max_rss_kib: usage.ru_maxrss,
    }
}

impl Recording {
    fn assert_finished(&self) {
        let Some(code) = self.exit_code else {
            panic!(
                "hostprof record was still running after {RECORD_DEADLINE:?}:\n{}",
                self.stderr
            );
        };
        assert_eq!(code, 0, "hostprof record failed:\n{}", self.stderr);
    }

    /// Samples whose stack holds a frame containing `text`.
    fn samples_naming(&self, text: &str) -> u64 {
        parse_folded(&self.folded)
            .iter()
            .filter(|(frames, _)| frames.iter().any(|frame| frame.contains(text)))
            .map(|(_, count)| count)
            .sum()
    }

    fn samples_of(&self, comm: &str) -> u64 {
        parse_folded(&self.folded)
            .iter()
            .filter(|(frames, _)| frames[0] == comm)
            .map(|(_, count)| count)
            .sum()
    }

    /// The "files refused" summary's first number (not regular files).
    fn refused_not_regular(&self) -> u64 {
        self.stderr
            .lines()
            .find_map(|line| line.strip_prefix("hostprof: files refused: "))
            .and_then(|rest| rest.split(' ').next()?.parse().ok())
            .unwrap_or(0)
    }
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = work_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_fifo_perf_map_is_refused_and_recording_ends() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let binary = build_c(
        "hostile_files.c",
        "hostile_fifo",
        &["-O0", "-g", "-fno-omit-frame-pointer"],
    );
    let target = Target::start(Command::new(&binary).args(["fifo", "60"]));
    let pid = target.pid().to_string();
    let run = record(
        "hostile_fifo",
        &[
            "-p",
            &pid,
            "-d",
            "2",
            "--log-level",
            "hostprof::files=debug",
        ],
    );
    run.assert_finished();
    assert!(
        run.samples_naming("native_named_spin") >= 20,
        "the process's own functions are still named:\n{}",
        run.folded
    );
    let map = format!("/tmp/perf-{pid}.map");
    assert!(
        run.stderr
            .contains(&format!("refused {map}: a FIFO, not a regular file")),
        "the FIFO was never refused (was JIT code sampled?):\n{}",
        run.stderr
    );
    assert!(run.refused_not_regular() >= 1, "{}", run.stderr);
}

#[test]
fn dev_zero_as_perf_map_and_debug_file_is_refused_in_little_memory() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let dir = fresh_dir("hostile_zero");
    let binary = dir.join("hostile_zero");
    std::fs::copy(
        build_c(
            "hostile_files.c",
            "hostile_zero_built",
            &["-O0", "-g", "-fno-omit-frame-pointer"],
        ),
        &binary,
    )
    .unwrap();
    // Stripped, with a debuglink to a debug file beside it (gdb's first
    // place to look), which then becomes a symlink to /dev/zero.
    let debug = dir.join("hostile_zero.debug");
    run_ok(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&binary)
            .arg(&debug),
    );
    run_ok(Command::new("strip").arg("--strip-all").arg(&binary));
    run_ok(
        Command::new("objcopy")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(&binary),
    );
    std::fs::remove_file(&debug).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &debug).unwrap();

    let target = Target::start(Command::new(&binary).args(["zero", "60"]));
    let pid = target.pid().to_string();
    let run = record(
        "hostile_zero",
        &[
            "-p",
            &pid,
            "-d",
            "2",
            "--log-level",
            "hostprof::files=debug",
        ],
    );
    run.assert_finished();
    let map = format!("/tmp/perf-{pid}.map");
    for refused in [map.as_str(), debug.to_str().unwrap()] {
        assert!(
            run.stderr.contains(&format!(
                "refused {refused}: a character device, not a regular file"
            )),
            "{refused} was not refused:\n{}",
            run.stderr
        );
    }
    assert!(run.refused_not_regular() >= 2, "{}", run.stderr);
    eprintln!("hostprof record peak RSS: {} MiB", run.max_rss_kib >> 10);
    assert!(
        run.max_rss_kib < 256 << 10,
        "hostprof record peaked at {} MiB",
        run.max_rss_kib >> 10
    );
}

#[test]
fn an_absolute_symlink_in_a_container_never_reads_the_host_file() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    if !common::require_tool("unshare") {
        return;
    }
    let id = "5eed0f11e5000000000000000000000000c0ffee";
    let build = |name: &str, hot: &str| {
        build_c(
            "replaced.c",
            name,
            &[
                "-O0",
                "-g",
                "-fno-omit-frame-pointer",
                "-static",
                &format!("-DHOT={hot}"),
                &format!("-Wl,--build-id=0x{id}"),
            ],
        )
    };
    let visible = build("escape_visible", "container_visible_spin");
    let secret = build("escape_secret", "host_only_secret_spin");
    // The host-only debug file: same build id, names found nowhere else.
    let host_dir = fresh_dir("escape_host_only");
    let host_debug = host_dir.join("secret.debug");
    run_ok(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&secret)
            .arg(&host_debug),
    );
    // The container: a stripped copy, and where its debug file would be, an
    // absolute symlink to the host file's path.
    let root = fresh_dir("escape_root");
    std::fs::copy(&visible, root.join("target")).unwrap();
    run_ok(
        Command::new("strip")
            .arg("--strip-all")
            .arg(root.join("target")),
    );
    let relative = format!("usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
    std::fs::create_dir_all(root.join(&relative).parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&host_debug, root.join(&relative)).unwrap();

    let mut container = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "chroot"])
        .arg(&root)
        .args(["/target", "30"])
        .spawn()
        .expect("start the container");
    let pid = container.id();
    wait_for(Duration::from_secs(10), || {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "target").then_some(())
    })
    .expect("the container's process started");
    // The control: a plain open through /proc/PID/root does reach the host
    // file, so the symlink is a real way out.
    let through_proc = std::fs::read(format!("/proc/{pid}/root/{relative}"));
    assert_eq!(
        through_proc.ok(),
        Some(std::fs::read(&host_debug).unwrap()),
        "the test's escape does not escape"
    );
    let run = record(
        "escape",
        &[
            "-p",
            &pid.to_string(),
            "-d",
            "2",
            "--log-level",
            "hostprof::files=debug",
        ],
    );
    let _ = (container.kill(), container.wait());
    run.assert_finished();
    assert!(run.samples_of("target") >= 50, "{}", run.folded);
    assert_eq!(
        run.samples_naming("host_only_secret"),
        0,
        "names from the host file:\n{}",
        run.folded
    );
    assert!(!run.stderr.contains("host_only_secret"), "{}", run.stderr);
}

#[test]
fn two_binaries_claiming_one_build_id_keep_their_own_names() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let id = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0";
    let build = |hot: &str| {
        let built = build_c(
            "replaced.c",
            &format!("{hot}_built"),
            &[
                "-O0",
                "-g",
                "-fno-omit-frame-pointer",
                &format!("-DHOT={hot}"),
                &format!("-Wl,--build-id=0x{id}"),
            ],
        );
        assert_eq!(common::gnu_build_id(&built), id);
        // The comm is the file name.
        let named = work_dir().join(hot.trim_end_matches("_spin"));
        std::fs::copy(&built, &named).unwrap();
        named
    };
    let alpha = build("forged_alpha_spin");
    let beta = build("forged_beta_spin");
    assert_ne!(
        std::fs::read(&alpha).unwrap(),
        std::fs::read(&beta).unwrap()
    );
    let mut a = Command::new(&alpha).arg("30").spawn().unwrap();
    let mut b = Command::new(&beta).arg("30").spawn().unwrap();
    let run = record(
        "forged",
        &[
            "-p",
            &a.id().to_string(),
            "-p",
            &b.id().to_string(),
            "-d",
            "3",
        ],
    );
    let _ = (a.kill(), b.kill(), a.wait(), b.wait());
    run.assert_finished();
    let stacks = parse_folded(&run.folded);
    for (comm, own, other) in [
        ("forged_alpha", "forged_alpha_spin", "forged_beta_spin"),
        ("forged_beta", "forged_beta_spin", "forged_alpha_spin"),
    ] {
        let of_comm: Vec<_> = stacks.iter().filter(|(f, _)| f[0] == comm).collect();
        let total: u64 = of_comm.iter().map(|(_, n)| n).sum();
        let with = |name: &str| -> u64 {
            of_comm
                .iter()
                .filter(|(frames, _)| frames.iter().any(|f| f == name))
                .map(|(_, n)| n)
                .sum()
        };
        assert!(total >= 50, "{comm}: {total} samples");
        assert_eq!(
            with(other),
            0,
            "{comm} named after the other file:\n{}",
            run.folded
        );
        assert!(
            with(own) as f64 >= 0.6 * total as f64,
            "{comm}: {own} in {} of {total}",
            with(own)
        );
    }
}

#[test]
fn a_library_truncated_while_read_does_not_stop_the_agent() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let mapper = build_c("maps_exec.c", "maps_exec", &["-O1"]);
    // A real library with unwind tables (our libc), which the agent reads
    // for every process mapping it, while it is cut to nothing and rewritten.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc_path = maps
        .lines()
        .filter_map(|line| line.split_ascii_whitespace().nth(5))
        .find(|path| path.contains("libc.so"))
        .expect("libc is mapped");
    let original = std::fs::read(libc_path).unwrap();
    let library = work_dir().join("truncated_library.so");
    std::fs::write(&library, &original).unwrap();
    let _spinner = Spinner::start();
    let agent = Agent::start(true, &[]);
    agent.wait_for_samples_above(0);

    let stop = Arc::new(AtomicBool::new(false));
    let cuts = Arc::new(AtomicUsize::new(0));
    let truncator = {
        let (stop, cuts, library) = (stop.clone(), cuts.clone(), library.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                truncate_and_restore(&library, &original);
                cuts.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let started = Instant::now();
    let mut processes = 0;
    while started.elapsed() < Duration::from_secs(8) {
        // Its exit status does not matter: it may find the file empty.
        let _ = Command::new(&mapper)
            .arg(&library)
            .arg("150")
            .status()
            .unwrap();
        processes += 1;
    }
    stop.store(true, Ordering::Relaxed);
    truncator.join().unwrap();
    assert!(processes >= 10 && cuts.load(Ordering::Relaxed) >= 10);
    // Still sampling (the spinner, at least)...
    let before = agent.samples().expect("the agent still answers");
    agent.wait_for_samples_above(before + 50);
    // ... and it exits cleanly, not by a signal.
    let (status, stderr) = agent.terminate();
    assert!(status.success(), "exit {status}:\n{stderr}");
}

/// Cuts `path` to nothing, then writes `content` back, in place (same inode).
fn truncate_and_restore(path: &Path, content: &[u8]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    file.write_all(content).unwrap();
}
