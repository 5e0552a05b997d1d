//! `report --trace-id/--span-id/--attribute`: parsing, and the samples kept
//! from each format that carries links (OTLP protobuf and JSON, pprof)
//! against a count made from the samples the file was written from.
use hostprof_proto::Message;

use super::{
    tests::{otlp_data, samples},
    *,
};
use crate::{
    model::TraceLink,
    output::{PprofProfile, Sink, otlp_json},
};

const TRACE_A: [u8; 16] = [0xa1; 16];
const TRACE_B: [u8; 16] = [0xb2; 16];
const UNKNOWN: [u8; 16] = [0xcc; 16];

fn span(n: u8) -> [u8; 8] {
    [0, 0, 0, 0, 0, 0, 0, n]
}

/// The fixture's samples, linked: app's thread 11 to trace A (span 1 in
/// even rounds, 2 in odd ones), app's thread 12 blocked in span 3 of
/// trace A, web to trace B (span 4); the rest to nothing.
fn linked_samples() -> Vec<ResolvedSample> {
    let mut samples = samples();
    for (at, sample) in samples.iter_mut().enumerate() {
        let link = |trace_id, span_id| Some(TraceLink { trace_id, span_id });
        sample.trace = match (&*sample.process.comm, sample.tid, &sample.off_cpu) {
            ("app", 11, None) => link(TRACE_A, span(1 + (at / 6 % 2) as u8)),
            ("app", 12, Some(_)) => link(TRACE_A, span(3)),
            ("web", _, _) => link(TRACE_B, span(4)),
            _ => None,
        };
    }
    samples
}

/// The fixture written as each format that carries links, read back.
fn each_format(samples: &[ResolvedSample]) -> Vec<(&'static str, InputProfile)> {
    let data = otlp_data(samples);
    let mut pprof = PprofProfile::new(99, 500, true);
    for sample in samples {
        pprof.push(sample);
    }
    let mut gz = Vec::new();
    pprof.write(9_000, &mut gz).unwrap();
    vec![
        (
            "otlp",
            read(&data.encode_to_vec(), InputFormat::Otlp).unwrap(),
        ),
        (
            "otlp-json",
            read(otlp_json::to_json(&data).as_bytes(), InputFormat::OtlpJson).unwrap(),
        ),
        ("pprof", read(&gz, InputFormat::Pprof).unwrap()),
    ]
}

/// Samples as `report` counts them: CPU samples and off-CPU periods.
fn weight(profile: &InputProfile) -> u64 {
    profile
        .groups
        .iter()
        .flat_map(|group| &group.samples)
        .map(|counted| counted.count)
        .sum()
}

fn filter(trace: Option<[u8; 16]>, span: Option<[u8; 8]>, attributes: &[&str]) -> SampleFilter {
    let attributes = attributes
        .iter()
        .map(|text| SampleFilter::parse_attribute(text).unwrap())
        .collect();
    SampleFilter::new(trace, span, attributes)
}

#[test]
fn attributes_parse_as_key_equals_value() {
    let parse = SampleFilter::parse_attribute;
    assert_eq!(
        parse("service.name=checkout"),
        Ok(("service.name".into(), "checkout".into()))
    );
    // The first `=` splits; values may be empty or hold more.
    assert_eq!(parse(" k =a=b"), Ok(("k".into(), "a=b".into())));
    assert_eq!(parse("k="), Ok(("k".into(), String::new())));
    let no_equals = parse("service.name").unwrap_err().to_string();
    assert!(no_equals.contains("KEY=VALUE"), "{no_equals}");
    assert_eq!(
        parse(" =x").unwrap_err().to_string(),
        "the key before `=` is empty"
    );
    let both = filter(Some(TRACE_A), Some(span(1)), &["a=1", "b=2", "a=1"]);
    assert_eq!(
        both.to_string(),
        format!(
            "--trace-id {} --span-id 0000000000000001 --attribute a=1 --attribute b=2",
            "a1".repeat(16)
        )
    );
    assert!(SampleFilter::default().is_empty());
    assert!(!both.is_empty());
}

#[test]
fn links_read_back_from_every_format_that_carries_them() {
    let samples = linked_samples();
    for (format, profile) in each_format(&samples) {
        let mut spans: Vec<(u8, u64)> = Vec::new();
        for counted in profile.groups.iter().flat_map(|group| &group.samples) {
            if let Some(link) = counted.sample.trace {
                let trace = if link.trace_id == TRACE_A { 0xa } else { 0xb };
                spans.push((trace * 16 + link.span_id[7], counted.count));
            }
        }
        spans.sort_unstable();
        spans.dedup_by(|b, a| {
            let same = a.0 == b.0;
            if same {
                a.1 += b.1;
            }
            same
        });
        assert_eq!(
            spans,
            [(0xa1, 6), (0xa2, 4), (0xa3, 2), (0xb4, 5)],
            "{format}"
        );
    }
}

