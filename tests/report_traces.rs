//! `hostprof report --trace-id/--span-id/--attribute` on a real recording:
//! `record` runs the OpenTelemetry thread-context writer
//! (`tests/programs/otel_thread_ctx.c`, three threads switching spans every
//! few milliseconds, a new trace every few seconds) under the real eBPF
//! sampler into an OTLP file. The recording and what `report` keeps are
//! decoded here with the generated protobuf types alone: the kept samples
//! are exactly those the recording links to the trace (or span) asked for,
//! in OTLP and in pprof; an unknown trace keeps none and says what the
//! file holds; bad ids fail in one line.
mod common;

use std::{
    collections::{BTreeMap, HashSet},
    io::Read as _,
    path::{Path, PathBuf},
};

use common::{collector::int_attribute, *};
use hostprof_proto::{Message, pprof::Profile, profiles::ProfilesData};

/// One sample as the recording has it: thread, time, trace and span (hex).
type Linked = (i64, u64, String, String);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Every sample of an OTLP file (one per timestamp), and the linked ones.
fn decode(path: &Path) -> (usize, Vec<Linked>) {
    let data = ProfilesData::decode(&*std::fs::read(path).expect("read the OTLP file"))
        .expect("an OTLP file");
    let dictionary = data.dictionary.as_ref().expect("a dictionary");
    let (mut all, mut linked) = (0, Vec::new());
    for resource in &data.resource_profiles {
        for scope in &resource.scope_profiles {
            for profile in &scope.profiles {
                for sample in &profile.samples {
                    all += sample.timestamps_unix_nano.len();
                    if sample.link_index == 0 {
                        continue;
                    }
                    let link = &dictionary.link_table[sample.link_index as usize];
                    let tid = int_attribute(dictionary, sample, "thread.id")
                        .expect("a thread.id attribute");
                    for &time in &sample.timestamps_unix_nano {
                        linked.push((tid, time, hex(&link.trace_id), hex(&link.span_id)));
                    }
                }
            }
        }
    }
    linked.sort_unstable();
    (all, linked)
}

/// Per pprof sample: its count and its `trace_id` label.
fn pprof_samples(path: &Path) -> Vec<(i64, Option<String>)> {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(&*std::fs::read(path).expect("read the pprof file"))
        .read_to_end(&mut bytes)
        .expect("gzip");
    let profile = Profile::decode(&*bytes).expect("a pprof profile");
    let strings = &profile.string_table;
    profile
        .sample
        .iter()
        .map(|sample| {
            let trace = sample
                .label
                .iter()
                .find(|label| strings[label.key as usize] == "trace_id")
                .map(|label| strings[label.str as usize].clone());
            (sample.value[0], trace)
        })
        .collect()
}

/// The traces the writer's log says it attached.
fn logged_traces(log: &Path) -> HashSet<String> {
    let text = std::fs::read_to_string(log).expect("the writer's log");
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            (fields.get(2) == Some(&"1")).then(|| fields[3].to_owned())
        })
        .collect()
}

