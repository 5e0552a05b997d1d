//! pprof's `profile.proto`, gzipped (`.pb.gz`): what `go tool pprof` reads.
//!
//! Samples carry two values (three with off-CPU samples: `off_cpu/nanoseconds`), `samples/count` and `cpu/nanoseconds` (count ×
//! period), and `pid`/`thread` labels (`trace_id`/`span_id` for samples
//! linked to a span); locations are per process address with
//! their mapping, inlined functions as extra lines.
use std::{
    collections::HashMap,
    io::{self, Write as _},
    sync::Arc,
};

use flate2::{Compression, write::GzEncoder};
use hostprof_proto::{
    Message,
    pprof::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType},
};

use crate::{
    model::{Frame, Mapping as ModelMapping, ResolvedSample, ThreadState},
    output::Sink,
};

/// A location's identity: mapping id, address, (function id, line) per line.
type LocationKey = (u64, u64, Vec<(u64, i64)>);

/// What tells two pprof samples apart: stack, pid, tid, off-CPU state,
/// span, thread-context attributes.
type SampleKey = (
    Vec<u64>,
    u32,
    u32,
    Option<ThreadState>,
    Option<crate::model::TraceLink>,
    Vec<(Arc<str>, Arc<str>)>,
);

/// Collects samples into a pprof profile.
pub struct PprofProfile {
    period_ns: i64,
    start_unix_nano: u64,
    strings: HashMap<String, i64>,
    string_table: Vec<String>,
    functions: HashMap<(i64, i64, i64, i64), u64>,
    mappings: HashMap<Arc<ModelMapping>, u64>,
    locations: HashMap<LocationKey, u64>,
    profile: Profile,
    /// (locations, pid, tid, off-CPU state) -> index in `profile.sample`.
    samples: HashMap<SampleKey, usize>,
    /// Whether samples have a third value, off-CPU nanoseconds.
    off_cpu: bool,
}

impl PprofProfile {
    /// A profile of samples taken `frequency_hz` times a second per CPU,
    /// starting at `start_unix_nano`; with `off_cpu`, a third sample type,
    /// `off_cpu/nanoseconds`, holds the time threads spent blocked.
    pub fn new(frequency_hz: u64, start_unix_nano: u64, off_cpu: bool) -> Self {
        let mut pprof = PprofProfile {
            period_ns: 1_000_000_000 / frequency_hz.max(1) as i64,
            start_unix_nano,
            strings: HashMap::new(),
            string_table: Vec::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            profile: Profile::default(),
            samples: HashMap::new(),
            off_cpu,
        };
        pprof.string("");
        pprof.profile.sample_type = vec![
            pprof.value_type("samples", "count"),
            pprof.value_type("cpu", "nanoseconds"),
        ];
        if off_cpu {
            let off_cpu_type = pprof.value_type("off_cpu", "nanoseconds");
            pprof.profile.sample_type.push(off_cpu_type);
        }
        pprof.profile.period_type = Some(pprof.value_type("cpu", "nanoseconds"));
        pprof.profile.period = pprof.period_ns;
        pprof
    }

