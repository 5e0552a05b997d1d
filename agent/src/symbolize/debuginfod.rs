//! Debug files from debuginfod servers (`DEBUGINFOD_URLS`, the convention
//! gdb, perf and elfutils share), for binaries the host has none for.
//!
//! Never on the sampling path: a file without DWARF asks [`Debuginfod::request`]
//! for its build id, which only queues it; one background thread fetches
//! `/buildid/HEX/debuginfo` from each server in turn, with timeouts, checks
//! the answer has that build id, and stores it in an on-disk cache laid out
//! as a debug directory (`.build-id/xx/rest.debug`, found by the usual
//! lookup). The symbolizer then forgets the module and loads it again.
//! Misses are remembered for a while (a negative cache), and the cache is
//! kept under its byte budget by deleting the oldest files.
//!
//! `http://` and `https://` servers (hyper, as for the metrics server, and
//! rustls with the system's roots, as for OTLP export: `SSL_CERT_FILE` or
//! `SSL_CERT_DIR` point elsewhere). Certificates are always verified.
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{
        Arc, Condvar, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant, SystemTime},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};

use crate::files::MAX_DEBUG_FILE_BYTES;

/// The variable gdb, perf and elfutils read the servers from.
pub const URLS_ENV: &str = "DEBUGINFOD_URLS";
/// How long a build id no server had is not asked for again.
const NEGATIVE_TTL: Duration = Duration::from_secs(600);
/// How long connecting to a server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings of the debuginfod client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebuginfodOptions {
    /// Server base URLs (`http://host:port` or with a path prefix).
    pub urls: Vec<String>,
    /// Where fetched debug files are kept.
    pub cache_dir: PathBuf,
    /// Most bytes the cache may hold; the oldest files go first.
    pub cache_bytes: u64,
    /// Most time one download may take.
    pub timeout: Duration,
    /// A PEM file of certificates trusted for `https://` servers besides
    /// the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl DebuginfodOptions {
    /// Servers from `DEBUGINFOD_URLS` (space-separated); `None` when unset
    /// or empty, which leaves debuginfod off.
    pub fn from_env() -> Option<Self> {
        let urls = std::env::var(URLS_ENV).ok()?;
        Self::with_urls(urls.split_ascii_whitespace().map(str::to_string).collect())
    }

    /// `urls` with the default cache (`$XDG_CACHE_HOME/hostprof/debuginfod`,
    /// else `~/.cache/…`, else `/var/cache/hostprof/debuginfod`, 2 GiB) and
    /// timeout (120 s); `None` without a URL.
    pub fn with_urls(urls: Vec<String>) -> Option<Self> {
        if urls.is_empty() {
            return None;
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
            .unwrap_or_else(|| PathBuf::from("/var/cache"));
        Some(DebuginfodOptions {
            urls,
            cache_dir: base.join("hostprof/debuginfod"),
            cache_bytes: 2 << 30,
            timeout: Duration::from_secs(120),
            ca_file: None,
        })
    }
}

/// What the background fetcher and the symbolizer share.
#[derive(Default)]
struct Fetches {
    /// Queued or being fetched.
    pending: HashSet<String>,
    /// Build ids no server had, and when that was learnt.
    missing: HashMap<String, Instant>,
    /// Fetched since the symbolizer last looked.
    arrived: Vec<String>,
}

struct Shared {
    fetches: Mutex<Fetches>,
    /// Signalled whenever `pending` shrinks.
    settled: Condvar,
    /// Set when `arrived` is not empty: the symbolizer's hot path reads
    /// only this.
    has_arrivals: AtomicBool,
    /// One warning per kind of failure, the rest at debug level.
    warned_unreachable: AtomicBool,
}

/// A debuginfod client with its background fetcher.
pub struct Debuginfod {
    cache_dir: PathBuf,
    shared: Arc<Shared>,
    queue: Mutex<mpsc::Sender<String>>,
}

