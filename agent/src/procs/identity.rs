//! Who a process says it is ([`ServiceResource`]): its OpenTelemetry process
//! context ([`otel_ctx`](super::otel_ctx)) when it publishes one, else
//! `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` from its environment
//! ([`environment`](super::environment)).
//!
//! Looked at with the process's first `/proc` read, then again from time
//! to time while samples of it come: a known context by its header alone
//! (one 32-byte read; the payload only when the timestamp moved) and its
//! maps too, with backoff (a library with the thread context's variable
//! may come after the context), a process without one by its maps, with
//! backoff, since an SDK may publish after the first sample. The
//! environment is read once per process: it cannot change after exec.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    environment,
    otel_ctx::{self, Reading, Refusal},
    thread_attrs::KeyMap,
};
use crate::model::ServiceResource;

/// How often a known context's header is read again: republished attributes
/// show within about this long.
const CONTEXT_RECHECK: Duration = Duration::from_secs(1);

/// How soon a context is read again when a thread record names a key
/// index its key map does not have yet: at once, unless it was read this
/// recently (a header read, 32 bytes; the payload only if republished).
const UNKNOWN_KEY_RECHECK: Duration = Duration::from_millis(10);

/// How soon the maps of a process without a known context are searched
/// when its threads' records carry attributes: after [`FIRST_CONTEXT_SEARCH`]
/// first, the wait doubling while none is found up to this (at most 4
/// reads of its `/proc/PID/maps` a second however many such samples come).
/// The agent attributes samples in batches, maybe seconds behind when busy:
/// a fixed quarter second there left hundreds of samples unnamed.
const UNKNOWN_CONTEXT_SEARCH: Duration = Duration::from_millis(250);
const FIRST_CONTEXT_SEARCH: Duration = Duration::from_millis(10);

/// Backoff for a process without a context: maps are read again after this,
/// the wait doubling up to [`MAX_SEARCH_INTERVAL`] while none shows.
const MIN_SEARCH_INTERVAL: Duration = Duration::from_secs(1);
const MAX_SEARCH_INTERVAL: Duration = Duration::from_secs(60);

/// A context taken: where its header is, and which publication was read.
#[derive(Clone, Debug)]
struct Context {
    address: u64,
    published_at_ns: u64,
    resource: Arc<ServiceResource>,
    /// The thread context's key map (OTEP 4947), published with it.
    keys: Arc<KeyMap>,
}

/// What [`Identity::recheck`] found.
#[derive(Debug)]
pub(super) struct Recheck {
    /// [`Identity::service`] or [`Identity::thread_keys`] changed.
    pub changed: bool,
    /// The text of `/proc/PID/maps`, when this look read it (searching
    /// for a context): it may show a library `dlopen`ed since the process's
    /// maps were read, which the thread context's variable may be in, and
    /// which its samples may never land in (so no address missing the
    /// maps would tell).
    pub maps: Option<Vec<u8>>,
}

/// What is known of one process image's identity.
#[derive(Clone, Debug)]
pub(super) struct Identity {
    context: Option<Context>,
    /// `None` until read (or when reading is off, never).
    environment: Option<Arc<ServiceResource>>,
    checked_at: Instant,
    check_after: Duration,
    /// The next search's wait when records carry attributes and no
    /// context is known ([`Identity::hurry`]).
    search_wait: Duration,
    /// Searches of the maps of a process whose context is known.
    libraries: LibrarySearch,
}

/// When the maps of a process with a known context are searched again: its
/// SDK may load the library holding the thread context's variable after it
/// published the context (a Python SDK that publishes from Python, then
/// loads a native extension at its first span), and samples may never land
/// in that library. Every [`MIN_SEARCH_INTERVAL`] at first, the wait
/// doubling up to [`MAX_SEARCH_INTERVAL`]: one read of `/proc/PID/maps` a
/// minute, for the few processes that publish a context.
#[derive(Clone, Debug)]
struct LibrarySearch {
    at: Instant,
    wait: Duration,
}

impl LibrarySearch {
    fn new() -> Self {
        LibrarySearch {
            at: Instant::now(),
            wait: MIN_SEARCH_INTERVAL,
        }
    }

