//! `hostprof record --off-cpu`: where and why threads block, on the real kernel.
mod common;

use common::{collector::sample_functions, *};
use hostprof::profile::dictionary_violations;
use hostprof_proto::{
    Message,
    common::any_value,
    profiles::{ProfilesData, ProfilesDictionary, Sample},
};

fn off_cpu_program() -> std::path::PathBuf {
    build_c(
        "off_cpu.c",
        "off_cpu",
        &["-O0", "-fno-omit-frame-pointer", "-g", "-pthread"],
    )
}

/// Folded stacks (values in microseconds) of `hostprof record --off-cpu`.
fn record_off_cpu(extra: &[&str], command: &[&str]) -> Vec<(Vec<String>, u64)> {
    let output = run_ok(
        hostprof()
            .args(["record", "--off-cpu", "-o", "-"])
            .args(extra)
            .arg("--")
            .args(command),
    );
    parse_folded(&String::from_utf8_lossy(&output.stdout))
}

/// Records 10 rounds of the off-CPU program into `file_name` (in the work
/// dir; the extension picks the format) and returns its path.
fn record_off_cpu_to(file_name: &str) -> std::path::PathBuf {
    let out = work_dir().join(file_name);
    run_ok(
        hostprof()
            .args(["record", "--off-cpu", "-o"])
            .arg(&out)
            .arg("--")
            .arg(off_cpu_program())
            .arg("10"),
    );
    out
}

/// Microseconds off CPU in stacks of the main thread passing through `function`.
fn blocked_in(stacks: &[(Vec<String>, u64)], function: &str) -> u64 {
    stacks
        .iter()
        .filter(|(frames, _)| frames.get(1).is_some_and(|f| f.starts_with("[off-cpu: ")))
        .filter(|(frames, _)| {
            frames.iter().any(|f| f == "main") && frames.iter().any(|f| f == function)
        })
        .map(|(_, us)| us)
        .sum()
}

#[test]
fn blocking_functions_dominate_with_their_designed_times_and_states() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = off_cpu_program();
    let stacks = record_off_cpu(&[], &[program.to_str().unwrap(), "20"]);
    let sleep = blocked_in(&stacks, "in_sleep") as f64;
    let pipe = blocked_in(&stacks, "in_pipe") as f64;
    let lock = blocked_in(&stacks, "in_lock") as f64;
    let all = sleep + pipe + lock;
    // Designed: 20 rounds of 50 + 30 + 20 ms.
    assert!(
        (sleep / 1e6 - 1.0).abs() < 0.15,
        "in_sleep blocked {:.3} s, designed 1.0 s",
        sleep / 1e6
    );
    assert!(
        (pipe / 1e6 - 0.6).abs() < 0.12,
        "in_pipe blocked {:.3} s, designed 0.6 s",
        pipe / 1e6
    );
    assert!(
        (lock / 1e6 - 0.4).abs() < 0.1,
        "in_lock blocked {:.3} s, designed 0.4 s",
        lock / 1e6
    );
    for (name, value, designed) in [
        ("in_sleep", sleep, 0.5),
        ("in_pipe", pipe, 0.3),
        ("in_lock", lock, 0.2),
    ] {
        assert!(
            (value / all - designed).abs() < 0.06,
            "{name} share {:.3}, designed {designed}",
            value / all
        );
    }
    // Sleeping on a timer, a pipe and a futex are all interruptible waits,
    // and the kernel side of each wait is named.
    for (function, kernel) in [
        ("in_sleep", "nanosleep"),
        ("in_pipe", "pipe_read"),
        ("in_lock", "futex"),
    ] {
        // The heaviest stack: each function also makes short waits of
        // other kinds (in_lock first reads the helper's pipe), which complete
        // stacks now show through libc's wrappers.
        let stack = stacks
            .iter()
            .filter(|(frames, _)| {
                frames.iter().any(|f| f == function) && frames[1].starts_with("[off-cpu")
            })
            .max_by_key(|(_, blocked)| *blocked)
            .unwrap_or_else(|| panic!("no off-CPU stack through {function}"));
        assert_eq!(
            stack.0[1], "[off-cpu: interruptible]",
            "{function}: {:?}",
            stack.0
        );
        assert!(
            stack
                .0
                .iter()
                .any(|f| f.contains(kernel) && f.ends_with("_[k]")),
            "{function}: {:?}",
            stack.0
        );
        assert!(
            !stack.0.iter().any(|f| f.starts_with("bpf_")),
            "tracing frames left in {:?}",
            stack.0
        );
    }
}

/// The off-CPU tracepoint for Linux 5.10 to 5.16 (its unwinder in tail
/// calls), forced on this kernel: the blocking functions still show, under
/// main, with the designed order of their times.
#[test]
fn legacy_variant_finds_the_blocking_functions() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = off_cpu_program();
    let output = run_ok(
        hostprof()
            .env(hostprof::sampler::VARIANT_ENV, "legacy")
            .args(["record", "--off-cpu", "-o", "-"])
            .arg("--")
            .arg(&program)
            .arg("10"),
    );
    let stacks = parse_folded(&String::from_utf8_lossy(&output.stdout));
    let (sleep, pipe, lock) = (
        blocked_in(&stacks, "in_sleep"),
        blocked_in(&stacks, "in_pipe"),
        blocked_in(&stacks, "in_lock"),
    );
    // 10 rounds of 50/30/20 ms.
    assert!(sleep > 300_000, "in_sleep {sleep} us");
    assert!(
        sleep > pipe && pipe > lock && lock > 100_000,
        "{sleep} {pipe} {lock}"
    );
}

