//! Per-container profiles from a real container runtime: workloads in real
//! Docker containers (images from `docker import`, no registry), profiled by
//! `hostprof agent` on the host and by the image packaging/Dockerfile builds,
//! run the way packaging/kubernetes/daemonset.yaml runs it. Each container
//! must come out as its own `ResourceProfiles` whose `container.id` is the id
//! `docker inspect` gives, host processes in the host's.
// The serializing guard of `require_ebpf` spans whole tests on purpose,
// awaits included: each test owns its runtime, nothing else waits on that lock.
#![allow(clippy::await_holding_lock)]
mod common;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

use common::{
    MIN_SHARE_SAMPLES,
    collector::{
        Collector, assert_valid, location_names, resource_string, sample_count, sample_locations,
        sample_pid,
    },
    docker::{Container, Docker, bookworm_base},
    running::wait_for,
};
use hostprof_proto::collector::ExportProfilesServiceRequest;
use tokio::net::TcpListener;

/// The workload image: busybox and a static otlp_spin (hot leaf
/// `otlp_hot_loop`), imported from a directory. The host runs the same
/// binary: static and not position-independent, its addresses are its
/// symbols' values in every process.
const SPIN_IMAGE: &str = "hostprof-test/spin:latest";
/// How long the workloads spin at most; they are removed once checked.
const SPIN_SECONDS: &str = "120";

fn spin_program() -> PathBuf {
    common::build_c(
        "otlp_spin.c",
        "otlp_spin_static",
        &["-static", "-no-pie", "-O0", "-fno-omit-frame-pointer", "-g"],
    )
}

