//! The pipeline's shared vocabulary: what a sample looks like once it has been
//! attributed to a process, unwound and symbolized.
//!
//! Every stage after the sampler speaks these types, so outputs (folded, OTLP,
//! pprof, …) never need to know where a frame came from.
use std::sync::Arc;

/// Identity of an executable or library file: what a backend needs to find the
/// same build again. The GNU build-id and htlhash are lowercase hex.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct BuildIds {
    /// `.note.gnu.build-id`.
    pub gnu: Option<Arc<str>>,
    /// `.note.go.buildid`, in Go's own text form (`actionID/contentID`, as
    /// `go tool buildid` prints it; not hex).
    pub go: Option<Arc<str>>,
    /// OpenTelemetry's file hash (`process.executable.build_id.htlhash`).
    pub htlhash: Option<Arc<str>>,
}

/// One executable mapping of a process (a line of `/proc/PID/maps`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of the byte mapped at `start`.
    pub file_offset: u64,
    /// The path as the process sees it (`/usr/lib/libc.so.6`, `[vdso]`, or empty
    /// for anonymous memory).
    pub path: Arc<str>,
    /// Device and inode of the mapped file (0 for anonymous memory): which
    /// file it is, even after the process is gone or the path was replaced.
    pub dev: u64,
    pub inode: u64,
    pub build_ids: BuildIds,
}

/// A range of a language runtime's code in a process, which the kernel
/// treats as that runtime's (`by`): every anonymous mapping it overlaps
/// (a JIT's code space), or with `in_files` the part of file mappings it
/// covers (code a runtime ships in its binary, such as V8's builtins or
/// CPython's evaluation loop).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodeRange {
    pub low: u64,
    pub high: u64,
    pub in_files: bool,
    pub by: CodeUse,
}

/// What the kernel's unwinder does with a [`CodeRange`]'s code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CodeUse {
    /// The runtime's walker steps it (no table): a
    /// `hostprof_common::runtime::tag` runtime (`HOTSPOT`, `V8`), which the
    /// kernel reads from the mapping to pick the walker without looking
    /// the process up in each runtime's map.
    Walked(u8),
    /// Native code, unwound with its table as any other, whose frames
    /// stand for the runtime's (an interpreter's loop): each is marked
    /// with this `hostprof_common::runtime::mark` in the stack.
    Marked(u32),
}

impl CodeRange {
    /// `runtime`'s anonymous code overlapping `[low, high)`.
    pub const fn anonymous(low: u64, high: u64, runtime: u8) -> CodeRange {
        CodeRange {
            low,
            high,
            in_files: false,
            by: CodeUse::Walked(runtime),
        }
    }

    /// `runtime`'s code in a file at `[low, high)`, which its walker steps.
    pub const fn in_files(low: u64, high: u64, runtime: u8) -> CodeRange {
        CodeRange {
            low,
            high,
            in_files: true,
            by: CodeUse::Walked(runtime),
        }
    }

    /// Native code in a file at `[low, high)` whose frames carry `mark`.
    pub const fn marked(low: u64, high: u64, mark: u32) -> CodeRange {
        CodeRange {
            low,
            high,
            in_files: true,
            by: CodeUse::Marked(mark),
        }
    }
}

impl Mapping {
    /// The file name, for display (`libc.so.6`); `[anon]` for anonymous memory.
    pub fn file_name(&self) -> &str {
        if self.path.is_empty() {
            return "[anon]";
        }
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

/// What kind of code a frame ran (OTLP `profile.frame.type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    Kernel,
    Native,
    Go,
    /// Python code run by CPython's interpreter.
    Python,
    /// Java code run by HotSpot (interpreted or compiled).
    Java,
    /// JavaScript run by V8 (interpreted or compiled).
    JavaScript,
}

impl FrameKind {
    /// The OpenTelemetry `profile.frame.type` value.
    pub const fn otel_name(self) -> &'static str {
        match self {
            FrameKind::Kernel => "kernel",
            FrameKind::Native => "native",
            FrameKind::Go => "go",
            FrameKind::Python => "cpython",
            FrameKind::Java => "jvm",
            FrameKind::JavaScript => "v8js",
        }
    }
}

