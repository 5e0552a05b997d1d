//! Each reader against its own format's writer: what `record` writes, read
//! back, gives the same folded stacks as the samples it was written from.
use std::sync::Arc;

use hostprof_proto::Message;

use super::*;
use crate::{
    model::{BuildIds, Frame, FrameKind, Line, Mapping, OffCpu, ProcessInfo, ThreadState},
    output::Sink,
    output::{FoldedStacks, PprofProfile, otlp_json},
    profile::{ProfileBuilder, ResourceConfig},
};

const PERIOD_NS: u64 = 1_000_000_000 / 99;

fn process(pid: u32, exe: &str, container: Option<&str>) -> Arc<ProcessInfo> {
    Arc::new(ProcessInfo {
        pid,
        comm: exe.rsplit('/').next().unwrap().into(),
        exe_path: exe.into(),
        container_id: container.map(Arc::from),
        pod_uid: container.map(|id| Arc::from(format!("pod-{id}"))),
        service: None,
        thread_keys: None,
    })
}

fn named(kind: FrameKind, address: u64, names: &[&str]) -> Frame {
    Frame {
        kind,
        address,
        mapping: None,
        file_offset: 0,
        lines: names
            .iter()
            .map(|name| Line {
                file: Some("src/x.c".into()),
                line: 7,
                start_line: 3,
                ..Line::named((*name).into(), format!("_Z{name}").into())
            })
            .collect(),
    }
}

/// Samples with everything a frame can be: kernel (named and not), inlined
/// functions, a frame in a library without names, Go; three resources (two
/// containers, host processes); CPU and off-CPU.
pub(super) fn samples() -> Vec<ResolvedSample> {
    let library = Arc::new(Mapping {
        start: 0x7f00_0000_0000,
        end: 0x7f00_0001_0000,
        file_offset: 0x2000,
        path: "/usr/lib/libfoo.so".into(),
        dev: 8,
        inode: 42,
        build_ids: BuildIds {
            gnu: Some("abcd".into()),
            ..Default::default()
        },
    });
    let mut in_library = named(FrameKind::Native, 0x7f00_0000_0123, &[]);
    in_library.mapping = Some(library.clone());
    in_library.file_offset = 0x2123;
    let main = named(FrameKind::Native, 0x401000, &["main"]);
    let hot = named(FrameKind::Native, 0x401100, &["inlined_leaf", "hot_work"]);
    let cold = named(FrameKind::Native, 0x401200, &["cold_work"]);
    let kernel = named(FrameKind::Kernel, 0xffff_ffff_8100_0000, &["do_syscall_64"]);
    let unnamed_kernel = named(FrameKind::Kernel, 0xffff_ffff_8100_0042, &[]);
    let go = named(FrameKind::Go, 0x45_0000, &["main.spin"]);
    let app = process(10, "/bin/app", Some("c0ffee"));
    let web = process(20, "/srv/web", Some("beef"));
    let host = process(30, "/usr/bin/tool", None);
    let sample = |process: &Arc<ProcessInfo>, tid, time, frames: Vec<Frame>| ResolvedSample {
        process: process.clone(),
        tid,
        thread_name: format!("{}-t{tid}", process.comm).into(),
        cpu: tid % 2,
        time_unix_nano: time,
        frames,
        off_cpu: None,
        trace: None,
        attributes: Vec::new(),
    };
    let mut all = Vec::new();
    for round in 0..5u64 {
        let time = 1_000 + round * 10;
        all.push(sample(&app, 11, time, vec![hot.clone(), main.clone()]));
        all.push(sample(&app, 11, time + 1, vec![hot.clone(), main.clone()]));
        all.push(sample(&app, 12, time + 2, vec![cold.clone(), main.clone()]));
        all.push(sample(
            &web,
            21,
            time + 3,
            vec![kernel.clone(), in_library.clone(), main.clone()],
        ));
        all.push(sample(&host, 31, time + 4, vec![go.clone()]));
        all.push(sample(
            &host,
            31,
            time + 5,
            vec![unnamed_kernel.clone(), main.clone()],
        ));
    }
    let mut blocked = sample(&app, 12, 2_000, vec![kernel.clone(), main.clone()]);
    blocked.off_cpu = Some(OffCpu {
        blocked_ns: 3_000_000,
        state: ThreadState::Interruptible,
    });
    all.push(blocked.clone());
    blocked.off_cpu = Some(OffCpu {
        blocked_ns: 5_000,
        state: ThreadState::Uninterruptible,
    });
    all.push(blocked);
    all
}

