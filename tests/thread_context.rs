//! Trace links from the OpenTelemetry thread context (OTEP 4947), end to
//! end with the real eBPF sampler: `hostprof agent` against an in-test
//! collector, a C writer (`tests/programs/otel_thread_ctx.c`) whose threads
//! switch spans every few milliseconds and log each switch, and a hostile
//! writer whose thread-local points at unmapped memory. The same writer
//! runs with the variable in the executable, in a library linked at start
//! and in a library `dlopen`ed later, each library built for the
//! traditional general-dynamic model and for TLS descriptors; a Rust
//! writer (`tests/programs/otel_thread_ctx.rs`) does the same as the C
//! executable and is held to the same checks. The requests are decoded by
//! the generated protobuf types, not the agent's builder.
// The serializing guard of `require_ebpf` spans whole tests on purpose,
// awaits included: each test owns its runtime, nothing else waits on that lock.
#![allow(clippy::await_holding_lock)]
mod common;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use common::{
    collector::{Collector, int_attribute, sample_pid, text_attribute},
    running::{KillOnDrop, free_port, metric, scrape},
};
use hostprof_proto::collector::ExportProfilesServiceRequest;
use tokio::net::TcpListener;

/// How long the linked samples may take to show in the collector.
const SHOW_WITHIN: Duration = Duration::from_secs(90);
/// Linked samples to wait for.
const LINKED_AT_LEAST: usize = 100;
/// Around a logged switch, a sample may show either side's span: the
/// pointer is written just before the switch's clock read, and the
/// agent's and the writer's realtime-monotonic offsets are two readings.
const SWITCH_SLACK_NS: u64 = 300_000;

/// The thread-context attributes the writer publishes.
const ATTRIBUTE_KEYS: [&str; 2] = ["http.route", "http.method"];

/// One sample of a process: thread, kernel time (Unix ns), its link and
/// its thread-context attributes.
struct Seen {
    tid: i64,
    time: u64,
    /// Which export request carried it: samples go out as they are
    /// attributed, which is not in time order (a sample held for its early
    /// stack copy's unwinding goes out seconds after later ones).
    request: usize,
    link: Option<(String, String)>,
    /// `http.route` and `http.method`, when the sample has them.
    attributes: [Option<String>; 2],
    /// From the off-CPU profile: its thread left the CPU at `time`.
    off_cpu: bool,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Every sample of `pid` in the requests, one per timestamp.
fn samples_of(requests: &[ExportProfilesServiceRequest], pid: u32) -> Vec<Seen> {
    let mut seen = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        let dictionary = request.dictionary.as_ref().expect("a dictionary");
        // Index 0 is the zero value: no link.
        assert_eq!(
            dictionary
                .link_table
                .first()
                .map(|link| link.trace_id.len()),
            Some(0)
        );
        for group in &request.resource_profiles {
            for scope in &group.scope_profiles {
                for profile in &scope.profiles {
                    let off_cpu = profile.sample_type.is_some_and(|kind| {
                        dictionary.string_table[kind.type_strindex as usize] == "off_cpu"
                    });
                    for sample in &profile.samples {
                        if sample_pid(dictionary, sample) != Some(i64::from(pid)) {
                            continue;
                        }
                        let tid =
                            int_attribute(dictionary, sample, "thread.id").expect("thread.id");
                        let link = (sample.link_index != 0).then(|| {
                            let link = &dictionary.link_table[sample.link_index as usize];
                            assert_eq!((link.trace_id.len(), link.span_id.len()), (16, 8));
                            (hex(&link.trace_id), hex(&link.span_id))
                        });
                        let attributes =
                            ATTRIBUTE_KEYS.map(|key| text_attribute(dictionary, sample, key));
                        for &time in &sample.timestamps_unix_nano {
                            seen.push(Seen {
                                tid,
                                time,
                                request: index,
                                link: link.clone(),
                                attributes: attributes.clone(),
                                off_cpu,
                            });
                        }
                    }
                }
            }
        }
    }
    seen
}

/// What a thread had attached: trace and span ids, `http.route`,
/// `http.method` (`None` when the span had none).
type Attached = (String, String, String, Option<String>);

/// The writer's log: its realtime-monotonic offset and, per thread, each
/// switch (monotonic ns, what was then attached if anything).
type Switches = HashMap<i64, Vec<(u64, Option<Attached>)>>;

