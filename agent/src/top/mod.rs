//! `hostprof top`'s figures, without a terminal: a [`TopSink`] gathers the
//! pipeline's samples by stack, a [`Window`] keeps the last seconds of them,
//! and [`Window::table`] ranks functions (self and total share), whole
//! stacks, trace ids, or the values of an attribute (`service.name`,
//! `thread.name`, …) under a [`Query`] (view, sort, [`Filter`]). The screen
//! ([`screen`]) only draws the table; `cli/top.rs` runs the loop.
//!
//! ```
//! use hostprof::top::{Query, Window};
//! let mut window = Window::new(10);
//! window.advance(Default::default()); // once a second: the sink's bucket
//! assert!(window.table(&Query::default()).rows.is_empty());
//! ```
mod filter;
pub mod screen;
#[cfg(test)]
mod tests;

pub use filter::Filter;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex},
};

use crate::{
    model::{Frame, FrameKind, ResolvedSample, ResourceValue, ServiceResource, ThreadState, hex},
    output::{Sink, frame_labels},
};

/// One frame's name and the file it ran in (`libc.so.6`, `[kernel]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Label {
    pub function: Arc<str>,
    pub module: Arc<str>,
}

/// Samples with this key are counted together: one stack of one thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub pid: u32,
    pub tid: u32,
    /// The process's comm.
    pub process: Arc<str>,
    pub thread: Arc<str>,
    /// `None`: on the host, in no container.
    pub container: Option<Arc<str>>,
    /// Set for off-CPU periods (`--off-cpu`).
    pub off_cpu: Option<ThreadState>,
    /// The trace the thread worked for (OpenTelemetry thread context);
    /// spans are left out, or every few milliseconds would be a new key.
    pub trace_id: Option<[u8; 16]>,
    /// The thread context's attributes, named by the process's key map.
    pub attributes: Vec<(Arc<str>, Arc<str>)>,
    /// What the process says it is (`service.name`, …).
    pub service: Option<Arc<ServiceResource>>,
    /// Root first, inlined functions expanded, as in folded stacks.
    pub frames: Vec<Label>,
}

impl StackKey {
    fn of(sample: &ResolvedSample) -> Self {
        let mut frames: Vec<Label> = Vec::with_capacity(sample.frames.len() + 1);
        if let Some(off_cpu) = &sample.off_cpu {
            // As folded stacks show it: the state is the root, so blocked
            // time reads as one subtree.
            frames.push(Label {
                function: format!("[off-cpu: {}]", off_cpu.state.name()).into(),
                module: "".into(),
            });
        }
        for frame in sample.frames.iter().rev() {
            let module = module_name(frame);
            frames.extend(frame_labels(frame).map(|function| Label {
                function: function.into(),
                module: module.clone(),
            }));
        }
        StackKey {
            pid: sample.process.pid,
            tid: sample.tid,
            process: sample.process.comm.clone(),
            thread: sample.thread_name.clone(),
            container: sample.process.container_id.clone(),
            off_cpu: sample.off_cpu.map(|off| off.state),
            trace_id: sample.trace.map(|link| link.trace_id),
            attributes: sample.attributes.clone(),
            service: sample.process.service.clone(),
            frames,
        }
    }

