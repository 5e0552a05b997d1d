//! Builder tests: dictionary rules, grouping, merging, attributes.
use std::sync::Arc;

use hostprof_proto::{
    common::{AnyValue, any_value},
    profiles::{ProfilesDictionary, ResourceProfiles},
};

use super::*;
use crate::model::{BuildIds, Frame, FrameKind, Line, Mapping, ProcessInfo, ResolvedSample};

const ID: &str = "4b1f0e5d0c3a8e2f9d7c6b5a4938271605f4e3d2c1b0a9f8e7d6c5b4a3928170";

fn process(pid: u32, container: Option<&str>) -> Arc<ProcessInfo> {
    Arc::new(ProcessInfo {
        pid,
        comm: "app".into(),
        exe_path: "/usr/bin/app".into(),
        container_id: container.map(Into::into),
        pod_uid: None,
        service: None,
        thread_keys: None,
    })
}

fn frames() -> Vec<Frame> {
    let mapping = Arc::new(Mapping {
        start: 0x1000,
        end: 0x9000,
        file_offset: 0,
        path: "/usr/bin/app".into(),
        dev: 1,
        inode: 2,
        build_ids: BuildIds {
            gnu: Some("abcd".into()),
            ..Default::default()
        },
    });
    let line = |name: &str, number| Line {
        file: Some("app.c".into()),
        line: number,
        column: 2,
        start_line: 1,
        ..Line::named(name.into(), name.into())
    };
    vec![
        Frame {
            kind: FrameKind::Kernel,
            address: 0xffff_ffff_8100_0000,
            mapping: None,
            file_offset: 0,
            lines: vec![Line::named("do_syscall_64".into(), "do_syscall_64".into())].into(),
        },
        Frame {
            kind: FrameKind::Native,
            address: 0x1234,
            mapping: Some(mapping.clone()),
            file_offset: 0x234,
            // `inner` inlined into `outer`.
            lines: vec![line("inner", 10), line("outer", 20)].into(),
        },
        Frame {
            kind: FrameKind::Native,
            address: 0x2000,
            mapping: Some(mapping),
            file_offset: 0x1000,
            lines: crate::model::no_lines(),
        },
    ]
}

fn sample(process: &Arc<ProcessInfo>, time: u64) -> ResolvedSample {
    ResolvedSample {
        process: process.clone(),
        tid: process.pid + 1,
        thread_name: "worker".into(),
        cpu: 3,
        time_unix_nano: time,
        frames: frames(),
        off_cpu: None,
        trace: None,
        attributes: Vec::new(),
    }
}

fn builder() -> ProfileBuilder {
    let resource = ResourceConfig::new("box", None, None, Some("svc")).unwrap();
    ProfileBuilder::new(resource, 19, 1_000)
}

fn attribute<'a>(
    dictionary: &'a ProfilesDictionary,
    indices: &[i32],
    key: &str,
) -> Option<&'a any_value::Value> {
    indices.iter().find_map(|&index| {
        let attribute = &dictionary.attribute_table[index as usize];
        (dictionary.string_table[attribute.key_strindex as usize] == key)
            .then(|| attribute.value.as_ref()?.value.as_ref())
            .flatten()
    })
}

fn resource_attribute(resource: &ResourceProfiles, key: &str) -> Option<String> {
    resource
        .resource
        .as_ref()?
        .attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match &kv.value {
            Some(AnyValue {
                value: Some(any_value::Value::StringValue(text)),
            }) => Some(text.clone()),
            _ => None,
        })
}

