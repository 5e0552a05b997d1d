//! `hostprof top` on a real terminal (tmux), with the real eBPF sampler:
//! the designed hot function of a test program is the top row, the keys
//! switch sort, view and filter, `q` and Ctrl-C quit with the terminal put
//! back; host-wide, a container filter finds the program in its container;
//! `t` ranks the traces of an OpenTelemetry thread-context writer; bad
//! starts fail in one line.
mod common;

use std::{
    path::PathBuf,
    process::{Child, Command},
};

use common::{cgroup::ContainerCgroup, tmux::Tmux, *};

/// `cpu_split` (hot_work 75%, cold_work 25%) named `comm`, spinning for a minute.
fn spin(comm: &str) -> Child {
    let program = work_dir().join(comm);
    let built = build_c(
        "cpu_split.c",
        "cpu_split_top",
        &["-O0", "-fno-omit-frame-pointer", "-g"],
    );
    std::fs::copy(built, &program).expect("copy test program");
    Command::new(&program)
        .arg("60")
        .spawn()
        .expect("start spinner")
}

/// Stops the spinners when the test ends, failed or not.
struct Spinners(Vec<Child>);

impl Drop for Spinners {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The shell line tmux runs: top, then its exit status and whether the
/// terminal is back in canonical mode (raw mode turns `icanon` off).
fn top_command(args: &str) -> String {
    format!(
        "{} top {args}; echo \"top exited with $?\"; \
         stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon; exec cat",
        env!("CARGO_BIN_EXE_hostprof")
    )
}

/// The table's rows on `screen`, each split into words.
fn rows(screen: &str) -> Vec<Vec<String>> {
    screen
        .lines()
        .skip_while(|line| !(line.contains("%TOTAL") || line.contains("WEIGHT")))
        .skip(1)
        // A table that fills the window ends right above the key help,
        // with no blank line between: a row starts with a number.
        .take_while(|line| {
            line.split_whitespace()
                .next()
                .is_some_and(|first| first.parse::<f64>().is_ok())
        })
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// The function of the top row in the functions view, with its %SELF and %TOTAL.
fn top_function(screen: &str) -> Option<(String, f64, f64)> {
    let row = rows(screen).into_iter().next()?;
    Some((
        row.get(4)?.clone(),
        row[0].parse().ok()?,
        row[1].parse().ok()?,
    ))
}

/// The %SELF of every row of `function`, added up.
fn self_share_of(screen: &str, function: &str) -> f64 {
    rows(screen)
        .iter()
        .filter(|row| row.get(4).is_some_and(|name| name == function))
        .filter_map(|row| row[0].parse::<f64>().ok())
        .sum()
}

/// The samples the title says the view shows (`…, 340 shown in 2 processes`):
/// the filter's, where one is set.
fn shown(screen: &str) -> Option<u64> {
    screen
        .split(" shown in ")
        .next()?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// The line under the title: view, sort and filter.
fn state_line(screen: &str) -> &str {
    screen.lines().nth(1).unwrap_or_default()
}

/// The first byte of a trace id the thread-context writer makes (sixteen
/// bytes counting up by one from the first), or None for any other text.
fn writer_trace(id: &str) -> Option<u8> {
    let bytes: Vec<u8> = (0..id.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(id.get(at..at + 2)?, 16).ok())
        .collect::<Option<_>>()?;
    let first = *bytes.first()?;
    (bytes.len() == 16
        && first >= 0x10
        && bytes
            .iter()
            .enumerate()
            .all(|(at, &byte)| usize::from(byte) == usize::from(first) + at))
    .then_some(first)
}

/// Where the test leaves the screen it captured, for the README.
fn capture_path() -> PathBuf {
    work_dir().join("top-screen.txt")
}

/// The screen after `q`: top exited 0 and the terminal is cooked again, the
/// full-screen view gone.
fn assert_clean_exit(tmux: &Tmux) {
    let screen = tmux.wait_for("exit", 30, |screen| {
        screen
            .lines()
            .any(|line| line == "icanon" || line == "-icanon")
            .then(|| screen.to_owned())
    });
    assert!(screen.contains("top exited with 0"), "{screen}");
    assert!(
        screen.lines().any(|line| line == "icanon"),
        "the terminal was left in raw mode:\n{screen}"
    );
    assert!(
        !screen.contains("q quit") && !screen.contains("%TOTAL"),
        "the full-screen view is still shown:\n{screen}"
    );
}

#[test]
fn top_ranks_the_hot_function_and_follows_the_keys() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    if !require_tool("tmux") {
        return;
    }
    let spinners = Spinners(vec![spin("top_spin_a"), spin("top_spin_b")]);
    let (a, b) = (spinners.0[0].id(), spinners.0[1].id());
    // README-sized, so its capture can go there as it is.
    let tmux = Tmux::start_sized(
        &format!("hostprof-top-{}", std::process::id()),
        (120, 24),
        &top_command(&format!("-F 199 -p {a} -p {b}")),
    );
    // The designed split: hot_work holds ~75% of both programs' samples
    // (one row per program: their files differ), judged on enough of them.
    let screen = tmux.wait_for("hot_work on top with its share", 60, |screen| {
        let (function, _, _) = top_function(screen)?;
        let hot = self_share_of(screen, "hot_work");
        (function == "hot_work"
            && shown(screen)? >= MIN_SHARE_SAMPLES
            && (60.0..=90.0).contains(&hot))
        .then(|| screen.to_owned())
    });
    assert!(
        screen.starts_with(&format!(
            "hostprof top: pid {a}, {b} at 199 Hz, last 10 s: "
        )),
        "{screen}"
    );
    assert_eq!(state_line(&screen), "functions by self share");
    let cold = self_share_of(&screen, "cold_work");
    assert!((10.0..=40.0).contains(&cold), "{screen}");

    // s: by total share, where main and its callers hold everything.
    tmux.keys(&["s"]);
    let screen = tmux.wait_for("sort by total", 10, |screen| {
        let (function, _, total) = top_function(screen)?;
        (state_line(screen) == "functions by total share" && function != "hot_work")
            .then(|| (screen.to_owned(), total))
    });
    assert!(
        screen.1 > 99.0,
        "top row by total is not everything:\n{}",
        screen.0
    );

    // v: whole stacks, the hot one first, leaf first.
    tmux.keys(&["v"]);
    let screen = tmux.wait_for("stacks view", 10, |screen| {
        (state_line(screen) == "stacks, leaf first" && !rows(screen).is_empty())
            .then(|| screen.to_owned())
    });
    let top = &rows(&screen)[0];
    assert_eq!(top[5..8], ["hot_work", "<", "main"], "{screen}");

    // Both programs are listed; a pid filter keeps one.
    tmux.keys(&["v", "s"]);
    tmux.wait_for("both processes", 10, |screen| {
        screen.contains(" shown in 2 processes,").then_some(())
    });
    tmux.keys(&["/"]);
    tmux.type_text(&format!("pid:{b}"));
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the filtered view", 10, |screen| {
        (state_line(screen) == format!("functions by self share, filter: pid:{b}")
            && screen.contains(" shown in 1 processes,"))
        .then(|| screen.to_owned())
    });
    let processes: Vec<String> = rows(&screen)
        .iter()
        .map(|row| row[row.len() - 3..row.len() - 1].join(" "))
        .collect();
    assert!(
        !processes.is_empty() && processes.iter().all(|p| *p == format!("top_spin_b {b}")),
        "{screen}"
    );
    // Esc: everything again; by now the window is well filled, and the
    // screen is kept for the README.
    tmux.keys(&["Escape"]);
    let screen = tmux.wait_for("no filter, 300 samples", 60, |screen| {
        let samples: u64 = screen
            .split(" last 10 s: ")
            .nth(1)?
            .split(' ')
            .next()?
            .parse()
            .ok()?;
        (state_line(screen) == "functions by self share"
            && screen.contains(" shown in 2 processes,")
            && top_function(screen)?.0 == "hot_work"
            && samples >= 300)
            .then(|| screen.to_owned())
    });
    let trimmed: Vec<&str> = screen.lines().map(str::trim_end).collect();
    std::fs::write(capture_path(), trimmed.join("\n") + "\n").expect("save the screen");