    /// The samples' value of `key`, as the OTLP output names it: a sample
    /// attribute (`thread.name`, `process.pid`, …), `trace_id`, or a
    /// resource attribute the process publishes (`service.name`, …).
    pub fn attribute(&self, key: &str) -> Option<String> {
        match key {
            TRACE_ID => self.trace_id.map(|id| hex(&id)),
            "process.pid" => Some(self.pid.to_string()),
            "thread.id" => Some(self.tid.to_string()),
            "process.executable.name" | "comm" => Some(self.process.to_string()),
            "thread.name" => Some(self.thread.to_string()),
            "container.id" => self.container.as_deref().map(str::to_owned),
            key => {
                // The thread context's attributes (`http.route`, …) first:
                // they are the sample's own, as in OTLP.
                if let Some((_, value)) = self.attributes.iter().find(|(name, _)| &**name == key) {
                    return Some(value.to_string());
                }
                let service = self.service.as_deref()?;
                let (_, value) = service.attributes.iter().find(|(name, _)| name == key)?;
                Some(match value {
                    ResourceValue::Str(text) => text.clone(),
                    ResourceValue::Int(number) => number.to_string(),
                    ResourceValue::Bool(flag) => flag.to_string(),
                    ResourceValue::Double(bits) => f64::from_bits(*bits).to_string(),
                })
            }
        }
    }
}

/// The key the traces view ranks by, as `report` and pprof name it.
pub const TRACE_ID: &str = "trace_id";

fn module_name(frame: &Frame) -> Arc<str> {
    match (&frame.mapping, frame.kind) {
        (Some(mapping), _) => mapping.file_name().into(),
        (None, FrameKind::Kernel) => "[kernel]".into(),
        (None, _) => "?".into(),
    }
}

/// Weights of the stacks seen in one refresh period.
pub type Bucket = HashMap<StackKey, u64>;

/// What the samples weigh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// One per CPU sample.
    Samples,
    /// Nanoseconds: CPU samples weigh one sampling period, off-CPU periods
    /// their length (with `--off-cpu`, so both read as time).
    Nanos { cpu_period_ns: u64 },
}

/// The pipeline's end for `top`: adds each sample to the bucket the screen
/// takes once a second.
#[derive(Clone)]
pub struct TopSink {
    pending: Arc<Mutex<Bucket>>,
    unit: Unit,
}

impl TopSink {
    pub fn new(unit: Unit) -> Self {
        TopSink {
            pending: Arc::default(),
            unit,
        }
    }

    /// The samples since the last call.
    pub fn take(&self) -> Bucket {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Sink for TopSink {
    fn push(&mut self, sample: &ResolvedSample) {
        self.push_count(sample, 1);
    }

    fn push_count(&mut self, sample: &ResolvedSample, count: u64) {
        let weight = match (self.unit, &sample.off_cpu) {
            (Unit::Samples, None) => 1,
            // Off-CPU periods have no place among sample counts.
            (Unit::Samples, Some(_)) => return,
            (Unit::Nanos { cpu_period_ns }, None) => cpu_period_ns,
            (Unit::Nanos { .. }, Some(off_cpu)) => off_cpu.blocked_ns,
        };
        let key = StackKey::of(sample);
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let total = pending.entry(key).or_default();
        *total = total.saturating_add(weight.saturating_mul(count));
    }
}

/// The last `seconds` buckets.
#[derive(Debug)]
pub struct Window {
    buckets: VecDeque<Bucket>,
    seconds: usize,
}

/// Functions, whole stacks, or the values of one attribute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum View {
    #[default]
    Functions,
    Stacks,
    /// Trace ids, busiest first.
    Traces,
    /// The values of [`Query::attribute`].
    Values,
}

/// Which share ranks the functions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sort {
    /// Time in the function itself (the stack's leaf).
    #[default]
    SelfShare,
    /// Time with the function anywhere on the stack.
    TotalShare,
}

/// What the screen asks of the window.
#[derive(Clone, Debug, Default)]
pub struct Query {
    pub view: View,
    pub sort: Sort,
    pub filter: Option<Filter>,
    /// The attribute [`View::Values`] ranks the values of.
    pub attribute: String,
}

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The function; for a stack, its frames leaf first, ` < ` between;
    /// for a value (trace id), the value, or `(none)` for the samples
    /// without one.
    pub name: String,
    /// The function's file (a stack's leaf's); for a value, the function
    /// its samples were most in (`function (file)`).
    pub module: String,
    pub self_weight: u64,
    pub total_weight: u64,
    /// The heaviest process (`comm pid`), `+N` when N more share the row.
    pub process: String,
    /// The heaviest container's short id (`-` on the host), `+N` likewise.
    pub container: String,
}