#[test]
fn one_window_obeys_every_dictionary_rule() {
    let mut builder = builder();
    let host = process(10, None);
    let boxed = process(20, Some(ID));
    builder.add(&sample(&host, 1_100));
    builder.add(&sample(&host, 1_200));
    builder.add(&sample(&boxed, 1_300));
    assert_eq!(builder.samples(), 3);
    let request = builder.finish(2_000);
    let dictionary = request.dictionary.as_ref().unwrap();
    assert_eq!(
        dictionary_violations(dictionary, &request.resource_profiles),
        Vec::<String>::new()
    );
    // Host group first, then the container.
    assert_eq!(request.resource_profiles.len(), 2);
    let [host_group, container_group] = &request.resource_profiles[..] else {
        unreachable!()
    };
    assert_eq!(resource_attribute(host_group, "container.id"), None);
    assert_eq!(
        resource_attribute(container_group, "container.id").as_deref(),
        Some(ID)
    );
    assert_eq!(
        resource_attribute(host_group, "service.name").as_deref(),
        Some("svc")
    );

    let profile = &host_group.scope_profiles[0].profiles[0];
    assert_eq!(profile.period, 1_000_000_000 / 19);
    assert_eq!(
        (profile.time_unix_nano, profile.duration_nano),
        (1_000, 1_000)
    );
    let strings = &dictionary.string_table;
    let sample_type = profile.sample_type.unwrap();
    assert_eq!(strings[sample_type.type_strindex as usize], "samples");
    assert_eq!(strings[sample_type.unit_strindex as usize], "count");
    let period_type = profile.period_type.unwrap();
    assert_eq!(strings[period_type.type_strindex as usize], "cpu");
    assert_eq!(strings[period_type.unit_strindex as usize], "nanoseconds");
    // The two identical host samples merged into one with two timestamps.
    assert_eq!(profile.samples.len(), 1);
    let merged = &profile.samples[0];
    assert_eq!(merged.timestamps_unix_nano, [1_100, 1_200]);
    assert!(merged.values.is_empty());
    let attrs = &merged.attribute_indices;
    assert_eq!(
        attribute(dictionary, attrs, "process.pid"),
        Some(&any_value::Value::IntValue(10))
    );
    assert_eq!(
        attribute(dictionary, attrs, "thread.id"),
        Some(&any_value::Value::IntValue(11))
    );
    assert_eq!(
        attribute(dictionary, attrs, "cpu.logical_number"),
        Some(&any_value::Value::IntValue(3))
    );
    assert_eq!(
        attribute(dictionary, attrs, "process.executable.name"),
        Some(&any_value::Value::StringValue("app".into()))
    );

    // Both groups share one stack; leaf (kernel) first.
    let container_profile = &container_group.scope_profiles[0].profiles[0];
    assert_eq!(container_profile.samples[0].stack_index, merged.stack_index);
    let stack = &dictionary.stack_table[merged.stack_index as usize];
    assert_eq!(stack.location_indices.len(), 3);
    let leaf = &dictionary.location_table[stack.location_indices[0] as usize];
    assert_eq!(
        attribute(dictionary, &leaf.attribute_indices, "profile.frame.type"),
        Some(&any_value::Value::StringValue("kernel".into()))
    );
    assert_eq!(leaf.mapping_index, 0);
    let inlined = &dictionary.location_table[stack.location_indices[1] as usize];
    let names: Vec<_> = inlined
        .lines
        .iter()
        .map(|line| {
            let function = &dictionary.function_table[line.function_index as usize];
            strings[function.name_strindex as usize].as_str()
        })
        .collect();
    assert_eq!(names, ["inner", "outer"]);
    assert_eq!((inlined.lines[0].line, inlined.lines[0].column), (10, 2));
    let mapping = &dictionary.mapping_table[inlined.mapping_index as usize];
    assert_eq!(
        (mapping.memory_start, mapping.memory_limit),
        (0x1000, 0x9000)
    );
    assert_eq!(strings[mapping.filename_strindex as usize], "/usr/bin/app");
    assert_eq!(
        attribute(
            dictionary,
            &mapping.attribute_indices,
            "process.executable.build_id.gnu"
        ),
        Some(&any_value::Value::StringValue("abcd".into()))
    );
    assert_ne!(profile.profile_id, container_profile.profile_id);
}

#[test]
fn windows_do_not_share_state_and_stretch_to_late_samples() {
    let mut builder = builder();
    let host = process(10, None);
    builder.add(&sample(&host, 1_500));
    let first = builder.finish(2_000);
    assert!(!first.resource_profiles.is_empty());
    // Resolved after the cut, but taken before it.
    builder.add(&sample(&host, 1_900));
    builder.add(&sample(&host, 2_500));
    let second = builder.finish(3_000);
    let dictionary = second.dictionary.as_ref().unwrap();
    assert_eq!(
        dictionary_violations(dictionary, &second.resource_profiles),
        Vec::<String>::new()
    );
    let profile = &second.resource_profiles[0].scope_profiles[0].profiles[0];
    assert_eq!(
        (profile.time_unix_nano, profile.duration_nano),
        (1_900, 1_100)
    );
    assert!(builder.finish(4_000).resource_profiles.is_empty());
}

