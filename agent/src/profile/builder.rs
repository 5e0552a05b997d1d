//! [`ProfileBuilder`]: resolved samples in, one `ExportProfilesServiceRequest`
//! per window out, with one `ResourceProfiles` per container (and one for the
//! host's own processes), split by what processes say they are, over one
//! shared dictionary.
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use hostprof_proto::{
    collector::ExportProfilesServiceRequest,
    common::InstrumentationScope,
    profiles::{Profile, ProfilesData, ResourceProfiles, Sample, ScopeProfiles, ValueType},
};

use super::{
    ResourceConfig,
    dictionary::{AttributeValue, Dictionary, Index, LineRef},
};
use crate::{
    model::{Frame, Mapping, ResolvedSample, ServiceResource},
    output::Sink,
};

/// Which `ResourceProfiles` a sample belongs to; the host group has no
/// container or pod.
///
/// Processes that say who they are (process context or environment) are
/// split by all of what they say: a resource's attributes must hold for
/// every sample under it, so two replicas in one pod (each its own
/// `service.instance.id`) and two services on one host (each its own
/// `service.name`) each get their own, which is what a backend keys its
/// service views on. Processes that say the same thing share one.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct GroupKey {
    container_id: Option<Arc<str>>,
    pod_uid: Option<Arc<str>>,
    service: Option<Arc<ServiceResource>>,
}

/// The sample attributes hostprof sets itself.
const OWN_KEYS: [&str; 7] = [
    "process.pid",
    "process.executable.name",
    "process.executable.path",
    "thread.id",
    "thread.name",
    "thread.state",
    "cpu.logical_number",
];

/// A sample's identity: stack, attribute set (sorted) and link (0: none).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SampleKey {
    stack: Index,
    attributes: Vec<Index>,
    link: Index,
}

/// Builds OTLP CPU profiles, one window at a time.
pub struct ProfileBuilder {
    resource: ResourceConfig,
    period_ns: i64,
    window_start: u64,
    dictionary: Dictionary,
    /// Per group, the timestamps of each distinct sample, in arrival order of
    /// first occurrence.
    groups: BTreeMap<GroupKey, Group>,
    /// Mappings already in this window's dictionary: most frames hit the same few.
    mapping_cache: HashMap<Arc<Mapping>, Index>,
    samples: u64,
}

#[derive(Default)]
struct Group {
    cpu: SampleSet,
    off_cpu: SampleSet,
}

/// Distinct samples of one profile, each with its occurrences.
#[derive(Default)]
struct SampleSet {
    /// First-occurrence order, so output is stable.
    order: Vec<SampleKey>,
    /// Per sample: (timestamp, value) of each occurrence; the value is the
    /// blocked time for off-CPU samples, unused for CPU samples.
    occurrences: HashMap<SampleKey, Vec<(u64, i64)>>,
}

impl SampleSet {
    fn add(&mut self, key: SampleKey, time: u64, value: i64) {
        match self.occurrences.get_mut(&key) {
            Some(occurrences) => occurrences.push((time, value)),
            None => {
                self.order.push(key.clone());
                self.occurrences.insert(key, vec![(time, value)]);
            }
        }
    }

    fn timestamps(&self) -> impl Iterator<Item = u64> + '_ {
        self.occurrences.values().flatten().map(|(time, _)| *time)
    }

    /// OTLP samples: timestamps only (each stands for one CPU sample), or
    /// timestamps with their values (off-CPU nanoseconds), index by index.
    fn into_samples(mut self, with_values: bool) -> Vec<Sample> {
        self.order
            .into_iter()
            .map(|key| {
                let occurrences = self.occurrences.remove(&key).unwrap_or_default();
                let (timestamps, values): (Vec<u64>, Vec<i64>) = occurrences.into_iter().unzip();
                Sample {
                    stack_index: key.stack,
                    attribute_indices: key.attributes,
                    link_index: key.link,
                    values: if with_values { values } else { Vec::new() },
                    timestamps_unix_nano: timestamps,
                }
            })
            .collect()
    }
}

impl ProfileBuilder {
    /// A builder whose first window starts at `window_start` (Unix nanoseconds),
    /// for samples taken `frequency_hz` times a second on each CPU.
    pub fn new(resource: ResourceConfig, frequency_hz: u64, window_start: u64) -> Self {
        ProfileBuilder {
            resource,
            period_ns: 1_000_000_000 / frequency_hz.max(1) as i64,
            window_start,
            dictionary: Dictionary::new(),
            groups: BTreeMap::new(),
            mapping_cache: HashMap::new(),
            samples: 0,
        }
    }

