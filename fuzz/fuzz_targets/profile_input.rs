//! A profile file given to `hostprof report` (OTLP protobuf and JSON, pprof,
//! folded stacks): every reader on the same bytes, then what `report` does
//! with what they accept (counts into a summary and folded stacks).
#![no_main]

use hostprof::{
    input::{InputFormat, read},
    output::{FoldedStacks, Summary},
    output::Sink,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = InputFormat::sniff(data);
    for format in [
        InputFormat::Otlp,
        InputFormat::OtlpJson,
        InputFormat::Pprof,
        InputFormat::Folded,
    ] {
        let Ok(mut profile) = read(data, format) else {
            continue;
        };
        let names: Vec<String> = profile.group_names().iter().map(|n| n.to_string()).collect();
        let mut summary = Summary::new();
        let mut folded = match profile.period_ns {
            Some(period) if profile.has_off_cpu() => FoldedStacks::in_microseconds(period),
            _ => FoldedStacks::new(),
        };
        for counted in profile.groups.iter().flat_map(|group| &group.samples) {
            assert!(counted.timestamps.is_empty() || counted.timestamps.len() as u64 == counted.count);
            summary.push_count(&counted.sample, counted.count);
            folded.push_count(&counted.sample, counted.count);
        }
        let _ = summary.top(5);
        let _ = folded.write(std::io::sink());
        if let Some(name) = names.first() {
            assert!(profile.select(name));
        }
    }
});
