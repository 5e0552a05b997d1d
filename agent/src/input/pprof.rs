//! pprof `profile.proto` (`.pb.gz`, gzipped or not) back into samples.
//!
//! pprof keeps less than OTLP: no thread ids, no frame types (kernel frames
//! are known by the ` [k]` hostprof appends to their names, or, unnamed, by a
//! kernel-half address), no per-sample times, and off-CPU periods summed per
//! stack. Stacks and their counts come back whole.
use std::{collections::HashMap, io::Read as _, sync::Arc};

use flate2::read::GzDecoder;
use hostprof_proto::{
    Message,
    pprof::{Function, Location, Mapping as PprofMapping, Profile},
};

use super::{Attributes, Counted, Group, InputError, InputProfile, MAX_SAMPLES, small};
use crate::model::{
    BuildIds, Frame, FrameKind, Line, Mapping, OffCpu, ProcessInfo, ResolvedSample, ThreadState,
    TraceLink,
};

/// The labels hostprof writes, and the OTLP attributes they stand for: a
/// `report --attribute` names a sample's attribute the same way whatever
/// the file's format.
const LABEL_ATTRIBUTES: [(&str, &str); 2] = [("pid", "process.pid"), ("thread", "thread.name")];

/// The most a gzipped profile may expand to (a bomb is an error, not an
/// out-of-memory kill).
const MAX_UNZIPPED: u64 = 1 << 30;

fn bad(text: impl Into<String>) -> InputError {
    InputError::Pprof(text.into())
}

pub(super) fn read(data: &[u8]) -> Result<InputProfile, InputError> {
    let unzipped;
    let bytes = if data.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(data)
            .take(MAX_UNZIPPED + 1)
            .read_to_end(&mut out)
            .map_err(|err| bad(format!("gzip does not decompress: {err}")))?;
        if out.len() as u64 > MAX_UNZIPPED {
            return Err(bad(format!(
                "expands to more than {} MiB",
                MAX_UNZIPPED >> 20
            )));
        }
        unzipped = out;
        &unzipped[..]
    } else {
        data
    };
    let profile =
        Profile::decode(bytes).map_err(|err| bad(format!("protobuf does not decode: {err}")))?;
    if profile.sample_type.is_empty() {
        return Err(bad("no sample types"));
    }
    decode(&profile).map_err(bad)
}

struct Tables<'a> {
    profile: &'a Profile,
    locations: HashMap<u64, &'a Location>,
    functions: HashMap<u64, &'a Function>,
    mappings: HashMap<u64, &'a PprofMapping>,
    mapping_cache: HashMap<u64, Arc<Mapping>>,
    frame_cache: HashMap<u64, Frame>,
}