    fn string(&mut self, text: &str) -> i64 {
        if let Some(&index) = self.strings.get(text) {
            return index;
        }
        let index = self.string_table.len() as i64;
        self.string_table.push(text.to_owned());
        self.strings.insert(text.to_owned(), index);
        index
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> ValueType {
        ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn mapping(&mut self, mapping: &Arc<ModelMapping>) -> u64 {
        if let Some(&id) = self.mappings.get(mapping) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let build_id = mapping.build_ids.gnu.as_deref().unwrap_or("");
        let entry = Mapping {
            id,
            memory_start: mapping.start,
            memory_limit: mapping.end,
            file_offset: mapping.file_offset,
            filename: self.string(&mapping.path),
            build_id: self.string(build_id),
            has_functions: true,
            ..Default::default()
        };
        self.profile.mapping.push(entry);
        self.mappings.insert(mapping.clone(), id);
        id
    }

    fn location(&mut self, frame: &Frame) -> u64 {
        let mapping_id = frame.mapping.as_ref().map_or(0, |m| self.mapping(m));
        let mut lines = Vec::with_capacity(frame.lines.len());
        for line in frame.lines.iter() {
            let name = match frame.kind {
                crate::model::FrameKind::Kernel => format!("{} [k]", line.function),
                _ => line.function.to_string(),
            };
            let key = (
                self.string(&name),
                self.string(&line.system_name),
                self.string(line.file.as_deref().unwrap_or("")),
                i64::from(line.start_line),
            );
            let next_id = self.profile.function.len() as u64 + 1;
            let id = *self.functions.entry(key).or_insert(next_id);
            if id == next_id {
                self.profile.function.push(Function {
                    id,
                    name: key.0,
                    system_name: key.1,
                    filename: key.2,
                    start_line: key.3,
                });
            }
            lines.push((id, i64::from(line.line)));
        }
        let key = (mapping_id, frame.address, lines);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(Location {
            id,
            mapping_id,
            address: frame.address,
            // pprof lists inlined functions innermost first, like our frames.
            line: key
                .2
                .iter()
                .map(|&(function_id, line)| Line {
                    function_id,
                    line,
                    column: 0,
                })
                .collect(),
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }

    /// Distinct samples (stack, pid, thread) so far.
    pub fn distinct_samples(&self) -> usize {
        self.profile.sample.len()
    }

    /// The profile, with its time span ending at `end_unix_nano`.
    pub fn finish(mut self, end_unix_nano: u64) -> Profile {
        self.profile.string_table = std::mem::take(&mut self.string_table);
        self.profile.time_nanos = self.start_unix_nano as i64;
        self.profile.duration_nanos = end_unix_nano.saturating_sub(self.start_unix_nano) as i64;
        self.profile
    }

    /// Writes the gzipped profile.
    pub fn write(self, end_unix_nano: u64, out: impl io::Write) -> io::Result<()> {
        let bytes = self.finish(end_unix_nano).encode_to_vec();
        let mut gzip = GzEncoder::new(out, Compression::default());
        gzip.write_all(&bytes)?;
        gzip.finish()?.flush()
    }
}

impl Sink for PprofProfile {
    fn push(&mut self, sample: &ResolvedSample) {
        self.push_count(sample, 1);
    }

    fn push_count(&mut self, sample: &ResolvedSample, count: u64) {
        if count == 0 {
            return;
        }
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        let locations: Vec<u64> = sample
            .frames
            .iter()
            .map(|frame| self.location(frame))
            .collect();
        let state = sample.off_cpu.map(|off_cpu| off_cpu.state);
        // CPU samples: one sample, one period; off-CPU ones: blocked time only.
        let mut add = vec![count, self.period_ns.saturating_mul(count)];
        if self.off_cpu {
            add.push(0);
        }
        if let Some(off_cpu) = sample.off_cpu {
            if !self.off_cpu {
                return;
            }
            let blocked = i64::try_from(off_cpu.blocked_ns).unwrap_or(i64::MAX);
            add = vec![0, 0, blocked.saturating_mul(count)];
        }
        let key = (
            locations,
            sample.process.pid,
            sample.tid,
            state,
            sample.trace,
            sample.attributes.clone(),
        );
        if let Some(&at) = self.samples.get(&key) {
            let values = &mut self.profile.sample[at].value;
            for (value, more) in values.iter_mut().zip(&add) {
                *value = value.saturating_add(*more);
            }
            return;
        }
        let mut labels = vec![
            Label {
                key: self.string("pid"),
                num: sample.process.pid.into(),
                ..Default::default()
            },
            Label {
                key: self.string("thread"),
                str: self.string(&sample.thread_name),
                ..Default::default()
            },
        ];
        if let Some(state) = state {
            labels.push(Label {
                key: self.string("thread.state"),
                str: self.string(state.name()),
                ..Default::default()
            });
        }
        if let Some(link) = sample.trace {
            for (name, value) in [("trace_id", link.trace_hex()), ("span_id", link.span_hex())] {
                labels.push(Label {
                    key: self.string(name),
                    str: self.string(&value),
                    ..Default::default()
                });
            }
        }
        for (name, value) in &sample.attributes {
            labels.push(Label {
                key: self.string(name),
                str: self.string(value),
                ..Default::default()
            });
        }
        self.samples.insert(key.clone(), self.profile.sample.len());
        self.profile.sample.push(Sample {
            location_id: key.0,
            value: add,
            label: labels,
        });
    }
}