impl Debuginfod {
    /// Starts the fetcher thread.
    pub fn start(options: DebuginfodOptions) -> Self {
        let shared = Arc::new(Shared {
            fetches: Mutex::default(),
            settled: Condvar::new(),
            has_arrivals: AtomicBool::new(false),
            warned_unreachable: AtomicBool::new(false),
        });
        let (sender, receiver) = mpsc::channel::<String>();
        let cache_dir = options.cache_dir.clone();
        let worker = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("debuginfod".into())
            .spawn(move || fetch_loop(&options, &worker, &receiver));
        if let Err(err) = spawned {
            tracing::warn!(
                "cannot start the debuginfod client ({err}): no debug files will be fetched"
            );
        }
        Debuginfod {
            cache_dir,
            shared,
            queue: Mutex::new(sender),
        }
    }

    /// The cache, laid out as a debug directory.
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// Queues a fetch of build id `hex` (lowercase hex) unless one is under
    /// way or no server had it lately. Never blocks on the network.
    pub fn request(&self, hex: &str) {
        if hex.len() < 4 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return;
        }
        {
            let mut fetches = lock(&self.shared.fetches);
            if fetches.pending.contains(hex)
                || fetches
                    .missing
                    .get(hex)
                    .is_some_and(|at| at.elapsed() < NEGATIVE_TTL)
            {
                return;
            }
            fetches.pending.insert(hex.to_string());
        }
        let sent = lock(&self.queue).send(hex.to_string());
        if sent.is_err() {
            // The fetcher is gone: nothing will come.
            lock(&self.shared.fetches).pending.remove(hex);
        }
    }

    /// Build ids whose debug file arrived since the last call.
    pub fn take_arrivals(&self) -> Vec<String> {
        // A plain load first: the hot path writes no shared cache line.
        if !self.shared.has_arrivals.load(Ordering::Relaxed)
            || !self.shared.has_arrivals.swap(false, Ordering::Acquire)
        {
            return Vec::new();
        }
        std::mem::take(&mut lock(&self.shared.fetches).arrived)
    }

    /// Waits until no fetch is queued or under way, at most `limit`; true
    /// if so.
    pub fn wait_settled(&self, limit: Duration) -> bool {
        let fetches = lock(&self.shared.fetches);
        let (fetches, _) = self
            .shared
            .settled
            .wait_timeout_while(fetches, limit, |fetches| !fetches.pending.is_empty())
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        fetches.pending.is_empty()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Why a server gave no file.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("{0} has no such debug file")]
    NotFound(String),
    #[error("{url}: {problem}")]
    Failed { url: String, problem: String },
}

fn fetch_loop(options: &DebuginfodOptions, shared: &Shared, queue: &mpsc::Receiver<String>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::warn!(
                "cannot start the debuginfod client ({err}): no debug files will be fetched"
            );
            return;
        }
    };
    let tls = Tls {
        ca_file: options.ca_file.as_deref(),
        config: std::cell::OnceCell::new(),
    };
    while let Ok(hex) = queue.recv() {
        let stored = runtime.block_on(fetch_any(options, shared, &tls, &hex));
        let mut fetches = lock(&shared.fetches);
        fetches.pending.remove(&hex);
        if stored {
            fetches.arrived.push(hex);
            shared.has_arrivals.store(true, Ordering::Release);
        } else {
            fetches.missing.retain(|_, at| at.elapsed() < NEGATIVE_TTL);
            fetches.missing.insert(hex, Instant::now());
        }
        drop(fetches);
        shared.settled.notify_all();
    }
}

/// Asks each server in turn; true once one file is stored.
async fn fetch_any(options: &DebuginfodOptions, shared: &Shared, tls: &Tls<'_>, hex: &str) -> bool {
    for base in &options.urls {
        let base = base.trim_end_matches('/');
        let url = format!("{base}/buildid/{hex}/debuginfo");
        let limit = options.cache_bytes.min(MAX_DEBUG_FILE_BYTES);
        let fetched = tokio::time::timeout(options.timeout, get(&url, limit, tls)).await;
        let body = match fetched {
            Ok(Ok(body)) => body,
            Ok(Err(FetchError::NotFound(url))) => {
                tracing::debug!("{url}: not found");
                continue;
            }
            Ok(Err(err)) => {
                unreachable_server(shared, &err.to_string());
                continue;
            }
            Err(_) => {
                unreachable_server(
                    shared,
                    &format!("{url}: no answer within {:?}", options.timeout),
                );
                continue;
            }
        };
        match store(&options.cache_dir, hex, &body, options.cache_bytes) {
            Ok(()) => {
                tracing::info!("fetched the debug file of build id {hex} from {base}");
                return true;
            }
            Err(err) => tracing::debug!("{url}: not stored: {err}"),
        }
    }
    false
}