    tmux.keys(&["q"]);
    assert_clean_exit(&tmux);
}

#[test]
fn top_host_wide_finds_the_program_in_its_container() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    if !require_tool("tmux") {
        return;
    }
    let cgroup = ContainerCgroup::create();
    let spinners = Spinners(vec![spin("top_boxed")]);
    cgroup.add(spinners.0[0].id());
    let short = &cgroup.id[..12];
    let tmux = Tmux::start(
        &format!("hostprof-top-host-{}", std::process::id()),
        &top_command("-F 199"),
    );
    tmux.wait_for("the host-wide view", 60, |screen| {
        screen
            .starts_with("hostprof top: host-wide at 199 Hz")
            .then_some(())
    });
    tmux.keys(&["/"]);
    tmux.type_text(&format!("container:{short}"));
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("hot_work in the container", 60, |screen| {
        let (function, self_share, _) = top_function(screen)?;
        (function == "hot_work"
            && shown(screen)? >= MIN_SHARE_SAMPLES
            && (60.0..=90.0).contains(&self_share))
        .then(|| screen.to_owned())
    });
    let row = &rows(&screen)[0];
    assert_eq!(
        row[row.len() - 3..],
        ["top_boxed", &spinners.0[0].id().to_string(), short],
        "{screen}"
    );
    // Ctrl-C quits too (raw mode makes it a key, not a signal).
    tmux.keys(&["C-c"]);
    assert_clean_exit(&tmux);
    drop(spinners);
    drop(cgroup);
}

