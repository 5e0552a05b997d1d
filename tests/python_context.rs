//! A Python thread deep in its own frames, with an OpenTelemetry span
//! attached (OTEP 4947, written by `tests/programs/otel_span_lib.c`, which
//! `tests/programs/deep_span.py` loads with ctypes): its samples carry
//! 127 runtime frames, so the record's used part ends where its link and
//! attributes sit, and the sampler moves a long attribute through its
//! scratch rather than over itself. `record` writes OTLP; the file is
//! decoded here with the generated protobuf types alone.
mod common;

use std::path::Path;

use common::*;
use hostprof_proto::{
    Message,
    common::any_value::Value,
    profiles::{ProfilesData, ProfilesDictionary, Sample},
};

/// The span `otel_span_attach` writes.
const TRACE: &str = "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf";
const SPAN: &str = "b0b1b2b3b4b5b6b7";
/// An `http.route` longer than the attribute bytes read with the record.
const ROUTE: &str = "/catalog/departments/garden-and-outdoor/categories/watering-equipment/\
                     products/oscillating-sprinkler-with-sixteen-nozzles/reviews/most-helpful";
/// `descend` frames that make a sample deep: its runtime frames then
/// reach past where a long attribute's copy would overlap itself.
const DEEP: usize = 100;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// One sample: how many `descend` frames, its link, its `http.route`.
struct Seen {
    depth: usize,
    link: Option<(String, String)>,
    route: Option<String>,
}

fn route_of(dictionary: &ProfilesDictionary, sample: &Sample) -> Option<String> {
    sample.attribute_indices.iter().find_map(|&index| {
        let attribute = &dictionary.attribute_table[index as usize];
        if dictionary.string_table[attribute.key_strindex as usize] != "http.route" {
            return None;
        }
        match attribute.value.as_ref()?.value.as_ref()? {
            Value::StringValue(value) => Some(value.clone()),
            _ => None,
        }
    })
}

fn depth_of(dictionary: &ProfilesDictionary, sample: &Sample) -> usize {
    let stack = &dictionary.stack_table[sample.stack_index as usize];
    stack
        .location_indices
        .iter()
        .flat_map(|&location| &dictionary.location_table[location as usize].lines)
        .filter(|line| {
            let function = &dictionary.function_table[line.function_index as usize];
            dictionary.string_table[function.name_strindex as usize] == "descend"
        })
        .count()
}

fn decode(path: &Path) -> Vec<Seen> {
    let data = ProfilesData::decode(&*std::fs::read(path).expect("read the OTLP file"))
        .expect("an OTLP file");
    let dictionary = data.dictionary.as_ref().expect("a dictionary");
    let mut seen = Vec::new();
    for resource in &data.resource_profiles {
        for scope in &resource.scope_profiles {
            for profile in &scope.profiles {
                for sample in &profile.samples {
                    let link = (sample.link_index != 0).then(|| {
                        let link = &dictionary.link_table[sample.link_index as usize];
                        (hex(&link.trace_id), hex(&link.span_id))
                    });
                    for _ in 0..sample.timestamps_unix_nano.len().max(1) {
                        seen.push(Seen {
                            depth: depth_of(dictionary, sample),
                            link: link.clone(),
                            route: route_of(dictionary, sample),
                        });
                    }
                }
            }
        }
    }
    seen
}

#[test]
fn a_deep_python_thread_keeps_its_span_and_long_attribute() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    if !require_tool("python3") {
        return;
    }
    let dir = work_dir().join("python_context");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let library = dir.join("libotel_span.so");
    run_ok(
        std::process::Command::new("cc")
            .args(["-O1", "-Wall", "-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(program_source("otel_span_lib.c")),
    );
    // Profiled from when the span is attached: the agent looks for the
    // variable when it first sees the process, and looks again only when
    // a sample lands outside the mappings it read, which this program's
    // samples, all in the interpreter, never do.
    let mut python = std::process::Command::new("python3")
        .arg(program_source("deep_span.py"))
        .arg(&library)
        .args(["60", ROUTE])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start python3");
    let stdout = python.stdout.take().expect("its stdout");
    let python = running::KillOnDrop(python);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
        .expect("read its first line");
    assert_eq!(
        line.trim(),
        "attached",
        "deep_span.py did not attach its span"
    );
    let recording = dir.join("deep.otlp.pb");
    run_ok(
        hostprof()
            .args(["record", "-F", "499", "-d", "5", "-p"])
            .arg(python.0.id().to_string())
            .arg("-o")
            .arg(&recording),
    );
    drop(python);
    let samples = decode(&recording);
    let deep: Vec<&Seen> = samples.iter().filter(|seen| seen.depth >= DEEP).collect();
    let linked = deep.iter().filter(|seen| seen.link.is_some()).count();
    println!(
        "{} samples, {} with at least {DEEP} descend frames, {linked} of them linked",
        samples.len(),
        deep.len()
    );
    // Before the agent has found the variable (the library is loaded after
    // the start), samples are unlinked; once linked, always right.
    for seen in &deep {
        if let Some((trace, span)) = &seen.link {
            assert_eq!((trace.as_str(), span.as_str()), (TRACE, SPAN));
            assert_eq!(seen.route.as_deref(), Some(ROUTE), "a deep sample's route");
        }
    }
    assert!(linked >= 100, "{linked} linked deep samples");
}
