//! Which samples of a file `hostprof report` keeps: `--trace-id`,
//! `--span-id` and `--attribute KEY=VALUE`, all of which must match. A
//! sample's trace and span are its OTLP link (pprof: its `trace_id` and
//! `span_id` labels); an attribute matches when the sample has it (OTLP
//! sample attribute, pprof label) or its resource does (`service.name`,
//! `container.id`, …), values compared as text.
//!
//! ```
//! use hostprof::input::{InputFormat, SampleFilter, read};
//! let attribute = SampleFilter::parse_attribute("service.name=cart").unwrap();
//! let filter = SampleFilter::new(None, None, vec![attribute]);
//! assert_eq!(filter.to_string(), "--attribute service.name=cart");
//! // Folded stacks name no service: nothing matches.
//! let mut profile = read(b"app;main 3\n", InputFormat::Folded).unwrap();
//! let matched = profile.keep_matching(&filter);
//! assert_eq!((matched.kept, matched.total), (0, 3));
//! ```
use std::{collections::HashMap, fmt};

use super::{Counted, InputProfile};
use crate::model::hex;

/// One condition a kept sample meets.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Criterion {
    Trace([u8; 16]),
    Span([u8; 8]),
    Attribute(String, String),
}

impl Criterion {
    fn matches(&self, resource: &[(String, String)], counted: &Counted) -> bool {
        let trace = counted.sample.trace.as_ref();
        match self {
            Criterion::Trace(id) => trace.is_some_and(|link| link.trace_id == *id),
            Criterion::Span(id) => trace.is_some_and(|link| link.span_id == *id),
            Criterion::Attribute(key, value) => {
                value_of(resource, counted, key).is_some_and(|found| found == value)
            }
        }
    }
}

/// A sample's value of `key`: its own attribute, else its resource's.
fn value_of<'a>(
    resource: &'a [(String, String)],
    counted: &'a Counted,
    key: &str,
) -> Option<&'a str> {
    counted
        .attributes
        .iter()
        .find(|(found, _)| &**found == key)
        .map(|(_, value)| &**value)
        .or_else(|| {
            resource
                .iter()
                .find(|(found, _)| found == key)
                .map(|(_, value)| value.as_str())
        })
}

impl fmt::Display for Criterion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Criterion::Trace(id) => write!(f, "--trace-id {}", hex(id)),
            Criterion::Span(id) => write!(f, "--span-id {}", hex(id)),
            Criterion::Attribute(key, value) => write!(f, "--attribute {key}={value}"),
        }
    }
}

/// What `report`'s selecting flags ask; empty keeps everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleFilter {
    criteria: Vec<Criterion>,
}

/// Why `--attribute` text is no `KEY=VALUE`; `Display` is one line.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct AttributeError {
    why: &'static str,
}

impl SampleFilter {
    pub fn new(
        trace_id: Option<[u8; 16]>,
        span_id: Option<[u8; 8]>,
        attributes: Vec<(String, String)>,
    ) -> Self {
        let mut criteria: Vec<Criterion> = trace_id.map(Criterion::Trace).into_iter().collect();
        criteria.extend(span_id.map(Criterion::Span));
        for (key, value) in attributes {
            let criterion = Criterion::Attribute(key, value);
            if !criteria.contains(&criterion) {
                criteria.push(criterion);
            }
        }
        SampleFilter { criteria }
    }

    /// `KEY=VALUE` (the first `=` splits; the value may be empty or hold
    /// more `=`), for `--attribute`.
    pub fn parse_attribute(text: &str) -> Result<(String, String), AttributeError> {
        // What was typed is not repeated: the caller shows it (clap does).
        let error = |why| AttributeError { why };
        let (key, value) = text.split_once('=').ok_or_else(|| {
            error("an attribute is KEY=VALUE, e.g. service.name=checkout or thread.id=4242")
        })?;
        let key = key.trim();
        if key.is_empty() {
            return Err(error("the key before `=` is empty"));
        }
        Ok((key.to_owned(), value.to_owned()))
    }

    /// True when nothing is asked: every sample is kept.
    pub fn is_empty(&self) -> bool {
        self.criteria.is_empty()
    }

    /// Whether the filter asks for a trace or a span.
    fn names_a_trace(&self) -> bool {
        self.criteria
            .iter()
            .any(|criterion| matches!(criterion, Criterion::Trace(_) | Criterion::Span(_)))
    }

    /// Whether `counted`, a sample of a resource with these attributes,
    /// is kept.
    pub fn matches(&self, resource: &[(String, String)], counted: &Counted) -> bool {
        self.criteria
            .iter()
            .all(|criterion| criterion.matches(resource, counted))
    }
}

impl fmt::Display for SampleFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (at, criterion) in self.criteria.iter().enumerate() {
            if at > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{criterion}")?;
        }
        Ok(())
    }
}

/// How many distinct values of a key are counted for the line that says
/// why nothing matched: enough to name the commonest, bounded whatever
/// the file holds.
const MAX_DISTINCT: usize = 10_000;
/// How many traces or values that line names.
const NAMED: usize = 3;

