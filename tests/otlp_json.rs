//! `hostprof record -o X.otlp.json` read back by a decoder that is not ours:
//! the OpenTelemetry project's Python classes (PyPI opentelemetry-proto,
//! matching the OTLP v1.11.0 protos in proto/), through
//! tests/scripts/otlp_json_summary.py.
mod common;

use std::{path::Path, process::Command};

use common::*;

/// The script's view of one profile.
#[derive(Debug)]
struct Decoded {
    kind: String,
    unit: String,
    samples: u64,
    /// Samples by leaf function name.
    leaves: Vec<(String, u64)>,
}

impl Decoded {
    fn leaf_share(&self, function: &str) -> f64 {
        let hits: u64 = self
            .leaves
            .iter()
            .filter(|(name, _)| name == function)
            .map(|(_, count)| count)
            .sum();
        hits as f64 / self.samples.max(1) as f64
    }
}

/// True when python3 can import the decoder; panics instead under
/// `CI=true`, where `cargo xtask setup` must have installed it.
fn require_decoder() -> bool {
    let imports = Command::new("python3")
        .args([
            "-c",
            "import google.protobuf.json_format, \
             opentelemetry.proto.profiles.v1development.profiles_pb2",
        ])
        .output();
    if imports.is_ok_and(|out| out.status.success()) {
        return true;
    }
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("python3 cannot import opentelemetry-proto, and CI=true forbids skipping");
    }
    eprintln!("skipping: python3 lacks opentelemetry-proto (cargo xtask setup installs it)");
    false
}

/// Runs the script on `file`; it must succeed.
fn decode(file: &Path) -> Vec<Decoded> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/scripts/otlp_json_summary.py");
    let output = run_ok(Command::new("python3").arg(script).arg(file));
    let text = String::from_utf8(output.stdout).expect("UTF-8 from the script");
    let mut profiles: Vec<Decoded> = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.splitn(4, ' ').collect();
        match fields[..] {
            ["profile", kind, unit, samples] => profiles.push(Decoded {
                kind: kind.to_owned(),
                unit: unit.to_owned(),
                samples: samples.parse().expect("a sample count"),
                leaves: Vec::new(),
            }),
            ["leaf", count, ..] => {
                let name = line.splitn(3, ' ').nth(2).unwrap_or_default();
                profiles
                    .last_mut()
                    .expect("a leaf line after its profile")
                    .leaves
                    .push((name.to_owned(), count.parse().expect("a leaf count")));
            }
            _ => panic!("unexpected line from the script: {line}"),
        }
    }
    profiles
}

#[test]
fn otlp_json_decodes_with_opentelemetry_proto_to_the_designed_profile() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    if !require_tool("python3") || !require_decoder() {
        return;
    }
    // hot_work does 3 units of work for each of cold_work's.
    let program = build_c(
        "cpu_split.c",
        "split_otlp_json",
        &["-O0", "-fno-omit-frame-pointer", "-g"],
    );
    let out = work_dir().join("split_otlp_json.otlp.json");
    let _ = std::fs::remove_file(&out);
    let recorded = run_ok(
        hostprof()
            .args(["record", "-F", "999", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&program)
            .arg("3"),
    );
    let profiles = decode(&out);
    // One process, CPU samples only: one profile.
    let [cpu] = &profiles[..] else {
        panic!("one profile expected: {profiles:#?}");
    };
    assert_eq!(cpu.kind, "samples", "{cpu:?}");
    assert!(
        cpu.samples >= 300,
        "only {} samples in 3 s at 999 Hz",
        cpu.samples
    );
    // The decoder counts what hostprof says it recorded.
    let summary = String::from_utf8_lossy(&recorded.stderr);
    let said: u64 = summary
        .lines()
        .find_map(|line| {
            line.strip_prefix("hostprof: ")?
                .split_once(" samples from ")
        })
        .and_then(|(count, _)| count.parse().ok())
        .unwrap_or_else(|| panic!("no sample count in the summary:\n{summary}"));
    assert_eq!(cpu.samples, said, "{summary}");
    let hot = cpu.leaf_share("hot_work");
    let cold = cpu.leaf_share("cold_work");
    assert!(
        (hot - 0.75).abs() < 0.08,
        "hot_work share {hot:.3}, designed 0.75: {cpu:?}"
    );
    assert!(
        (cold - 0.25).abs() < 0.08,
        "cold_work share {cold:.3}, designed 0.25: {cpu:?}"
    );
    assert!(!cpu.unit.is_empty(), "{cpu:?}");
}