/// One source-level function at a frame: a frame with inlined calls has several,
/// innermost first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Line {
    /// Demangled name (`std::io::stdio::_print`).
    pub function: Arc<str>,
    /// Name as stored in the binary (`_ZN3std2io5stdio6_print17h…E`).
    pub system_name: Arc<str>,
    pub file: Option<Arc<str>>,
    /// 0 when unknown.
    pub line: u32,
    /// 0 when unknown.
    pub column: u32,
    /// First line of the function, 0 when unknown.
    pub start_line: u32,
}

impl Line {
    /// A line known only by its symbol name.
    pub fn named(function: Arc<str>, system_name: Arc<str>) -> Self {
        Line {
            function,
            system_name,
            file: None,
            line: 0,
            column: 0,
            start_line: 0,
        }
    }
}

/// The lines of a frame not (yet) named: one shared empty slice, so an
/// unnamed frame allocates nothing.
pub fn no_lines() -> Arc<[Line]> {
    static EMPTY: std::sync::OnceLock<Arc<[Line]>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| Arc::from(Vec::new())).clone()
}

/// One frame of a stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub kind: FrameKind,
    /// The instruction address as the process (or kernel) saw it.
    pub address: u64,
    /// The mapping holding `address`; `None` for kernel frames and unmapped addresses.
    pub mapping: Option<Arc<Mapping>>,
    /// `address` translated into the mapped file (for kernel frames: into its
    /// module, or the kernel image); meaningful when `mapping` is set.
    pub file_offset: u64,
    /// Source functions at this address, innermost first; empty when the frame
    /// could not be symbolized. Shared with the symbolizer's cache: a frame
    /// named before costs a reference count, not a copy of its names.
    pub lines: Arc<[Line]>,
}

impl Frame {
    /// `[module+0xOFFSET]`: how a frame without a name is shown.
    pub fn unsymbolized_label(&self) -> String {
        let mut label = String::new();
        self.write_unsymbolized_label(&mut label);
        label
    }

    /// Appends [`Frame::unsymbolized_label`] to `out`.
    pub fn write_unsymbolized_label(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = match (&self.mapping, self.kind) {
            (Some(mapping), _) => {
                // "[vdso]" reads better as "[vdso+0x10]" than "[[vdso]+0x10]".
                let name = mapping
                    .file_name()
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                write!(out, "[{name}+{:#x}]", self.file_offset)
            }
            (None, FrameKind::Kernel) => write!(out, "[kernel+{:#x}]", self.address),
            (None, _) => write!(out, "[unknown+{:#x}]", self.address),
        };
    }
}

/// A process, as far as the profile cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    /// `/proc/PID/comm` of the main thread.
    pub comm: Arc<str>,
    /// Target of `/proc/PID/exe`, as the process sees it; empty for kernel threads.
    pub exe_path: Arc<str>,
    /// Container the process runs in, from `/proc/PID/cgroup`.
    pub container_id: Option<Arc<str>>,
    /// Kubernetes pod uid, from `/proc/PID/cgroup`.
    pub pod_uid: Option<Arc<str>>,
    /// What the process says it is (`service.name`, `service.instance.id`,
    /// …): its OpenTelemetry process context, or else its environment.
    pub service: Option<Arc<ServiceResource>>,
    /// The names of its thread records' attribute keys
    /// (`threadlocal.attribute_key_map` in its process context).
    pub thread_keys: Option<Arc<crate::procs::thread_attrs::KeyMap>>,
}

/// Resource attributes a process publishes about itself, by key (sorted,
/// each key once).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceResource {
    pub attributes: Vec<(String, ResourceValue)>,
}