#[test]
fn threshold_drops_shorter_blocks() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = off_cpu_program();
    let stacks = record_off_cpu(
        &["--off-cpu-threshold", "40ms"],
        &[program.to_str().unwrap(), "10"],
    );
    assert!(
        blocked_in(&stacks, "in_sleep") >= 400_000,
        "the 50 ms sleeps must stay"
    );
    assert_eq!(
        blocked_in(&stacks, "in_pipe"),
        0,
        "30 ms pipe waits are under 40 ms"
    );
    assert_eq!(
        blocked_in(&stacks, "in_lock"),
        0,
        "20 ms lock waits are under 40 ms"
    );
}

#[test]
fn cpu_bound_program_shows_little_off_cpu_time() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = build_c(
        "cpu_split.c",
        "cpu_split_offcpu",
        &["-O0", "-fno-omit-frame-pointer", "-g"],
    );
    let stacks = record_off_cpu(&["-F", "499"], &[program.to_str().unwrap(), "2"]);
    let (mut on_cpu, mut off_cpu) = (0u64, 0u64);
    for (frames, us) in &stacks {
        // Preempted (runnable) is waiting for a CPU, which a loaded
        // machine makes any program do; blocked is what the program did.
        if frames.get(1).is_some_and(|f| f == "[off-cpu: runnable]") {
            continue;
        }
        if frames.get(1).is_some_and(|f| f.starts_with("[off-cpu")) {
            off_cpu += us;
        } else {
            on_cpu += us;
        }
    }
    assert!(on_cpu >= 1_000_000, "only {on_cpu} us on CPU in 2 s");
    assert!(
        (off_cpu as f64) < 0.1 * on_cpu as f64,
        "{off_cpu} us off CPU next to {on_cpu} us on CPU"
    );
}

fn string_attribute(dictionary: &ProfilesDictionary, sample: &Sample, key: &str) -> Option<String> {
    sample.attribute_indices.iter().find_map(|&index| {
        let attribute = &dictionary.attribute_table[index as usize];
        (dictionary.string_table[attribute.key_strindex as usize] == key).then(|| {
            match attribute
                .value
                .as_ref()
                .and_then(|value| value.value.as_ref())
            {
                Some(any_value::Value::StringValue(text)) => text.clone(),
                other => format!("{other:?}"),
            }
        })
    })
}

#[test]
fn otlp_output_has_an_off_cpu_profile_with_blocked_time_and_state() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let out = record_off_cpu_to("off_cpu.otlp.pb");
    let data = ProfilesData::decode(&*std::fs::read(&out).unwrap()).expect("a ProfilesData");
    let dictionary = data.dictionary.as_ref().unwrap();
    assert_eq!(
        dictionary_violations(dictionary, &data.resource_profiles),
        Vec::<String>::new()
    );
    let string = |index: i32| dictionary.string_table[index as usize].as_str();
    let off_cpu_profiles: Vec<_> = data
        .resource_profiles
        .iter()
        .flat_map(|resource| &resource.scope_profiles)
        .flat_map(|scope| &scope.profiles)
        .filter(|profile| {
            profile.sample_type.is_some_and(|t| {
                string(t.type_strindex) == "off_cpu" && string(t.unit_strindex) == "nanoseconds"
            })
        })
        .collect();
    assert_eq!(
        off_cpu_profiles.len(),
        1,
        "one off-CPU profile for the host group"
    );
    let profile = off_cpu_profiles[0];
    let mut in_sleep_ns = 0i64;
    for sample in &profile.samples {
        assert_eq!(
            sample.values.len(),
            sample.timestamps_unix_nano.len(),
            "values and timestamps pair up"
        );
        for &time in &sample.timestamps_unix_nano {
            assert!(
                time >= profile.time_unix_nano
                    && time < profile.time_unix_nano + profile.duration_nano
            );
        }
        assert!(
            string_attribute(dictionary, sample, "thread.state").is_some(),
            "every off-CPU sample has thread.state"
        );
        if sample_functions(dictionary, sample)
            .iter()
            .any(|f| f == "in_sleep")
        {
            // Asleep, or preempted on its way there (a loaded machine).
            let state = string_attribute(dictionary, sample, "thread.state");
            assert!(
                matches!(state.as_deref(), Some("interruptible" | "runnable")),
                "{state:?}"
            );
            if state.as_deref() == Some("interruptible") {
                in_sleep_ns += sample.values.iter().sum::<i64>();
            }
        }
    }
    // Designed: 10 rounds of 50 ms.
    assert!(
        (in_sleep_ns as f64 / 1e9 - 0.5).abs() < 0.08,
        "in_sleep blocked {:.3} s, designed 0.5 s",
        in_sleep_ns as f64 / 1e9
    );
}

#[test]
fn pprof_output_has_an_off_cpu_sample_type() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    if !require_tool("go") {
        return;
    }
    let out = record_off_cpu_to("off_cpu.pb.gz");
    let top = run_ok(
        std::process::Command::new("go")
            .args(["tool", "pprof", "-sample_index=off_cpu", "-top", "-cum"])
            .arg(&out),
    );
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(
        text.contains("in_sleep") && text.contains("in_pipe") && text.contains("in_lock"),
        "{text}"
    );
}