fn unreachable_server(shared: &Shared, problem: &str) {
    if shared.warned_unreachable.swap(true, Ordering::Relaxed) {
        tracing::debug!("debuginfod: {problem}");
    } else {
        tracing::warn!(
            "debuginfod: {problem}; frames it could name stay unnamed (check {URLS_ENV}); \
             further failures are logged at debug level"
        );
    }
}

/// The TLS client configuration: built at the first https download, then
/// shared by all of them (loading the system's certificates costs more
/// than a handshake).
struct Tls<'a> {
    /// Trusted besides the system's roots.
    ca_file: Option<&'a Path>,
    /// Once built, or why it could not be.
    config: std::cell::OnceCell<Result<Arc<tokio_rustls::rustls::ClientConfig>, String>>,
}

impl Tls<'_> {
    fn config(&self) -> Result<Arc<tokio_rustls::rustls::ClientConfig>, String> {
        self.config.get_or_init(|| tls_config(self.ca_file)).clone()
    }
}

/// GETs `url` (HTTP/1.1, over TLS for `https://`), at most `limit` bytes
/// of body.
async fn get(url: &str, limit: u64, tls: &Tls<'_>) -> Result<Bytes, FetchError> {
    let failed = |problem: String| FetchError::Failed {
        url: url.to_string(),
        problem,
    };
    let (https, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => return Err(failed("not an http:// or https:// URL".into())),
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    // `host`, `host:port`, `[v6]` or `[v6]:port`.
    let host = match authority.rsplit_once(':') {
        Some((host, _)) if !authority.ends_with(']') => host,
        _ => authority,
    }
    .trim_start_matches('[')
    .trim_end_matches(']');
    let address = if authority.contains(':') && !authority.ends_with(']') {
        authority.to_string()
    } else {
        format!("{authority}:{}", if https { 443 } else { 80 })
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&address))
        .await
        .map_err(|_| failed(format!("no connection within {CONNECT_TIMEOUT:?}")))?
        .map_err(|err| failed(format!("cannot connect: {err}")))?;
    let request = hyper::Request::get(if path.is_empty() { "/" } else { path })
        .header(hyper::header::HOST, authority)
        .header(hyper::header::USER_AGENT, "hostprof")
        .body(Empty::<Bytes>::new())
        .map_err(|err| failed(err.to_string()))?;
    if !https {
        return send(stream, request, limit)
            .await
            .map_err(|err| err.at(url));
    }
    let config = tls.config().map_err(failed)?;
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|err| failed(format!("{host}: not a TLS server name: {err}")))?;
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_rustls::TlsConnector::from(config).connect(name, stream),
    )
    .await
    .map_err(|_| failed(format!("no TLS handshake within {CONNECT_TIMEOUT:?}")))?
    .map_err(|err| failed(format!("TLS: {err}")))?;
    send(stream, request, limit)
        .await
        .map_err(|err| err.at(url))
}

/// What [`send`] found, before it is told the URL.
enum Sent {
    NotFound,
    Failed(String),
}

impl Sent {
    fn at(self, url: &str) -> FetchError {
        match self {
            Sent::NotFound => FetchError::NotFound(url.to_string()),
            Sent::Failed(problem) => FetchError::Failed {
                url: url.to_string(),
                problem,
            },
        }
    }
}

/// Sends `request` on `stream` and reads at most `limit` bytes of the body.
async fn send<S>(
    stream: S,
    request: hyper::Request<Empty<Bytes>>,
    limit: u64,
) -> Result<Bytes, Sent>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let failed = |err: &dyn std::fmt::Display| Sent::Failed(err.to_string());
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|err| failed(&err))?;
    let driver = tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|err| failed(&err))?;
    let status = response.status();
    if status == hyper::StatusCode::NOT_FOUND {
        driver.abort();
        return Err(Sent::NotFound);
    }
    if !status.is_success() {
        driver.abort();
        return Err(Sent::Failed(format!("answered {status}")));
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let body = Limited::new(response.into_body(), limit)
        .collect()
        .await
        .map_err(|err| Sent::Failed(format!("body: {err}")))?
        .to_bytes();
    driver.abort();
    Ok(body)
}