impl ServiceResource {
    /// From key/values in precedence order: a later key replaces an earlier one.
    pub fn new(attributes: impl IntoIterator<Item = (String, ResourceValue)>) -> Self {
        let mut by_key = std::collections::BTreeMap::new();
        for (key, value) in attributes {
            by_key.insert(key, value);
        }
        ServiceResource {
            attributes: by_key.into_iter().collect(),
        }
    }

    /// A string attribute's value.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(existing, _)| existing == key)
            .and_then(|(_, value)| match value {
                ResourceValue::Str(text) => Some(text.as_str()),
                _ => None,
            })
    }
}

/// A scalar attribute value (what resources carry in practice).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceValue {
    Str(String),
    Int(i64),
    Bool(bool),
    /// An `f64`'s bits, so the value can be compared and hashed.
    Double(u64),
}

impl ProcessInfo {
    /// The executable's file name (`process.executable.name`), or comm when the
    /// process has no executable (kernel threads).
    pub fn exe_name(&self) -> &str {
        match self.exe_path.rsplit('/').next() {
            Some(name) if !name.is_empty() => name,
            _ => &self.comm,
        }
    }
}

/// Why a thread was off CPU: its scheduler state when it left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ThreadState {
    /// Preempted while it could still run: waiting for a CPU.
    Runnable,
    /// Sleeping until an event (I/O on sockets and pipes, timers, futexes).
    Interruptible,
    /// Waiting in the kernel, typically on disk I/O.
    Uninterruptible,
    /// An idle kernel wait that does not count as load.
    Idle,
    Stopped,
    Traced,
    Other,
}

impl ThreadState {
    /// Decodes `task_struct::__state` bits (include/linux/sched.h).
    pub fn from_kernel(state: u32) -> Self {
        const INTERRUPTIBLE: u32 = 0x1;
        const UNINTERRUPTIBLE: u32 = 0x2;
        const STOPPED: u32 = 0x4;
        const TRACED: u32 = 0x8;
        const NOLOAD: u32 = 0x400;
        match state {
            0 => ThreadState::Runnable,
            s if s & TRACED != 0 => ThreadState::Traced,
            s if s & STOPPED != 0 => ThreadState::Stopped,
            s if s & UNINTERRUPTIBLE != 0 && s & NOLOAD != 0 => ThreadState::Idle,
            s if s & UNINTERRUPTIBLE != 0 => ThreadState::Uninterruptible,
            s if s & INTERRUPTIBLE != 0 => ThreadState::Interruptible,
            _ => ThreadState::Other,
        }
    }

    /// Every state, in declaration order.
    pub const ALL: [ThreadState; 7] = [
        ThreadState::Runnable,
        ThreadState::Interruptible,
        ThreadState::Uninterruptible,
        ThreadState::Idle,
        ThreadState::Stopped,
        ThreadState::Traced,
        ThreadState::Other,
    ];

    /// The state a `thread.state` value names (the inverse of [`name`](Self::name)).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.name() == name)
    }

    /// The value of the `thread.state` attribute.
    pub const fn name(self) -> &'static str {
        match self {
            ThreadState::Runnable => "runnable",
            ThreadState::Interruptible => "interruptible",
            ThreadState::Uninterruptible => "uninterruptible",
            ThreadState::Idle => "idle",
            ThreadState::Stopped => "stopped",
            ThreadState::Traced => "traced",
            ThreadState::Other => "other",
        }
    }
}

/// An off-CPU period of a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpu {
    /// How long the thread was away.
    pub blocked_ns: u64,
    pub state: ThreadState,
}

/// A sample after attribution, unwinding and symbolization: a cpu-clock
/// sample, or (with `off_cpu` set) a period the thread spent off CPU.
#[derive(Clone, Debug)]
pub struct ResolvedSample {
    pub process: Arc<ProcessInfo>,
    pub tid: u32,
    /// The thread's comm at sampling time.
    pub thread_name: Arc<str>,
    pub cpu: u32,
    /// Wall-clock time of the sample; for off-CPU samples, when the block started.
    pub time_unix_nano: u64,
    /// Leaf first: kernel frames (if the CPU was in the kernel), then user frames.
    pub frames: Vec<Frame>,
    /// Set for off-CPU samples.
    pub off_cpu: Option<OffCpu>,
    /// The trace and span the thread was working for, when its process
    /// publishes an OpenTelemetry thread context.
    pub trace: Option<TraceLink>,
    /// The attributes of that thread context, named by the process's key
    /// map (`http.route` → `/cart`, …): OTLP sample attributes, pprof labels.
    pub attributes: Vec<(Arc<str>, Arc<str>)>,
}

