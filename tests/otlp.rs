//! OTLP export and local outputs, end to end with the real eBPF sampler:
//! `hostprof agent` against an in-test gRPC collector (dictionary rules,
//! a collector that comes back after an outage; per-container grouping is
//! in tests/containers.rs, with real containers), and
//! `hostprof record` pprof/OTLP files read back by their consumers.
// The serializing guard of `require_ebpf` spans whole tests on purpose,
// awaits included: each test owns its runtime, nothing else waits on that lock.
#![allow(clippy::await_holding_lock)]
mod common;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
};

use common::collector::{Collector, assert_valid};
use hostprof::profile::dictionary_violations;
use hostprof_proto::{
    Message, collector::profiles_service_server::ProfilesServiceServer, profiles::ProfilesData,
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpListener,
};
use tonic::codec::CompressionEncoding;

fn spin_program() -> PathBuf {
    common::build_c(
        "otlp_spin.c",
        "otlp_spin",
        &["-O0", "-fno-omit-frame-pointer", "-g"],
    )
}

/// Runs the agent for `seconds` with 1 s windows, `extra` arguments added;
/// it must succeed.
async fn run_agent(
    endpoint: &str,
    seconds: &str,
    extra: &[&std::ffi::OsStr],
) -> std::process::Output {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostprof"))
        .args(["agent", "--duration", seconds, "--report-interval", "1s"])
        .args(["--otlp-endpoint", endpoint, "--service-name", "otlp-test"])
        .args(extra)
        .output()
        .await
        .expect("run hostprof agent");
    assert!(
        output.status.success(),
        "hostprof agent failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_delivers_after_the_collector_comes_back() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    // Reserve a port, then leave it closed: the collector is down.
    let addr: SocketAddr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let endpoint = format!("http://{addr}");
    let collector = Collector::default();
    // Keep a CPU busy for the whole run: every window then has samples, even
    // on an otherwise idle machine (empty windows are not sent).
    let mut workload = std::process::Command::new(spin_program())
        .arg("10")
        .spawn()
        .expect("start the workload");
    let mut agent = tokio::process::Command::new(env!("CARGO_BIN_EXE_hostprof"))
        .args(["agent", "--duration", "8", "--report-interval", "1s"])
        .args(["--status-interval", "1"])
        .args(["--otlp-endpoint", &endpoint])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hostprof agent");
    // Bring the collector up only once the agent has seen it down, and
    // retried in vain (a status line counts two failed calls): the windows
    // of the outage wait in the queue.
    let mut lines = BufReader::new(agent.stderr.take().unwrap()).lines();
    let mut stderr = String::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        stderr.push_str(&line);
        stderr.push('\n');
        let failures = line
            .split(" export_failures=")
            .nth(1)
            .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok());
        if failures.is_some_and(|failures| failures >= 2) {
            break;
        }
    }
    assert!(stderr.contains("cannot export profiles"), "{stderr}");
    let server = collector.serve(TcpListener::bind(addr).await.expect("rebind the port"));
    while let Some(line) = lines.next_line().await.unwrap() {
        stderr.push_str(&line);
        stderr.push('\n');
    }
    let status = agent.wait().await.unwrap();
    let _ = (workload.kill(), workload.wait());
    assert!(status.success(), "{stderr}");
    server.abort();
    let requests = collector.requests();
    assert_valid(&requests);
    // Windows cut while the collector was down arrive too (they were queued).
    let times: Vec<u64> = requests
        .iter()
        .flat_map(|r| &r.resource_profiles)
        .map(|g| g.scope_profiles[0].profiles[0].time_unix_nano)
        .collect();
    let (earliest, latest) = (times.iter().min().unwrap(), times.iter().max().unwrap());
    assert!(
        latest - earliest >= 4_000_000_000,
        "queued windows from the outage were not delivered:\n{stderr}"
    );
    assert!(stderr.contains("reachable again"), "{stderr}");
}

#[test]
fn record_pprof_opens_in_go_tool_pprof() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let go_missing = Command::new("go")
        .arg("version")
        .stdout(Stdio::null())
        .status()
        .is_err();
    if go_missing {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true needs go for `go tool pprof` (apt-get install golang-go)"
        );
        eprintln!("skipping: no `go` for `go tool pprof` (apt-get install golang-go)");
        return;
    }
    let program = spin_program();
    let out = common::work_dir().join("otlp_spin.pb.gz");
    common::run_ok(
        common::hostprof()
            .args(["record", "-F", "199", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&program)
            .arg("2"),
    );
    let top = common::run_ok(Command::new("go").args(["tool", "pprof", "-top"]).arg(&out));
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(text.contains("otlp_hot_loop"), "{text}");
}