/// The TLS client configuration: the system's roots (rustls-native-certs:
/// `SSL_CERT_FILE`/`SSL_CERT_DIR` where set) and `ca_file`'s certificates.
fn tls_config(ca_file: Option<&Path>) -> Result<Arc<tokio_rustls::rustls::ClientConfig>, String> {
    use tokio_rustls::rustls::{self, pki_types::pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates leave fewer roots, not an error: a
    // server signed by one of them then fails its handshake, and says so.
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|err| format!("CA file {}: {err}", path.display()))?;
        roots.add_parsable_certificates(certs);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("TLS: {err}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Path of build id `hex`'s debug file under `dir`.
fn cache_path(dir: &Path, hex: &str) -> PathBuf {
    dir.join(".build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]))
}

/// Stores `body` as build id `hex`'s debug file if it is one, then evicts
/// the oldest files until the cache holds at most `budget` bytes.
fn store(dir: &Path, hex: &str, body: &[u8], budget: u64) -> std::io::Result<()> {
    let id = (0..hex.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&hex[at..at + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(std::io::Error::other)?;
    if !super::debuginfo::same_build_id(body, &id) {
        return Err(std::io::Error::other(
            "the answer is not an ELF file with that build id",
        ));
    }
    let path = cache_path(dir, hex);
    let parent = path.parent().expect("a build-id directory");
    std::fs::create_dir_all(parent)?;
    // Written aside, then renamed: a reader never sees half a file.
    let partial = parent.join(format!(".{}.partial", std::process::id()));
    std::fs::write(&partial, body)?;
    std::fs::rename(&partial, &path)?;
    evict(dir, budget);
    Ok(())
}

/// Deletes the oldest cached files until at most `budget` bytes remain.
fn evict(dir: &Path, budget: u64) {
    let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
    let Ok(subdirs) = std::fs::read_dir(dir.join(".build-id")) else {
        return;
    };
    for subdir in subdirs.flatten() {
        let Ok(entries) = std::fs::read_dir(subdir.path()) else {
            continue;
        };
        for entry in entries.flatten() {
            if let Ok(meta) = entry.metadata()
                && meta.is_file()
            {
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                files.push((modified, meta.len(), entry.path()));
            }
        }
    }
    let mut total: u64 = files.iter().map(|(_, size, _)| size).sum();
    files.sort();
    for (_, size, path) in files {
        if total <= budget {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_keeps_the_newest_files_within_the_budget() {
        let dir = std::env::temp_dir().join(format!("hostprof-evict-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ids = ["aa01", "bb02", "cc03"];
        for (age, hex) in ids.iter().enumerate() {
            let path = cache_path(&dir, hex);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, vec![0u8; 100]).unwrap();
            let time = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + age as u64);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(time)
                .unwrap();
        }
        evict(&dir, 250);
        let left: Vec<bool> = ids
            .iter()
            .map(|hex| cache_path(&dir, hex).exists())
            .collect();
        assert_eq!(left, [false, true, true]);
        evict(&dir, 0);
        assert!(ids.iter().all(|hex| !cache_path(&dir, hex).exists()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_an_elf_file_with_the_build_id_is_stored() {
        let dir = std::env::temp_dir().join(format!("hostprof-store-{}", std::process::id()));
        let err = store(&dir, "abcd", b"<html>not found</html>", 1 << 20).unwrap_err();
        assert!(err.to_string().contains("build id"), "{err}");
        assert!(!cache_path(&dir, "abcd").exists());
    }

    #[test]
    fn off_without_urls() {
        assert!(DebuginfodOptions::with_urls(Vec::new()).is_none());
        let options = DebuginfodOptions::with_urls(vec!["http://127.0.0.1:1".into()]).unwrap();
        assert!(options.cache_dir.ends_with("hostprof/debuginfod"));
    }
}
