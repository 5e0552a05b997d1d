//! `hostprof report` on what `record` writes, with the real eBPF sampler:
//! each file format read back gives exactly the stacks an independent
//! reading of the same file gives (decoded here with the protobuf types
//! alone), `--container` and `{container}` split a file with two resources
//! (a real container cgroup), bad files fail in one line; and `record`'s
//! progress line, seen on a real terminal (tmux).
mod common;

use std::{
    collections::BTreeMap,
    io::Read as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use common::{cgroup::ContainerCgroup, tmux::Tmux, *};
use hostprof_proto::{Message, profiles::ProfilesData};
use serde_json::Value;

/// Folded stacks as a multiset: line → count.
type Stacks = BTreeMap<String, u64>;

fn cpu_split() -> PathBuf {
    build_c(
        "cpu_split.c",
        "cpu_split",
        &["-O0", "-fno-omit-frame-pointer", "-g"],
    )
}

/// A test's own directory, empty.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = work_dir().join("report").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}

fn stacks(text: &str) -> Stacks {
    let mut stacks = Stacks::new();
    for line in text.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("`stack count`");
        *stacks.entry(stack.to_owned()).or_default() += count.parse::<u64>().expect("count");
    }
    stacks
}

fn report(args: &[&std::ffi::OsStr]) -> std::process::Output {
    hostprof()
        .arg("report")
        .args(args)
        .output()
        .expect("run hostprof report")
}