fn folded(samples: impl IntoIterator<Item = (ResolvedSample, u64)>, off_cpu: bool) -> String {
    let mut folded = if off_cpu {
        FoldedStacks::in_microseconds(PERIOD_NS)
    } else {
        FoldedStacks::new()
    };
    for (sample, count) in samples {
        folded.push_count(&sample, count);
    }
    let mut out = Vec::new();
    folded.write(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn folded_of(profile: &InputProfile, off_cpu: bool) -> String {
    folded(
        profile
            .groups
            .iter()
            .flat_map(|group| &group.samples)
            .map(|counted| (counted.sample.clone(), counted.count)),
        off_cpu,
    )
}

pub(super) fn otlp_data(samples: &[ResolvedSample]) -> hostprof_proto::profiles::ProfilesData {
    let resource =
        ResourceConfig::new("node-7", Some("deployment.environment=test"), None, None).unwrap();
    let mut builder = ProfileBuilder::new(resource, 99, 500);
    for sample in samples {
        builder.push(sample);
    }
    builder.finish_data(9_000)
}

#[test]
fn otlp_protobuf_reads_back_to_the_same_stacks_groups_and_times() {
    let samples = samples();
    let bytes = otlp_data(&samples).encode_to_vec();
    let profile = read(&bytes, InputFormat::Otlp).unwrap();
    let expected = folded(samples.iter().map(|s| (s.clone(), 1)), true);
    assert!(expected.contains("[off-cpu: interruptible]"), "{expected}");
    assert!(expected.contains("[libfoo.so+0x2123]"), "{expected}");
    assert!(
        expected.contains("[kernel+0xffffffff81000042]"),
        "{expected}"
    );
    assert_eq!(folded_of(&profile, true), expected);
    assert_eq!(profile.period_ns, Some(PERIOD_NS));
    assert!(profile.start_unix_nano <= 500 && profile.end_unix_nano >= 9_000);
    assert!(
        profile
            .resource_attributes
            .contains(&("host.name".into(), "node-7".into()))
    );
    assert!(profile.skipped.is_empty());
    let mut names = profile.group_names();
    names.sort_unstable();
    assert_eq!(names, ["beef", "c0ffee", "host"]);
    // Times, processes and mappings come back too.
    let mut times: Vec<u64> = profile
        .groups
        .iter()
        .flat_map(|group| &group.samples)
        .filter(|counted| counted.sample.off_cpu.is_none())
        .flat_map(|counted| counted.timestamps.clone())
        .collect();
    times.sort_unstable();
    let mut expected_times: Vec<u64> = samples
        .iter()
        .filter(|sample| sample.off_cpu.is_none())
        .map(|sample| sample.time_unix_nano)
        .collect();
    expected_times.sort_unstable();
    assert_eq!(times, expected_times);
    let web = profile
        .groups
        .iter()
        .find(|group| group.name() == "beef")
        .unwrap();
    let first = &web.samples[0].sample;
    assert_eq!(first.process.pid, 20);
    assert_eq!(&*first.process.exe_path, "/srv/web");
    assert_eq!(first.process.pod_uid.as_deref(), Some("pod-beef"));
    let library = first.frames[1].mapping.as_ref().unwrap();
    assert_eq!(library.build_ids.gnu.as_deref(), Some("abcd"));
    assert_eq!(first.frames[0].kind, FrameKind::Kernel);
    assert_eq!(first.frames[0].lines[0].start_line, 3);
}

#[test]
fn otlp_json_reads_back_like_protobuf() {
    let samples = samples();
    let data = otlp_data(&samples);
    let from_json = read(otlp_json::to_json(&data).as_bytes(), InputFormat::OtlpJson).unwrap();
    let from_protobuf = read(&data.encode_to_vec(), InputFormat::Otlp).unwrap();
    assert_eq!(folded_of(&from_json, true), folded_of(&from_protobuf, true));
    assert_eq!(from_json.period_ns, from_protobuf.period_ns);
    assert_eq!(from_json.group_names(), from_protobuf.group_names());
    assert_eq!(
        folded_of(&from_json, true),
        folded(samples.into_iter().map(|s| (s, 1)), true)
    );
}

#[test]
fn pprof_reads_back_to_the_same_stacks_and_counts() {
    let samples = samples();
    let mut pprof = PprofProfile::new(99, 500, true);
    for sample in &samples {
        pprof.push(sample);
    }
    let mut gz = Vec::new();
    pprof.write(9_000, &mut gz).unwrap();
    let profile = read(&gz, InputFormat::Pprof).unwrap();
    assert_eq!(profile.period_ns, Some(PERIOD_NS));
    assert_eq!(
        folded_of(&profile, true),
        folded(samples.into_iter().map(|s| (s, 1)), true)
    );
}

#[test]
fn folded_reads_back_to_itself() {
    let samples = samples();
    for off_cpu in [false, true] {
        let text = folded(
            samples
                .iter()
                .filter(|s| off_cpu || s.off_cpu.is_none())
                .map(|s| (s.clone(), 1)),
            off_cpu,
        );
        let profile = read(text.as_bytes(), InputFormat::Folded).unwrap();
        assert_eq!(profile.has_off_cpu(), off_cpu);
        let again = match off_cpu {
            // CPU lines count microseconds: 1 µs "samples".
            true => {
                let mut folded = FoldedStacks::in_microseconds(profile.period_ns.unwrap());
                for counted in &profile.groups[0].samples {
                    folded.push_count(&counted.sample, counted.count);
                }
                let mut out = Vec::new();
                folded.write(&mut out).unwrap();
                String::from_utf8(out).unwrap()
            }
            false => folded_of(&profile, false),
        };
        assert_eq!(again, text);
    }
}

#[test]
fn container_selection_keeps_only_that_resource() {
    let samples = samples();
    let mut profile = read(&otlp_data(&samples).encode_to_vec(), InputFormat::Otlp).unwrap();
    assert!(!profile.clone().select("nope"));
    assert!(profile.select("c0ffee"));
    let expected = folded(
        samples
            .into_iter()
            .filter(|s| s.process.container_id.as_deref() == Some("c0ffee"))
            .map(|s| (s, 1)),
        true,
    );
    assert_eq!(folded_of(&profile, true), expected);
    assert!(expected.contains("hot_work"));
    assert!(!expected.contains("main.spin"));
}

#[test]
fn formats_are_told_by_name_and_content() {
    assert_eq!(InputFormat::for_name("a.otlp.pb"), Some(InputFormat::Otlp));
    assert_eq!(
        InputFormat::for_name("a.otlp.json"),
        Some(InputFormat::OtlpJson)
    );
    assert_eq!(InputFormat::for_name("a.pb.gz"), Some(InputFormat::Pprof));
    assert_eq!(InputFormat::for_name("a.folded"), Some(InputFormat::Folded));
    assert_eq!(InputFormat::for_name("a.txt"), None);
    assert_eq!(InputFormat::sniff(b"\x1f\x8b\x08"), InputFormat::Pprof);
    assert_eq!(InputFormat::sniff(b" {\"x\":1}"), InputFormat::OtlpJson);
    assert_eq!(InputFormat::sniff(b"a;b 3\nc 4\n"), InputFormat::Folded);
    assert_eq!(InputFormat::sniff(b"\x0a\x02\x08\x01"), InputFormat::Otlp);
}

#[test]
fn bad_input_is_one_line_error() {
    let cases: &[(&[u8], InputFormat, &str)] = &[
        (b"hello world", InputFormat::Otlp, "not an OTLP profile: "),
        (b"\x0a\x05\x0a", InputFormat::Otlp, "not an OTLP profile: "),
        (
            b"{\"resourceProfiles\": 3}",
            InputFormat::OtlpJson,
            "is not an array",
        ),
        (
            b"{",
            InputFormat::OtlpJson,
            "not an OTLP/JSON profile: invalid JSON",
        ),
        (
            b"\x1f\x8b\x08\x00garbage",
            InputFormat::Pprof,
            "not a pprof profile: ",
        ),
        (b"a;b\n", InputFormat::Folded, "line 1: no count"),
        (
            b"a;b x\n",
            InputFormat::Folded,
            "line 1: the count is not a number",
        ),
        (
            b"a;[off-cpu: dozing];b 4\n",
            InputFormat::Folded,
            "unknown off-CPU state",
        ),
    ];
    for (data, format, expected) in cases {
        let err = read(data, *format).unwrap_err().to_string();
        assert!(err.contains(expected), "{err:?} lacks {expected:?}");
        assert!(!err.contains('\n'), "{err:?}");
    }
    // Indices past their tables.
    let mut data = otlp_data(&samples());
    data.dictionary.as_mut().unwrap().stack_table.truncate(1);
    let err = read(&data.encode_to_vec(), InputFormat::Otlp).unwrap_err();
    assert!(err.to_string().contains("stack index"), "{err}");
    let mut data = otlp_data(&samples());
    data.dictionary.as_mut().unwrap().string_table.truncate(3);
    assert!(read(&data.encode_to_vec(), InputFormat::Otlp).is_err());
}

#[test]
fn unknown_sample_types_are_named_not_guessed() {
    let mut data = otlp_data(&samples());
    let dictionary = data.dictionary.as_mut().unwrap();
    dictionary.string_table.push("alloc_space".into());
    dictionary.string_table.push("bytes".into());
    let strings = dictionary.string_table.len() as i32;
    for resource in &mut data.resource_profiles {
        for profile in &mut resource.scope_profiles[0].profiles {
            profile.sample_type = Some(hostprof_proto::profiles::ValueType {
                type_strindex: strings - 2,
                unit_strindex: strings - 1,
            });
        }
    }
    let profile = read(&data.encode_to_vec(), InputFormat::Otlp).unwrap();
    assert_eq!(profile.skipped, ["alloc_space/bytes"]);
    assert!(profile.groups.iter().all(|group| group.samples.is_empty()));
}
