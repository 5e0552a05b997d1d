//! Large files are read, hashed and their tables built on a thread of their
//! own, so that one of them does not hold up every other process's tables.
//!
//! Why: the service loads one process at a time, and a file is streamed
//! whole to hash it. A tenant's 150 MB library took 19 s to read on a
//! saturated host, and the 15 other processes waiting behind it got no
//! table meanwhile. Now a process mapping a file of [`LARGE_FILE`] bytes or
//! more is loaded at once without that file's table (those addresses fall
//! back to frame pointers); the file goes to this lane, and when its table
//! is ready every process that wanted it is asked for again. Small files
//! (interpreters, libc: a few MB, well under a second) are still read
//! inline: a second thread for them would only add contention.
//!
//! Each file is handed over once (by what `fstat` says of it); a file that
//! cannot be read or has no table is remembered as such, so processes
//! asking again do not read it again. Both are bounded.
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, mpsc},
};

use hostprof_unwind::table::{self, TableError, UnwindTable};

use super::{FileData, FileKey, cache};
use crate::files::{self, OpenFile, Stat};

/// Files of at least this many bytes go to the lane (a large interpreter
/// or libc is 2 to 10 MB; browsers, LLVM and CUDA libraries 100 MB or more).
pub const LARGE_FILE: u64 = 32 << 20;

/// Files waiting or done at most; past it the done ones are forgotten
/// (their processes ask again, and a file whose table is in the disk cache
/// is not read again).
const MAX_SLOTS: usize = 256;
/// Processes remembered per waiting file.
const MAX_WAITERS: usize = 64;

/// A file's table, read, hashed and built on the lane.
pub struct Built {
    pub key: FileKey,
    pub data: FileData,
    /// The table (true: from the disk cache), or why there is none.
    pub table: Result<(UnwindTable, bool), TableError>,
}

enum Slot {
    /// On the lane; these processes want it.
    Waiting(Vec<u32>),
    Ready(Box<Built>),
    /// Unreadable, or no ELF file: not tried again while it is the same.
    Failed,
}

/// What the lane does with one file (tests wrap [`read_and_build`]).
pub type Work = Box<dyn Fn(OpenFile) -> Option<Built> + Send>;

/// Told which processes wanted a file whose table is now ready.
pub type Notify = Box<dyn Fn(&[u32]) + Send>;

/// The service's end of the lane.
pub struct SlowLane {
    jobs: mpsc::Sender<(Stat, OpenFile)>,
    slots: Arc<Mutex<HashMap<Stat, Slot>>>,
    /// The least size sent to the lane.
    min_bytes: u64,
}

impl SlowLane {
    /// Starts the lane's thread (at `nice` 10 when `background`, else at
    /// [`super::FOREGROUND_NICE`], not the table thread's); it ends
    /// when the lane is dropped.
    pub fn spawn(
        min_bytes: u64,
        background: bool,
        work: Work,
        notify: Notify,
    ) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<(Stat, OpenFile)>();
        let slots: Arc<Mutex<HashMap<Stat, Slot>>> = Arc::default();
        let shared = slots.clone();
        std::thread::Builder::new()
            .name("hostprof-unwind-large".into())
            .spawn(move || {
                let nice = if background {
                    10
                } else {
                    super::FOREGROUND_NICE
                };
                // SAFETY: setpriority on our own thread id.
                unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice)
                };
                for (stat, file) in queue {
                    let slot = match work(file) {
                        Some(built) => Slot::Ready(Box::new(built)),
                        None => Slot::Failed,
                    };
                    let waiters = match lock(&shared).insert(stat, slot) {
                        Some(Slot::Waiting(pids)) => pids,
                        _ => Vec::new(),
                    };
                    notify(&waiters);
                }
            })?;
        Ok(SlowLane {
            jobs,
            slots,
            min_bytes,
        })
    }

    /// `file`, read by process `pid`, if the lane has it ready; `None` when
    /// it goes (or went) to the lane, or failed there: `pid` is asked for
    /// again when it is ready. `Err(file)`: small, read it inline.
    pub fn take(&self, pid: u32, file: OpenFile) -> Result<Option<Box<Built>>, OpenFile> {
        let stat = *file.stat();
        if stat.size < self.min_bytes {
            return Err(file);
        }
        let mut slots = lock(&self.slots);
        match slots.get_mut(&stat) {
            Some(Slot::Waiting(pids)) => {
                if pids.len() < MAX_WAITERS && !pids.contains(&pid) {
                    pids.push(pid);
                }
                return Ok(None);
            }
            Some(Slot::Failed) => return Ok(None),
            Some(Slot::Ready(_)) => {
                let Some(Slot::Ready(built)) = slots.remove(&stat) else {
                    unreachable!("matched above");
                };
                return Ok(Some(built));
            }
            None => {}
        }
        if slots.len() >= MAX_SLOTS {
            slots.retain(|_, slot| matches!(slot, Slot::Waiting(_)));
            if slots.len() >= MAX_SLOTS {
                // The lane is this far behind: leave the file for later.
                return Ok(None);
            }
        }
        slots.insert(stat, Slot::Waiting(vec![pid]));
        drop(slots);
        if self.jobs.send((stat, file)).is_err() {
            // The lane's thread is gone: not tried again.
            lock(&self.slots).insert(stat, Slot::Failed);
        }
        Ok(None)
    }

    /// Files on the lane or waiting for it (tests).
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        lock(&self.slots)
            .values()
            .filter(|slot| matches!(slot, Slot::Waiting(_)))
            .count()
    }
}

fn lock(slots: &Mutex<HashMap<Stat, Slot>>) -> MutexGuard<'_, HashMap<Stat, Slot>> {
    slots.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lane's work: the file's unwind parts read (every byte hashed), its
/// table taken from `cache` or built (and stored there). `None`: not
/// readable, or not an ELF file.
pub fn read_and_build(file: OpenFile, cache: Option<&cache::TableCache>) -> Option<Built> {
    let data = file
        .read_parts(files::Parts::Unwind)
        .map_err(|err| tracing::debug!("{err}"))
        .ok()?;
    let key = FileKey::Content(data.content_id());
    let segments = table::load_segments(&data)?;
    let table = cache::table_of(cache, &key, &data, &segments, true);
    Some(Built {
        key,
        data: Arc::new(data),
        table,
    })
}
