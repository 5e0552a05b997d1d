//! Language runtimes whose frames the kernel walks and the host names:
//! the [`Runtime`] seam each plugs into, and what they share: the runtime
//! library's ELF ([`elf`]) and where their code is ([`RuntimeCode`]); the
//! process memory reader is `crate::procs::memory` (the process context
//! reads with it too).
//!
//! - [`python`]: CPython (interpreter frames merged in place of the
//!   evaluation loop's native frames);
//! - [`java`]: JVMs, their frames named by [`hotspot`] (JIT and
//!   interpreted code, found by the kernel's walk in the code cache);
//! - [`v8`]: Node.js, its JavaScript frames (every tier, found by the
//!   kernel's frame-pointer walk of V8's code);
//! - `recent`: the frames each names, kept a moment for the samples that
//!   repeat them;
//! - [`refusals`]: what the name readers refused of a process's memory;
//! - [`go_labels`]: no frames, the pprof labels of Go's goroutines, whose
//!   place it tells the kernel;
//! - [`thread_ctx`]: no frames, the OpenTelemetry thread context (OTEP
//!   4947), whose thread-local it locates for the kernel (in a library:
//!   [`tls_library`]).
pub mod elf;
pub mod go_labels;
pub mod hotspot;
pub mod java;
pub mod present;
pub mod python;
mod recent;
pub mod refusals;
mod registry;
pub mod thread_ctx;
pub mod tls_library;
pub mod v8;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

pub use registry::Registry;

use crate::model::{CodeRange, Frame, Mapping};

/// Per process, the address ranges of each runtime's code that the
/// kernel's unwinder treats as that runtime's (a JVM's code heaps, V8's
/// code space and builtins, which their walkers step; CPython's
/// evaluation loop, whose frames it marks): written by the attribution
/// thread when it finds the runtime, read by the unwind service at each
/// load of the process, which marks the mappings there for the kernel.
#[derive(Clone, Debug, Default)]
pub struct RuntimeCode(Arc<Mutex<CodeRanges>>);

/// (pid, runtime) -> each range of that runtime's code in the process.
type CodeRanges = HashMap<(u32, hostprof_common::runtime::Runtime), Vec<CodeRange>>;

impl RuntimeCode {
    /// Says where `runtime`'s code is in `pid` (none: `ranges` empty).
    pub fn set(
        &self,
        pid: u32,
        runtime: hostprof_common::runtime::Runtime,
        ranges: Vec<CodeRange>,
    ) {
        let mut code = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if ranges.is_empty() {
            code.remove(&(pid, runtime));
        } else {
            code.insert((pid, runtime), ranges);
        }
    }

    /// Where `pid`'s runtimes' code is; empty when it has none.
    pub fn get(&self, pid: u32) -> Vec<CodeRange> {
        let code = self.0.lock().unwrap_or_else(|e| e.into_inner());
        hostprof_common::runtime::Runtime::ALL
            .iter()
            .filter_map(|&runtime| code.get(&(pid, runtime)))
            .flatten()
            .copied()
            .collect()
    }
}

/// A process the sampling program's JIT runtime walks or Go label reads
/// are for was registered with the kernel (`crate::sampler`'s lean program
/// has neither: `record` and `top` then load the whole one).
static WALKS_WANTED: AtomicBool = AtomicBool::new(false);

/// Says that a process needs the whole sampling program (`Registry`).
fn want_walks() {
    WALKS_WANTED.store(true, Ordering::Relaxed);
}

/// Whether a process needed the whole sampling program so far.
pub fn walks_wanted() -> bool {
    WALKS_WANTED.load(Ordering::Relaxed)
}

/// A Python interpreter was registered with the kernel: a lean start then
/// loads CPython's walk (`Sampler::load_deferred_python_walk`).
static PYTHON_WANTED: AtomicBool = AtomicBool::new(false);

/// Says that a process needs CPython's walk (`crate::runtime::python`).
pub fn want_python_walk() {
    PYTHON_WANTED.store(true, Ordering::Relaxed);
}

/// Whether a process needed CPython's walk so far.
pub fn python_walk_wanted() -> bool {
    PYTHON_WANTED.load(Ordering::Relaxed)
}

/// Processes a runtime was found in but could not be registered with the
/// kernel because the map of its processes was full (sized at load by
/// `crate::sampler`): sampled without that runtime's frames.
static UNREGISTERED_FULL: AtomicU64 = AtomicU64::new(0);

/// Counts a failed registration of a process in a runtime's kernel map
/// when the kernel says the map is full (E2BIG).
pub fn count_if_full(err: &aya::maps::MapError) {
    if let aya::maps::MapError::SyscallError(call) = err
        && call.io_error.raw_os_error() == Some(libc::E2BIG)
    {
        UNREGISTERED_FULL.fetch_add(1, Ordering::Relaxed);
    }
}

/// Processes left without their runtime's frames because its kernel map
/// was full, so far in this process.
pub fn unregistered_full() -> u64 {
    UNREGISTERED_FULL.load(Ordering::Relaxed)
}