#[test]
fn top_ranks_the_traces_of_a_thread_context_writer() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    if !require_tool("tmux") {
        return;
    }
    let writer = build_otel_writer();
    // Three threads, each in its own trace (`1011…1f`, `2021…2f`,
    // `3031…3f`), a new span every 12 ms and the trace's first byte one up
    // every 256 spans (about 3 s); no stop file.
    let writing = Spinners(vec![
        Command::new(&writer)
            .arg(work_dir().join("top_traces.log"))
            .arg(work_dir().join("top_traces.never"))
            .args(["60", "3"])
            .spawn()
            .expect("start the writer"),
    ]);
    let pid = writing.0[0].id();
    let tmux = Tmux::start(
        &format!("hostprof-top-traces-{}", std::process::id()),
        &top_command(&format!("-F 499 -p {pid}")),
    );
    tmux.wait_for("the first samples", 60, |screen| {
        top_function(screen).map(|_| ())
    });
    tmux.keys(&["t"]);
    // Which traces are in the window depends on how long top took to
    // start, so every id the writer makes is accepted, and each of the
    // three threads must show one (the first byte's high nibble is the
    // thread's for the writer's first 48 s).
    let screen = tmux.wait_for("the writer's three threads' traces", 60, |screen| {
        let threads: std::collections::BTreeSet<u8> = rows(screen)
            .iter()
            .filter_map(|row| writer_trace(&row[2]))
            .map(|first| first >> 4)
            .collect();
        (state_line(screen) == "trace ids, busiest first"
            && [1, 2, 3].iter().all(|thread| threads.contains(thread)))
        .then(|| screen.to_owned())
    });
    for row in rows(&screen) {
        // The spans burn CPU in burn_until, the detached gaps too.
        assert_eq!(row[3], "burn_until", "{screen}");
        assert!(
            writer_trace(&row[2]).is_some() || row[2] == "(none)",
            "{screen}"
        );
    }
    // From a trace to its functions: filter by the busiest trace's prefix
    // (a whole span of it is in the window, so it stays there for seconds),
    // then `v`.
    let busiest = rows(&screen)
        .into_iter()
        .map(|row| row[2].clone())
        .find(|id| writer_trace(id).is_some())
        .expect("a trace on the screen");
    let filter = format!("trace:{}", &busiest[..8]);
    tmux.keys(&["/"]);
    tmux.type_text(&filter);
    tmux.keys(&["Enter", "v"]);
    tmux.wait_for("the trace's functions", 30, |screen| {
        (state_line(screen) == format!("functions by self share, filter: {filter}")
            && top_function(screen)?.0 == "burn_until")
            .then_some(())
    });
    tmux.keys(&["q"]);
    assert_clean_exit(&tmux);
    drop(writing);
}

