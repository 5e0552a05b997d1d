//! OTLP `ProfilesData` (what `record -o X.otlp.pb` writes, and what the
//! agent sends: an `ExportProfilesServiceRequest` has the same fields) back
//! into samples: one group per `ResourceProfiles`, frames from the shared
//! dictionary, process and thread from the sample attributes that
//! [`ProfileBuilder`](crate::profile::ProfileBuilder) writes.
use std::{collections::HashMap, sync::Arc};

use hostprof_proto::{
    Message,
    common::{AnyValue, KeyValue, any_value},
    profiles::{Location, ProfilesData, ProfilesDictionary},
};

use super::{Attributes, Counted, Group, InputError, InputProfile, MAX_SAMPLES, small};
use crate::model::{
    BuildIds, Frame, FrameKind, Line, Mapping, OffCpu, ProcessInfo, ResolvedSample, ThreadState,
    TraceLink,
};

pub(super) fn read_protobuf(data: &[u8]) -> Result<InputProfile, InputError> {
    let decoded = ProfilesData::decode(data)
        .map_err(|err| InputError::Otlp(format!("protobuf does not decode: {err}")))?;
    if !data.is_empty() && decoded.resource_profiles.is_empty() && decoded.dictionary.is_none() {
        return Err(InputError::Otlp(format!(
            "{} bytes without any resource profiles",
            data.len()
        )));
    }
    decode(&decoded).map_err(InputError::Otlp)
}

/// What a profile's samples measure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `samples/count`: each timestamp (or each unit of value) is one sample.
    Cpu,
    /// `off_cpu/nanoseconds`: one period per value, with its timestamp.
    OffCpu,
}

/// A decoded attribute value (hostprof writes strings and integers).
enum Value<'a> {
    Str(&'a str),
    Int(i64),
    Other,
}

impl<'a> Value<'a> {
    fn str(&self) -> Option<&'a str> {
        match self {
            Value::Str(text) => Some(text),
            _ => None,
        }
    }

    fn int(&self) -> Option<i64> {
        match self {
            Value::Int(number) => Some(*number),
            Value::Str(text) => text.parse().ok(),
            Value::Other => None,
        }
    }
}

/// Index lookups into the dictionary, each checked.
struct Tables<'a> {
    dictionary: &'a ProfilesDictionary,
    mappings: HashMap<i32, Arc<Mapping>>,
    frames: HashMap<i32, Frame>,
    /// Samples' attributes as text, by their attribute indices.
    texts: HashMap<Vec<i32>, Attributes>,
}

fn get<'t, T>(table: &'t [T], index: i32, what: &str) -> Result<Option<&'t T>, String> {
    // Index 0 of every table is its zero value, which an empty table omits.
    if index == 0 && table.is_empty() {
        return Ok(None);
    }
    usize::try_from(index)
        .ok()
        .and_then(|at| table.get(at))
        .map(Some)
        .ok_or_else(|| {
            format!(
                "{what} index {index} out of range ({} entries)",
                table.len()
            )
        })
}