/// One language runtime on the host: finds it in a process, tells the
/// kernel where its structures are, and names the frames the kernel
/// recorded. The attribution thread owns one of each and calls them for
/// every sample; each keeps its processes and caches, and forgets them
/// when the process exits.
pub trait Runtime: Send {
    /// Looks for the runtime in `pid` (its executable `mappings`) the first
    /// time the pid is seen, and now and then while not found; registers
    /// it with the kernel when found. Cheap once known. True when it was
    /// found just now and the process's unwind mappings must be loaded
    /// again (the kernel hands the runtime's code to its walker).
    fn attach(&mut self, pid: u32, mappings: &[Arc<Mapping>]) -> bool;
    /// Told, before `attach`, what attribution knows of the sample's
    /// process (its service identity, its context's key map). Nothing by
    /// default: the thread context stops the kernel reading records of a
    /// schema the process context says are not the OTEP's.
    fn identity(&mut self, _pid: u32, _process: &crate::model::ProcessInfo) {}
    /// Puts the sample's runtime frames, named, among its native `frames`
    /// (leaf first). None by default: a runtime that only tells the
    /// kernel where to read (a thread context, Go labels) has no frames.
    fn add_frames(
        &mut self,
        _pid: u32,
        _stack: &hostprof_common::runtime::Stack,
        _frames: &mut Vec<Frame>,
    ) {
    }
    /// The processes it knows.
    fn pids(&self) -> Vec<u32>;
    /// Forgets processes for which `alive` is false.
    fn retain(&mut self, alive: &mut dyn FnMut(u32) -> bool) {
        for pid in self.pids() {
            if !alive(pid) {
                self.forget(pid);
            }
        }
    }
    /// Forgets a process that exec'd or exited (its pid may come back as
    /// another program).
    fn forget(&mut self, pid: u32);
}

/// Replaces each native frame of `frames` that marks one of `stack`'s
/// runtime frames of `runtime` (a `tag` runtime, its kind bits aside)
/// with `name(recorded, leaf)` (`leaf`: the frame is where the CPU was,
/// not a caller): the kernel left the mark where the runtime's
/// frame ran, among the native ones.
pub fn replace_marks(
    runtime: u8,
    stack: &hostprof_common::runtime::Stack,
    frames: &mut [Frame],
    mut name: impl FnMut(hostprof_common::runtime::Frame, bool) -> Frame,
) {
    use hostprof_common::runtime::{FRAME_INDEX_MASK, FRAME_MARK, tag};
    let len = (stack.len as usize).min(stack.frames.len());
    // The first user frame is where the CPU was; every other one ran to a
    // call (its pc is a return address).
    let leaf = frames
        .iter()
        .position(|frame| frame.kind != crate::model::FrameKind::Kernel);
    for (at, frame) in frames.iter_mut().enumerate() {
        if frame.kind != crate::model::FrameKind::Native || frame.address & FRAME_MARK != FRAME_MARK
        {
            continue;
        }
        let index = (frame.address & FRAME_INDEX_MASK) as usize;
        let Some(&recorded) = stack.frames[..len].get(index) else {
            continue;
        };
        if tag::of(recorded.code) & tag::RUNTIME_MASK == runtime {
            *frame = name(recorded, leaf == Some(at));
        }
    }
}

/// The pids among `processes`' keys for which `alive` is false.
pub fn gone<V>(processes: &HashMap<u32, V>, mut alive: impl FnMut(u32) -> bool) -> Vec<u32> {
    processes
        .keys()
        .copied()
        .filter(|&pid| !alive(pid))
        .collect()
}

/// Reasons already said at warning level, which are then said at info
/// level only: a node running fifty copies of one unsupported runtime
/// gets one warning, not fifty. Bounded: past that many, all are info.
static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
const SAID_MAX: usize = 64;

/// Says that `pid`'s frames of `what` (JavaScript, Java, Python) will not
/// be walked, and why: a warning the first time a reason is seen, so
/// that `record` (whose default level is warnings) tells its user why a
/// runtime's frames are missing, and info after, so that an agent does
/// not repeat it for every process.
pub fn not_walked(pid: u32, what: &str, reason: impl std::fmt::Display) {
    let reason = reason.to_string();
    if first_time(&SAID, format!("{what}: {reason}")) {
        tracing::warn!("pid {pid}: its {what} frames cannot be walked: {reason}");
    } else {
        tracing::info!("pid {pid}: its {what} frames cannot be walked: {reason}");
    }
}

/// Whether `key` is new to `said` (which then holds it, up to [`SAID_MAX`]).
fn first_time(said: &Mutex<Vec<String>>, key: String) -> bool {
    let mut said = said.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if said.contains(&key) || said.len() >= SAID_MAX {
        return false;
    }
    said.push(key);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_a_warning_once_and_the_list_is_bounded() {
        let said = Mutex::new(Vec::new());
        assert!(first_time(&said, "V8: constants missing".into()));
        assert!(!first_time(&said, "V8: constants missing".into()));
        assert!(first_time(&said, "Java: no gHotSpotVMStructs".into()));
        for i in 0..SAID_MAX {
            first_time(&said, format!("reason {i}"));
        }
        assert_eq!(said.lock().unwrap().len(), SAID_MAX);
        assert!(!first_time(&said, "one more".into()));
    }
}