#[test]
fn top_refuses_bad_starts_in_one_line() {
    // Not a terminal: stdout is a pipe here.
    let output = hostprof().arg("top").output().expect("run top");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("hostprof: error: hostprof top needs a terminal")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
    // A pid that is gone.
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    let output = hostprof()
        .args(["top", "-p", &pid.to_string()])
        .output()
        .expect("run top");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.trim_end(),
        format!("hostprof: error: no process with pid {pid}: check it with `ps -p {pid}`")
    );
}

#[test]
fn top_without_privileges_says_so_on_the_terminal() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !require_tool("tmux") || !require_tool("setpriv") {
        eprintln!("skipping: needs root to become an unprivileged user");
        return;
    }
    let tmux = Tmux::start(
        &format!("hostprof-top-nobody-{}", std::process::id()),
        &format!(
            "setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all {}",
            top_command("")
        ),
    );
    let screen = tmux.wait_for("exit", 30, |screen| {
        screen
            .contains("top exited with")
            .then(|| screen.to_owned())
    });
    assert!(screen.contains("top exited with 1"), "{screen}");
    let errors: Vec<&str> = screen
        .lines()
        .filter(|line| line.starts_with("hostprof: "))
        .collect();
    assert_eq!(errors.len(), 1, "{screen}");
    // Long lines wrap on the terminal.
    let joined = screen.replace('\n', "");
    assert!(
        errors[0].starts_with("hostprof: error: permission denied")
            && joined.contains("run as root"),
        "{screen}"
    );
}

/// The state letter of a process (`/proc/PID/stat`), `None` once it is gone.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

#[test]
fn top_outside_the_terminals_session_exits_when_the_terminal_goes_away() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    if !require_tool("tmux") || !require_tool("setsid") {
        return;
    }
    let spinners = Spinners(vec![spin("top_spin_hup")]);
    let target = spinners.0[0].id();
    // In a session of its own (setsid), as under nohup or a job runner:
    // the terminal's hangup sends it no SIGHUP.
    let tmux = Tmux::start(
        &format!("hostprof-top-hup-{}", std::process::id()),
        &format!(
            "setsid -w {} top -F 199 -p {target}",
            env!("CARGO_BIN_EXE_hostprof")
        ),
    );
    tmux.wait_for("the first screen", 30, |screen| {
        screen.contains("hostprof top:").then_some(())
    });
    // top's pid: the hostprof whose command line names this target.
    let wanted = format!(" top -F 199 -p {target} ");
    let top = std::fs::read_dir("/proc")
        .expect("list /proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let is_hostprof = std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|exe| exe.ends_with("hostprof"));
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            is_hostprof
                && String::from_utf8_lossy(&cmdline)
                    .replace('\0', " ")
                    .contains(&wanted)
        })
        .expect("top's process");
    drop(tmux);
    // Gone (or a zombie waiting for its parent) within the grace period
    // and a refresh or two, not spinning on the dead terminal.
    let ended = common::running::wait_for(std::time::Duration::from_secs(15), || {
        matches!(process_state(top), None | Some('Z')).then_some(())
    });
    assert!(
        ended.is_some(),
        "top (pid {top}) still runs after its terminal closed: state {:?}",
        process_state(top)
    );
}