    /// True when a search is due, which is then counted as done.
    fn due(&mut self) -> bool {
        if self.at.elapsed() < self.wait {
            return false;
        }
        self.at = Instant::now();
        self.wait = (self.wait * 2).min(MAX_SEARCH_INTERVAL);
        true
    }
}

impl Identity {
    /// A look with the text of `/proc/PID/maps` just read. `previous`: what
    /// an earlier read of the same image found (its environment is kept, its
    /// context costs only a header read if unchanged); `None`: the image's
    /// first read, which reads the environment when `read_environment` is on.
    pub(super) fn read(
        pid: u32,
        maps: &[u8],
        previous: Option<&Identity>,
        read_environment: bool,
    ) -> Self {
        let mut identity = match previous {
            Some(previous) => previous.clone(),
            None => Identity {
                context: None,
                environment: read_environment
                    .then(|| environment::read(pid).map(Arc::new))
                    .flatten(),
                checked_at: Instant::now(),
                check_after: MIN_SEARCH_INTERVAL,
                search_wait: FIRST_CONTEXT_SEARCH,
                libraries: LibrarySearch::new(),
            },
        };
        identity.checked_at = Instant::now();
        identity.take_context(pid, maps);
        identity
    }

    /// A process /proc could not show: nothing known, nothing to re-check
    /// (the whole process is read again instead).
    pub(super) fn unknown() -> Self {
        Identity {
            context: None,
            environment: None,
            checked_at: Instant::now(),
            check_after: MAX_SEARCH_INTERVAL,
            search_wait: FIRST_CONTEXT_SEARCH,
            libraries: LibrarySearch::new(),
        }
    }

    /// A forked child's: the environment is inherited, the context is not
    /// (the OTEP's writers map it `MADV_DONTFORK`, so the child has none
    /// until its own SDK publishes one).
    pub(super) fn forked(&self) -> Self {
        Identity {
            context: None,
            environment: self.environment.clone(),
            checked_at: Instant::now(),
            check_after: MIN_SEARCH_INTERVAL,
            search_wait: FIRST_CONTEXT_SEARCH,
            libraries: LibrarySearch::new(),
        }
    }

    /// The context's resource, else the environment's.
    pub(super) fn service(&self) -> Option<Arc<ServiceResource>> {
        match &self.context {
            Some(context) => Some(context.resource.clone()),
            None => self.environment.clone(),
        }
    }

    /// The thread context's key map (and schema), when the context
    /// publishes either.
    pub(super) fn thread_keys(&self) -> Option<Arc<KeyMap>> {
        let context = self.context.as_ref()?;
        (!context.keys.is_empty() || context.keys.schema().is_some()).then(|| context.keys.clone())
    }

    /// Looks again within [`UNKNOWN_KEY_RECHECK`]: a thread record named a
    /// key index past the map, which the OTEP says to read again. A record
    /// that keeps naming one costs a header read per that interval, no more.
    /// A process whose context was not found yet (its first look came before
    /// it published, and the backoff doubles) has its maps searched within
    /// [`FIRST_CONTEXT_SEARCH`], then at doubling waits up to
    /// [`UNKNOWN_CONTEXT_SEARCH`]: its threads' attributes say it publishes
    /// one, and they go unnamed until it is read.
    pub(super) fn hurry(&mut self) {
        let soon = if self.context.is_some() {
            UNKNOWN_KEY_RECHECK
        } else {
            self.search_wait
        };
        self.check_after = self.check_after.min(soon);
    }

    /// Time for [`Identity::recheck`].
    pub(super) fn due(&self) -> bool {
        self.checked_at.elapsed() >= self.check_after
    }