fn read_log(path: &std::path::Path) -> (i128, Switches) {
    let text = std::fs::read_to_string(path).expect("the writer's log");
    let mut lines = text.lines();
    let offset = lines
        .next()
        .and_then(|line| line.strip_prefix("offset "))
        .and_then(|offset| offset.parse().ok())
        .expect("an offset line");
    let mut switches = Switches::new();
    for line in lines {
        let fields: Vec<&str> = line.split(' ').collect();
        let [tid, ns, state, trace, span, route, method] = fields[..] else {
            panic!("a bad log line: {line}");
        };
        let link = (state == "1").then(|| {
            let method = (method != "-").then(|| method.to_owned());
            (trace.to_owned(), span.to_owned(), route.to_owned(), method)
        });
        switches
            .entry(tid.parse().unwrap())
            .or_default()
            .push((ns.parse().unwrap(), link));
    }
    (offset, switches)
}

/// The spans a sample at monotonic `at` may show: the one attached at
/// `at`, and its neighbour's when a switch is within the slack.
fn allowed(switches: &[(u64, Option<Attached>)], at: u64) -> Vec<Option<Attached>> {
    let mut allowed = Vec::new();
    let current = switches.partition_point(|(ns, _)| *ns <= at);
    // Before the thread's first switch: nothing attached.
    let state = |index: usize| index.checked_sub(1).and_then(|i| switches[i].1.clone());
    allowed.push(state(current));
    if current > 0 && at - switches[current - 1].0 <= SWITCH_SLACK_NS {
        allowed.push(state(current - 1));
    }
    if current < switches.len() && switches[current].0 - at <= SWITCH_SLACK_NS {
        allowed.push(state(current + 1));
    }
    allowed
}

/// Where the writer's `otel_thread_ctx_v1` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// The executable's static TLS.
    Executable,
    /// A library the executable is linked with: its block in static TLS.
    AtStart,
    /// A library the running executable `dlopen`s once the agent has
    /// sampled it.
    Dlopened,
}

/// What the writer is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Language {
    /// `otel_thread_ctx.c`: every place, and the hostile modes.
    C,
    /// `otel_thread_ctx.rs`: the executable's normal mode only.
    Rust,
}

/// One way of building and running the writer.
#[derive(Clone, Copy, Debug)]
struct Writer {
    name: &'static str,
    place: Place,
    language: Language,
    /// `-mtls-dialect=gnu2` (TLS descriptors) instead of the traditional
    /// general-dynamic calls to `__tls_get_addr` (libraries only).
    descriptors: bool,
    /// The writer's environment: a glibc tunable, to have the loader put
    /// a `dlopen`ed module in dynamic TLS.
    tunables: Option<&'static str>,
    /// Built with `musl-gcc` (C only): musl's loader places the module,
    /// its DTV the kernel reads.
    musl: bool,
}