/// The ranked rows of a window under a query.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    pub rows: Vec<Row>,
    /// Weight of the samples the filter kept: the 100% of the shares.
    pub total_weight: u64,
    /// Weight of all samples in the window.
    pub window_weight: u64,
    /// Distinct processes the filter kept.
    pub processes: usize,
}

impl Table {
    /// A row's share (0..=1) of the filtered total.
    pub fn share(&self, weight: u64) -> f64 {
        weight as f64 / self.total_weight.max(1) as f64
    }
}

/// Who contributed to a row, by weight.
#[derive(Default)]
struct Contributors {
    processes: HashMap<(Arc<str>, u32), u64>,
    containers: HashMap<Option<Arc<str>>, u64>,
}

impl Contributors {
    fn add(&mut self, key: &StackKey, weight: u64) {
        *self
            .processes
            .entry((key.process.clone(), key.pid))
            .or_default() += weight;
        *self.containers.entry(key.container.clone()).or_default() += weight;
    }

    fn process(&self) -> String {
        heaviest(&self.processes, |(comm, pid)| format!("{comm} {pid}"))
    }

    fn container(&self) -> String {
        heaviest(&self.containers, |id| short_container(id.as_deref()))
    }
}

/// The heaviest entry, named, with `+N` for the N others.
fn heaviest<K: Ord>(weights: &HashMap<K, u64>, name: impl Fn(&K) -> String) -> String {
    let Some((key, _)) = weights
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
    else {
        return String::new();
    };
    match weights.len() {
        1 => name(key),
        n => format!("{} +{}", name(key), n - 1),
    }
}

/// A container id as `docker ps` shows it: 12 characters; `-` for the host.
pub fn short_container(id: Option<&str>) -> String {
    match id {
        Some(id) => id.chars().take(12).collect(),
        None => "-".into(),
    }
}

impl Window {
    /// A window of the last `seconds` buckets (at least one).
    pub fn new(seconds: usize) -> Self {
        Window {
            buckets: VecDeque::new(),
            seconds: seconds.max(1),
        }
    }

    /// Adds the newest bucket, dropping those older than the window.
    pub fn advance(&mut self, bucket: Bucket) {
        self.buckets.push_back(bucket);
        while self.buckets.len() > self.seconds {
            self.buckets.pop_front();
        }
    }

    /// Every stack in the window with its weight, repeated stacks merged.
    fn stacks(&self) -> HashMap<&StackKey, u64> {
        let mut merged: HashMap<&StackKey, u64> = HashMap::new();
        for bucket in &self.buckets {
            for (key, weight) in bucket {
                *merged.entry(key).or_default() += weight;
            }
        }
        merged
    }

    /// The rows `query` asks for, heaviest first.
    pub fn table(&self, query: &Query) -> Table {
        let stacks = self.stacks();
        let window_weight = stacks.values().sum();
        let kept: Vec<(&StackKey, u64)> = stacks
            .into_iter()
            .filter(|(key, _)| query.filter.as_ref().is_none_or(|f| f.matches(key)))
            .collect();
        let total_weight = kept.iter().map(|(_, weight)| weight).sum();
        let processes = kept
            .iter()
            .map(|(key, _)| key.pid)
            .collect::<HashSet<_>>()
            .len();
        let mut rows = match query.view {
            View::Functions => function_rows(&kept),
            View::Stacks => stack_rows(&kept),
            View::Traces => value_rows(&kept, TRACE_ID),
            View::Values => value_rows(&kept, &query.attribute),
        };
        rows.sort_by(|a, b| {
            let (first, second) = match query.sort {
                Sort::SelfShare => (a.self_weight, a.total_weight),
                Sort::TotalShare => (a.total_weight, a.self_weight),
            };
            let (b_first, b_second) = match query.sort {
                Sort::SelfShare => (b.self_weight, b.total_weight),
                Sort::TotalShare => (b.total_weight, b.self_weight),
            };
            (b_first, b_second)
                .cmp(&(first, second))
                .then_with(|| a.name.cmp(&b.name))
                .then_with(|| a.module.cmp(&b.module))
        });
        Table {
            rows,
            total_weight,
            window_weight,
            processes,
        }
    }
}