    /// Looks again. `reads` counts `/proc` reads.
    pub(super) fn recheck(&mut self, pid: u32, reads: &mut u64) -> Recheck {
        let before = (self.service(), self.thread_keys());
        let mut maps_now = None;
        if self.check_after < MIN_SEARCH_INTERVAL {
            self.check_after = CONTEXT_RECHECK;
        }
        self.checked_at = Instant::now();
        match &mut self.context {
            Some(context) => {
                let known = Some(context.published_at_ns);
                match otel_ctx::read_context(&mut reader(pid), context.address, known) {
                    Ok(Reading::Unchanged) => {}
                    Ok(Reading::Published {
                        published_at_ns,
                        resource,
                        keys,
                    }) => {
                        context.published_at_ns = published_at_ns;
                        context.resource = Arc::new(resource);
                        context.keys = Arc::new(keys);
                    }
                    // Mid-update for every attempt: keep what was read, try
                    // again next time.
                    Err(Refusal::Unsettled) => otel_ctx::count_refusal(pid, Refusal::Unsettled),
                    // Unmapped, moved to a new mapping, or (no maps at
                    // all) exited: see `take_context`.
                    Err(Refusal::Unreadable) => maps_now = self.search_maps(pid, reads),
                    // Overwritten: the context is gone, search the maps
                    // again from the shortest wait.
                    Err(reason) => {
                        otel_ctx::count_refusal(pid, reason);
                        self.context = None;
                        self.check_after = MIN_SEARCH_INTERVAL;
                    }
                }
                if maps_now.is_none() && self.context.is_some() && self.libraries.due() {
                    maps_now = self.search_maps(pid, reads);
                }
            }
            None => {
                maps_now = self.search_maps(pid, reads);
                if self.context.is_none() {
                    self.search_wait = (self.search_wait * 2).min(UNKNOWN_CONTEXT_SEARCH);
                }
            }
        }
        Recheck {
            changed: (self.service(), self.thread_keys()) != before,
            maps: maps_now,
        }
    }

    /// Reads `/proc/PID/maps` and takes the context it names (see
    /// `take_context`); the text, for [`Recheck::maps`].
    fn search_maps(&mut self, pid: u32, reads: &mut u64) -> Option<Vec<u8>> {
        *reads += 1;
        match std::fs::read(format!("/proc/{pid}/maps")) {
            Ok(maps) => {
                self.take_context(pid, &maps);
                Some(maps)
            }
            // Gone: nothing more to learn.
            Err(_) => {
                self.check_after = MAX_SEARCH_INTERVAL;
                None
            }
        }
    }

    /// Reads the context of the mapping named in `maps`, if any (the payload
    /// only if it is not the one already read), and sets when to look again.
    fn take_context(&mut self, pid: u32, maps: &[u8]) {
        // No memory at all: the process exited (a zombie's maps are empty),
        // and this look, a re-check or a re-read of its maps after an
        // address they missed, came after it. What it published stands for
        // its samples still being attributed, taken while it ran (dropping
        // it left dozens of them unnamed, in either look).
        if maps.is_empty() && self.context.is_some() {
            self.check_after = MAX_SEARCH_INTERVAL;
            return;
        }
        let found = otel_ctx::locate(maps).and_then(|address| {
            let known = self
                .context
                .as_ref()
                .filter(|known| known.address == address);
            let at = known.map(|known| known.published_at_ns);
            match otel_ctx::read_context(&mut reader(pid), address, at) {
                Ok(Reading::Published {
                    published_at_ns,
                    resource,
                    keys,
                }) => Some(Context {
                    address,
                    published_at_ns,
                    resource: Arc::new(resource),
                    keys: Arc::new(keys),
                }),
                Ok(Reading::Unchanged) => known.cloned(),
                // Mid-update for every attempt: keep what was read (as
                // `recheck` does), the next look reads the update.
                Err(Refusal::Unsettled) if known.is_some() => {
                    otel_ctx::count_refusal(pid, Refusal::Unsettled);
                    known.cloned()
                }
                Err(reason) => {
                    otel_ctx::count_refusal(pid, reason);
                    None
                }
            }
        });
        self.check_after = match (&found, &self.context) {
            (Some(_), _) => CONTEXT_RECHECK,
            (None, Some(_)) => MIN_SEARCH_INTERVAL,
            (None, None) => (self.check_after * 2).min(MAX_SEARCH_INTERVAL),
        };
        self.context = found;
    }
}

/// Reads process `pid`'s memory (`process_vm_readv`).
fn reader(pid: u32) -> impl FnMut(u64, &mut [u8]) -> bool {
    move |address, buf| crate::procs::memory::read(pid, address, buf)
}