/// What [`InputProfile::keep_matching`] kept, with what explains a miss.
/// Weights are samples: a CPU sample's count, one per off-CPU period.
#[derive(Clone, Debug, Default)]
pub struct Matched {
    pub kept: u64,
    pub total: u64,
    /// Per criterion, in the filter's order: the samples it alone keeps.
    alone: Vec<u64>,
    /// Samples linked to a trace, and each trace's (bounded).
    linked: u64,
    traces: HashMap<[u8; 16], u64>,
    /// Per `--attribute` key: its values' samples (bounded).
    values: HashMap<String, HashMap<String, u64>>,
}

impl Matched {
    /// The line `report` prints: how many matched of how many and, when
    /// none did, what the file holds instead.
    pub fn line(&self, filter: &SampleFilter) -> String {
        if self.kept > 0 {
            return format!("{} of {} samples match {filter}", self.kept, self.total);
        }
        let mut line = format!("no sample matches {filter} (of {})", self.total);
        if self.total == 0 {
            return line;
        }
        if filter.criteria.len() > 1 {
            let alone: Vec<String> = filter
                .criteria
                .iter()
                .zip(&self.alone)
                .map(|(criterion, kept)| format!("{criterion} alone {kept}"))
                .collect();
            line.push_str(&format!("; {}", alone.join(", ")));
        }
        let missed = |wanted: fn(&Criterion) -> bool| {
            filter
                .criteria
                .iter()
                .zip(&self.alone)
                .any(|(criterion, &kept)| wanted(criterion) && kept == 0)
        };
        if filter.names_a_trace()
            && missed(|criterion| matches!(criterion, Criterion::Trace(_) | Criterion::Span(_)))
        {
            if self.linked == 0 {
                line.push_str(
                    "; no sample in it is linked to a trace: its processes published no \
                     OpenTelemetry thread context",
                );
            } else {
                let busiest: Vec<String> = commonest(&self.traces)
                    .into_iter()
                    .map(|(id, samples)| format!("{} ({samples})", hex(&id)))
                    .collect();
                line.push_str(&format!(
                    "; {} samples are linked to {} traces, the busiest: {}",
                    self.linked,
                    self.traces.len(),
                    busiest.join(", ")
                ));
            }
        }
        for (criterion, &kept) in filter.criteria.iter().zip(&self.alone) {
            let Criterion::Attribute(key, _) = criterion else {
                continue;
            };
            if kept > 0 {
                continue;
            }
            match self.values.get(key).filter(|values| !values.is_empty()) {
                None => line.push_str(&format!("; no sample or resource has `{key}`")),
                Some(values) => {
                    let common: Vec<String> = commonest(values)
                        .into_iter()
                        .map(|(value, samples)| format!("{value} ({samples})"))
                        .collect();
                    line.push_str(&format!("; `{key}` there: {}", common.join(", ")));
                }
            }
        }
        line
    }

    fn observe(&mut self, filter: &SampleFilter, resource: &[(String, String)], counted: &Counted) {
        let weight = counted.count;
        if filter.names_a_trace()
            && let Some(link) = &counted.sample.trace
        {
            self.linked += weight;
            add_bounded(&mut self.traces, link.trace_id, weight);
        }
        for criterion in &filter.criteria {
            if let Criterion::Attribute(key, _) = criterion
                && let Some(value) = value_of(resource, counted, key)
            {
                let values = self.values.entry(key.clone()).or_default();
                if let Some(samples) = values.get_mut(value) {
                    *samples += weight;
                } else {
                    add_bounded(values, value.to_owned(), weight);
                }
            }
        }
    }
}

fn add_bounded<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, u64>, key: K, weight: u64) {
    let room = counts.len() < MAX_DISTINCT;
    match counts.get_mut(&key) {
        Some(samples) => *samples = samples.saturating_add(weight),
        None if room => {
            counts.insert(key, weight);
        }
        None => {}
    }
}

/// The [`NAMED`] heaviest entries, ties by key.
fn commonest<K: Ord + Clone>(counts: &HashMap<K, u64>) -> Vec<(K, u64)> {
    let mut entries: Vec<(K, u64)> = counts.iter().map(|(k, &n)| (k.clone(), n)).collect();
    entries.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    entries.truncate(NAMED);
    entries
}

impl InputProfile {
    /// Keeps only the samples `filter` matches; groups it empties go too.
    pub fn keep_matching(&mut self, filter: &SampleFilter) -> Matched {
        let mut matched = Matched {
            alone: vec![0; filter.criteria.len()],
            ..Default::default()
        };
        self.groups.retain_mut(|group| {
            let had_samples = !group.samples.is_empty();
            let resource = &group.attributes;
            group.samples.retain(|counted| {
                let weight = counted.count;
                matched.total = matched.total.saturating_add(weight);
                let mut all = true;
                for (at, criterion) in filter.criteria.iter().enumerate() {
                    if criterion.matches(resource, counted) {
                        matched.alone[at] = matched.alone[at].saturating_add(weight);
                    } else {
                        all = false;
                    }
                }
                matched.observe(filter, resource, counted);
                if all {
                    matched.kept = matched.kept.saturating_add(weight);
                }
                all
            });
            !had_samples || !group.samples.is_empty()
        });
        matched
    }
}
