//! Profiles read back from files: what `record` and `agent` write (OTLP
//! protobuf or JSON, gzipped pprof, folded stacks), decoded into the
//! [`ResolvedSample`]s every output already consumes, so `hostprof report`
//! converts between formats with the same writers as `record`.
//!
//! One reader per format; each returns an [`InputProfile`]: one [`Group`] per
//! OTLP `ResourceProfiles` (a container, or the host's processes), one group
//! for the other formats. Readers parse data from anywhere, so a bad file is
//! an [`InputError`], never a panic (`fuzz/fuzz_targets/profile_input.rs`).
//!
//! ```
//! use hostprof::input::{InputFormat, read};
//! let profile = read(b"app;main;work 3\n", InputFormat::Folded).unwrap();
//! assert_eq!(profile.groups[0].samples[0].count, 3);
//! assert!(read(b"\x08\xff", InputFormat::Otlp).is_err());
//! ```
mod folded;
mod otlp;
mod otlp_json;
mod pprof;
mod select;

use std::sync::Arc;

pub use select::{AttributeError, Matched, SampleFilter};

use crate::model::ResolvedSample;

/// The formats `hostprof report` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputFormat {
    /// OTLP `ProfilesData` (or an agent's `ExportProfilesServiceRequest`,
    /// which has the same wire format), protobuf.
    Otlp,
    /// OTLP `ProfilesData` as OTLP/JSON.
    OtlpJson,
    /// pprof `profile.proto`, gzipped or not.
    Pprof,
    /// Folded stacks, `comm;root;...;leaf COUNT`.
    Folded,
}

impl InputFormat {
    /// The format a file name says (the names `record -o` uses), if any.
    pub fn for_name(name: &str) -> Option<Self> {
        let format = match name {
            name if name.ends_with(".otlp.pb") => InputFormat::Otlp,
            name if name.ends_with(".otlp.json") => InputFormat::OtlpJson,
            name if name.ends_with(".pb.gz") || name.ends_with(".pprof") => InputFormat::Pprof,
            name if name.ends_with(".folded") => InputFormat::Folded,
            _ => return None,
        };
        Some(format)
    }

    /// A guess from the bytes, for names that say nothing (or stdin): gzip
    /// is pprof, `{` opens OTLP/JSON, text whose lines end in a count is
    /// folded stacks, anything else is tried as OTLP protobuf.
    pub fn sniff(data: &[u8]) -> Self {
        if data.starts_with(&[0x1f, 0x8b]) {
            return InputFormat::Pprof;
        }
        let text = std::str::from_utf8(data).ok();
        match text.map(str::trim_start) {
            Some(text) if text.starts_with('{') => InputFormat::OtlpJson,
            Some(text)
                if !text.is_empty()
                    && text
                        .lines()
                        .filter(|line| !line.trim().is_empty())
                        .all(|line| {
                            line.trim_end()
                                .rsplit_once(' ')
                                .is_some_and(|(_, count)| count.parse::<u64>().is_ok())
                        }) =>
            {
                InputFormat::Folded
            }
            _ => InputFormat::Otlp,
        }
    }
}

/// Why a file could not be read as a profile; `Display` is one line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InputError {
    #[error("not an OTLP profile: {0}")]
    Otlp(String),
    #[error("not an OTLP/JSON profile: {0}")]
    OtlpJson(String),
    #[error("not a pprof profile: {0}")]
    Pprof(String),
    #[error("not folded stacks: {0}")]
    Folded(String),
}

/// One sample as the file holds it: how many times it was taken, and when.
#[derive(Clone, Debug)]
pub struct Counted {
    /// Its `time_unix_nano` is the first (or only known) time.
    pub sample: ResolvedSample,
    /// CPU samples taken with this stack; always 1 for off-CPU samples,
    /// whose time away is in `sample.off_cpu`.
    pub count: u64,
    /// When each was taken, when the file says (OTLP): empty, or `count` long.
    pub timestamps: Vec<u64>,
    /// Every attribute the file gives the sample (OTLP sample attributes,
    /// pprof labels), values as text, for `report --attribute`.
    pub attributes: Attributes,
}

/// Key/value pairs as text (integers in decimal), shared by the samples
/// that have the same.
pub type Attributes = Arc<[(Arc<str>, Arc<str>)]>;

/// One resource's samples: a container's, or the host processes'.
#[derive(Clone, Debug, Default)]
pub struct Group {
    /// `container.id` of the resource; `None` for host processes.
    pub container_id: Option<Arc<str>>,
    pub pod_uid: Option<Arc<str>>,
    /// Every attribute of the resource (OTLP), values as text.
    pub attributes: Vec<(String, String)>,
    pub samples: Vec<Counted>,
}

impl Group {
    /// How `report` names the group: its container id, or `host`.
    pub fn name(&self) -> &str {
        self.container_id.as_deref().unwrap_or(HOST_GROUP)
    }
}

/// The name of the group of host processes (those in no container).
pub const HOST_GROUP: &str = "host";

/// A profile read from a file.
#[derive(Clone, Debug, Default)]
pub struct InputProfile {
    pub groups: Vec<Group>,
    /// The CPU sampling period, when the file says.
    pub period_ns: Option<u64>,
    /// The time span the profile covers (0 when the file does not say).
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// Attributes every resource shares (OTLP input; `container.id` and
    /// `k8s.pod.uid` are per group).
    pub resource_attributes: Vec<(String, String)>,
    /// Profiles or samples left out because their type is not one hostprof
    /// knows (`type/unit`, e.g. `alloc_space/bytes`), each named once.
    pub skipped: Vec<String>,
}

impl InputProfile {
    /// Whether any sample is an off-CPU period (folded outputs then count
    /// microseconds, as `record --off-cpu` does).
    pub fn has_off_cpu(&self) -> bool {
        self.groups
            .iter()
            .flat_map(|group| &group.samples)
            .any(|counted| counted.sample.off_cpu.is_some())
    }

    /// The groups' names ([`Group::name`]), each once, in file order.
    pub fn group_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for group in &self.groups {
            if !names.contains(&group.name()) {
                names.push(group.name());
            }
        }
        names
    }

    /// Only the groups named `name` (several resources may share one).
    pub fn select(&mut self, name: &str) -> bool {
        self.groups.retain(|group| group.name() == name);
        !self.groups.is_empty()
    }

    fn skip(&mut self, what: String) {
        if !self.skipped.contains(&what) {
            self.skipped.push(what);
        }
    }
}

/// Reads `data` as `format`.
pub fn read(data: &[u8], format: InputFormat) -> Result<InputProfile, InputError> {
    match format {
        InputFormat::Otlp => otlp::read_protobuf(data),
        InputFormat::OtlpJson => otlp_json::read(data),
        InputFormat::Pprof => pprof::read(data),
        InputFormat::Folded => folded::read(data),
    }
}

/// More samples than any real profile holds: a count past it is a bad file
/// (and would make writers loop for ages).
const MAX_SAMPLES: u64 = 1 << 40;

/// `u32` from a file's wider integer; out-of-range values read as 0
/// (unknown), as the model has it.
fn small(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(0)
}

#[cfg(test)]
mod select_tests;
#[cfg(test)]
mod tests;