fn spin_image(docker: &Docker) {
    let root = common::work_dir().join("spin-image");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy(spin_program(), root.join("bin/otlp_spin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("busybox-static");
    for applet in ["sh", "renice"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    docker.import(&root, SPIN_IMAGE);
}

/// Two spinning containers (no network: they need none). With the host's
/// spinner, three on a 2-CPU machine would starve the agent: these two run
/// at the lowest priority.
fn start_workloads(docker: &'static Docker) -> [Container; 2] {
    spin_image(docker);
    let start = || {
        docker.start_container(&[
            "--network=none",
            SPIN_IMAGE,
            "/bin/sh",
            "-c",
            &format!("renice -n 19 $$ >/dev/null && exec /bin/otlp_spin {SPIN_SECONDS}"),
        ])
    };
    [start(), start()]
}

/// The same program on the host, outside any container.
fn start_host_spinner() -> Child {
    Command::new(spin_program())
        .arg(SPIN_SECONDS)
        .spawn()
        .unwrap()
}

/// The workload's function symbols, to name the locations the agent sent
/// with addresses only (it does while its symbolizer is behind, by design:
/// a first look at a binary, a starved host), and to check the names it sent.
struct Symbols(Vec<(u64, u64, String)>);

impl Symbols {
    fn load(path: &Path) -> Symbols {
        use object::{Object, ObjectSymbol, SymbolKind};
        let data = std::fs::read(path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        Symbols(
            file.symbols()
                .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.size() > 0)
                .map(|symbol| {
                    let start = symbol.address();
                    (
                        start,
                        start + symbol.size(),
                        symbol.name().unwrap().to_owned(),
                    )
                })
                .collect(),
        )
    }

    /// The names at `address` (aliases: `__libc_start_main` and
    /// `__libc_start_main_impl`), the first one first.
    fn names(&self, address: u64) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(start, end, _)| (*start..*end).contains(&address))
            .map(|(_, _, name)| name.as_str())
            .collect()
    }
}

/// What one resource group held of one process.
#[derive(Default, Debug)]
struct Seen {
    samples: u64,
    /// Of those, sent with function names (and those names right).
    named: u64,
    hot_leaf: u64,
    rooted: u64,
    /// A stack that is not rooted, leaf first.
    unrooted: String,
}

/// Samples of each of `pids` in `requests`, whatever their group.
fn samples_of(requests: &[ExportProfilesServiceRequest], pids: &[u32]) -> Vec<u64> {
    let mut counts = vec![0; pids.len()];
    for request in requests {
        let dictionary = request.dictionary.as_ref().unwrap();
        for group in &request.resource_profiles {
            for sample in &group.scope_profiles[0].profiles[0].samples {
                let pid = sample_pid(dictionary, sample);
                if let Some(at) = pids.iter().position(|&p| Some(i64::from(p)) == pid) {
                    counts[at] += sample_count(sample);
                }
            }
        }
    }
    counts
}

/// Waits until the collector holds [`MIN_SHARE_SAMPLES`] of each of `pids`
/// (false after `limit`, or once `alive` says the agent is gone).
fn wait_for_samples(
    collector: &Collector,
    pids: &[u32],
    limit: Duration,
    mut alive: impl FnMut() -> bool,
) -> bool {
    wait_for(limit, || {
        let counts = samples_of(&collector.requests(), pids);
        if counts.iter().all(|&count| count >= MIN_SHARE_SAMPLES) {
            Some(true)
        } else {
            (!alive()).then_some(false)
        }
    })
    .unwrap_or(false)
}

/// The shares a workload's samples must reach: CPU in its hot loop, and
/// stacks walked down to the program's `main`. Not to `_start` below it:
/// until the agent has built the unwind tables of every binary on the host
/// (seconds on a busy machine) it walks frame pointers, which the static
/// glibc's start code lacks (it counts those samples itself).
const MIN_HOT_SHARE: f64 = 0.9;
const MIN_ROOTED_SHARE: f64 = 0.95;

/// Checks every request, and that each container's process was sampled in a
/// group of its own (by `container.id` = `docker inspect`'s id), the host
/// process in the host group, and neither anywhere else.
fn assert_per_container(
    requests: &[ExportProfilesServiceRequest],
    containers: &[&Container],
    host_pid: u32,
) {
    assert_valid(requests);
    let symbols = Symbols::load(&spin_program());
    let ids: Vec<String> = containers.iter().map(|c| c.inspect("{{.Id}}")).collect();
    for (container, id) in containers.iter().zip(&ids) {
        assert_eq!(&container.id, id);
        assert_eq!(id.len(), 64, "docker's full id");
    }
    let pids: Vec<i64> = containers.iter().map(|c| i64::from(c.pid())).collect();
    let host_pid = i64::from(host_pid);
    // seen[i]: container i's process in its own group; last: host in host.
    let mut seen: Vec<Seen> = (0..=containers.len()).map(|_| Seen::default()).collect();
    for request in requests {
        let dictionary = request.dictionary.as_ref().unwrap();
        let host_groups = request
            .resource_profiles
            .iter()
            .filter(|group| resource_string(group, "container.id").is_none())
            .count();
        assert!(host_groups <= 1, "one host group per request");
        for group in &request.resource_profiles {
            assert_eq!(resource_string(group, "os.type").as_deref(), Some("linux"));
            let container = resource_string(group, "container.id");
            // Whose process may appear in this group: the container's own, or
            // (host group) the host's.
            let owner = match &container {
                Some(id) => ids.iter().position(|known| known == id),
                None => Some(containers.len()),
            };
            for sample in &group.scope_profiles[0].profiles[0].samples {
                let Some(pid) = sample_pid(dictionary, sample) else {
                    continue;
                };
                let Some(whose) = pids
                    .iter()
                    .position(|&p| p == pid)
                    .or((pid == host_pid).then_some(containers.len()))
                else {
                    continue;
                };
                assert_eq!(
                    owner,
                    Some(whose),
                    "pid {pid} sampled in the group of container {container:?}"
                );
                // One name per location, leaf first: ours, from the binary;
                // where the agent sent names, its outermost must be ours.
                let mut named = true;
                let frames: Vec<&str> = sample_locations(dictionary, sample)
                    .into_iter()
                    .map(|location| {
                        let ours = symbols.names(location.address);
                        match location_names(dictionary, location).last() {
                            Some(theirs) if !ours.is_empty() => {
                                assert!(ours.contains(&theirs.as_str()), "{theirs} {ours:?}")
                            }
                            Some(_) => {}
                            None => named = false,
                        }
                        ours.first().copied().unwrap_or("?")
                    })
                    .collect();
                let count = sample_count(sample);
                let seen = &mut seen[whose];
                seen.samples += count;
                seen.named += if named { count } else { 0 };
                if frames.first() == Some(&"otlp_hot_loop") {
                    seen.hot_leaf += count;
                }
                if frames.contains(&"main") {
                    seen.rooted += count;
                } else {
                    seen.unrooted = frames.join(";");
                }
            }
        }
    }
    for (at, seen) in seen.iter().enumerate() {
        let who = ids.get(at).map_or("the host", String::as_str);
        eprintln!("{who}: {seen:?}");
        assert!(
            seen.samples >= MIN_SHARE_SAMPLES,
            "{who}: too few samples in its group ({seen:?})"
        );
        let hot = seen.hot_leaf as f64 / seen.samples as f64;
        let rooted = seen.rooted as f64 / seen.samples as f64;
        assert!(hot >= MIN_HOT_SHARE, "{who}: hot share {hot:.3} ({seen:?})");
        assert!(
            rooted >= MIN_ROOTED_SHARE,
            "{who}: rooted share {rooted:.3} ({seen:?})"
        );
    }
}

/// Replaces the stand-in cgroup directories of earlier tests: two real
/// containers and a host process, `hostprof agent` on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_exports_each_docker_container_as_its_own_resource() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let Some(docker) = Docker::get() else {
        return;
    };
    let containers = start_workloads(docker);
    let mut host = start_host_spinner();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let collector = Collector::default();
    let server = collector.serve(listener);

    // Until each workload has its samples (a bound, not the wait), then
    // SIGTERM, which flushes.
    let mut agent = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostprof"))
        .args(["agent", "--duration", "300", "--report-interval", "1s"])
        .args(["--otlp-endpoint", &endpoint, "--service-name", "containers"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run hostprof agent");
    let agent_pid = agent.id().expect("the agent's pid");
    let pids = [containers[0].pid(), containers[1].pid(), host.id()];
    let enough = wait_for_samples(&collector, &pids, Duration::from_secs(240), || {
        matches!(agent.try_wait(), Ok(None))
    });
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(agent_pid as i32, libc::SIGTERM) };
    let output = agent
        .wait_with_output()
        .await
        .expect("wait for hostprof agent");
    let _ = host.kill();
    let _ = host.wait();
    server.abort();
    assert!(
        output.status.success(),
        "hostprof agent failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        enough,
        "fewer than {MIN_SHARE_SAMPLES} samples of a workload:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let requests = collector.requests();
    for group in requests.iter().flat_map(|r| &r.resource_profiles) {
        assert_eq!(
            resource_string(group, "service.name").as_deref(),
            Some("containers")
        );
    }
    assert_per_container(&requests, &[&containers[0], &containers[1]], host.id());
}

/// The directory `cargo xtask package` made for this machine's arch (the
/// tarball's content: the release binary and its files), from
/// HOSTPROF_PACKAGE_DIR, which `cargo xtask test` sets.
fn package_dir() -> Option<PathBuf> {
    match std::env::var("HOSTPROF_PACKAGE_DIR") {
        Ok(dir) => Some(PathBuf::from(dir)),
        Err(_) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!(
                "CI=true: HOSTPROF_PACKAGE_DIR must name the package directory (cargo xtask test sets it)"
            )
        }
        Err(_) => {
            eprintln!(
                "skipping: set HOSTPROF_PACKAGE_DIR to target/package/hostprof-VERSION-ARCH-linux \
                 (cargo xtask package makes it)"
            );
            None
        }
    }
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The `hostprof.toml` block of the ConfigMap (a YAML literal block).
fn configmap_toml() -> String {
    let configmap =
        std::fs::read_to_string(repo_file("packaging/kubernetes/configmap.yaml")).unwrap();
    let mut lines = configmap
        .lines()
        .skip_while(|line| !line.trim_start().starts_with("hostprof.toml: |"));
    lines.next();
    lines
        .take_while(|line| line.starts_with("    ") || line.is_empty())
        .map(|line| format!("{}\n", line.trim_start()))
        .collect()
}

/// The capabilities the DaemonSet adds (all others dropped), read from it so
/// the two cannot drift apart.
fn daemonset_capabilities() -> Vec<String> {
    let daemonset =
        std::fs::read_to_string(repo_file("packaging/kubernetes/daemonset.yaml")).unwrap();
    let caps: Vec<String> = daemonset
        .lines()
        .skip_while(|line| line.trim() != "add:")
        .skip(1)
        .map_while(|line| line.trim().strip_prefix("- "))
        .map(str::to_owned)
        .collect();
    assert!(caps.contains(&"BPF".to_owned()), "{caps:?}");
    caps
}

/// The DaemonSet's CPU and memory limits, as `docker run` takes them
/// (`--cpus` in CPUs, `--memory` in bytes).
fn daemonset_limits() -> (f64, u64) {
    let daemonset =
        std::fs::read_to_string(repo_file("packaging/kubernetes/daemonset.yaml")).unwrap();
    let limits: Vec<(&str, &str)> = daemonset
        .lines()
        .skip_while(|line| line.trim() != "limits:")
        .skip(1)
        .map_while(|line| line.trim().split_once(": "))
        .collect();
    let get = |key: &str| {
        limits
            .iter()
            .find(|(k, _)| *k == key)
            .unwrap_or_else(|| panic!("no {key} limit in the DaemonSet"))
            .1
    };
    let cpu = match get("cpu").strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().unwrap() / 1000.0,
        None => get("cpu").parse().unwrap(),
    };
    let memory = get("memory");
    let (number, unit) = memory.split_at(memory.find(|c: char| !c.is_ascii_digit()).unwrap());
    let scale = match unit {
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("memory unit {other}"),
    };
    (cpu, number.parse::<u64>().unwrap() * scale)
}