/// `hostprof report INPUT -o OUT.folded`, read back.
fn report_folded(input: &Path, out: &Path) -> Stacks {
    let output = report(&[input.as_os_str(), "-o".as_ref(), out.as_os_str()]);
    assert!(
        output.status.success(),
        "report {} failed:\n{}",
        input.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    stacks(&std::fs::read_to_string(out).expect("read report output"))
}

/// Records the designed CPU split for 2 s at 499 Hz into `out`.
fn record_split(out: &Path, comm: &str) {
    let program = work_dir().join(comm);
    std::fs::copy(cpu_split(), &program).expect("copy test program");
    run_ok(
        hostprof()
            .arg("record")
            .args(["-F", "499", "-o"])
            .arg(out)
            .args(["--".as_ref(), program.as_os_str(), "2".as_ref()]),
    );
}

/// The share of `stacks` (of `comm`) whose leaf is `function`.
fn leaf_share(stacks: &Stacks, comm: &str, function: &str) -> f64 {
    let of_comm = stacks
        .iter()
        .filter(|(stack, _)| stack.split(';').next() == Some(comm));
    let (mut total, mut hits) = (0, 0);
    for (stack, count) in of_comm {
        total += count;
        if stack.rsplit(';').next() == Some(function) {
            hits += count;
        }
    }
    hits as f64 / total.max(1) as f64
}

/// The record's own figures: the designed 3:1 split, enough samples.
fn assert_designed_split(stacks: &Stacks, comm: &str) {
    let total: u64 = stacks
        .iter()
        .filter(|(stack, _)| stack.starts_with(&format!("{comm};")))
        .map(|(_, count)| count)
        .sum();
    assert!(total >= 300, "only {total} samples of {comm}: {stacks:#?}");
    let hot = leaf_share(stacks, comm, "hot_work");
    assert!((hot - 0.75).abs() < 0.08, "hot_work share {hot:.3}");
}

/// `;` separates frames: names holding one are written with `:` instead.
fn clean(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

/// Folds an OTLP/JSON document on its own: the test's reading of the
/// format (lowerCamelCase, 64-bit integers as strings), not hostprof's.
fn fold_otlp_json(doc: &Value) -> Stacks {
    let dict = &doc["dictionary"];
    let table = |name: &str| dict[name].as_array().cloned().unwrap_or_default();
    let (strings, attributes, stacks_table) = (
        table("stringTable"),
        table("attributeTable"),
        table("stackTable"),
    );
    let (locations, functions, mappings) = (
        table("locationTable"),
        table("functionTable"),
        table("mappingTable"),
    );
    let int = |value: &Value| -> u64 {
        match value {
            Value::String(text) => text.parse().unwrap(),
            Value::Number(number) => number.as_u64().unwrap(),
            _ => 0,
        }
    };
    let index = |value: &Value| value.as_u64().unwrap_or(0) as usize;
    let string = |value: &Value| strings[index(value)].as_str().unwrap().to_owned();
    // (key, string value) of an attribute.
    let attribute = |at: &Value| {
        let entry = &attributes[index(at)];
        (
            string(&entry["keyStrindex"]),
            entry["value"]["stringValue"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        )
    };
    let frame_labels = |at: &Value| -> Vec<String> {
        let location = &locations[index(at)];
        let kernel = location["attributeIndices"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|at| attribute(at) == ("profile.frame.type".into(), "kernel".into()));
        let lines = location["lines"].as_array().cloned().unwrap_or_default();
        let address = int(&location["address"]);
        if lines.is_empty() {
            let mapping_at = index(&location["mappingIndex"]);
            return vec![if mapping_at == 0 {
                format!(
                    "[{}+{address:#x}]",
                    if kernel { "kernel" } else { "unknown" }
                )
            } else {
                let mapping = &mappings[mapping_at];
                let path = string(&mapping["filenameStrindex"]);
                let name = path.rsplit('/').next().unwrap().to_owned();
                let name = if path.is_empty() { "anon".into() } else { name };
                let offset = address - int(&mapping["memoryStart"]) + int(&mapping["fileOffset"]);
                format!("[{}+{offset:#x}]", name.trim_matches(['[', ']']))
            }];
        }
        // Innermost first in the file; outermost first in a folded line.
        lines
            .iter()
            .rev()
            .map(|line| {
                let name = string(&functions[index(&line["functionIndex"])]["nameStrindex"]);
                if kernel { format!("{name}_[k]") } else { name }
            })
            .collect()
    };
    let mut folded = Stacks::new();
    for resource in doc["resourceProfiles"].as_array().unwrap() {
        for scope in resource["scopeProfiles"].as_array().unwrap() {
            for profile in scope["profiles"].as_array().unwrap() {
                let kind = string(&profile["sampleType"]["typeStrindex"]);
                assert_eq!(kind, "samples", "a CPU profile only");
                for sample in profile["samples"].as_array().unwrap() {
                    let thread = sample["attributeIndices"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(attribute)
                        .find(|(key, _)| key == "thread.name")
                        .expect("thread.name")
                        .1;
                    let stack = &stacks_table[index(&sample["stackIndex"])];
                    let frames: Vec<String> = stack["locationIndices"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .iter()
                        .rev()
                        .flat_map(frame_labels)
                        .collect();
                    let mut line = clean(&thread);
                    for frame in frames {
                        line.push(';');
                        line.push_str(&clean(&frame));
                    }
                    let count = sample["timestampsUnixNano"].as_array().unwrap().len() as u64;
                    *folded.entry(line).or_default() += count;
                }
            }
        }
    }
    folded
}

/// Folds a pprof profile on its own, from the protobuf types.
fn fold_pprof(gz: &[u8]) -> Stacks {
    use hostprof_proto::pprof::Profile;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut bytes)
        .expect("gunzip");
    let profile = Profile::decode(&bytes[..]).expect("decode pprof");
    let string = |at: i64| profile.string_table[at as usize].clone();
    let count_at = profile
        .sample_type
        .iter()
        .position(|t| string(t.r#type) == "samples")
        .expect("samples/count");
    let mut folded = Stacks::new();
    for sample in &profile.sample {
        let thread = sample
            .label
            .iter()
            .find(|label| string(label.key) == "thread")
            .map(|label| string(label.str))
            .expect("thread label");
        let mut line = clean(&thread);
        for id in sample.location_id.iter().rev() {
            let location = profile.location.iter().find(|l| l.id == *id).unwrap();
            if location.line.is_empty() {
                let label = match profile.mapping.iter().find(|m| m.id == location.mapping_id) {
                    Some(mapping) => {
                        let path = string(mapping.filename);
                        let offset = location.address - mapping.memory_start + mapping.file_offset;
                        format!(
                            "[{}+{offset:#x}]",
                            path.rsplit('/').next().unwrap().trim_matches(['[', ']'])
                        )
                    }
                    None if location.address >> 63 == 1 => {
                        format!("[kernel+{:#x}]", location.address)
                    }
                    None => format!("[unknown+{:#x}]", location.address),
                };
                line.push(';');
                line.push_str(&clean(&label));
            }
            for pprof_line in location.line.iter().rev() {
                let function = profile
                    .function
                    .iter()
                    .find(|f| f.id == pprof_line.function_id)
                    .unwrap();
                let name = string(function.name);
                let name = match name.strip_suffix(" [k]") {
                    Some(kernel) => format!("{kernel}_[k]"),
                    None => name,
                };
                line.push(';');
                line.push_str(&clean(&name));
            }
        }
        *folded.entry(line).or_default() += sample.value[count_at] as u64;
    }
    folded
}

#[test]
fn otlp_protobuf_reports_the_stacks_the_file_holds() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let dir = fresh_dir("otlp_pb");
    let input = dir.join("run.otlp.pb");
    record_split(&input, "split_otlp");
    let data = ProfilesData::decode(&std::fs::read(&input).unwrap()[..]).expect("decode");
    let json: Value = serde_json::from_str(&hostprof::output::otlp_json::to_json(&data)).unwrap();
    let expected = fold_otlp_json(&json);
    assert_designed_split(&expected, "split_otlp");
    let reported = report_folded(&input, &dir.join("x.folded"));
    assert_eq!(reported, expected);
    // And on through the other formats: JSON and pprof written by report
    // read back to the same stacks.
    let via_json = dir.join("via.otlp.json");
    let via_pprof = dir.join("via.pb.gz");
    for out in [&via_json, &via_pprof] {
        let output = report(&[input.as_os_str(), "-o".as_ref(), out.as_os_str()]);
        assert!(output.status.success(), "{output:?}");
    }
    assert_eq!(report_folded(&via_json, &dir.join("y.folded")), expected);
    assert_eq!(report_folded(&via_pprof, &dir.join("z.folded")), expected);
}

#[test]
fn otlp_json_reports_the_stacks_the_file_holds() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let dir = fresh_dir("otlp_json");
    let input = dir.join("run.otlp.json");
    record_split(&input, "split_json");
    let json: Value = serde_json::from_slice(&std::fs::read(&input).unwrap()).unwrap();
    let expected = fold_otlp_json(&json);
    assert_designed_split(&expected, "split_json");
    assert_eq!(report_folded(&input, &dir.join("x.folded")), expected);
}

#[test]
fn pprof_reports_the_stacks_and_counts_the_file_holds() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let dir = fresh_dir("pprof");
    let input = dir.join("run.pb.gz");
    record_split(&input, "split_pprof");
    let expected = fold_pprof(&std::fs::read(&input).unwrap());
    assert_designed_split(&expected, "split_pprof");
    assert_eq!(report_folded(&input, &dir.join("x.folded")), expected);
    // Without -o: the top functions, as record lists them.
    let output = report(&[input.as_os_str()]);
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    let total: u64 = expected.values().sum();
    assert!(
        text.starts_with(&format!("hostprof: {total} samples from ")),
        "{text}"
    );
    let hot_line = text
        .lines()
        .skip_while(|line| *line != "top functions by self share:")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let hot_count: u64 = expected
        .iter()
        .filter(|(stack, _)| stack.ends_with(";hot_work"))
        .map(|(_, count)| count)
        .sum();
    assert!(
        hot_line.ends_with(&format!("  {hot_count:>8}  hot_work")),
        "{hot_line:?} is not hot_work with {hot_count} samples:\n{text}"
    );
}

#[test]
fn folded_reports_itself() {
    let dir = fresh_dir("folded");
    let input = dir.join("in.folded");
    let text = "app;main;hot_work 30\napp;main;cold_work 10\napp;[libc.so.6+0x1234];write_[k] 2\n";
    std::fs::write(&input, text).unwrap();
    assert_eq!(report_folded(&input, &dir.join("out.folded")), stacks(text));
}

#[test]
fn container_option_and_placeholder_split_the_resources() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let dir = fresh_dir("containers");
    let program = cpu_split();
    let boxed_program = work_dir().join("split_boxed");
    let host_program = work_dir().join("split_host");
    std::fs::copy(&program, &boxed_program).unwrap();
    std::fs::copy(&program, &host_program).unwrap();
    // A cgroup named like a container is enough here: what is tested is
    // `report`'s split of a file by container (tests/containers.rs checks
    // the ids real containers get); it keeps this test free of a daemon.
    let cgroup = ContainerCgroup::create();
    let mut boxed = Command::new(&boxed_program).arg("3").spawn().unwrap();
    cgroup.add(boxed.id());
    let mut host = Command::new(&host_program).arg("3").spawn().unwrap();
    let input = dir.join("two.otlp.pb");
    run_ok(
        hostprof()
            .args(["record", "-F", "199", "-d", "2", "-o"])
            .arg(&input)
            .args(["-p", &boxed.id().to_string(), "-p", &host.id().to_string()]),
    );
    boxed.wait().unwrap();
    host.wait().unwrap();
    let id = cgroup.id.clone();
    drop(cgroup);

    let all = report_folded(&input, &dir.join("all.folded"));
    let comm_of = |stacks: &Stacks| -> Vec<String> {
        let mut comms: Vec<String> = stacks
            .keys()
            .map(|stack| stack.split(';').next().unwrap().to_owned())
            .collect();
        comms.dedup();
        comms
    };
    assert_eq!(comm_of(&all), ["split_boxed", "split_host"]);

    let only = |container: &str, out: &str| -> Stacks {
        let out = dir.join(out);
        let output = report(&[
            input.as_os_str(),
            "--container".as_ref(),
            container.as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        assert!(output.status.success(), "{output:?}");
        stacks(&std::fs::read_to_string(out).unwrap())
    };
    let in_container = only(&id, "boxed.folded");
    let on_host = only("host", "host.folded");
    assert_eq!(comm_of(&in_container), ["split_boxed"]);
    assert_eq!(comm_of(&on_host), ["split_host"]);
    // Together they are the whole file.
    let mut both = in_container.clone();
    for (stack, count) in &on_host {
        *both.entry(stack.clone()).or_default() += count;
    }
    assert_eq!(both, all);

    // An unknown id: one line naming the ones there are.
    let output = report(&[
        input.as_os_str(),
        "--container".as_ref(),
        "0123abc".as_ref(),
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no container `0123abc`")
            && stderr.contains(&id)
            && stderr.contains("host"),
        "{stderr}"
    );

    // One flame graph per container.
    let pattern = dir.join("flame-{container}.svg");
    let output = report(&[input.as_os_str(), "-o".as_ref(), pattern.as_os_str()]);
    assert!(output.status.success(), "{output:?}");
    for (name, comm) in [(id.as_str(), "split_boxed"), ("host", "split_host")] {
        let svg = std::fs::read_to_string(dir.join(format!("flame-{name}.svg")))
            .unwrap_or_else(|err| panic!("flame graph of {name}: {err}"));
        assert!(svg.contains("<svg") && svg.contains(comm), "{name}");
        let other = if comm == "split_boxed" {
            "split_host"
        } else {
            "split_boxed"
        };
        assert!(!svg.contains(other), "{name} holds {other}");
    }
}

#[test]
fn bad_files_fail_in_one_line() {
    let dir = fresh_dir("bad");
    let cases = [
        (
            "junk.otlp.pb",
            &b"\xff\xff\xff\xff"[..],
            "not an OTLP profile: ",
        ),
        (
            "junk.otlp.json",
            b"{\"resourceProfiles\": {}}",
            "not an OTLP/JSON profile: ",
        ),
        ("junk.pb.gz", b"\x1f\x8bnot gzip", "not a pprof profile: "),
        ("junk.folded", b"main;work\n", "not folded stacks: line 1: "),
    ];
    for (name, data, expected) in cases {
        let path = dir.join(name);
        std::fs::write(&path, data).unwrap();
        let output = report(&[
            path.as_os_str(),
            "-o".as_ref(),
            dir.join("out.folded").as_os_str(),
        ]);
        assert_eq!(output.status.code(), Some(1), "{name}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let prefix = format!("hostprof: error: {}: {expected}", path.display());
        assert!(
            stderr.starts_with(&prefix) && stderr.lines().count() == 1,
            "{name}: {stderr:?} should be one line starting {prefix:?}"
        );
    }
    let missing = dir.join("missing.otlp.pb");
    let output = report(&[missing.as_os_str()]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read"));
}

/// The sample count of the progress line on `screen`, if one shows.
fn progress_samples(screen: &str) -> Option<u64> {
    let line = screen
        .lines()
        .find(|line| line.starts_with("hostprof: ") && line.ends_with(" awaiting symbols"))?;
    let (_, rest) = line.split_once(", ")?;
    rest.split(' ').next()?.parse().ok()
}

fn spin(comm: &str) -> Child {
    let program = work_dir().join(comm);
    std::fs::copy(cpu_split(), &program).expect("copy test program");
    Command::new(&program)
        .arg("60")
        .spawn()
        .expect("start spinner")
}

#[test]
fn progress_line_on_a_terminal_and_ctrl_c_still_writes() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    if !require_tool("tmux") {
        return;
    }
    let dir = fresh_dir("progress");
    let mut spinner = spin("split_tty");
    let out = dir.join("tty.folded");
    let command = format!(
        "{} record -F 199 -p {} -o {}; echo \"record exited with $?\"; exec cat",
        env!("CARGO_BIN_EXE_hostprof"),
        spinner.id(),
        out.display()
    );
    let tmux = Tmux::start(
        &format!("hostprof-progress-{}", std::process::id()),
        &command,
    );
    let first = tmux.wait_for("progress line with samples", 60, |screen| {
        progress_samples(screen).filter(|&samples| samples > 0)
    });
    let line = tmux.wait_for("growing sample count", 30, |screen| {
        progress_samples(screen)
            .filter(|&samples| samples > first)
            .map(|_| screen.to_owned())
    });
    // Elapsed time, no duration (none given), the process, nothing lost.
    let progress = line
        .lines()
        .find(|line| line.ends_with(" awaiting symbols"))
        .unwrap();
    assert!(
        progress.contains(" s, ")
            && !progress.contains(" / ")
            && progress.contains(", 1 processes, "),
        "{progress}"
    );
    // One line, rewritten in place: never two on the screen.
    assert_eq!(
        line.matches("awaiting symbols").count(),
        1,
        "the progress line scrolled:\n{line}"
    );
    tmux.keys(&["C-c"]);
    let screen = tmux.wait_for("exit after Ctrl-C", 60, |screen| {
        screen
            .contains("record exited with")
            .then(|| screen.to_owned())
    });
    spinner.kill().unwrap();
    spinner.wait().unwrap();
    assert!(screen.contains("record exited with 0"), "{screen}");
    assert!(screen.contains("(interrupted)"), "{screen}");
    assert!(
        !screen.contains("awaiting symbols"),
        "the progress line was not erased:\n{screen}"
    );
    let written = stacks(&std::fs::read_to_string(&out).expect("Ctrl-C wrote the profile"));
    let total: u64 = written
        .iter()
        .filter(|(stack, _)| stack.starts_with("split_tty;"))
        .map(|(_, count)| count)
        .sum();
    assert!(total >= first, "{total} samples written, {first} shown");
}

#[test]
fn no_progress_line_when_stderr_is_not_a_terminal() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let mut spinner = spin("split_pipe");
    let output = hostprof()
        .args([
            "record",
            "-F",
            "99",
            "-d",
            "2.5",
            "-p",
            &spinner.id().to_string(),
        ])
        .stderr(Stdio::piped())
        .output()
        .expect("run record");
    spinner.kill().unwrap();
    spinner.wait().unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("hostprof: "), "{stderr}");
    assert!(
        !stderr.contains('\r') && !stderr.contains("awaiting symbols") && !stderr.contains('\x1b'),
        "{stderr:?}"
    );
    assert!(stderr.contains(" samples from 1 processes in "), "{stderr}");
}
