//! Java processes: finds the JVM (HotSpot's `libjvm.so`) in a process,
//! tells the kernel where its code heaps and fields are (the
//! `HOTSPOT_PROCS` map, and the code ranges the unwind service marks), and
//! names the Java frames the kernel recorded, through [`super::hotspot`].
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use hostprof_common::{
    hotspot,
    runtime::{self, tag},
};

use super::{
    Registry, Runtime, RuntimeCode,
    hotspot::{HotspotError, JavaFrame, Jvm, LibjvmCache},
    recent::Recent,
};
use crate::model::{CodeRange, Frame, FrameKind, Line, Mapping};

/// The kernel map of Java processes.
pub type ProcessMap = BpfHashMap<MapData, u32, hotspot::Process>;

/// How often a process without a (ready) JVM is looked at again: a JVM
/// being started has `libjvm.so` mapped before its code cache exists.
const RECHECK_INTERVAL: Duration = Duration::from_millis(250);

/// A frame the kernel recorded that no JVM could name (code freed since,
/// or its process gone).
const UNNAMED: &str = "[unknown Java frame]";

/// What is known of a process.
enum State {
    Jvm(Box<Attached>),
    /// No JVM (yet) when last looked at: no `libjvm.so`, or a JVM still
    /// starting.
    NotYet(Instant),
    /// A JVM that cannot be walked (said once); looked at again after an
    /// exec.
    Unsupported,
}

/// A JVM walked, and its frames named lately (by recorded method or code
/// and bci or pc; a frame of a hot method is named once, not per sample).
/// The one memo of named frames: `hotspot` keeps only what it read (methods,
/// nmethods, symbols), so naming a frame again past `recent::REUSE` decodes
/// from memory already read, without a read of the process.
struct Attached {
    jvm: Jvm,
    recent: Recent<(u64, u64), Frame>,
}

/// The JVMs of the processes seen (the attribution thread owns it).
pub struct Java {
    code: RuntimeCode,
    processes: Registry<State, hotspot::Process>,
    /// Each `libjvm.so`'s symbols, read once however many JVMs map it.
    libjvm: LibjvmCache,
}

impl Java {
    /// With the kernel's map (none: nothing is registered, e.g. tests) and
    /// where to publish the JVMs' code ranges for the unwind service.
    pub fn new(map: Option<ProcessMap>, code: RuntimeCode) -> Self {
        Java {
            code,
            processes: Registry::new(map, "its JVM", |state| matches!(state, State::Jvm(_)))
                .read_by_the_whole_program(),
            libjvm: LibjvmCache::default(),
        }
    }
}

impl Runtime for Java {
    fn attach(&mut self, pid: u32, mappings: &[Arc<Mapping>]) -> bool {
        match self.processes.get(pid) {
            Some(State::Jvm(_) | State::Unsupported) => return false,
            Some(State::NotYet(at)) if at.elapsed() < RECHECK_INTERVAL => return false,
            _ => {}
        }
        let Some(libjvm) = mappings
            .iter()
            .find(|mapping| mapping.file_name() == "libjvm.so")
        else {
            self.processes.set(pid, State::NotYet(Instant::now()));
            return false;
        };
        let jvm = match Jvm::attach_cached(pid, libjvm, &mut self.libjvm) {
            Ok(jvm) => jvm,
            Err(HotspotError::NotReady) => {
                self.processes.set(pid, State::NotYet(Instant::now()));
                return false;
            }
            Err(err) => {
                crate::runtime::not_walked(pid, "Java", err);
                self.processes.set(pid, State::Unsupported);
                return false;
            }
        };
        self.processes.register(pid, jvm.kernel_process());
        let code = jvm.code_ranges().into_iter();
        self.code.set(
            pid,
            runtime::Runtime::Hotspot,
            code.map(|(low, high)| CodeRange::anonymous(low, high, tag::HOTSPOT))
                .collect(),
        );
        tracing::debug!(
            "pid {pid}: Java {}: its frames are walked",
            jvm.version().as_deref().unwrap_or("(unknown version)")
        );
        self.processes.set(
            pid,
            State::Jvm(Box::new(Attached {
                jvm,
                recent: Recent::default(),
            })),
        );
        true
    }

    fn add_frames(&mut self, pid: u32, stack: &runtime::Stack, frames: &mut Vec<Frame>) {
        let Some(State::Jvm(attached)) = self.processes.get_mut(pid) else {
            return;
        };
        let Attached { jvm, recent } = &mut **attached;
        super::replace_marks(tag::HOTSPOT, stack, frames, |recorded, _leaf| {
            recent.get_or_name((recorded.code, recorded.instr), || {
                java_frame(recorded, &jvm.name_frame(recorded))
            })
        });
    }

    fn pids(&self) -> Vec<u32> {
        self.processes.pids()
    }

    fn forget(&mut self, pid: u32) {
        self.processes.forget(pid);
        self.code.set(pid, runtime::Runtime::Hotspot, Vec::new());
    }
}

/// The frame of a recorded HotSpot frame: its methods (innermost inlined
/// one first) as lines, like a native frame's inlined functions.
fn java_frame(recorded: runtime::Frame, named: &[JavaFrame]) -> Frame {
    let mut lines: Vec<Line> = named.iter().map(java_line).collect();
    if lines.is_empty() {
        lines.push(Line::named(UNNAMED.into(), UNNAMED.into()));
    }
    Frame {
        kind: FrameKind::Java,
        address: recorded.code & tag::ADDRESS_MASK,
        mapping: None,
        file_offset: recorded.instr,
        lines: lines.into(),
    }
}

fn java_line(frame: &JavaFrame) -> Line {
    let function: Arc<str> = if frame.class.is_empty() {
        frame.method.as_str().into()
    } else {
        format!("{}.{}", frame.class, frame.method).into()
    };
    Line {
        system_name: function.clone(),
        function,
        file: frame.file.as_deref().map(Arc::from),
        line: frame.line.unwrap_or(0),
        column: 0,
        start_line: 0,
    }
}