#[test]
fn the_checker_catches_broken_dictionaries() {
    let mut builder = builder();
    builder.add(&sample(&process(10, None), 1_100));
    let request = builder.finish(2_000);
    let good = request.dictionary.unwrap();
    let groups = request.resource_profiles;

    let mut duplicate = good.clone();
    duplicate.string_table.push("samples".into());
    let problems = dictionary_violations(&duplicate, &groups);
    assert!(
        problems.iter().any(|p| p.contains("duplicates")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("not referenced")),
        "{problems:?}"
    );

    let mut no_zero = good.clone();
    no_zero.string_table[0] = "x".into();
    assert!(!dictionary_violations(&no_zero, &groups).is_empty());

    let mut out_of_range = groups.clone();
    out_of_range[0].scope_profiles[0].profiles[0].samples[0].stack_index = 999;
    let problems = dictionary_violations(&good, &out_of_range);
    assert!(
        problems.iter().any(|p| p.contains("stack_table[999]")),
        "{problems:?}"
    );

    let mut late = groups;
    late[0].scope_profiles[0].profiles[0].samples[0].timestamps_unix_nano = vec![5_000];
    assert!(!dictionary_violations(&good, &late).is_empty());
}

#[test]
fn off_cpu_samples_form_a_second_profile_sharing_the_dictionary() {
    use crate::model::{OffCpu, ThreadState};
    let process = process(7, None);
    let mut builder = builder();
    builder.add(&sample(&process, 1_100));
    for (time, blocked) in [(1_200, 5_000_000), (1_300, 7_000_000)] {
        let mut blocked_sample = sample(&process, time);
        blocked_sample.off_cpu = Some(OffCpu {
            blocked_ns: blocked,
            state: ThreadState::Uninterruptible,
        });
        builder.add(&blocked_sample);
    }
    let request = builder.finish(2_000);
    let dictionary = request.dictionary.as_ref().unwrap();
    assert_eq!(
        dictionary_violations(dictionary, &request.resource_profiles),
        Vec::<String>::new()
    );
    let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
    assert_eq!(profiles.len(), 2, "a CPU and an off-CPU profile");
    let string = |index: i32| dictionary.string_table[index as usize].as_str();
    let off_cpu = &profiles[1];
    let sample_type = off_cpu.sample_type.unwrap();
    assert_eq!(
        (
            string(sample_type.type_strindex),
            string(sample_type.unit_strindex)
        ),
        ("off_cpu", "nanoseconds")
    );
    // Both blocks share stack and attributes: one sample, values and
    // timestamps index by index.
    assert_eq!(off_cpu.samples.len(), 1);
    assert_eq!(off_cpu.samples[0].values, [5_000_000, 7_000_000]);
    assert_eq!(off_cpu.samples[0].timestamps_unix_nano, [1_200, 1_300]);
    let state = attribute(
        dictionary,
        &off_cpu.samples[0].attribute_indices,
        "thread.state",
    );
    assert_eq!(
        state,
        Some(&any_value::Value::StringValue("uninterruptible".into()))
    );
    // The CPU profile's samples carry no thread.state.
    assert!(
        attribute(
            dictionary,
            &profiles[0].samples[0].attribute_indices,
            "thread.state"
        )
        .is_none()
    );
}

#[test]
fn processes_that_say_who_they_are_get_resources_of_their_own() {
    use crate::model::{ResourceValue, ServiceResource};
    let named = |pid, container, instance: &str| {
        let service = ServiceResource::new([
            ("service.name".into(), ResourceValue::Str("checkout".into())),
            (
                "service.instance.id".into(),
                ResourceValue::Str(instance.into()),
            ),
        ]);
        Arc::new(ProcessInfo {
            service: Some(Arc::new(service)),
            thread_keys: None,
            ..(*process(pid, container)).clone()
        })
    };
    let mut builder = builder();
    // Two replicas in one container, one of them with two processes that
    // publish the same, and a process that publishes nothing.
    builder.add(&sample(&named(10, Some(ID), "a"), 1_100));
    builder.add(&sample(&named(11, Some(ID), "b"), 1_200));
    builder.add(&sample(&named(12, Some(ID), "b"), 1_300));
    builder.add(&sample(&process(13, Some(ID)), 1_400));
    let request = builder.finish(2_000);
    let dictionary = request.dictionary.as_ref().unwrap();
    assert_eq!(
        dictionary_violations(dictionary, &request.resource_profiles),
        Vec::<String>::new()
    );
    let mut seen: Vec<(Option<String>, Option<String>, usize)> = request
        .resource_profiles
        .iter()
        .map(|group| {
            assert_eq!(
                resource_attribute(group, "container.id").as_deref(),
                Some(ID)
            );
            (
                resource_attribute(group, "service.name"),
                resource_attribute(group, "service.instance.id"),
                group.scope_profiles[0].profiles[0].samples.len(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (Some("checkout".into()), Some("a".into()), 1),
            // Same stack, other pid: two samples.
            (Some("checkout".into()), Some("b".into()), 2),
            // The agent's own service name where the process said nothing.
            (Some("svc".into()), None, 1),
        ]
    );
}
