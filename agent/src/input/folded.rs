//! Folded stacks (`comm;root;...;leaf COUNT`) back into samples: one frame
//! per name, `_[k]` marking kernel frames, `[module+0xOFFSET]` unnamed ones.
//!
//! A file with off-CPU stacks (`comm;[off-cpu: STATE];...`) counts
//! microseconds, as `record --off-cpu` writes it: off-CPU lines become
//! periods of that many microseconds, CPU lines that many 1 µs samples (the
//! sampling period is not in the file), so writing folded stacks again gives
//! the same numbers.
use std::sync::Arc;

use super::{Attributes, Counted, Group, InputError, InputProfile, MAX_SAMPLES};
use crate::model::{
    Frame, FrameKind, Line, Mapping, OffCpu, ProcessInfo, ResolvedSample, ThreadState,
};

/// The CPU "period" of files in microseconds: one sample per microsecond.
const MICROSECOND_NS: u64 = 1000;

pub(super) fn read(data: &[u8]) -> Result<InputProfile, InputError> {
    let text = std::str::from_utf8(data)
        .map_err(|err| InputError::Folded(format!("not UTF-8 text: {err}")))?;
    let mut lines = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| {
            let shown: String = line.chars().take(80).collect();
            InputError::Folded(format!("line {}: {why}: `{shown}`", number + 1))
        };
        let (stack, count) = line
            .rsplit_once(' ')
            .ok_or_else(|| bad("no count after the stack"))?;
        let count: u64 = count
            .parse()
            .map_err(|_| bad("the count is not a number"))?;
        let mut names = stack.split(';');
        let thread = names.next().unwrap_or_default();
        let mut names = names.peekable();
        let state = match names.peek().and_then(|name| off_cpu_state(name)) {
            Some(state) => {
                names.next();
                Some(state.ok_or_else(|| bad("unknown off-CPU state"))?)
            }
            None => None,
        };
        lines.push((thread, state, names.map(frame).collect::<Vec<_>>(), count));
    }
    let off_cpu = lines.iter().any(|(_, state, _, _)| state.is_some());
    let mut profile = InputProfile {
        period_ns: off_cpu.then_some(MICROSECOND_NS),
        ..Default::default()
    };
    let mut group = Group::default();
    let mut total: u64 = 0;
    for (thread, state, mut frames, count) in lines {
        if count == 0 {
            continue;
        }
        total = total.saturating_add(count);
        if total > MAX_SAMPLES {
            return Err(InputError::Folded(format!(
                "more than {MAX_SAMPLES} samples"
            )));
        }
        // Root first in the file, leaf first in a sample.
        frames.reverse();
        let sample = ResolvedSample {
            process: Arc::new(ProcessInfo {
                pid: 0,
                comm: thread.into(),
                exe_path: "".into(),
                container_id: None,
                pod_uid: None,
                service: None,
                thread_keys: None,
            }),
            tid: 0,
            thread_name: thread.into(),
            cpu: 0,
            time_unix_nano: 0,
            frames,
            off_cpu: state.map(|state| OffCpu {
                blocked_ns: count.saturating_mul(1000),
                state,
            }),
            trace: None,
            attributes: Vec::new(),
        };
        group.samples.push(Counted {
            count: if sample.off_cpu.is_some() { 1 } else { count },
            sample,
            timestamps: Vec::new(),
            attributes: Attributes::default(),
        });
    }
    profile.groups.push(group);
    Ok(profile)
}

/// `Some(state)` for an `[off-cpu: STATE]` marker (`Some(None)`: an
/// unknown state), `None` for any other name.
fn off_cpu_state(name: &str) -> Option<Option<ThreadState>> {
    let state = name.strip_prefix("[off-cpu: ")?.strip_suffix(']')?;
    Some(ThreadState::from_name(state))
}

/// The frame a folded name stands for.
fn frame(name: &str) -> Frame {
    let mut frame = Frame {
        kind: FrameKind::Native,
        address: 0,
        mapping: None,
        file_offset: 0,
        lines: crate::model::no_lines(),
    };
    if let Some((module, offset)) = unsymbolized(name) {
        match module {
            "kernel" => {
                frame.kind = FrameKind::Kernel;
                frame.address = offset;
            }
            "unknown" => frame.address = offset,
            module => {
                frame.address = offset;
                frame.file_offset = offset;
                frame.mapping = Some(Arc::new(Mapping {
                    start: 0,
                    end: 0,
                    file_offset: 0,
                    path: module.into(),
                    dev: 0,
                    inode: 0,
                    build_ids: Default::default(),
                }));
            }
        }
        return frame;
    }
    let function = match name.strip_suffix("_[k]") {
        Some(kernel) => {
            frame.kind = FrameKind::Kernel;
            kernel
        }
        None => name,
    };
    let function: Arc<str> = function.into();
    frame.lines = Arc::new([Line::named(function.clone(), function)]);
    frame
}

/// `[module+0xOFFSET]` → (module, offset).
fn unsymbolized(name: &str) -> Option<(&str, u64)> {
    let inner = name.strip_prefix('[')?.strip_suffix(']')?;
    let (module, offset) = inner.rsplit_once("+0x")?;
    if module.is_empty() {
        return None;
    }
    Some((module, u64::from_str_radix(offset, 16).ok()?))
}
