//! `hostprof agent` as a service: configuration errors, the metrics endpoint,
//! and its lifecycle with the real eBPF programs (SIGTERM leaves no program
//! behind; a second agent on the host does not disturb the first).
mod common;

use common::{
    hostprof,
    running::{Agent, Spinner},
};

/// Ids of the BPF programs `pid` holds open (`prog_id:` in its fds' fdinfo).
fn held_program_ids(pid: u32) -> Vec<u32> {
    held_ids(pid, "prog_id:")
}

/// Ids of the BPF objects `pid` holds open, by their fdinfo field.
fn held_ids(pid: u32, field: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    for fd in fds.flatten() {
        let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
        ids.extend(
            info.lines()
                .filter_map(|line| line.strip_prefix(field))
                .filter_map(|id| id.trim().parse::<u32>().ok()),
        );
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Kernel memory of the BPF maps `pid` holds open: the `memlock` of each
/// map (by `map_id`, once however many fds it has) in its fds' fdinfo.
fn held_map_bytes(pid: u32) -> u64 {
    let mut maps = std::collections::BTreeMap::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .expect("fdinfo")
        .flatten()
    {
        let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|value| value.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(bytes)) = (field("map_id:"), field("memlock:")) {
            maps.insert(id, bytes);
        }
    }
    maps.values().sum()
}

/// How many BPF links (each perf event's attachment, each tracepoint's)
/// `pid` holds open.
fn bpf_link_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.as_os_str() == "anon_inode:bpf_link")
                })
                .count()
        })
        .unwrap_or(0)
}

/// (thread name, CapEff, CapPrm) of every thread of `pid`.
fn thread_capabilities(pid: u32) -> Vec<(String, u64, u64)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .flatten()
    {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
                .unwrap_or(u64::MAX)
        };
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        threads.push((name.trim().to_owned(), field("CapEff:"), field("CapPrm:")));
    }
    threads
}

/// (thread name, nice) of every thread of `pid`.
fn thread_nices(pid: u32) -> Vec<(String, i64)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .flatten()
    {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the name (which may hold spaces): state is 3rd,
        // nice the 19th.
        let after = stat.rsplit_once(") ").map_or("", |(_, after)| after);
        let nice = after
            .split(' ')
            .nth(16)
            .and_then(|nice| nice.parse().ok())
            .unwrap_or(i64::MAX);
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        threads.push((name.trim().to_owned(), nice));
    }
    threads
}

/// Every BPF program loaded in the kernel, by id.
fn loaded_program_ids() -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|program| program.id())
        .collect()
}