fn function_rows(stacks: &[(&StackKey, u64)]) -> Vec<Row> {
    #[derive(Default)]
    struct Sums {
        self_weight: u64,
        total_weight: u64,
        by: Contributors,
    }
    let mut functions: HashMap<&Label, Sums> = HashMap::new();
    let mut seen: HashSet<&Label> = HashSet::new();
    for &(key, weight) in stacks {
        if let Some(leaf) = key.frames.last() {
            functions.entry(leaf).or_default().self_weight += weight;
        }
        // Recursion must not count a function twice in one stack.
        seen.clear();
        for label in &key.frames {
            if seen.insert(label) {
                let sums = functions.entry(label).or_default();
                sums.total_weight += weight;
                sums.by.add(key, weight);
            }
        }
    }
    functions
        .into_iter()
        .map(|(label, sums)| Row {
            name: label.function.to_string(),
            module: label.module.to_string(),
            self_weight: sums.self_weight,
            total_weight: sums.total_weight,
            process: sums.by.process(),
            container: sums.by.container(),
        })
        .collect()
}

/// Stacks of one process (its threads merged) with the same frames are one row.
fn stack_rows(stacks: &[(&StackKey, u64)]) -> Vec<Row> {
    let mut merged: HashMap<(u32, &[Label]), (u64, Contributors)> = HashMap::new();
    for &(key, weight) in stacks {
        let (sum, by) = merged.entry((key.pid, &key.frames)).or_default();
        *sum += weight;
        by.add(key, weight);
    }
    merged
        .into_iter()
        .map(|((_, frames), (weight, by))| Row {
            name: frames
                .iter()
                .rev()
                .map(|label| &*label.function)
                .collect::<Vec<_>>()
                .join(" < "),
            module: frames
                .last()
                .map(|label| label.module.to_string())
                .unwrap_or_default(),
            self_weight: weight,
            total_weight: weight,
            process: by.process(),
            container: by.container(),
        })
        .collect()
}

/// What samples without the value show as.
pub const NO_VALUE: &str = "(none)";

/// One row per value of `key` (the samples without it in one `(none)`
/// row), each with the function its samples were most in.
fn value_rows(stacks: &[(&StackKey, u64)], key: &str) -> Vec<Row> {
    #[derive(Default)]
    struct Sums<'a> {
        weight: u64,
        leaves: HashMap<&'a Label, u64>,
        by: Contributors,
    }
    let mut values: HashMap<Option<String>, Sums> = HashMap::new();
    for &(stack, weight) in stacks {
        let sums = values.entry(stack.attribute(key)).or_default();
        sums.weight += weight;
        if let Some(leaf) = stack.frames.last() {
            *sums.leaves.entry(leaf).or_default() += weight;
        }
        sums.by.add(stack, weight);
    }
    values
        .into_iter()
        .map(|(value, sums)| {
            let hottest = sums
                .leaves
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.function.cmp(&a.0.function)))
                .map(|(label, _)| match &*label.module {
                    "" => label.function.to_string(),
                    module => format!("{} ({module})", label.function),
                })
                .unwrap_or_default();
            Row {
                name: value.unwrap_or_else(|| NO_VALUE.to_owned()),
                module: hottest,
                self_weight: sums.weight,
                total_weight: sums.weight,
                process: sums.by.process(),
                container: sums.by.container(),
            }
        })
        .collect()
}