fn report(args: &[&str]) -> (bool, String, String) {
    let output = hostprof()
        .arg("report")
        .args(args)
        .output()
        .expect("run hostprof report");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

#[test]
fn report_keeps_exactly_the_samples_of_a_trace_or_span() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let writer = build_otel_writer();
    let dir: PathBuf = work_dir().join("report_traces");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (log, recording) = (dir.join("writer.log"), dir.join("linked.otlp.pb"));
    // No stop file: the writer runs its 4 s (a new trace per thread after
    // about 3 s), then logs its switches.
    run_ok(
        hostprof()
            .args(["record", "-F", "499", "-o"])
            .arg(&recording)
            .arg("--")
            .arg(&writer)
            .arg(&log)
            .arg(dir.join("never.stop"))
            .args(["4", "3"]),
    );
    let (all, linked) = decode(&recording);
    let logged = logged_traces(&log);
    let mut by_trace: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, _, trace, _) in &linked {
        assert!(logged.contains(trace), "trace {trace} is not the writer's");
        *by_trace.entry(trace).or_default() += 1;
    }
    let (&trace, &expected) = by_trace
        .iter()
        .max_by_key(|(trace, count)| (**count, std::cmp::Reverse(**trace)))
        .expect("linked samples in the recording");
    println!(
        "{all} samples, {} linked to {} traces; {trace}: {expected}",
        linked.len(),
        by_trace.len()
    );
    assert!(expected >= 20, "{expected} samples of the busiest trace");
    let of_trace: Vec<Linked> = linked
        .iter()
        .filter(|(_, _, id, _)| id == trace)
        .cloned()
        .collect();

    // The trace, as OTLP: exactly its samples, times and spans included.
    let kept = dir.join("trace.otlp.pb");
    let (ok, _, stderr) = report(&[
        path_str(&recording),
        "--trace-id",
        &trace.to_uppercase(),
        "-o",
        path_str(&kept),
    ]);
    assert!(ok, "{stderr}");
    let line = format!(
        "hostprof: {}: {expected} of {all} samples match --trace-id {trace}",
        recording.display()
    );
    assert!(stderr.contains(&line), "{stderr:?} lacks {line:?}");
    let (kept_all, kept_linked) = decode(&kept);
    assert_eq!(kept_all, expected, "only linked samples kept");
    assert_eq!(kept_linked, of_trace);

    // As pprof: the same count, each sample labelled with the trace.
    let pprof = dir.join("trace.pb.gz");
    let (ok, _, stderr) = report(&[
        path_str(&recording),
        "--trace-id",
        trace,
        "-o",
        path_str(&pprof),
    ]);
    assert!(ok, "{stderr}");
    let samples = pprof_samples(&pprof);
    assert!(samples.iter().all(|(_, id)| id.as_deref() == Some(trace)));
    assert_eq!(
        samples.iter().map(|(count, _)| count).sum::<i64>() as usize,
        expected
    );
    // The pprof file selects the same, from its labels.
    let (ok, stdout, stderr) = report(&[path_str(&pprof), "--trace-id", trace]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(&format!("{expected} of {expected} samples match")),
        "{stderr}"
    );
    assert!(
        stdout.starts_with(&format!("hostprof: {expected} samples")),
        "{stdout}"
    );

    // One span of it, and one thread of it (a sample attribute).
    let (tid, _, _, span) = &of_trace[of_trace.len() / 2];
    let of_span: Vec<Linked> = linked.iter().filter(|l| &l.3 == span).cloned().collect();
    let kept = dir.join("span.otlp.pb");
    let (ok, _, stderr) = report(&[
        path_str(&recording),
        "--span-id",
        span,
        "-o",
        path_str(&kept),
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(decode(&kept).1, of_span);
    let thread = format!("thread.id={tid}");
    let (ok, _, stderr) = report(&[
        path_str(&recording),
        "--trace-id",
        trace,
        "--attribute",
        &thread,
        "-o",
        path_str(&kept),
    ]);
    assert!(ok, "{stderr}");
    let of_thread: Vec<Linked> = of_trace.iter().filter(|l| l.0 == *tid).cloned().collect();
    assert_eq!(decode(&kept).1, of_thread);

    // A trace the writer never had: nothing kept, and the line names the
    // busiest traces there are.
    let unknown = (0..u8::MAX)
        .map(|byte| hex(&[byte; 16]))
        .find(|id| !logged.contains(id) && id != &"00".repeat(16))
        .unwrap();
    let (ok, stdout, stderr) = report(&[path_str(&recording), "--trace-id", &unknown]);
    assert!(ok, "{stderr}");
    let line = format!(
        "hostprof: {}: no sample matches --trace-id {unknown} (of {all}); {} samples are \
         linked to {} traces, the busiest: {trace} ({expected})",
        recording.display(),
        linked.len(),
        by_trace.len()
    );
    assert!(stderr.starts_with(&line), "{stderr:?} lacks {line:?}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stdout.starts_with("hostprof: 0 samples"), "{stdout}");

    // Bad ids: one line each, before the file is read.
    for (flag, value, why) in [
        (
            "--trace-id",
            &trace[..30],
            "a trace id is 32 hex digits, this has 30",
        ),
        (
            "--span-id",
            trace,
            "a span id is 16 hex digits, this has 32",
        ),
        ("--span-id", "00000000000000zz", "`z` is none"),
        ("--attribute", "thread.id", "an attribute is KEY=VALUE"),
    ] {
        let (ok, _, stderr) = report(&[path_str(&recording), flag, value]);
        assert!(!ok);
        assert!(
            stderr.starts_with("hostprof: error: ") && stderr.contains(why),
            "{flag} {value}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    // Folded stacks carry no links: refused, not an empty answer.
    let folded = dir.join("linked.folded");
    let (ok, _, stderr) = report(&[path_str(&recording), "-o", path_str(&folded)]);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = report(&[path_str(&folded), "--trace-id", trace]);
    assert!(!ok);
    assert!(
        stderr.contains("folded stacks keep no trace links"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