impl<'a> Tables<'a> {
    fn string(&self, index: i64) -> Result<&'a str, String> {
        let table = &self.profile.string_table;
        usize::try_from(index)
            .ok()
            .and_then(|at| table.get(at))
            .map(String::as_str)
            .ok_or_else(|| {
                format!(
                    "string index {index} out of range ({} strings)",
                    table.len()
                )
            })
    }

    fn mapping(&mut self, id: u64) -> Result<Option<Arc<Mapping>>, String> {
        if id == 0 {
            return Ok(None);
        }
        if let Some(mapping) = self.mapping_cache.get(&id) {
            return Ok(Some(mapping.clone()));
        }
        let entry = *self
            .mappings
            .get(&id)
            .ok_or_else(|| format!("no mapping with id {id}"))?;
        let build_id = self.string(entry.build_id)?;
        let mapping = Arc::new(Mapping {
            start: entry.memory_start,
            end: entry.memory_limit,
            file_offset: entry.file_offset,
            path: self.string(entry.filename)?.into(),
            dev: 0,
            inode: 0,
            build_ids: BuildIds {
                gnu: (!build_id.is_empty()).then(|| build_id.into()),
                ..Default::default()
            },
        });
        self.mapping_cache.insert(id, mapping.clone());
        Ok(Some(mapping))
    }

    fn frame(&mut self, id: u64) -> Result<Frame, String> {
        if let Some(frame) = self.frame_cache.get(&id) {
            return Ok(frame.clone());
        }
        let location = *self
            .locations
            .get(&id)
            .ok_or_else(|| format!("no location with id {id}"))?;
        let mapping = self.mapping(location.mapping_id)?;
        let mut kernel = false;
        let mut lines = Vec::with_capacity(location.line.len());
        for line in &location.line {
            let function = *self
                .functions
                .get(&line.function_id)
                .ok_or_else(|| format!("no function with id {}", line.function_id))?;
            let mut name = self.string(function.name)?;
            if let Some(kernel_name) = name.strip_suffix(" [k]") {
                kernel = true;
                name = kernel_name;
            }
            let file = self.string(function.filename)?;
            lines.push(Line {
                function: name.into(),
                system_name: self.string(function.system_name)?.into(),
                file: (!file.is_empty()).then(|| file.into()),
                line: small(line.line),
                column: small(line.column),
                start_line: small(function.start_line),
            });
        }
        // Unnamed kernel frames have no mapping and a kernel-half address.
        if lines.is_empty() && mapping.is_none() && location.address >> 63 == 1 {
            kernel = true;
        }
        let file_offset = mapping.as_ref().map_or(0, |mapping| {
            (location.address.wrapping_sub(mapping.start)).wrapping_add(mapping.file_offset)
        });
        let frame = Frame {
            kind: if kernel {
                FrameKind::Kernel
            } else {
                FrameKind::Native
            },
            address: location.address,
            mapping,
            file_offset,
            lines: lines.into(),
        };
        self.frame_cache.insert(id, frame.clone());
        Ok(frame)
    }
}