    /// Samples in the current window.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Adds one sample to the current window.
    pub fn add(&mut self, sample: &ResolvedSample) {
        let locations = sample
            .frames
            .iter()
            .map(|frame| self.location(frame))
            .collect();
        let stack = self.dictionary.stack(locations);
        let attributes = self.sample_attributes(sample);
        let group = self
            .groups
            .entry(GroupKey {
                container_id: sample.process.container_id.clone(),
                pod_uid: sample.process.pod_uid.clone(),
                service: sample.process.service.clone(),
            })
            .or_default();
        let link = sample
            .trace
            .map_or(0, |link| self.dictionary.link(link.trace_id, link.span_id));
        let key = SampleKey {
            stack,
            attributes,
            link,
        };
        match &sample.off_cpu {
            Some(off_cpu) => {
                let blocked = i64::try_from(off_cpu.blocked_ns).unwrap_or(i64::MAX);
                group.off_cpu.add(key, sample.time_unix_nano, blocked);
            }
            None => group.cpu.add(key, sample.time_unix_nano, 0),
        }
        self.samples += 1;
    }

    fn sample_attributes(&mut self, sample: &ResolvedSample) -> Vec<Index> {
        let process = &sample.process;
        let dictionary = &mut self.dictionary;
        let mut attributes = vec![
            dictionary.attribute("process.pid", AttributeValue::Int(process.pid.into())),
            dictionary.attribute(
                "process.executable.name",
                AttributeValue::Str(process.exe_name().to_owned()),
            ),
            dictionary.attribute("thread.id", AttributeValue::Int(sample.tid.into())),
            dictionary.attribute(
                "thread.name",
                AttributeValue::Str(sample.thread_name.to_string()),
            ),
            dictionary.attribute("cpu.logical_number", AttributeValue::Int(sample.cpu.into())),
        ];
        if let Some(off_cpu) = &sample.off_cpu {
            attributes.push(dictionary.attribute(
                "thread.state",
                AttributeValue::Str(off_cpu.state.name().to_owned()),
            ));
        }
        if !process.exe_path.is_empty() {
            attributes.push(dictionary.attribute(
                "process.executable.path",
                AttributeValue::Str(process.exe_path.to_string()),
            ));
        }
        // The thread context's, under their key-map names; one that would
        // repeat a key set above is the process's to pick, not ours: dropped.
        for (key, value) in &sample.attributes {
            if !OWN_KEYS.contains(&&**key) {
                attributes.push(dictionary.attribute(key, AttributeValue::Str(value.to_string())));
            }
        }
        attributes.sort_unstable();
        attributes
    }

    fn location(&mut self, frame: &Frame) -> Index {
        let mapping = match &frame.mapping {
            Some(mapping) => self.mapping(mapping),
            None => 0,
        };
        let lines: Vec<LineRef> = frame
            .lines
            .iter()
            .map(|line| LineRef {
                function: self.dictionary.function(
                    &line.function,
                    &line.system_name,
                    line.file.as_deref().unwrap_or(""),
                    line.start_line.into(),
                ),
                line: line.line.into(),
                column: line.column.into(),
            })
            .collect();
        let kind = self
            .dictionary
            .attribute("profile.frame.type", frame_type(frame));
        self.dictionary
            .location(mapping, frame.address, &lines, vec![kind])
    }

    fn mapping(&mut self, mapping: &Arc<Mapping>) -> Index {
        if let Some(&index) = self.mapping_cache.get(mapping) {
            return index;
        }
        let ids = &mapping.build_ids;
        let mut attributes: Vec<Index> = [
            ("process.executable.build_id.gnu", &ids.gnu),
            ("process.executable.build_id.go", &ids.go),
            ("process.executable.build_id.htlhash", &ids.htlhash),
        ]
        .into_iter()
        .filter_map(|(key, id)| {
            let id = id.as_ref()?;
            Some(
                self.dictionary
                    .attribute(key, AttributeValue::Str(id.to_string())),
            )
        })
        .collect();
        attributes.sort_unstable();
        let index = self.dictionary.mapping(
            mapping.start,
            mapping.end,
            mapping.file_offset,
            &mapping.path,
            attributes,
        );
        self.mapping_cache.insert(mapping.clone(), index);
        index
    }