#[cfg(test)]
impl ResolvedSample {
    /// A CPU sample of a process `app` (pid and thread 1) stopped in
    /// `frames`, leaf first: for tests.
    pub fn of_app(frames: Vec<Frame>) -> Self {
        ResolvedSample {
            process: Arc::new(ProcessInfo {
                pid: 1,
                comm: "app".into(),
                exe_path: "/bin/app".into(),
                container_id: None,
                pod_uid: None,
                service: None,
                thread_keys: None,
            }),
            tid: 1,
            thread_name: "app".into(),
            cpu: 0,
            time_unix_nano: 0,
            frames,
            off_cpu: None,
            trace: None,
            attributes: Vec::new(),
        }
    }
}

/// A W3C trace id and span id (OTLP `Link`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceLink {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

impl TraceLink {
    /// The link of a kernel record; `None` for a record that names no
    /// trace (all-zero ids: "none active").
    pub fn from_kernel(link: &hostprof_common::trace::Link) -> Option<TraceLink> {
        let link = TraceLink {
            trace_id: link.trace_id,
            span_id: link.span_id,
        };
        (link.trace_id != [0; 16] && link.span_id != [0; 8]).then_some(link)
    }

    /// The trace id in lowercase hex (W3C form).
    pub fn trace_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id in lowercase hex.
    pub fn span_hex(&self) -> String {
        hex(&self.span_id)
    }
}

/// Why text is no trace or span id; `Display` is one line.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("a {what} is {digits} hex digits, this has {len}")]
    Length {
        what: &'static str,
        digits: usize,
        len: usize,
    },
    #[error("a {what} is hex digits (0-9, a-f), `{found}` is none")]
    NotHex { what: &'static str, found: char },
    #[error("an all-zero {what} names none (W3C trace context): copy the id from the trace")]
    Zero { what: &'static str },
}

/// `text` as an id of `N` bytes in hex (either case, as tracing UIs show
/// them); all zeros is refused, as W3C trace context does.
fn parse_id<const N: usize>(text: &str, what: &'static str) -> Result<[u8; N], IdError> {
    // What was typed is not repeated: the caller shows it (clap does).
    if let Some(found) = text.chars().find(|ch| !ch.is_ascii_hexdigit()) {
        return Err(IdError::NotHex { what, found });
    }
    if text.len() != 2 * N {
        return Err(IdError::Length {
            what,
            digits: 2 * N,
            len: text.len(),
        });
    }
    let mut id = [0u8; N];
    for (byte, pair) in id.iter_mut().zip(text.as_bytes().chunks(2)) {
        // Checked above: two ASCII hex digits.
        let pair = std::str::from_utf8(pair).unwrap_or("00");
        *byte = u8::from_str_radix(pair, 16).unwrap_or(0);
    }
    if id == [0; N] {
        return Err(IdError::Zero { what });
    }
    Ok(id)
}

impl TraceLink {
    /// A trace id as W3C trace context writes it: 32 hex digits.
    pub fn parse_trace_id(text: &str) -> Result<[u8; 16], IdError> {
        parse_id(text.trim(), "trace id")
    }

    /// A span id: 16 hex digits.
    pub fn parse_span_id(text: &str) -> Result<[u8; 8], IdError> {
        parse_id(text.trim(), "span id")
    }
}

/// Lowercase hex, as W3C trace context writes ids.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// An entry of a `key=value,…` list that could not be read.
pub(crate) enum BadEntry {
    NotKeyValue(String),
    BadEscape(String),
}

/// The OpenTelemetry environment's `key1=value1,key2=value2` lists (resource
/// attributes, exporter headers): trimmed keys, %-decoded values.
pub(crate) fn parse_key_values(text: &str) -> Result<Vec<(String, String)>, BadEntry> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (key, value) = entry
                .split_once('=')
                .filter(|(key, _)| !key.trim().is_empty())
                .ok_or_else(|| BadEntry::NotKeyValue(entry.to_owned()))?;
            let value = percent_decode(value.trim())
                .ok_or_else(|| BadEntry::BadEscape(entry.to_owned()))?;
            Ok((key.trim().to_owned(), value))
        })
        .collect()
}

