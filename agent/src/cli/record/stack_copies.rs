//! `--stack-copy-dir`: the kernel's stack copies written out as replayable
//! snapshots (registers, stack bytes, mappings, the kernel's frames).
use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::Context;

/// Turns `--stack-copy` records into snapshots (with the process's
/// mappings, read when its first copy arrives and again when a frame falls
/// outside them) and writes them to `dir`; returns how many were written.
pub(super) fn keep_stack_copies(
    copies: std::sync::mpsc::Receiver<crate::sampler::StackCopy>,
    dir: Option<&Path>,
) -> anyhow::Result<u64> {
    use crate::unwind::replay::{RecordedSample, SnapshotMapping, process_mappings, save_vdso};
    // The vDSO is no file: the snapshots name a copy of it.
    let vdso = dir.map(|dir| dir.join("vdso.so"));
    let vdso = vdso.filter(|path| match save_vdso(path) {
        Ok(()) => true,
        Err(err) => {
            tracing::warn!("cannot save the vDSO for the snapshots: {err}");
            false
        }
    });
    let mut mappings: std::collections::HashMap<u32, Vec<SnapshotMapping>> = Default::default();
    let mut written = 0;
    for copy in copies {
        let Some(dir) = dir else { continue };
        let tgid = copy.sample.tgid;
        let frames = &copy.sample.user_stack
            [..(copy.sample.user_stack_len as usize).min(copy.sample.user_stack.len())];
        let known = mappings.get(&tgid).is_some_and(|maps| {
            frames
                .iter()
                .all(|pc| maps.iter().any(|m| (m.start..m.end).contains(pc)))
        });
        if !known && let Ok(fresh) = process_mappings(tgid, vdso.as_deref()) {
            mappings.insert(tgid, fresh);
        }
        let Some(maps) = mappings.get(&tgid) else {
            // Gone before its first copy was read: nothing to replay with.
            continue;
        };
        let Some(recorded) = RecordedSample::new(&copy, maps.clone()) else {
            continue;
        };
        let path = dir.join(format!(
            "{}-{}-{}.stack",
            recorded.tgid, recorded.tid, recorded.ktime_ns
        ));
        let mut out = BufWriter::new(
            File::create(&path).with_context(|| format!("cannot create {}", path.display()))?,
        );
        recorded
            .write(&mut out)
            .and_then(|()| out.flush())
            .with_context(|| format!("cannot write {}", path.display()))?;
        written += 1;
    }
    Ok(written)
}
