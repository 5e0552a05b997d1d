//! Faults a node agent meets in production, with the real eBPF programs: a
//! collector that accepts connections and never answers, fork/exec churn, a
//! binary replaced on disk under a running process, a full ring buffer.
mod common;

use std::{
    net::TcpListener,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use common::{
    build_c, hostprof, parse_folded, run_ok,
    running::{Agent, Spinner, wait_for},
    work_dir,
};
use hostprof::sampler::{Sampler, SamplerOptions};
use hostprof_common::Counter;

#[test]
fn a_collector_that_never_answers_does_not_stall_sampling() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    // Accepts connections and holds them open without a byte of HTTP/2.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::Relaxed);
            held.push(stream);
        }
    });
    let _spinner = Spinner::start();
    let agent = Agent::start(
        true,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--export-timeout",
            "1",
            "--report-interval",
            "1",
        ],
    );
    agent.wait_for_samples_above(0);
    // Export calls time out, one after another...
    wait_for(Duration::from_secs(60), || {
        agent
            .metric("hostprof_export_failed_calls_total")
            .filter(|&failed| failed >= 3)
    })
    .unwrap_or_else(|| panic!("no export timed out:\n{}", agent.stderr()));
    assert!(accepted.load(Ordering::Relaxed) >= 1);
    // ... while sampling goes on at full rate.
    let before = agent.samples().unwrap();
    agent.wait_for_samples_above(before + 100);
    assert_eq!(
        agent.metric("hostprof_samples_lost_total{where=\"pipeline\"}"),
        Some(0)
    );
    let (status, stderr) = agent.terminate();
    assert!(status.success(), "exit {status}:\n{stderr}");
    assert!(stderr.contains("stopped (SIGTERM)"), "{stderr}");
}

#[test]
fn process_churn_leaves_no_state_behind() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let _spinner = Spinner::start();
    // Exited processes are swept every 2 s instead of every 10 s.
    let agent = Agent::start_with_env(true, &[], &[("HOSTPROF_SWEEP_INTERVAL_MS", "2000")]);
    agent.wait_for_samples_above(0);
    let tracked = || agent.metric("hostprof_tracked_processes");
    // Past two sweeps: the host's running processes are in the cache, and
    // none that exited more than a sweep ago: the steady state.
    wait_for(Duration::from_secs(60), || {
        agent
            .metric("hostprof_process_sweeps_total")
            .filter(|&sweeps| sweeps >= 2)
    })
    .unwrap_or_else(|| panic!("no sweep of exited processes:\n{}", agent.stderr()));
    let baseline = tracked().unwrap();

    // 1500 short-lived processes, each burning a few ms of CPU: many are
    // sampled, and each sampled one is looked up in /proc and cached.
    let mut churn = Command::new("sh")
        .args([
            "-c",
            "for n in $(seq 1500); do sh -c 'i=0; while [ $i -lt 300 ]; do i=$((i+1)); done'; done",
        ])
        .spawn()
        .expect("start the churn");
    let mut peak = baseline;
    while churn.try_wait().unwrap().is_none() {
        peak = peak.max(tracked().unwrap_or(0));
        std::thread::sleep(Duration::from_millis(250));
    }
    // The control: the churn did reach the cache.
    assert!(
        peak >= baseline + 20,
        "peak {peak}, baseline {baseline}:\n{}",
        agent.stderr()
    );
    // Exited processes are swept back to where we started (give or take
    // the host's own comings and goings).
    let slack = 5.max((peak - baseline) / 10);
    let settled = wait_for(Duration::from_secs(60), || {
        tracked().filter(|&now| now <= baseline + slack)
    });
    assert!(
        settled.is_some(),
        "still tracking {:?} processes (baseline {baseline}, peak {peak})",
        tracked()
    );
    let (status, stderr) = agent.terminate();
    assert!(status.success(), "exit {status}:\n{stderr}");
}

#[test]
fn a_binary_replaced_on_disk_keeps_its_old_names() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let flags = ["-O0", "-fno-omit-frame-pointer", "-g"];
    let old = build_c(
        "replaced.c",
        "replaced_old",
        &[&flags[..], &["-DHOT=old_version_spin"]].concat(),
    );
    let new = build_c(
        "replaced.c",
        "replaced_new",
        &[&flags[..], &["-DHOT=new_version_spin"]].concat(),
    );
    let installed = work_dir().join("replaced_installed");
    std::fs::copy(&old, &installed).unwrap();
    let mut running = Command::new(&installed).arg("8").spawn().unwrap();
    // spawn returns once the child has exec'd, so the old file is mapped;
    // checked all the same, since the test means nothing otherwise.
    let exe = format!("/proc/{}/exe", running.id());
    assert_eq!(std::fs::read_link(&exe).unwrap(), installed);
    // An upgrade: the new build renamed over the path the process runs from.
    let staged = work_dir().join("replaced_staged");
    std::fs::copy(&new, &staged).unwrap();
    std::fs::rename(&staged, &installed).unwrap();

    let output = work_dir().join("replaced.folded");
    run_ok(
        hostprof()
            .args(["record", "-p", &running.id().to_string(), "-d", "2", "-o"])
            .arg(&output),
    );
    let _ = (running.kill(), running.wait());
    let stacks = parse_folded(&std::fs::read_to_string(&output).unwrap());
    let total: u64 = stacks.iter().map(|(_, count)| count).sum();
    let named = |name: &str| -> u64 {
        stacks
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f == name))
            .map(|(_, count)| count)
            .sum()
    };
    assert!(total >= 50, "{total} samples");
    assert_eq!(
        named("new_version_spin"),
        0,
        "names from the new file: {stacks:?}"
    );
    assert!(
        // The rest is main's loop and clock_gettime.
        named("old_version_spin") as f64 >= 0.6 * total as f64,
        "old_version_spin in {} of {total}",
        named("old_version_spin")
    );
}

#[test]
fn a_full_ring_buffer_is_counted_not_fatal() {
    let Some(_guard) = common::require_ebpf() else {
        return;
    };
    let _spinner = Spinner::start();
    // One page of ring: room for one sample, and nobody reads it. No early
    // stack copies: nothing loads tables here, so every sample would be an
    // 18 KiB copy record, larger than the whole ring.
    let options = SamplerOptions {
        frequency_hz: 499,
        ring_bytes: 4096,
        early_copy_bytes: 0,
        ..Default::default()
    };
    let mut sampler = Sampler::start(&options).expect("start the sampler");
    wait_for(Duration::from_secs(30), || {
        let counters = sampler.counters().ok()?;
        (counters.get(Counter::RingFull) >= 100).then_some(())
    })
    .expect("the ring buffer never filled");
    sampler.stop();
    let counters = sampler.counters().expect("read the counters");
    assert!(counters.get(Counter::Submitted) >= 1);
    // Every firing is accounted for: skipped, written or lost.
    let accounted = counters.get(Counter::Idle)
        + counters.get(Counter::Filtered)
        + counters.get(Counter::Submitted)
        + counters.get(Counter::RingFull);
    let fired = counters.get(Counter::Fired);
    assert_eq!(fired, accounted, "{counters:?}");
}