fn decode(profile: &Profile) -> Result<InputProfile, String> {
    let mut tables = Tables {
        profile,
        locations: profile.location.iter().map(|l| (l.id, l)).collect(),
        functions: profile.function.iter().map(|f| (f.id, f)).collect(),
        mappings: profile.mapping.iter().map(|m| (m.id, m)).collect(),
        mapping_cache: HashMap::new(),
        frame_cache: HashMap::new(),
    };
    let mut types = Vec::with_capacity(profile.sample_type.len());
    for value_type in &profile.sample_type {
        types.push((
            tables.string(value_type.r#type)?,
            tables.string(value_type.unit)?,
        ));
    }
    let find = |wanted: (&str, &str)| types.iter().position(|&found| found == wanted);
    let samples_at = find(("samples", "count"));
    let cpu_at = find(("cpu", "nanoseconds"));
    let off_cpu_at = find(("off_cpu", "nanoseconds"));
    let period = match &profile.period_type {
        Some(period_type)
            if tables.string(period_type.r#type)? == "cpu"
                && tables.string(period_type.unit)? == "nanoseconds"
                && profile.period > 0 =>
        {
            Some(profile.period as u64)
        }
        _ => None,
    };
    let mut input = InputProfile {
        period_ns: period,
        start_unix_nano: u64::try_from(profile.time_nanos).unwrap_or(0),
        ..Default::default()
    };
    input.end_unix_nano = input
        .start_unix_nano
        .saturating_add(u64::try_from(profile.duration_nanos).unwrap_or(0));
    if samples_at.is_none() && (cpu_at.is_none() || period.is_none()) && off_cpu_at.is_none() {
        for (kind, unit) in &types {
            input.skip(format!("{kind}/{unit}"));
        }
    }
    let mut group = Group::default();
    let mut processes: HashMap<(i64, &str), Arc<ProcessInfo>> = HashMap::new();
    let mut total: u64 = 0;
    // Samples of one thread and span share their labels' text.
    let mut label_texts: HashMap<Vec<(i64, i64, i64)>, Attributes> = HashMap::new();
    for sample in &profile.sample {
        let (mut pid, mut thread, mut state) = (0, "", None);
        let (mut trace_id, mut span_id) = (None, None);
        for label in &sample.label {
            match tables.string(label.key)? {
                "pid" => pid = label.num,
                "thread" => thread = tables.string(label.str)?,
                "thread.state" => state = Some(tables.string(label.str)?),
                "trace_id" => trace_id = TraceLink::parse_trace_id(tables.string(label.str)?).ok(),
                "span_id" => span_id = TraceLink::parse_span_id(tables.string(label.str)?).ok(),
                _ => {}
            }
        }
        let trace = trace_id
            .zip(span_id)
            .map(|(trace_id, span_id)| TraceLink { trace_id, span_id });
        let label_key: Vec<(i64, i64, i64)> = sample
            .label
            .iter()
            .map(|label| (label.key, label.str, label.num))
            .collect();
        let attributes = match label_texts.get(&label_key) {
            Some(texts) => texts.clone(),
            None => {
                let texts = labels_as_attributes(&tables, &sample.label)?;
                label_texts.insert(label_key, texts.clone());
                texts
            }
        };
        let value = |at: Option<usize>| {
            at.and_then(|at| sample.value.get(at))
                .map(|&value| u64::try_from(value).unwrap_or(0))
        };
        let (count, off_cpu) = match state {
            Some(state) => {
                let Some(blocked_ns) = value(off_cpu_at) else {
                    continue;
                };
                let state = ThreadState::from_name(state).unwrap_or(ThreadState::Other);
                (1, Some(OffCpu { blocked_ns, state }))
            }
            None => match (value(samples_at), value(cpu_at), period) {
                (Some(count), _, _) => (count, None),
                (None, Some(cpu_ns), Some(period)) => (cpu_ns / period, None),
                _ => continue,
            },
        };
        if count == 0 {
            continue;
        }
        total = total.saturating_add(count);
        if total > MAX_SAMPLES {
            return Err(format!("more than {MAX_SAMPLES} samples"));
        }
        let frames = sample
            .location_id
            .iter()
            .map(|&id| tables.frame(id))
            .collect::<Result<Vec<_>, _>>()?;
        let process = processes
            .entry((pid, thread))
            .or_insert_with(|| {
                Arc::new(ProcessInfo {
                    pid: u32::try_from(pid).unwrap_or(0),
                    // pprof keeps no process name: its thread's stands in.
                    comm: thread.into(),
                    exe_path: "".into(),
                    container_id: None,
                    pod_uid: None,
                    service: None,
                    thread_keys: None,
                })
            })
            .clone();
        group.samples.push(Counted {
            sample: ResolvedSample {
                process,
                tid: 0,
                thread_name: thread.into(),
                cpu: 0,
                time_unix_nano: input.start_unix_nano,
                frames,
                off_cpu,
                trace,
                attributes: Vec::new(),
            },
            count,
            timestamps: Vec::new(),
            attributes,
        });
    }
    input.groups.push(group);
    Ok(input)
}

/// A sample's labels as attributes: text labels as they are, numeric ones
/// in decimal, and each label hostprof writes under its OTLP name too.
fn labels_as_attributes(
    tables: &Tables,
    labels: &[hostprof_proto::pprof::Label],
) -> Result<Attributes, String> {
    let mut texts: Vec<(Arc<str>, Arc<str>)> = Vec::with_capacity(labels.len() + 2);
    for label in labels {
        let key = tables.string(label.key)?;
        let value: Arc<str> = match label.str {
            0 => label.num.to_string().into(),
            index => tables.string(index)?.into(),
        };
        if let Some((_, otlp)) = LABEL_ATTRIBUTES.iter().find(|(name, _)| *name == key) {
            texts.push((Arc::from(*otlp), value.clone()));
        }
        texts.push((key.into(), value));
    }
    Ok(texts.into())
}
