//! Service identity, end to end with the real eBPF sampler: `hostprof agent`
//! against an in-test collector, with a C program that publishes an
//! OpenTelemetry process context (OTEP 4719's `OTEL_CTX` memfd) and
//! republishes it once, and a program named only by `OTEL_SERVICE_NAME` /
//! `OTEL_RESOURCE_ATTRIBUTES` in its environment. The collector's requests
//! are decoded by the generated protobuf types, not the agent's builder.
//! Hostile publishers are refused, counted, and sampled all the same.
// The serializing guard of `require_ebpf` spans whole tests on purpose,
// awaits included: each test owns its runtime, nothing else waits on that lock.
#![allow(clippy::await_holding_lock)]
mod common;

use std::time::{Duration, Instant};

use common::{
    collector::{Collector, assert_valid, resource_string, sampled_pids},
    running::{Agent, KillOnDrop, wait_for},
};
use hostprof_proto::collector::ExportProfilesServiceRequest;
use tokio::net::TcpListener;

/// How long any one thing may take to show in the collector.
const SHOW_WITHIN: Duration = Duration::from_secs(60);

/// Whether some resource says `service.name` = `name` (and, when given,
/// `service.instance.id` = `instance`) and holds samples of `pid`.
fn named(
    requests: &[ExportProfilesServiceRequest],
    pid: u32,
    name: &str,
    instance: Option<&str>,
) -> bool {
    requests.iter().any(|request| {
        let dictionary = request.dictionary.as_ref().expect("a dictionary");
        request.resource_profiles.iter().any(|group| {
            resource_string(group, "service.name").as_deref() == Some(name)
                && instance.is_none_or(|id| {
                    resource_string(group, "service.instance.id").as_deref() == Some(id)
                })
                && sampled_pids(dictionary, group).contains(&i64::from(pid))
        })
    })
}