#[test]
fn trace_span_and_attribute_filters_keep_exactly_the_matching_samples() {
    let samples = linked_samples();
    let linked_to = |trace, span: Option<[u8; 8]>| {
        samples
            .iter()
            .filter(|sample| {
                sample.trace.is_some_and(|link| {
                    link.trace_id == trace && span.is_none_or(|span| link.span_id == span)
                })
            })
            .count() as u64
    };
    assert_eq!(linked_to(TRACE_A, None), 12);
    for (format, profile) in each_format(&samples) {
        let all = weight(&profile);
        let pprof = format == "pprof";
        let cases: Vec<(SampleFilter, u64)> = vec![
            (filter(Some(TRACE_A), None, &[]), linked_to(TRACE_A, None)),
            (
                filter(None, Some(span(1)), &[]),
                linked_to(TRACE_A, Some(span(1))),
            ),
            (filter(Some(TRACE_B), Some(span(4)), &[]), 5),
            // A span of another trace: both must hold.
            (filter(Some(TRACE_B), Some(span(1)), &[]), 0),
            // A sample attribute (pprof: the `thread` label, by its OTLP name).
            (filter(Some(TRACE_A), None, &["thread.name=app-t11"]), 10),
            (filter(None, None, &["process.pid=20"]), 5),
            // A resource attribute: OTLP has resources, pprof none.
            (
                filter(Some(TRACE_B), None, &["container.id=beef"]),
                if pprof { 0 } else { 5 },
            ),
            (
                filter(None, None, &["host.name=node-7"]),
                if pprof { 0 } else { all },
            ),
            (filter(Some(UNKNOWN), None, &[]), 0),
        ];
        for (filter, expected) in cases {
            let mut kept = profile.clone();
            let matched = kept.keep_matching(&filter);
            assert_eq!(
                (matched.kept, matched.total),
                (expected, all),
                "{format}: {filter}"
            );
            assert_eq!(weight(&kept), expected, "{format}: {filter}");
            for group in &kept.groups {
                for counted in &group.samples {
                    assert!(
                        filter.matches(&group.attributes, counted),
                        "{format}: {filter}"
                    );
                }
            }
            // Groups the filter emptied are gone, so `{container}` writes
            // no empty files.
            assert!(
                kept.groups.iter().all(|group| !group.samples.is_empty()),
                "{format}: {filter}"
            );
        }
    }
}

#[test]
fn the_line_says_how_many_matched_and_what_is_there_instead() {
    let samples = linked_samples();
    let profile = read(&otlp_data(&samples).encode_to_vec(), InputFormat::Otlp).unwrap();
    let line = |filter: &SampleFilter| profile.clone().keep_matching(filter).line(filter);
    let trace_a = filter(Some(TRACE_A), None, &[]);
    assert_eq!(
        line(&trace_a),
        format!("12 of 32 samples match --trace-id {}", "a1".repeat(16))
    );
    // An unknown trace: the traces there are, busiest first.
    let unknown = line(&filter(Some(UNKNOWN), None, &[]));
    assert!(
        unknown.starts_with(&format!(
            "no sample matches --trace-id {} (of 32); 17 samples are linked to 2 traces, \
             the busiest: {} (12), {} (5)",
            "cc".repeat(16),
            "a1".repeat(16),
            "b2".repeat(16)
        )),
        "{unknown}"
    );
    // Each criterion alone, and the values of an attribute that matched none.
    let both = line(&filter(Some(TRACE_B), None, &["thread.name=app-t11"]));
    assert!(
        both.contains("alone 5, --attribute thread.name=app-t11 alone 10"),
        "{both}"
    );
    let value = line(&filter(None, None, &["process.pid=99"]));
    assert!(
        value.ends_with("; `process.pid` there: 10 (17), 30 (10), 20 (5)"),
        "{value}"
    );
    let key = line(&filter(None, None, &["service.name=cart"]));
    assert!(
        key.ends_with("; no sample or resource has `service.name`"),
        "{key}"
    );
    // A file without links says so.
    let unlinked = read(
        &otlp_data(&super::tests::samples()).encode_to_vec(),
        InputFormat::Otlp,
    )
    .unwrap();
    let none = unlinked.clone().keep_matching(&trace_a).line(&trace_a);
    assert!(
        none.ends_with("no sample in it is linked to a trace: its processes published no OpenTelemetry thread context"),
        "{none}"
    );
}

#[test]
fn bad_links_in_a_file_are_one_line_errors() {
    let mut data = otlp_data(&linked_samples());
    data.dictionary.as_mut().unwrap().link_table[1]
        .span_id
        .pop();
    let err = read(&data.encode_to_vec(), InputFormat::Otlp).unwrap_err();
    assert!(err.to_string().contains("a 7-byte span id"), "{err}");
    let mut data = otlp_data(&linked_samples());
    data.dictionary.as_mut().unwrap().link_table.truncate(2);
    let err = read(&data.encode_to_vec(), InputFormat::Otlp).unwrap_err();
    assert!(err.to_string().contains("link index"), "{err}");
    let json = otlp_json::to_json(&otlp_data(&linked_samples()));
    let bad = json.replacen(&"a1".repeat(16), &format!("zz{}", "a1".repeat(15)), 1);
    assert_ne!(bad, json);
    let err = read(bad.as_bytes(), InputFormat::OtlpJson).unwrap_err();
    assert!(err.to_string().contains("`traceId` is not hex"), "{err}");
}