/// Whether capability number `cap` is in this process's bounding set.
fn in_bounding_set(cap: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .expect("CapBnd in /proc/self/status");
    mask & (1 << cap) != 0
}

/// packaging/Dockerfile built for real (from the packaged binary, on a
/// bookworm base imported from debootstrap) and run as the DaemonSet runs
/// it: host pid namespace, only its capabilities, read-only root, uid 0,
/// no privilege escalation, seccomp/AppArmor unconfined, its CPU and memory
/// limits (the agent must live within them), the ConfigMap at /etc/hostprof and the host's /sys/kernel and
/// /usr/lib/debug read-only. One difference: the host network (the tests'
/// daemon has no bridge, and the collector listens on 127.0.0.1 only); in a
/// cluster the pod reaches the collector's Service over the pod network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemonset_image_profiles_the_other_containers() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let Some(package) = package_dir() else {
        return;
    };
    let Some(docker) = Docker::get() else {
        return;
    };
    assert!(
        package.join("hostprof").is_file(),
        "{} holds no hostprof binary",
        package.display()
    );
    let base = "hostprof-test/bookworm-minbase:latest";
    bookworm_base(docker, base);
    let image = "hostprof:test";
    // The legacy builder: the single-stage Dockerfile needs nothing more, and
    // both Debian's docker.io client and newer ones without buildx have it.
    let build = docker
        .command()
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "--quiet", "-t", image, "-f"])
        .arg(repo_file("packaging/Dockerfile"))
        .args(["--build-arg", &format!("RUNTIME_IMAGE={base}")])
        .arg(&package)
        .output()
        .expect("run docker build");
    assert!(
        build.status.success(),
        "docker build failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );

    let config = common::work_dir().join("daemonset-config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("hostprof.toml"), configmap_toml()).unwrap();
    // hostPath type DirectoryOrCreate.
    std::fs::create_dir_all("/usr/lib/debug").unwrap();

    let containers = start_workloads(docker);
    let mut host = start_host_spinner();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let collector = Collector::default();
    let server = collector.serve(listener);

    let mut args: Vec<String> = [
        "--pid=host",
        "--network=host",
        "--read-only",
        "--user=0",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--security-opt=seccomp=unconfined",
        "--security-opt=apparmor=unconfined",
        "--volume=/sys/kernel:/sys/kernel:ro",
        "--volume=/usr/lib/debug:/usr/lib/debug:ro",
        "--env=OTEL_SERVICE_NAME=hostprof",
        "--env=OTEL_RESOURCE_ATTRIBUTES=k8s.node.name=test-node",
        // Windows of 2 s instead of the ConfigMap's 5, to keep the test short.
        "--env=HOSTPROF_REPORT_INTERVAL=2",
    ]
    .map(str::to_owned)
    .to_vec();
    // Debian bookworm's Docker (20.10) predates CAP_BPF, CAP_PERFMON and
    // CAP_CHECKPOINT_RESTORE and refuses them by name: SYS_ADMIN, which
    // covers the first two, stands in for the three (containerd, which the
    // kubelet drives, takes them as they are).
    let mut caps = daemonset_capabilities();
    let newer = ["BPF", "PERFMON", "CHECKPOINT_RESTORE"];
    caps.retain(|cap| !newer.contains(&cap.as_str()));
    caps.push("SYS_ADMIN".into());
    // A container cannot get what its runtime lacks: some sandboxes (this
    // project's CI machines among them) withhold CAP_SYS_RESOURCE (24), which
    // the agent needs only for RLIMIT_MEMLOCK on kernels before 5.11.
    if !in_bounding_set(24) {
        eprintln!("CAP_SYS_RESOURCE is not in this process's bounding set: not added");
        caps.retain(|cap| cap != "SYS_RESOURCE");
    }
    args.extend(caps.iter().map(|cap| format!("--cap-add={cap}")));
    let (cpu, memory) = daemonset_limits();
    args.push(format!("--cpus={cpu}"));
    args.push(format!("--memory={memory}"));
    args.push(format!("--volume={}:/etc/hostprof:ro", config.display()));
    args.push(format!(
        "--env=OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{port}"
    ));
    args.extend([image, "agent", "--config", "/etc/hostprof/hostprof.toml"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = docker.start_container(&args);

    // Until each workload has its samples, then SIGTERM (what the kubelet
    // sends) must flush and end the agent cleanly. An agent that died
    // (killed at its memory limit) sends nothing more.
    let pids = [containers[0].pid(), containers[1].pid(), host.id()];
    let arrived = wait_for_samples(&collector, &pids, Duration::from_secs(240), || {
        agent.inspect("{{.State.Running}}") == "true"
    });
    docker.run(&["stop", "--time", "30", &agent.id]);
    let exit = agent.wait(Duration::from_secs(5));
    let logs = agent.logs();
    assert_eq!(
        agent.inspect("{{.State.OOMKilled}}"),
        "false",
        "the agent was killed at the DaemonSet's memory limit ({memory} bytes):\n{logs}"
    );
    let _ = host.kill();
    let _ = host.wait();
    server.abort();
    assert!(arrived, "the workloads never arrived:\n{logs}");
    assert_eq!(exit, Some(0), "the agent's exit code:\n{logs}");
    // The ConfigMap asks for JSON logs. (The unwinder's closing summary,
    // `hostprof: user stacks: ...`, is still plain text.)
    assert!(
        logs.lines()
            .filter(|line| !line.starts_with("hostprof: "))
            .all(|line| line.starts_with('{')),
        "not JSON lines:\n{logs}"
    );
    assert!(
        logs.lines()
            .any(|line| line.starts_with('{') && line.contains("hostprof agent stopped (SIGTERM)")),
        "no JSON line saying the agent stopped:\n{logs}"
    );
    let requests = collector.requests();
    for group in requests.iter().flat_map(|r| &r.resource_profiles) {
        assert_eq!(
            resource_string(group, "k8s.node.name").as_deref(),
            Some("test-node")
        );
    }
    assert_per_container(&requests, &[&containers[0], &containers[1]], host.id());
}