impl<'a> Tables<'a> {
    fn string(&self, index: i32) -> Result<&'a str, String> {
        Ok(get(&self.dictionary.string_table, index, "string")?.map_or("", String::as_str))
    }

    fn any_value(&self, value: Option<&'a AnyValue>) -> Result<Value<'a>, String> {
        Ok(match value.and_then(|value| value.value.as_ref()) {
            Some(any_value::Value::StringValue(text)) => Value::Str(text),
            Some(any_value::Value::StringValueStrindex(index)) => Value::Str(self.string(*index)?),
            Some(any_value::Value::IntValue(number)) => Value::Int(*number),
            _ => Value::Other,
        })
    }

    fn attribute(&self, index: i32) -> Result<(&'a str, Value<'a>), String> {
        match get(&self.dictionary.attribute_table, index, "attribute")? {
            Some(entry) => Ok((
                self.string(entry.key_strindex)?,
                self.any_value(entry.value.as_ref())?,
            )),
            None => Ok(("", Value::Other)),
        }
    }

    fn attributes(&self, indices: &[i32]) -> Result<Vec<(&'a str, Value<'a>)>, String> {
        indices.iter().map(|&index| self.attribute(index)).collect()
    }

    /// A sample's attributes with their values as text (those with a
    /// scalar value; the index-0 zero value has no key and is left out).
    fn texts(&mut self, indices: &[i32]) -> Result<Attributes, String> {
        if let Some(texts) = self.texts.get(indices) {
            return Ok(texts.clone());
        }
        let mut texts = Vec::with_capacity(indices.len());
        for &index in indices {
            let Some(entry) = get(&self.dictionary.attribute_table, index, "attribute")? else {
                continue;
            };
            let key = self.string(entry.key_strindex)?;
            let value = match entry.value.as_ref().and_then(|value| value.value.as_ref()) {
                Some(any_value::Value::StringValueStrindex(index)) => {
                    Some(self.string(*index)?.to_owned())
                }
                Some(value) => scalar_text(value),
                None => None,
            };
            if let (false, Some(value)) = (key.is_empty(), value) {
                texts.push((Arc::from(key), Arc::from(value)));
            }
        }
        let texts = Attributes::from(texts);
        self.texts.insert(indices.to_vec(), texts.clone());
        Ok(texts)
    }

    /// The trace and span a sample links to; `None` for index 0 (no link).
    fn link(&self, index: i32) -> Result<Option<TraceLink>, String> {
        if index == 0 {
            return Ok(None);
        }
        let Some(link) = get(&self.dictionary.link_table, index, "link")? else {
            return Ok(None);
        };
        let (Ok(trace_id), Ok(span_id)) = (
            <[u8; 16]>::try_from(link.trace_id.as_slice()),
            <[u8; 8]>::try_from(link.span_id.as_slice()),
        ) else {
            return Err(format!(
                "link {index} has a {}-byte trace id and a {}-byte span id (16 and 8 expected)",
                link.trace_id.len(),
                link.span_id.len()
            ));
        };
        Ok(Some(TraceLink { trace_id, span_id }))
    }

    fn mapping(&mut self, index: i32) -> Result<Option<Arc<Mapping>>, String> {
        if index == 0 {
            return Ok(None);
        }
        if let Some(mapping) = self.mappings.get(&index) {
            return Ok(Some(mapping.clone()));
        }
        let Some(entry) = get(&self.dictionary.mapping_table, index, "mapping")? else {
            return Ok(None);
        };
        let mut build_ids = BuildIds::default();
        for (key, value) in self.attributes(&entry.attribute_indices)? {
            let slot = match key {
                "process.executable.build_id.gnu" => &mut build_ids.gnu,
                "process.executable.build_id.go" => &mut build_ids.go,
                "process.executable.build_id.htlhash" => &mut build_ids.htlhash,
                _ => continue,
            };
            *slot = value.str().map(Arc::from);
        }
        let mapping = Arc::new(Mapping {
            start: entry.memory_start,
            end: entry.memory_limit,
            file_offset: entry.file_offset,
            path: self.string(entry.filename_strindex)?.into(),
            dev: 0,
            inode: 0,
            build_ids,
        });
        self.mappings.insert(index, mapping.clone());
        Ok(Some(mapping))
    }

    fn frame(&mut self, index: i32) -> Result<Frame, String> {
        if let Some(frame) = self.frames.get(&index) {
            return Ok(frame.clone());
        }
        let dictionary = self.dictionary;
        let zero = Location::default();
        let location = get(&dictionary.location_table, index, "location")?.unwrap_or(&zero);
        let mapping = self.mapping(location.mapping_index)?;
        let mut kind = FrameKind::Native;
        for (key, value) in self.attributes(&location.attribute_indices)? {
            if key == "profile.frame.type" {
                kind = match value.str() {
                    Some("kernel") => FrameKind::Kernel,
                    Some("go") => FrameKind::Go,
                    Some("cpython") => FrameKind::Python,
                    Some("jvm") => FrameKind::Java,
                    Some("v8js") => FrameKind::JavaScript,
                    _ => FrameKind::Native,
                };
            }
        }
        let mut lines = Vec::with_capacity(location.lines.len());
        for line in &location.lines {
            let Some(function) = get(&dictionary.function_table, line.function_index, "function")?
            else {
                continue;
            };
            let file = self.string(function.filename_strindex)?;
            lines.push(Line {
                function: self.string(function.name_strindex)?.into(),
                system_name: self.string(function.system_name_strindex)?.into(),
                file: (!file.is_empty()).then(|| file.into()),
                line: small(line.line),
                column: small(line.column),
                start_line: small(function.start_line),
            });
        }
        let file_offset = mapping.as_ref().map_or(0, |mapping| {
            (location.address.wrapping_sub(mapping.start)).wrapping_add(mapping.file_offset)
        });
        let frame = Frame {
            kind,
            address: location.address,
            mapping,
            file_offset,
            lines: lines.into(),
        };
        self.frames.insert(index, frame.clone());
        Ok(frame)
    }

    fn stack(&mut self, index: i32) -> Result<Vec<Frame>, String> {
        let dictionary = self.dictionary;
        let Some(stack) = get(&dictionary.stack_table, index, "stack")? else {
            return Ok(Vec::new());
        };
        stack
            .location_indices
            .iter()
            .map(|&location| self.frame(location))
            .collect()
    }
}