/// Builds `writer`: the program to run and the arguments before the
/// writer's own.
fn build(writer: Writer) -> (std::path::PathBuf, Vec<String>) {
    let base = ["-O1", "-Wall", "-pthread"];
    if writer.place == Place::Executable {
        let program = match writer.language {
            Language::C => common::build_otel_writer(),
            Language::Rust => common::build_rust_otel_writer(),
        };
        return (program, Vec::new());
    }
    assert_eq!(writer.language, Language::C, "a library is C");
    let dialect = if writer.descriptors {
        "-mtls-dialect=gnu2"
    } else {
        "-mtls-dialect=gnu"
    };
    let compiler = if writer.musl { "musl-gcc" } else { "cc" };
    let library = common::work_dir().join(format!("lib{}.so", writer.name));
    common::run_ok(
        std::process::Command::new(compiler)
            .args(base)
            .args(["-fPIC", "-shared", "-DOTEL_WRITER_LIBRARY", dialect])
            .arg("-o")
            .arg(&library)
            .arg(common::program_source("otel_thread_ctx.c")),
    );
    let out = common::work_dir().join(writer.name);
    let mut cc = std::process::Command::new(compiler);
    cc.args(base).arg("-o").arg(&out);
    cc.arg(common::program_source("otel_thread_ctx_main.c"));
    if writer.place == Place::AtStart {
        cc.arg("-Wl,--no-as-needed").arg(&library);
    }
    common::run_ok(cc.arg("-ldl"));
    let prefix = match writer.place {
        Place::Dlopened => {
            let go = common::work_dir().join(format!("{}.go", writer.name));
            let _ = std::fs::remove_file(&go);
            vec![
                "--dlopen".into(),
                library.display().to_string(),
                go.display().to_string(),
            ]
        }
        _ => Vec::new(),
    };
    (out, prefix)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_link_to_the_span_their_thread_had() {
    check_links(Writer {
        name: "otel_thread_ctx",
        place: Place::Executable,
        language: Language::C,
        descriptors: false,
        tunables: None,
        musl: false,
    })
    .await;
}

/// The Rust writer: its variable defined in assembly (stable Rust cannot
/// name a thread-local), reached local-exec, found by the agent as the C
/// executable's is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_come_from_a_rust_writer() {
    check_links(Writer {
        name: "otel_thread_ctx_rs",
        place: Place::Executable,
        language: Language::Rust,
        descriptors: false,
        tunables: None,
        musl: false,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_come_from_a_library_loaded_at_start() {
    for descriptors in [false, true] {
        check_links(Writer {
            name: if descriptors {
                "otel_ctx_start_desc"
            } else {
                "otel_ctx_start_gd"
            },
            place: Place::AtStart,
            language: Language::C,
            descriptors,
            tunables: None,
            musl: false,
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_come_from_a_library_dlopened_later() {
    for (name, descriptors, tunables) in [
        ("otel_ctx_dlopen_gd", false, None),
        // glibc puts a descriptor-reached module in the static TLS surplus
        // when it fits; without a surplus it stays in dynamic TLS.
        ("otel_ctx_dlopen_desc", true, None),
        (
            "otel_ctx_dlopen_desc_dtv",
            true,
            Some("glibc.rtld.optional_static_tls=0"),
        ),
    ] {
        check_links(Writer {
            name,
            place: Place::Dlopened,
            language: Language::C,
            descriptors,
            tunables,
            musl: false,
        })
        .await;
    }
}

/// A writer built against musl and `dlopen`ed: musl always gives such a
/// module dynamic TLS, in a DTV of its own shape (word entries, the count
/// in entry 0, below the thread pointer on aarch64), reached through
/// `__tls_get_addr` or musl's TLS descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_come_from_a_musl_library_dlopened_later() {
    for (name, descriptors) in [
        ("otel_ctx_musl_dlopen_gd", false),
        ("otel_ctx_musl_dlopen_desc", true),
    ] {
        check_links(Writer {
            name,
            place: Place::Dlopened,
            language: Language::C,
            descriptors,
            tunables: None,
            musl: true,
        })
        .await;
    }
}

/// Runs `writer` under the agent: every linked sample's link is the span
/// its thread had then, none while detached or not valid, and at least
/// [`LINKED_AT_LEAST`] linked. With the C executable's writer, the
/// hostile writers (its other modes) run beside it.
async fn check_links(writer: Writer) {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    println!("{writer:?}");
    let (program, prefix) = build(writer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let collector = Collector::default();
    let server = collector.serve(listener);
    let port = free_port();
    let _agent = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_hostprof"))
            .args(["agent", "--duration", "150", "--report-interval", "1s"])
            .args(["-F", "499", "--otlp-endpoint", &endpoint])
            // With the executable's writer, off-CPU samples too: its three
            // busy threads on two CPUs are preempted, and a record is read
            // when its thread leaves the CPU.
            .args(if writer.place == Place::Executable {
                &["--off-cpu"][..]
            } else {
                &[][..]
            })
            .args(["--metrics-addr", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start hostprof agent"),
    );
    let log = common::work_dir().join(format!("{}.log", writer.name));
    let stop = common::work_dir().join(format!("{}.stop", writer.name));
    let _ = std::fs::remove_file(&stop);
    let _ = std::fs::remove_file(&log);
    let mut command = std::process::Command::new(&program);
    command
        .args(&prefix)
        .arg(&log)
        .arg(&stop)
        .args(["120", "3"]);
    if let Some(tunables) = writer.tunables {
        command.env("GLIBC_TUNABLES", tunables);
    }
    let mut writing = KillOnDrop(command.spawn().expect("start the writer"));
    let hostile =
        (writer.place == Place::Executable && writer.language == Language::C).then(|| {
            ["--hostile", "--hostile-attrs"].map(|mode| {
                KillOnDrop(
                    std::process::Command::new(&program)
                        .args([mode, "120"])
                        .spawn()
                        .expect("start the hostile writer"),
                )
            })
        });
    let pid = writing.0.id();
    let hostile_pid = hostile.as_ref().map(|hostile| hostile[0].0.id());
    let hostile_attrs_pid = hostile.as_ref().map(|hostile| hostile[1].0.id());
    let start = Instant::now();
    if writer.place == Place::Dlopened {
        // The agent has seen the process without the library: the
        // variable must be picked up when it appears.
        while samples_of(&collector.requests(), pid).len() < 20 {
            assert!(start.elapsed() < SHOW_WITHIN, "no samples of the writer");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        std::fs::write(&prefix[2], b"").unwrap();
    }
    // Wait for the linked samples, with attributes, some named by the
    // republished key map, and some of the hostile processes'.
    loop {
        let requests = collector.requests();
        let samples = samples_of(&requests, pid);
        let linked = samples.iter().filter(|seen| seen.link.is_some()).count();
        let routed = samples
            .iter()
            .filter(|seen| seen.attributes[0].is_some())
            .count();
        let with_method = samples
            .iter()
            .filter(|seen| seen.attributes[1].is_some())
            .count();
        let off_cpu_routed = if writer.place == Place::Executable {
            samples
                .iter()
                .filter(|seen| seen.off_cpu && seen.attributes[0].is_some())
                .count()
        } else {
            20
        };
        let hostile_seen = hostile_pid.map_or(20, |pid| samples_of(&requests, pid).len());
        let hostile_linked = hostile_attrs_pid.map_or(20, |pid| {
            samples_of(&requests, pid)
                .iter()
                .filter(|seen| seen.link.is_some())
                .count()
        });
        if linked >= LINKED_AT_LEAST
            && routed >= LINKED_AT_LEAST
            && with_method >= 20
            && off_cpu_routed >= 20
            && hostile_seen >= 20
            && hostile_linked >= 20
        {
            break;
        }
        assert!(
            start.elapsed() < SHOW_WITHIN,
            "{}: {linked} linked samples, {routed} with http.route, {with_method} with \
             http.method, {off_cpu_routed} off-CPU with http.route within {SHOW_WITHIN:?}",
            writer.name
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    std::fs::write(&stop, b"").unwrap();
    assert!(writing.0.wait().unwrap().success(), "the writer failed");
    // Every sample of the writer taken before it exited, exported.
    let exported = collector.requests().len();
    let start = Instant::now();
    while collector.requests().len() < exported + 2 {
        assert!(start.elapsed() < SHOW_WITHIN, "no more windows exported");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = scrape(port).unwrap_or_default();
    let faults = metric(
        &metrics,
        "hostprof_kernel_events_total{event=\"trace_read_fault\"}",
    );
    let refused = |reason: &str| {
        metric(
            &metrics,
            &format!("hostprof_context_refused_total{{reason=\"{reason}\"}}"),
        )
        .unwrap_or(0)
    };
    // For a failure below: what the agent refused, and why.
    for line in metrics
        .lines()
        .filter(|line| line.starts_with("hostprof_context_refused_total"))
    {
        println!("{}: {line}", writer.name);
    }
    let requests = collector.requests();
    server.abort();
    // The format's rules, link table included (`assert_valid` expects 19 Hz).
    for request in &requests {
        let dictionary = request.dictionary.as_ref().expect("a dictionary");
        let problems =
            hostprof::profile::dictionary_violations(dictionary, &request.resource_profiles);
        assert!(problems.is_empty(), "{problems:#?}");
    }

    let (offset, switches) = read_log(&log);
    let samples = samples_of(&requests, pid);
    // The kernel reads a process's context once the agent registered it,
    // at its first samples (or the library's): those before carry no link.
    let registered = samples
        .iter()
        .filter(|seen| seen.link.is_some())
        .map(|seen| seen.time)
        .min()
        .expect("linked samples");
    let before = samples.iter().filter(|seen| seen.time < registered).count();
    // Attributes are named once the agent has read the key map (the first
    // samples' look at the process, or a later one when the context came
    // after them), the second key once it has read the map again: samples
    // attributed before may lack them, those after may not. Attributed
    // before: taken before the first sample named with the key (a second
    // later: samples of two CPUs are attributed a batch apart), or sent in
    // an export request up to the one after the first that names it
    // (samples held for their early stack copies go out late).
    let known_at = |key: usize| {
        let named = samples.iter().filter(|seen| seen.attributes[key].is_some());
        (
            named
                .clone()
                .map(|seen| seen.time + 1_000_000_000)
                .min()
                .expect("samples with the attribute"),
            named.map(|seen| seen.request + 1).min().unwrap_or(0),
        )
    };
    let keys_known_at = [known_at(0), known_at(1)];
    let (mut linked, mut unlinked_detached, mut routed, mut unnamed_late) = (0, 0, 0, 0);
    let mut off_cpu_routed = 0;
    for seen in samples.iter().filter(|seen| seen.time >= registered) {
        let at = u64::try_from(i128::from(seen.time) - offset).expect("a monotonic time");
        let Some(thread) = switches.get(&seen.tid) else {
            // The main thread never attaches a span.
            assert_eq!(
                seen.link, None,
                "a link on thread {} without spans",
                seen.tid
            );
            continue;
        };
        let allowed = allowed(thread, at);
        // A sample with the right link and no attributes at all, after the
        // agent had named them: its process's key map was not at hand when
        // it was attributed. Two causes were found and fixed: a sample named
        // with its process as it was before a look during its attribution
        // found the map (up to 200 of about 900), and a context dropped when
        // its process exited, with the last samples still to be attributed
        // (64 and 79 of about 1,300; 0 in six runs since). Counted and
        // bounded below; a wrong value never passes.
        let unnamed = seen.attributes == [None, None]
            && allowed.iter().any(|attached| {
                attached.as_ref().is_some_and(|(trace, span, ..)| {
                    seen.link == Some((trace.clone(), span.clone()))
                })
            });
        let matches = |attached: &Option<Attached>| match attached {
            None => seen.link.is_none() && seen.attributes == [None, None],
            Some((trace, span, route, method)) => {
                let expected = [Some(route.clone()), method.clone()];
                seen.link == Some((trace.clone(), span.clone()))
                    && (0..2).all(|key| {
                        seen.attributes[key] == expected[key]
                            || (seen.attributes[key].is_none()
                                && (seen.time < keys_known_at[key].0
                                    || seen.request <= keys_known_at[key].1))
                    })
            }
        };
        unnamed_late += usize::from(unnamed && !allowed.iter().any(matches));
        assert!(
            unnamed || allowed.iter().any(matches),
            "{}: thread {} at {at} (export {}; keys named from {:?}): {:?} {:?}, the writer \
             had {:?}",
            writer.name,
            seen.tid,
            seen.request,
            keys_known_at.map(|(time, request)| (time - registered, request)),
            seen.link,
            seen.attributes,
            allowed
        );
        routed += usize::from(seen.attributes[0].is_some());
        off_cpu_routed += usize::from(seen.off_cpu && seen.attributes[0].is_some());
        match &seen.link {
            Some(_) => linked += 1,
            None if allowed == [None] => unlinked_detached += 1,
            None => {}
        }
    }
    println!(
        "{}: {} samples: {before} before the process was registered, {linked} linked \
         ({routed} with the attributes their span had, {off_cpu_routed} of them off-CPU, \
         {unnamed_late} without any once they were named), {unlinked_detached} while \
         detached or not valid",
        writer.name,
        samples.len()
    );
    assert!(
        unnamed_late * 100 <= linked,
        "{unnamed_late} of {linked} linked samples lost their attributes"
    );
    assert!(
        routed >= LINKED_AT_LEAST,
        "{routed} samples with attributes"
    );
    // How many come before the registration depends on how busy the
    // machine is (CI: 525 of about 1,300 under three builds): said, not
    // asserted; the linked samples below must be there whatever it is.
    assert!(linked >= LINKED_AT_LEAST, "{linked} linked samples");
    assert!(
        unlinked_detached >= 20,
        "{unlinked_detached} detached samples"
    );

    // The hostile writer: sampled, never linked, its reads counted.
    if let Some(hostile_pid) = hostile_pid {
        let hostile_samples = samples_of(&requests, hostile_pid);
        assert!(hostile_samples.len() >= 20);
        assert!(hostile_samples.iter().all(|seen| seen.link.is_none()));
        assert!(
            faults.is_some_and(|faults| faults > 0),
            "trace_read_fault: {faults:?}"
        );
    }
    // The writer of hostile attributes: linked, never an attribute, each
    // kind of refusal counted.
    if let Some(hostile_attrs_pid) = hostile_attrs_pid {
        let hostile_samples = samples_of(&requests, hostile_attrs_pid);
        assert!(
            hostile_samples
                .iter()
                .filter(|seen| seen.link.is_some())
                .count()
                >= 20
        );
        assert!(
            hostile_samples
                .iter()
                .all(|seen| seen.attributes == [None, None])
        );
        for reason in [
            "attrs_over_cap",
            "attrs_utf8",
            "attrs_unknown_key",
            "attrs_truncated",
        ] {
            assert!(refused(reason) > 0, "{reason}: {}", refused(reason));
        }
    }
    drop(hostile);
}