/// Polls the collector until `check` holds of what it received.
async fn wait_until(
    collector: &Collector,
    what: &str,
    check: impl Fn(&[ExportProfilesServiceRequest]) -> bool,
) {
    let start = Instant::now();
    while !check(&collector.requests()) {
        assert!(
            start.elapsed() < SHOW_WITHIN,
            "{what} did not show within {SHOW_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An in-test collector and `hostprof agent` (1 s windows, its own service
/// name `agent-default`) exporting to it, with `extra` arguments.
async fn start_agent(extra: &[&str]) -> (Collector, tokio::task::JoinHandle<()>, KillOnDrop) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let collector = Collector::default();
    let server = collector.serve(listener);
    let agent = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_hostprof"))
            .args(["agent", "--duration", "120", "--report-interval", "1s"])
            .args(["--otlp-endpoint", &endpoint])
            .args(["--service-name", "agent-default"])
            .args(extra)
            .env_remove("OTEL_SERVICE_NAME")
            .env_remove("OTEL_RESOURCE_ATTRIBUTES")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start hostprof agent"),
    );
    (collector, server, agent)
}

/// A CPU-bound program named by its environment only; `%2C` is a comma,
/// %-decoded as the SDK specification says.
fn start_env_named(spinner: &std::path::Path, name: &str) -> KillOnDrop {
    KillOnDrop(
        std::process::Command::new(spinner)
            .arg("90")
            .env("OTEL_SERVICE_NAME", name)
            .env(
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=overridden,service.instance.id=env%2C1",
            )
            .spawn()
            .expect("start the environment-named program"),
    )
}

/// A name no other run or process on the host has.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_carry_what_processes_publish() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let publisher = common::build_c("otel_ctx.c", "otel_ctx", &["-O0", "-Wall"]);
    let spinner = common::build_c("otlp_spin.c", "otlp_spin", &["-O0"]);
    let (first, second) = (unique("ctx-first"), unique("ctx-second"));
    let (instance, env_name) = (unique("instance"), unique("env"));
    let (collector, server, _agent) = start_agent(&[]).await;
    let from_env = start_env_named(&spinner, &env_name);
    let env_pid = from_env.0.id();
    // Its resource showing means the agent samples and exports by now.
    wait_until(&collector, "the environment's service", |requests| {
        named(requests, env_pid, &env_name, Some("env,1"))
    })
    .await;

    let republish = common::work_dir().join("otel_ctx.republish");
    let _ = std::fs::remove_file(&republish);
    let publishing = KillOnDrop(
        std::process::Command::new(&publisher)
            .args([&first, &instance, "90"])
            .arg(&republish)
            .arg(&second)
            .spawn()
            .expect("start the publisher"),
    );
    let pid = publishing.0.id();
    wait_until(&collector, "the published service", |requests| {
        named(requests, pid, &first, Some(&instance))
    })
    .await;
    // Republished once the first name was seen (a fixed 4 s was too short
    // for an agent attributing seconds behind on a loaded machine): the
    // new name shows, the instance stays.
    std::fs::write(&republish, b"").unwrap();
    wait_until(&collector, "the republished service", |requests| {
        named(requests, pid, &second, Some(&instance))
    })
    .await;

    let requests = collector.requests();
    server.abort();
    assert_valid(&requests);
    // The agent's own name stays where a process said nothing, and no
    // resource mixes the publisher with another process.
    for request in &requests {
        let dictionary = request.dictionary.as_ref().unwrap();
        for group in &request.resource_profiles {
            let pids = sampled_pids(dictionary, group);
            let name = resource_string(group, "service.name");
            for ours in [i64::from(pid), i64::from(env_pid)] {
                if pids.contains(&ours) {
                    assert!(pids.iter().all(|&p| p == ours), "{name:?} mixes {pids:?}");
                }
            }
            assert_ne!(name.as_deref(), Some("overridden"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_is_left_unread_when_turned_off() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let spinner = common::build_c("otlp_spin.c", "otlp_spin", &["-O0"]);
    let (collector, server, _agent) = start_agent(&["--no-process-environment"]).await;
    let env_name = unique("unread");
    let from_env = start_env_named(&spinner, &env_name);
    let pid = from_env.0.id();
    // Sampled, and under the agent's own name.
    wait_until(&collector, "the program's samples", |requests| {
        named(requests, pid, "agent-default", None)
    })
    .await;
    server.abort();
    let requests = collector.requests();
    assert!(!named(&requests, pid, &env_name, None));
    assert!(!named(&requests, pid, "overridden", None));
}

#[test]
fn hostile_contexts_are_refused_and_counted() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let publisher = common::build_c("otel_ctx.c", "otel_ctx", &["-O0", "-Wall"]);
    let agent = Agent::start(true, &[]);
    let _hostile: Vec<KillOnDrop> = ["huge", "unmapped", "loop"]
        .into_iter()
        .map(|kind| {
            KillOnDrop(
                std::process::Command::new(&publisher)
                    .args(["--hostile", kind, "60"])
                    .spawn()
                    .expect("start a hostile publisher"),
            )
        })
        .collect();
    for reason in ["too_large", "unreadable"] {
        let name = format!("hostprof_context_refused_total{{reason=\"{reason}\"}}");
        let counted = wait_for(SHOW_WITHIN, || agent.metric(&name).filter(|&n| n > 0));
        assert!(
            counted.is_some(),
            "no {reason} refusal counted:\n{}",
            agent.stderr()
        );
    }
    // Still sampling with a context republished in a tight loop (whether
    // a read ever settles is up to the scheduler), and it stops cleanly.
    let samples = agent.wait_for_samples_above(0);
    agent.wait_for_samples_above(samples);
    let (status, stderr) = agent.terminate();
    assert!(status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A thread-local `otel_thread_ctx_v1` in a library whose code never
/// reaches it (so the loader fills no slot a reader could follow): the
/// process is sampled all the same, and `record` says the context was
/// refused, under the metric's reason.
#[test]
fn a_thread_context_no_code_reaches_is_refused_and_said() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let flags = ["-O1", "-Wall"];
    let library = common::build_c(
        "otel_tls_unreached.c",
        "libotel_tls_unreached.so",
        &[&flags[..], &["-fPIC", "-shared", "-DUNREACHED_LIBRARY"]].concat(),
    );
    let program = common::work_dir().join("otel_tls_unreached");
    common::run_ok(
        std::process::Command::new("cc")
            .args(flags)
            .arg("-o")
            .arg(&program)
            .arg(common::program_source("otel_tls_unreached.c"))
            .arg("-Wl,--no-as-needed")
            .arg(&library)
            .arg(format!("-Wl,-rpath,{}", common::work_dir().display())),
    );
    let output = common::run_ok(common::hostprof().args([
        "record",
        "-F",
        "199",
        "-o",
        "-",
        "--",
        program.to_str().unwrap(),
        "2",
    ]));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let folded = String::from_utf8_lossy(&output.stdout);
    let sampled: u64 = common::parse_folded(&folded)
        .iter()
        .filter(|(stack, _)| stack.first().is_some_and(|comm| comm == "otel_tls_unreac"))
        .map(|(_, count)| count)
        .sum();
    assert!(sampled >= 100, "{sampled} samples of the program: {stderr}");
    // Once per look at the process: again if its mappings change.
    let refused = stderr
        .lines()
        .find_map(|line| line.strip_prefix("hostprof: trace context refused: "))
        .and_then(|reasons| {
            reasons
                .split(", ")
                .find_map(|r| r.strip_prefix("tls_unreachable "))
        })
        .and_then(|count| count.parse::<u64>().ok());
    assert!(refused.is_some_and(|count| count >= 1), "{stderr}");
}