/// Decodes `%XX` escapes; `None` when one is malformed or the result is not UTF-8.
pub(crate) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::ThreadState;

    #[test]
    fn decodes_kernel_task_states() {
        assert_eq!(ThreadState::from_kernel(0), ThreadState::Runnable);
        assert_eq!(ThreadState::from_kernel(0x1), ThreadState::Interruptible);
        // TASK_FREEZABLE (0x2000) rides along with futex and pipe waits.
        assert_eq!(ThreadState::from_kernel(0x2001), ThreadState::Interruptible);
        assert_eq!(ThreadState::from_kernel(0x2), ThreadState::Uninterruptible);
        // TASK_KILLABLE = WAKEKILL | UNINTERRUPTIBLE; TASK_IDLE adds NOLOAD.
        assert_eq!(
            ThreadState::from_kernel(0x102),
            ThreadState::Uninterruptible
        );
        assert_eq!(ThreadState::from_kernel(0x402), ThreadState::Idle);
        assert_eq!(ThreadState::from_kernel(0x8), ThreadState::Traced);
        assert_eq!(ThreadState::from_kernel(0x40), ThreadState::Other);
    }

    #[test]
    fn trace_and_span_ids_parse_from_hex() {
        use super::{IdError, TraceLink};
        let trace = TraceLink::parse_trace_id("0102030405060708090A0b0c0d0e0f10").unwrap();
        assert_eq!(trace[0], 1);
        assert_eq!(trace[10], 0x0b);
        assert_eq!(trace[15], 0x10);
        assert_eq!(
            TraceLink::parse_span_id(" 00000000000000ff\n"),
            Ok([0, 0, 0, 0, 0, 0, 0, 0xff])
        );
        assert!(matches!(
            TraceLink::parse_trace_id("0102"),
            Err(IdError::Length {
                digits: 32,
                len: 4,
                ..
            })
        ));
        // A trace id where a span id goes: the length says so.
        assert!(matches!(
            TraceLink::parse_span_id("0102030405060708090a0b0c0d0e0f10"),
            Err(IdError::Length {
                digits: 16,
                len: 32,
                ..
            })
        ));
        assert!(matches!(
            TraceLink::parse_span_id("00000000000000fg"),
            Err(IdError::NotHex { found: 'g', .. })
        ));
        // Not hex before the length: `0x…` says what is wrong with it.
        assert!(matches!(
            TraceLink::parse_span_id("0x00000000000000ff"),
            Err(IdError::NotHex { found: 'x', .. })
        ));
        assert!(matches!(
            TraceLink::parse_span_id("ünïcödé"),
            Err(IdError::NotHex { found: 'ü', .. })
        ));
        assert_eq!(
            TraceLink::parse_span_id("0000000000000000"),
            Err(IdError::Zero { what: "span id" })
        );
        let long = "a".repeat(10_000);
        let message = TraceLink::parse_trace_id(&long).unwrap_err().to_string();
        assert_eq!(message, "a trace id is 32 hex digits, this has 10000");
    }

    #[test]
    fn state_names_read_back() {
        for state in ThreadState::ALL {
            assert_eq!(ThreadState::from_name(state.name()), Some(state));
        }
        assert_eq!(ThreadState::from_name("sleepy"), None);
    }
}