/// Inodes of the sockets `pid` holds that listen on TCP.
fn listening_sockets(pid: u32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter_map(|fd| {
                    let target = std::fs::read_link(fd.path()).ok()?;
                    let target = target.to_str()?;
                    Some(
                        target
                            .strip_prefix("socket:[")?
                            .strip_suffix(']')?
                            .to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut listening = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
        {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // State 0A is LISTEN; field 9 is the inode.
            if fields.get(3) == Some(&"0A")
                && fields.get(9).is_some_and(|i| inodes.iter().any(|x| x == i))
            {
                listening.push(fields[1].to_owned());
            }
        }
    }
    listening
}

#[test]
fn sigterm_detaches_every_bpf_program_and_exits() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let _spinner = Spinner::start();
    let agent = Agent::start(true, &["--off-cpu"]);
    agent.wait_for_samples_above(0);

    let held = held_program_ids(agent.pid());
    // The CPU sampler and the off-CPU tracepoint, at least.
    assert!(held.len() >= 2, "programs held: {held:?}");
    let loaded = loaded_program_ids();
    // The control: while the agent runs, the kernel lists them.
    assert!(
        held.iter().all(|id| loaded.contains(id)),
        "held {held:?}, loaded {loaded:?}"
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // One perf event link per CPU, plus the tracepoint's.
    assert!(bpf_link_fds(agent.pid()) > cpus);
    // The kernel memory of its maps, as it reports it and as /proc says:
    // the same maps, none of which grows (a few KiB of slack for a map
    // the kernel might size differently between the readings).
    let reported = agent
        .metric("hostprof_bpf_map_bytes")
        .expect("hostprof_bpf_map_bytes");
    let held_bytes = held_map_bytes(agent.pid());
    assert!(reported > 1 << 20, "hostprof_bpf_map_bytes {reported}");
    assert!(
        reported.abs_diff(held_bytes) <= 64 << 10,
        "hostprof_bpf_map_bytes {reported}, /proc/{}/fdinfo says {held_bytes}",
        agent.pid()
    );

    // After setup every thread has given up loading programs and opening
    // perf events (and every other capability but the four it reads with)...
    let tasks = thread_capabilities(agent.pid());
    assert!(tasks.len() >= 3, "{tasks:?}");
    for (thread, effective, permitted) in &tasks {
        for (bit, name) in [(21, "CAP_SYS_ADMIN"), (38, "CAP_PERFMON"), (39, "CAP_BPF")] {
            assert_eq!(effective & (1 << bit), 0, "{thread} still has {name}");
            assert_eq!(permitted & (1 << bit), 0, "{thread} may regain {name}");
        }
        assert_ne!(effective & (1 << 19), 0, "{thread} lost CAP_SYS_PTRACE");
        assert_eq!(effective & (1 << 23), 0, "{thread} still has CAP_SYS_NICE");
    }
    // Without CAP_SYS_NICE, the table thread still runs ahead of the
    // host's busy processes (within its CPU budget); the others do not.
    let nice = thread_nices(agent.pid());
    let tables = nice.iter().find(|(thread, _)| thread == "hostprof-unwind");
    assert_eq!(tables.map(|(_, nice)| *nice), Some(-20), "{nice:?}");
    let raised = nice.iter().filter(|(_, nice)| *nice < 0).count();
    assert_eq!(raised, 1, "{nice:?}");
    // ... and still samples and reads its counters.
    let now = agent.wait_for_samples_above(0);
    agent.wait_for_samples_above(now);

    let (status, stderr) = agent.terminate();
    assert!(status.success(), "exit {status}:\n{stderr}");
    assert!(stderr.contains("stopped (SIGTERM)"), "{stderr}");
    let loaded = loaded_program_ids();
    let left: Vec<&u32> = held.iter().filter(|id| loaded.contains(id)).collect();
    assert!(left.is_empty(), "programs left behind: {left:?}");
}

#[test]
fn a_second_agent_does_not_disturb_the_first() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let _spinner = Spinner::start();
    let first = Agent::start(true, &[]);
    let before = first.wait_for_samples_above(0);
    let first_programs = held_program_ids(first.pid());

    // The second one, without --metrics-addr: it must not listen at all.
    let second = Agent::start(false, &[]);
    second.wait_for_samples_above(0);
    assert!(
        listening_sockets(second.pid()).is_empty(),
        "an agent without --metrics-addr listens: {:?}",
        listening_sockets(second.pid())
    );
    assert_eq!(listening_sockets(first.pid()).len(), 1);
    let during = first.wait_for_samples_above(before);

    let (status, stderr) = second.terminate();
    assert!(status.success(), "second agent: exit {status}:\n{stderr}");
    // The first keeps sampling with its own programs.
    first.wait_for_samples_above(during + 10);
    let loaded = loaded_program_ids();
    assert!(first_programs.iter().all(|id| loaded.contains(id)));
    let (status, stderr) = first.terminate();
    assert!(status.success(), "first agent: exit {status}:\n{stderr}");
    assert!(stderr.contains("status samples="), "{stderr}");
}

#[test]
fn bad_configuration_is_one_line_naming_the_key() {
    let dir = common::work_dir().join("agent-config");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "frequency = 19\nexport-queue-mb = 64\n").unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, "frequency = 49\nmetrics-addr = \":9999\"\n").unwrap();

    /// Arguments, environment, and what the one error line must say.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 4] = [
        (
            &["--config", bad.to_str().unwrap()],
            &[],
            "unknown key `export-queue-mb`",
        ),
        (&[], &[("HOSTPROF_OFF_CPU", "perhaps")], "HOSTPROF_OFF_CPU"),
        (&["--frequency", "0"], &[], "--frequency"),
        (
            &["--config", "/nonexistent/hostprof.toml"],
            &[],
            "cannot read the configuration file /nonexistent/hostprof.toml",
        ),
    ];
    for (args, env, expected) in cases {
        let output = hostprof()
            .arg("agent")
            .args(args)
            .envs(env.iter().copied())
            .output()
            .expect("run hostprof");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} {env:?} was accepted");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }

    // A good file through HOSTPROF_CONFIG, overridden by a flag.
    let output = hostprof()
        .args(["agent", "--print-config", "-F", "7"])
        .env("HOSTPROF_CONFIG", &good)
        .output()
        .expect("run hostprof");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{printed}");
    assert!(
        printed.contains("frequency = 7  # command line"),
        "{printed}"
    );
    assert!(
        printed.contains("metrics-addr = \"127.0.0.1:9999\""),
        "{printed}"
    );
}

#[test]
fn unprivileged_users_cannot_open_the_agents_maps() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let probe = common::build_c("bpf_map_by_id.c", "bpf_map_by_id", &["-O1"]);
    let agent = Agent::start(false, &[]);
    agent.wait_for_samples_above(0);
    let maps = held_ids(agent.pid(), "map_id:");
    assert!(maps.len() >= 3, "maps held: {maps:?}");
    let ids: Vec<String> = maps.iter().map(u32::to_string).collect();
    let opened = |uid: Option<u32>| {
        let mut command = std::process::Command::new(&probe);
        command.args(&ids);
        if let Some(uid) = uid {
            std::os::unix::process::CommandExt::uid(&mut command, uid);
            std::os::unix::process::CommandExt::gid(&mut command, uid);
        }
        let output = common::run_ok(&mut command);
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    // The control: root can, so the ids and the probe are right.
    let as_root = opened(None);
    assert_eq!(as_root.matches(" ok").count(), ids.len(), "{as_root}");
    // nobody gets EPERM (1) for every one of them.
    let as_nobody = opened(Some(65534));
    for line in as_nobody.lines() {
        assert!(line.ends_with(" 1"), "nobody opened a map: {line}");
    }
    assert_eq!(as_nobody.lines().count(), ids.len());
    let (status, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
}