#[test]
fn record_otlp_file_obeys_the_dictionary_rules() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let program = spin_program();
    let out = common::work_dir().join("otlp_spin.otlp.pb");
    common::run_ok(
        common::hostprof()
            .args(["record", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&program)
            .arg("1"),
    );
    let data = ProfilesData::decode(&*std::fs::read(&out).unwrap()).expect("a ProfilesData");
    let dictionary = data.dictionary.as_ref().unwrap();
    assert_eq!(
        dictionary_violations(dictionary, &data.resource_profiles),
        Vec::<String>::new()
    );
    assert!(
        dictionary.string_table.iter().any(|s| s == "otlp_hot_loop"),
        "the hot function is in the dictionary"
    );
    let json = common::work_dir().join("otlp_spin.otlp.json");
    common::run_ok(
        common::hostprof()
            .args(["record", "-o"])
            .arg(&json)
            .arg("--")
            .arg(&program)
            .arg("1"),
    );
    let text = std::fs::read_to_string(&json).unwrap();
    assert!(text.starts_with("{\"resourceProfiles\":[") && text.contains("\"stringTable\":[\"\","));
}

/// A CA and a `localhost` certificate it signed, made with openssl in `dir`:
/// (CA certificate, server certificate, server key).
fn make_certificates(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let path = |name: &str| dir.join(name);
    let openssl = |args: &[&str]| {
        common::run_ok(Command::new("openssl").args(args).current_dir(dir));
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=hostprof test CA",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(
        path("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    (path("ca.pem"), path("server.pem"), path("server.key"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_verified_against_the_given_ca_only() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    if !common::require_tool("openssl") {
        return;
    }
    let (ca, cert, key) = make_certificates(&common::work_dir().join("tls"));
    let identity = tonic::transport::Identity::from_pem(
        std::fs::read(&cert).unwrap(),
        std::fs::read(&key).unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!(
        "https://localhost:{}",
        listener.local_addr().unwrap().port()
    );
    let collector = Collector::default();
    let service =
        ProfilesServiceServer::new(collector.clone()).accept_compressed(CompressionEncoding::Gzip);
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .expect("server TLS")
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .expect("serve");
    });
    let mut workload = std::process::Command::new(spin_program())
        .arg("12")
        .spawn()
        .expect("start the workload");

    // Verification is on by default: a certificate from an unknown CA is refused.
    let output = run_agent(&endpoint, "4", &[]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        collector.requests().is_empty(),
        "an unverified collector got data"
    );
    assert!(stderr.contains("cannot export profiles"), "{stderr}");

    // With the CA that signed it, the same collector receives valid profiles.
    run_agent(&endpoint, "4", &["--otlp-ca".as_ref(), ca.as_os_str()]).await;
    let _ = (workload.kill(), workload.wait());
    server.abort();
    assert_valid(&collector.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_queue_cannot_hold_is_counted_as_dropped() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    // The collector stays down for the whole run and the queue holds nothing
    // but the newest window: every older window is dropped, and said so.
    let mut workload = std::process::Command::new(spin_program())
        .arg("10")
        .spawn()
        .expect("start the workload");
    let output = run_agent(
        "http://127.0.0.1:1",
        "5",
        &["--export-queue-mib".as_ref(), "0".as_ref()],
    )
    .await;
    let _ = (workload.kill(), workload.wait());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let summary = stderr
        .lines()
        .find(|line| line.contains("hostprof agent stopped"))
        .unwrap_or_else(|| panic!("no summary:\n{stderr}"));
    let count = |label: &str| -> u64 {
        summary
            .split(label)
            .nth(1)
            .and_then(|rest| {
                rest.trim_start()
                    .split([' ', ';', ','])
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no `{label}` in: {summary}"))
    };
    let windows = summary
        .split(" samples in ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok())
        .unwrap();
    assert!(windows >= 3, "{summary}");
    assert_eq!(count("exported"), 0, "{summary}");
    // Every non-empty window was dropped: while the collector was down, or
    // still unsent at shutdown.
    assert!(count("dropped") >= 2, "{summary}");
}