    /// Ends the window at `window_end` and returns its request; the next
    /// window starts there with a fresh dictionary. A window without samples
    /// gives a request without `resource_profiles`.
    pub fn finish(&mut self, window_end: u64) -> ExportProfilesServiceRequest {
        let data = self.finish_data(window_end);
        ExportProfilesServiceRequest {
            resource_profiles: data.resource_profiles,
            dictionary: data.dictionary,
        }
    }

    /// Like [`finish`](Self::finish), as the `ProfilesData` of file outputs.
    pub fn finish_data(&mut self, window_end: u64) -> ProfilesData {
        let groups = std::mem::take(&mut self.groups);
        let mut dictionary = std::mem::take(&mut self.dictionary);
        self.mapping_cache.clear();
        self.samples = 0;
        // Samples resolved late may predate the window's start (or pass its end);
        // the window stretches to cover them, as the format asks.
        let (mut start, mut end) = (self.window_start, window_end.max(self.window_start));
        for group in groups.values() {
            for time in group.cpu.timestamps().chain(group.off_cpu.timestamps()) {
                start = start.min(time);
                end = end.max(time.saturating_add(1));
            }
        }
        self.window_start = window_end;
        if groups.is_empty() {
            return ProfilesData::default();
        }
        let scope = InstrumentationScope {
            name: "hostprof".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        };
        // Value types only for the profiles present: unreferenced strings
        // would break the dictionary's rules.
        let cpu_types = groups
            .values()
            .any(|group| !group.cpu.order.is_empty())
            .then(|| {
                let sample_type = ValueType {
                    type_strindex: dictionary.string("samples"),
                    unit_strindex: dictionary.string("count"),
                };
                let period_type = ValueType {
                    type_strindex: dictionary.string("cpu"),
                    unit_strindex: dictionary.string("nanoseconds"),
                };
                (sample_type, period_type)
            });
        let off_cpu_type = groups
            .values()
            .any(|group| !group.off_cpu.order.is_empty())
            .then(|| ValueType {
                type_strindex: dictionary.string("off_cpu"),
                unit_strindex: dictionary.string("nanoseconds"),
            });
        let resource_profiles = groups
            .into_iter()
            .map(|(key, group)| {
                let mut profiles = Vec::with_capacity(2);
                if let (false, Some((sample_type, period_type))) =
                    (group.cpu.order.is_empty(), cpu_types)
                {
                    profiles.push(Profile {
                        sample_type: Some(sample_type),
                        samples: group.cpu.into_samples(false),
                        time_unix_nano: start,
                        duration_nano: end - start,
                        period_type: Some(period_type),
                        period: self.period_ns,
                        profile_id: super::random_profile_id().to_vec(),
                        ..Default::default()
                    });
                }
                if let (false, Some(off_cpu_type)) = (group.off_cpu.order.is_empty(), off_cpu_type)
                {
                    profiles.push(Profile {
                        // Values are blocked nanoseconds; timestamps say when
                        // each block started, index by index.
                        sample_type: Some(off_cpu_type),
                        samples: group.off_cpu.into_samples(true),
                        time_unix_nano: start,
                        duration_nano: end - start,
                        profile_id: super::random_profile_id().to_vec(),
                        ..Default::default()
                    });
                }
                ResourceProfiles {
                    resource: Some(self.resource.resource(
                        key.container_id.as_deref(),
                        key.pod_uid.as_deref(),
                        key.service.as_deref(),
                    )),
                    scope_profiles: vec![ScopeProfiles {
                        scope: Some(scope.clone()),
                        profiles,
                        schema_url: String::new(),
                    }],
                    schema_url: String::new(),
                }
            })
            .collect();
        ProfilesData {
            resource_profiles,
            dictionary: Some(dictionary.into_proto()),
        }
    }
}

fn frame_type(frame: &Frame) -> AttributeValue {
    AttributeValue::Str(frame.kind.otel_name().to_owned())
}

impl Sink for ProfileBuilder {
    fn push(&mut self, sample: &ResolvedSample) {
        self.add(sample);
    }

    /// Keeps each occurrence's time when the file had them.
    fn push_counted(&mut self, counted: &crate::input::Counted) {
        if counted.timestamps.is_empty() {
            return self.push_count(&counted.sample, counted.count);
        }
        let mut sample = counted.sample.clone();
        for &time in &counted.timestamps {
            sample.time_unix_nano = time;
            self.add(&sample);
        }
    }
}