/// A scalar value as text: strings as they are, numbers in decimal,
/// `true`/`false`; `None` for arrays, maps and bytes.
fn scalar_text(value: &any_value::Value) -> Option<String> {
    match value {
        any_value::Value::StringValue(text) => Some(text.clone()),
        any_value::Value::IntValue(number) => Some(number.to_string()),
        any_value::Value::BoolValue(flag) => Some(flag.to_string()),
        any_value::Value::DoubleValue(number) => Some(number.to_string()),
        _ => None,
    }
}

fn resource_strings(attributes: &[KeyValue]) -> Vec<(String, String)> {
    attributes
        .iter()
        .filter_map(|attribute| {
            let value = scalar_text(attribute.value.as_ref()?.value.as_ref()?)?;
            Some((attribute.key.clone(), value))
        })
        .collect()
}

/// The samples of `data`.
pub(super) fn decode(data: &ProfilesData) -> Result<InputProfile, String> {
    let empty = ProfilesDictionary::default();
    let mut tables = Tables {
        dictionary: data.dictionary.as_ref().unwrap_or(&empty),
        mappings: HashMap::new(),
        frames: HashMap::new(),
        texts: HashMap::new(),
    };
    let mut profile = InputProfile::default();
    let mut processes: HashMap<(usize, i64, &str, &str), Arc<ProcessInfo>> = HashMap::new();
    let mut total: u64 = 0;
    let mut span: Option<(u64, u64)> = None;
    for (at, resource_profiles) in data.resource_profiles.iter().enumerate() {
        let attributes = resource_profiles
            .resource
            .as_ref()
            .map(|resource| resource_strings(&resource.attributes))
            .unwrap_or_default();
        let find = |key: &str| {
            attributes
                .iter()
                .find(|(existing, _)| existing == key)
                .map(|(_, value)| Arc::<str>::from(value.as_str()))
        };
        let mut group = Group {
            container_id: find("container.id"),
            pod_uid: find("k8s.pod.uid"),
            attributes: attributes.clone(),
            samples: Vec::new(),
        };
        if profile.resource_attributes.is_empty() {
            profile.resource_attributes = attributes
                .iter()
                .filter(|(key, _)| key != "container.id" && key != "k8s.pod.uid")
                .cloned()
                .collect();
        }
        for scope in &resource_profiles.scope_profiles {
            for otlp_profile in &scope.profiles {
                let (kind_name, unit) = match &otlp_profile.sample_type {
                    Some(value_type) => (
                        tables.string(value_type.type_strindex)?,
                        tables.string(value_type.unit_strindex)?,
                    ),
                    None => ("", ""),
                };
                let kind = match (kind_name, unit) {
                    ("off_cpu", "nanoseconds") => Kind::OffCpu,
                    (_, "count") => Kind::Cpu,
                    _ => {
                        profile.skip(format!("{kind_name}/{unit}"));
                        continue;
                    }
                };
                if kind == Kind::Cpu && otlp_profile.period > 0 && profile.period_ns.is_none() {
                    profile.period_ns = Some(otlp_profile.period as u64);
                }
                let start = otlp_profile.time_unix_nano;
                let end = start.saturating_add(otlp_profile.duration_nano);
                span = Some(match span {
                    Some((first, last)) => (first.min(start), last.max(end)),
                    None => (start, end),
                });
                for sample in &otlp_profile.samples {
                    let frames = tables.stack(sample.stack_index)?;
                    let (mut pid, mut tid, mut cpu) = (0, 0, 0);
                    let (mut exe_name, mut exe_path, mut thread) = ("", "", None);
                    let mut state = None;
                    // Any other text attribute: the thread context's (`http.route`, …).
                    let mut attributes = Vec::new();
                    for (key, value) in tables.attributes(&sample.attribute_indices)? {
                        match key {
                            "process.pid" => pid = value.int().unwrap_or(0),
                            "thread.id" => tid = value.int().unwrap_or(0),
                            "cpu.logical_number" => cpu = value.int().unwrap_or(0),
                            "process.executable.name" => exe_name = value.str().unwrap_or(""),
                            "process.executable.path" => exe_path = value.str().unwrap_or(""),
                            "thread.name" => thread = value.str(),
                            "thread.state" => state = value.str().map(ThreadState::from_name),
                            key => {
                                if let Some(text) = value.str() {
                                    attributes.push((Arc::from(key), Arc::from(text)));
                                }
                            }
                        }
                    }
                    let process = processes
                        .entry((at, pid, exe_name, exe_path))
                        .or_insert_with(|| {
                            Arc::new(ProcessInfo {
                                pid: u32::try_from(pid).unwrap_or(0),
                                comm: exe_name.into(),
                                exe_path: exe_path.into(),
                                container_id: group.container_id.clone(),
                                pod_uid: group.pod_uid.clone(),
                                service: None,
                                thread_keys: None,
                            })
                        })
                        .clone();
                    let mut resolved = ResolvedSample {
                        process,
                        tid: u32::try_from(tid).unwrap_or(0),
                        thread_name: thread.unwrap_or(exe_name).into(),
                        cpu: u32::try_from(cpu).unwrap_or(0),
                        time_unix_nano: sample
                            .timestamps_unix_nano
                            .first()
                            .copied()
                            .unwrap_or(start),
                        frames,
                        off_cpu: None,
                        trace: tables.link(sample.link_index)?,
                        attributes,
                    };
                    let texts = tables.texts(&sample.attribute_indices)?;
                    match kind {
                        Kind::Cpu => {
                            let count = if sample.values.is_empty() {
                                sample.timestamps_unix_nano.len() as u64
                            } else {
                                sample
                                    .values
                                    .iter()
                                    .map(|&value| u64::try_from(value).unwrap_or(0))
                                    .fold(0u64, u64::saturating_add)
                            };
                            total = total.saturating_add(count);
                            if total > MAX_SAMPLES {
                                return Err(format!("more than {MAX_SAMPLES} samples"));
                            }
                            let timestamps = if sample.timestamps_unix_nano.len() as u64 == count {
                                sample.timestamps_unix_nano.clone()
                            } else {
                                Vec::new()
                            };
                            group.samples.push(Counted {
                                sample: resolved,
                                count,
                                timestamps,
                                attributes: texts,
                            });
                        }
                        Kind::OffCpu => {
                            let state = state.flatten().unwrap_or(ThreadState::Other);
                            let periods =
                                sample.values.len().max(sample.timestamps_unix_nano.len());
                            for index in 0..periods {
                                let blocked = sample.values.get(index).copied().unwrap_or(0);
                                resolved.off_cpu = Some(OffCpu {
                                    blocked_ns: u64::try_from(blocked).unwrap_or(0),
                                    state,
                                });
                                resolved.time_unix_nano = sample
                                    .timestamps_unix_nano
                                    .get(index)
                                    .copied()
                                    .unwrap_or(start);
                                group.samples.push(Counted {
                                    sample: resolved.clone(),
                                    count: 1,
                                    timestamps: Vec::new(),
                                    attributes: texts.clone(),
                                });
                            }
                        }
                    }
                }
            }
        }
        profile.groups.push(group);
    }
    if let Some((start, end)) = span {
        profile.start_unix_nano = start;
        profile.end_unix_nano = end;
    }
    Ok(profile)
}
