//! The agent's effective configuration from four layers, highest first:
//! command-line flags, environment (`HOSTPROF_*`, then the OpenTelemetry
//! `OTEL_*` variables that mean the same), a TOML file (`--config` or
//! `HOSTPROF_CONFIG`), and defaults.
//!
//! Every setting has one name: the TOML key is the flag's long name
//! (`report-interval`) and the variable is `HOSTPROF_` plus that name in upper
//! snake case (`HOSTPROF_REPORT_INTERVAL`). Values from the environment and the
//! file go through the same parsers as the flags, so a bad value gets the same
//! one-line message naming where it came from and what is allowed.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

/// The variable naming the configuration file when `--config` is not given.
pub const CONFIG_ENV: &str = "HOSTPROF_CONFIG";

/// Every key a configuration file (or `HOSTPROF_*` variable) may set, with what
/// its value must look like.
pub const KEYS: &[(&str, &str)] = &[
    ("frequency", "samples per second per CPU, 1 to 10000"),
    (
        "report-interval",
        "seconds between exports, e.g. 5 or \"10s\"",
    ),
    ("otlp-endpoint", "http://HOST:PORT or https://HOST:PORT"),
    ("otlp-headers", "key1=value1,key2=value2 (values %-escaped)"),
    ("otlp-ca", "path of a PEM CA certificate"),
    ("export-timeout", "seconds one export may take"),
    (
        "export-queue-mib",
        "MiB of unsent profiles to keep, 0 or more",
    ),
    ("service-name", "the resources' service.name"),
    ("off-cpu", "true or false"),
    (
        "off-cpu-threshold",
        "a duration such as \"1ms\" or \"500us\"",
    ),
    ("off-cpu-probability", "a share above 0 and at most 1"),
    ("debug-dir", "a directory or a list of directories"),
    (
        "symbol-cache-mib",
        "MiB of parsed symbols to keep, 16 or more",
    ),
    ("metrics-addr", "PORT, :PORT, HOST:PORT or [IPv6]:PORT"),
    (
        "status-interval",
        "seconds between status log lines; 0 turns them off",
    ),
    ("log-format", "text or json"),
    (
        "log-level",
        "error, warn, info, debug, trace or a RUST_LOG filter",
    ),
    ("unwind", "dwarf (in-kernel tables) or fp (frame pointers)"),
    (
        "unwind-table-mib",
        "MiB of kernel memory for unwind tables, 1 to 4096",
    ),
];

/// Where a setting's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    Env(String),
    Flag,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Env(name) => f.write_str(name),
            Source::Flag => f.write_str("command line"),
        }
    }
}

/// A configuration error, always one line naming the key and what is allowed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "configuration file {} is not valid TOML: {}",
        path.display(),
        message.escape_debug()
    )]
    Syntax { path: PathBuf, message: String },
    #[error(
        "configuration file {}: unknown key `{}`; known keys: {}",
        path.display(),
        key.escape_debug(),
        known_keys()
    )]
    UnknownKey { path: PathBuf, key: String },
    // Values and problems are escaped: the message stays on one line whatever
    // the input holds (found by fuzzing).
    #[error(
        "{place}: invalid value `{}` for `{key}`: {} (allowed: {allowed})",
        value.escape_debug(),
        problem.escape_debug()
    )]
    Invalid {
        place: String,
        key: &'static str,
        value: String,
        problem: String,
        allowed: &'static str,
    },
}

fn known_keys() -> String {
    KEYS.iter()
        .map(|(key, _)| *key)
        .collect::<Vec<_>>()
        .join(", ")
}

fn allowed(key: &str) -> &'static str {
    KEYS.iter()
        .find(|(name, _)| *name == key)
        .map_or("see hostprof agent --help", |(_, allowed)| allowed)
}

/// `report-interval` → `HOSTPROF_REPORT_INTERVAL`.
pub fn env_name(key: &str) -> String {
    format!("HOSTPROF_{}", key.replace('-', "_").to_ascii_uppercase())
}

/// Logs go out as human-readable lines or as JSON objects (one per line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// How user stacks are walked (see `hostprof agent --help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindMethod {
    Dwarf,
    Fp,
}

/// The values given on the command line (`None` when a flag was not given).
#[derive(Clone, Debug, Default)]
pub struct Flags {
    pub config: Option<PathBuf>,
    pub frequency: Option<u64>,
    pub report_interval: Option<Duration>,
    pub otlp_endpoint: Option<String>,
    pub otlp_ca: Option<PathBuf>,
    pub export_timeout: Option<Duration>,
    pub export_queue_mib: Option<u64>,
    pub service_name: Option<String>,
    pub off_cpu: Option<bool>,
    pub off_cpu_threshold: Option<Duration>,
    pub off_cpu_probability: Option<f64>,
    pub debug_dirs: Vec<PathBuf>,
    pub symbol_cache_mib: Option<u64>,
    pub metrics_addr: Option<SocketAddr>,
    pub status_interval: Option<Duration>,
    pub log_format: Option<LogFormat>,
    pub log_level: Option<String>,
    pub unwind: Option<UnwindMethod>,
    pub unwind_table_mib: Option<u32>,
}

/// The agent's effective configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    pub frequency: u64,
    pub report_interval: Duration,
    pub otlp_endpoint: String,
    pub otlp_headers: Vec<(String, String)>,
    pub otlp_ca: Option<PathBuf>,
    pub export_timeout: Duration,
    pub export_queue_mib: u64,
    pub service_name: Option<String>,
    pub off_cpu: bool,
    pub off_cpu_threshold: Duration,
    pub off_cpu_probability: f64,
    pub debug_dirs: Vec<PathBuf>,
    pub symbol_cache_mib: u64,
    pub metrics_addr: Option<SocketAddr>,
    /// Zero: no status lines.
    pub status_interval: Duration,
    pub log_format: LogFormat,
    pub log_level: String,
    pub unwind: UnwindMethod,
    pub unwind_table_mib: u32,
    /// Where each key's value came from (keys without a value are absent).
    pub sources: BTreeMap<&'static str, Source>,
}

pub const DEFAULT_FREQUENCY: u64 = 19;
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_EXPORT_QUEUE_MIB: u64 = 64;
pub const DEFAULT_OFF_CPU_THRESHOLD: Duration = Duration::from_millis(1);
pub const DEFAULT_SYMBOL_CACHE_MIB: u64 = 48;
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(60);
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4317";
pub const DEFAULT_UNWIND_TABLE_MIB: u32 = 32;

/// A value from the environment or the file, before parsing.
enum Raw {
    One(String),
    Many(Vec<String>),
}

/// The file's keys, as raw values, and which of them were used.
struct FileLayer {
    path: PathBuf,
    values: BTreeMap<String, Raw>,
}

/// Reads and checks a configuration file: TOML, only known keys, scalar
/// values (or a list for `debug-dir`).
fn parse_file(path: &Path, text: &str) -> Result<FileLayer, ConfigError> {
    let table: toml::Table = text
        .parse()
        .map_err(|err: toml::de::Error| ConfigError::Syntax {
            path: path.to_owned(),
            // toml's messages span several lines with a source excerpt; keep the first.
            message: err.message().lines().next().unwrap_or("").to_owned(),
        })?;
    let mut values = BTreeMap::new();
    for (key, value) in table {
        let Some(&(name, allowed)) = KEYS.iter().find(|(name, _)| *name == key) else {
            return Err(ConfigError::UnknownKey {
                path: path.to_owned(),
                key,
            });
        };
        let invalid = |value: &toml::Value, problem: &str| ConfigError::Invalid {
            place: format!("configuration file {}", path.display()),
            key: name,
            value: value.to_string(),
            problem: problem.to_owned(),
            allowed,
        };
        let raw = match &value {
            toml::Value::Array(items) if name == "debug-dir" => Raw::Many(
                items
                    .iter()
                    .map(|item| scalar(item).ok_or_else(|| invalid(item, "expected a string")))
                    .collect::<Result<_, _>>()?,
            ),
            other => Raw::One(scalar(other).ok_or_else(|| invalid(other, "expected one value"))?),
        };
        values.insert(key, raw);
    }
    Ok(FileLayer {
        path: path.to_owned(),
        values,
    })
}

/// A TOML scalar as the text a flag would have had.
fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(text) => Some(text.clone()),
        toml::Value::Integer(number) => Some(number.to_string()),
        toml::Value::Float(number) => Some(number.to_string()),
        toml::Value::Boolean(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// Checks a configuration file's text the way `hostprof agent` would, without
/// resolving it (for fuzzing and `--config` validation).
pub fn check_file(text: &str) -> Result<(), ConfigError> {
    let layer = parse_file(Path::new("<config>"), text)?;
    let env = |_: &str| None;
    Resolver {
        env: &env,
        file: Some(&layer),
        sources: BTreeMap::new(),
    }
    .resolve(Flags::default())
    .map(drop)
}

impl AgentConfig {
    /// Resolves `flags` over this process's environment and the configuration
    /// file they (or `HOSTPROF_CONFIG`) name.
    pub fn load(flags: Flags) -> Result<Self, ConfigError> {
        warn_unknown_env(std::env::vars().map(|(name, _)| name));
        Self::resolve(flags, &|name| {
            std::env::var(name).ok().filter(|v| !v.trim().is_empty())
        })
    }

    /// Resolves `flags` over the environment `env` and the file it names.
    pub fn resolve(
        flags: Flags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let path = flags
            .config
            .clone()
            .or_else(|| env(CONFIG_ENV).map(PathBuf::from));
        let file = match path {
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Some(parse_file(&path, &text)?)
            }
            None => None,
        };
        Resolver {
            env,
            file: file.as_ref(),
            sources: BTreeMap::new(),
        }
        .resolve(flags)
    }

    /// The configuration as a TOML file that `--config` accepts, each line
    /// saying where its value came from. Header values are hidden: they
    /// usually carry credentials.
    pub fn to_toml(&self) -> String {
        let mut out = String::from(
            "# hostprof agent: effective configuration.\n\
             # Precedence: flags > HOSTPROF_* / OTEL_* environment > configuration file > defaults.\n",
        );
        let text = |s: &str| toml::Value::String(s.to_owned()).to_string();
        let seconds = |d: Duration| toml::Value::Float(d.as_secs_f64()).to_string();
        let mut line = |key: &'static str, value: Option<String>| {
            let source = self.sources.get(key).cloned().unwrap_or(Source::Default);
            match value {
                Some(value) => {
                    let _ = writeln!(out, "{key} = {value}  # {source}");
                }
                None => {
                    let _ = writeln!(out, "# {key} is not set ({})", allowed(key));
                }
            }
        };
        line("frequency", Some(self.frequency.to_string()));
        line("report-interval", Some(seconds(self.report_interval)));
        line("otlp-endpoint", Some(text(&self.otlp_endpoint)));
        line(
            "otlp-headers",
            (!self.otlp_headers.is_empty()).then(|| {
                let redacted: Vec<String> = self
                    .otlp_headers
                    .iter()
                    .map(|(key, _)| format!("{key}=<redacted>"))
                    .collect();
                text(&redacted.join(","))
            }),
        );
        line(
            "otlp-ca",
            self.otlp_ca.as_ref().map(|p| text(&p.to_string_lossy())),
        );
        line("export-timeout", Some(seconds(self.export_timeout)));
        line("export-queue-mib", Some(self.export_queue_mib.to_string()));
        line("service-name", self.service_name.as_deref().map(text));
        line("off-cpu", Some(self.off_cpu.to_string()));
        line(
            "off-cpu-threshold",
            Some(text(&format!("{}us", self.off_cpu_threshold.as_micros()))),
        );
        line(
            "off-cpu-probability",
            Some(format!("{:?}", self.off_cpu_probability)),
        );
        let dirs: Vec<toml::Value> = self
            .debug_dirs
            .iter()
            .map(|dir| toml::Value::String(dir.to_string_lossy().into_owned()))
            .collect();
        line("debug-dir", Some(toml::Value::Array(dirs).to_string()));
        line("symbol-cache-mib", Some(self.symbol_cache_mib.to_string()));
        line(
            "metrics-addr",
            self.metrics_addr.map(|a| text(&a.to_string())),
        );
        line("status-interval", Some(seconds(self.status_interval)));
        line(
            "log-format",
            Some(text(match self.log_format {
                LogFormat::Text => "text",
                LogFormat::Json => "json",
            })),
        );
        line("log-level", Some(text(&self.log_level)));
        line(
            "unwind",
            Some(text(match self.unwind {
                UnwindMethod::Dwarf => "dwarf",
                UnwindMethod::Fp => "fp",
            })),
        );
        line("unwind-table-mib", Some(self.unwind_table_mib.to_string()));
        out
    }
}

/// Names `HOSTPROF_*` variables that are not settings. A warning, not an
/// error: Kubernetes injects `HOSTPROF_SERVICE_HOST`-style variables for any
/// Service named hostprof.
fn warn_unknown_env(names: impl Iterator<Item = String>) {
    for name in names {
        let known = name == CONFIG_ENV || KEYS.iter().any(|(key, _)| env_name(key) == name);
        if name.starts_with("HOSTPROF_") && !known {
            tracing::debug!("ignoring {name}: not a hostprof setting");
        }
    }
}

struct Resolver<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    file: Option<&'a FileLayer>,
    sources: BTreeMap<&'static str, Source>,
}

impl Resolver<'_> {
    /// The flag, else the environment (`HOSTPROF_*`, then `otel_env`), else the
    /// file, parsed with `parse`; records where it came from.
    fn pick<T>(
        &mut self,
        key: &'static str,
        flag: Option<T>,
        otel_env: &[&str],
        parse: fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        if flag.is_some() {
            self.sources.insert(key, Source::Flag);
            return Ok(flag);
        }
        let hostprof_env = env_name(key);
        let from_env = std::iter::once(hostprof_env.as_str())
            .chain(otel_env.iter().copied())
            .find_map(|name| (self.env)(name).map(|value| (name.to_owned(), value)));
        let (source, value) = match from_env {
            Some((name, value)) => (Source::Env(name), value),
            None => match self.file.and_then(|file| file.values.get(key)) {
                Some(Raw::One(value)) => (Source::File(self.file_path()), value.clone()),
                Some(Raw::Many(_)) | None => return Ok(None),
            },
        };
        let parsed = parse(&value).map_err(|problem| ConfigError::Invalid {
            place: match &source {
                Source::Env(name) => format!("environment variable {name}"),
                other => format!("configuration file {other}"),
            },
            key,
            value: value.clone(),
            problem,
            allowed: allowed(key),
        })?;
        self.sources.insert(key, source);
        Ok(Some(parsed))
    }

    fn file_path(&self) -> PathBuf {
        self.file.map(|file| file.path.clone()).unwrap_or_default()
    }

    /// `debug-dir`: flags, else `HOSTPROF_DEBUG_DIR` (colon-separated), else the file.
    fn debug_dirs(&mut self, flags: Vec<PathBuf>) -> Vec<PathBuf> {
        const KEY: &str = "debug-dir";
        if !flags.is_empty() {
            self.sources.insert(KEY, Source::Flag);
            return flags;
        }
        let name = env_name(KEY);
        if let Some(value) = (self.env)(&name) {
            self.sources.insert(KEY, Source::Env(name));
            return std::env::split_paths(&value).collect();
        }
        match self.file.and_then(|file| file.values.get(KEY)) {
            Some(raw) => {
                self.sources.insert(KEY, Source::File(self.file_path()));
                match raw {
                    Raw::One(dir) => vec![PathBuf::from(dir)],
                    Raw::Many(dirs) => dirs.iter().map(PathBuf::from).collect(),
                }
            }
            None => Vec::new(),
        }
    }

    fn resolve(mut self, flags: Flags) -> Result<AgentConfig, ConfigError> {
        let frequency = self
            .pick("frequency", flags.frequency, &[], parse_frequency)?
            .unwrap_or(DEFAULT_FREQUENCY);
        let report_interval = self
            .pick("report-interval", flags.report_interval, &[], parse_seconds)?
            .unwrap_or(DEFAULT_REPORT_INTERVAL);
        let otlp_endpoint = self
            .pick(
                "otlp-endpoint",
                flags.otlp_endpoint,
                &[
                    "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                ],
                parse_endpoint,
            )?
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
        let otlp_headers = self
            .pick(
                "otlp-headers",
                None,
                &[
                    "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
                    "OTEL_EXPORTER_OTLP_HEADERS",
                ],
                parse_headers,
            )?
            .unwrap_or_default();
        let otlp_ca = self.pick("otlp-ca", flags.otlp_ca, &[], parse_path)?;
        if otlp_ca.is_some() && !otlp_endpoint.starts_with("https://") {
            return Err(ConfigError::Invalid {
                place: format!("{}", self.sources["otlp-ca"]),
                key: "otlp-ca",
                value: otlp_ca.unwrap_or_default().display().to_string(),
                problem: format!("the endpoint {otlp_endpoint} is plain text"),
                allowed: "a CA only with an https:// endpoint",
            });
        }
        let export_timeout = self
            .pick("export-timeout", flags.export_timeout, &[], parse_seconds)?
            .unwrap_or(DEFAULT_EXPORT_TIMEOUT);
        let export_queue_mib = self
            .pick("export-queue-mib", flags.export_queue_mib, &[], parse_u64)?
            .unwrap_or(DEFAULT_EXPORT_QUEUE_MIB);
        let service_name = self.pick(
            "service-name",
            flags.service_name,
            &["OTEL_SERVICE_NAME"],
            parse_text,
        )?;
        let off_cpu = self
            .pick("off-cpu", flags.off_cpu, &[], parse_bool)?
            .unwrap_or(false);
        let off_cpu_threshold = self
            .pick(
                "off-cpu-threshold",
                flags.off_cpu_threshold,
                &[],
                parse_duration,
            )?
            .unwrap_or(DEFAULT_OFF_CPU_THRESHOLD);
        let off_cpu_probability = self
            .pick(
                "off-cpu-probability",
                flags.off_cpu_probability,
                &[],
                parse_probability,
            )?
            .unwrap_or(1.0);
        let debug_dirs = self.debug_dirs(flags.debug_dirs);
        let symbol_cache_mib = self
            .pick(
                "symbol-cache-mib",
                flags.symbol_cache_mib,
                &[],
                parse_cache_mib,
            )?
            .unwrap_or(DEFAULT_SYMBOL_CACHE_MIB);
        let metrics_addr =
            self.pick("metrics-addr", flags.metrics_addr, &[], parse_metrics_addr)?;
        let status_interval = self
            .pick(
                "status-interval",
                flags.status_interval,
                &[],
                parse_seconds_or_zero,
            )?
            .unwrap_or(DEFAULT_STATUS_INTERVAL);
        let log_format = self
            .pick("log-format", flags.log_format, &[], parse_log_format)?
            .unwrap_or(LogFormat::Text);
        let log_level = self
            .pick("log-level", flags.log_level, &[], parse_log_level)?
            .unwrap_or_else(|| "info".to_owned());
        let unwind = self
            .pick("unwind", flags.unwind, &[], parse_unwind)?
            .unwrap_or(UnwindMethod::Dwarf);
        let unwind_table_mib = self
            .pick(
                "unwind-table-mib",
                flags.unwind_table_mib,
                &[],
                parse_unwind_table_mib,
            )?
            .unwrap_or(DEFAULT_UNWIND_TABLE_MIB);
        Ok(AgentConfig {
            frequency,
            report_interval,
            otlp_endpoint,
            otlp_headers,
            otlp_ca,
            export_timeout,
            export_queue_mib,
            service_name,
            off_cpu,
            off_cpu_threshold,
            off_cpu_probability,
            debug_dirs,
            symbol_cache_mib,
            metrics_addr,
            status_interval,
            log_format,
            log_level,
            unwind,
            unwind_table_mib,
            sources: self.sources,
        })
    }
}

// The parsers: shared by clap (flags) and the environment/file layers.

pub fn parse_frequency(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(hz @ 1..=10_000) => Ok(hz),
        Ok(_) => Err("out of range (1 to 10000)".into()),
        Err(_) => Err("not a whole number".into()),
    }
}

pub fn parse_u64(text: &str) -> Result<u64, String> {
    text.trim()
        .parse()
        .map_err(|_| "not a whole number".to_owned())
}

pub fn parse_cache_mib(text: &str) -> Result<u64, String> {
    match parse_u64(text)? {
        mib @ 16.. => Ok(mib),
        _ => Err("too small to hold one large binary's symbols".into()),
    }
}

/// Seconds, fractions allowed, with an optional `s`; more than zero.
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .trim_end_matches('s')
        .parse()
        .map_err(|_| "not a number of seconds".to_owned())?;
    if !(seconds > 0.0 && seconds.is_finite() && seconds < 1e9) {
        return Err("must be more than 0 seconds".into());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Seconds as [`parse_seconds`], or 0.
pub fn parse_seconds_or_zero(text: &str) -> Result<Duration, String> {
    match text.trim().trim_end_matches('s').parse::<f64>() {
        Ok(0.0) => Ok(Duration::ZERO),
        _ => parse_seconds(text),
    }
}

/// A duration with a unit: `ns`, `us`, `ms` or `s` (seconds when bare).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = [("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)]
        .iter()
        .find_map(|(unit, scale)| text.strip_suffix(unit).map(|number| (number, *scale)))
        .unwrap_or((text, 1.0));
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| "not a duration such as 1ms or 0.5s".to_owned())?;
    if !(value >= 0.0 && value.is_finite() && value * scale < 1e9) {
        return Err("must be 0 or more and finite".into());
    }
    Ok(Duration::from_secs_f64(value * scale))
}

pub fn parse_probability(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err("not a probability above 0 and at most 1".into()),
    }
}

pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("not true or false".into()),
    }
}

fn parse_text(text: &str) -> Result<String, String> {
    Ok(text.to_owned())
}

fn parse_path(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        return Err("empty path".into());
    }
    Ok(PathBuf::from(text))
}

/// `http://` or `https://` with a host; a trailing `/` is dropped.
pub fn parse_endpoint(text: &str) -> Result<String, String> {
    let endpoint = text.trim().trim_end_matches('/');
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or_else(|| "needs a scheme: http:// (plain) or https:// (TLS)".to_owned())?;
    if rest.is_empty() || rest.contains(char::is_whitespace) {
        return Err("needs a host (and port)".into());
    }
    Ok(endpoint.to_owned())
}

/// `key1=value1,key2=value2` (values %-encoded) into gRPC metadata, keys lowercase.
pub fn parse_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let headers = crate::profile::parse_key_values(text).map_err(|bad| match bad {
        crate::profile::BadEntry::NotKeyValue(entry) => format!("`{entry}` is not key=value"),
        crate::profile::BadEntry::BadEscape(entry) => format!("bad %-escape in `{entry}`"),
    })?;
    Ok(headers
        .into_iter()
        .map(|(key, value)| (key.to_ascii_lowercase(), value))
        .collect())
}

/// `PORT` or `:PORT` listen on loopback only; a host must be given to listen
/// anywhere else (`0.0.0.0:PORT` for every interface).
pub fn parse_metrics_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port = port.parse::<u16>().map_err(|_| "bad port".to_owned())?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse()
        .map_err(|_| "not an IP address and port".to_owned())
}

pub fn parse_unwind(text: &str) -> Result<UnwindMethod, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "dwarf" => Ok(UnwindMethod::Dwarf),
        "fp" => Ok(UnwindMethod::Fp),
        _ => Err("unknown unwinding method (dwarf or fp)".into()),
    }
}

pub fn parse_unwind_table_mib(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(mib @ 1..=4096) => Ok(mib),
        Ok(_) => Err("out of range (1 to 4096)".into()),
        Err(_) => Err("not a whole number".into()),
    }
}

pub fn parse_log_format(text: &str) -> Result<LogFormat, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err("unknown log format".into()),
    }
}

pub fn parse_log_level(text: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(text.trim())
        .map(|_| text.trim().to_owned())
        .map_err(|err| err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        }
    }

    fn write_config(text: &str) -> (tempdir::Dir, PathBuf) {
        let dir = tempdir::Dir::new();
        let path = dir.path().join("hostprof.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// A directory removed on drop (std only, to avoid a dev-dependency).
    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let path = std::env::temp_dir()
                    .join(format!("hostprof-config-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&path).unwrap();
                Dir(path)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn defaults_without_flags_env_or_file() {
        let config = AgentConfig::resolve(Flags::default(), &|_| None).unwrap();
        assert_eq!(config.frequency, DEFAULT_FREQUENCY);
        assert_eq!(config.otlp_endpoint, DEFAULT_ENDPOINT);
        assert_eq!(config.metrics_addr, None);
        assert_eq!(config.status_interval, DEFAULT_STATUS_INTERVAL);
        assert!(config.sources.is_empty());
    }

    #[test]
    fn flags_beat_env_beats_file_beats_default() {
        let (_dir, path) = write_config(
            "frequency = 7\nreport-interval = \"2s\"\nexport-queue-mib = 3\n\
             debug-dir = [\"/a\", \"/b\"]\noff-cpu = true\n",
        );
        let flags = Flags {
            config: Some(path.clone()),
            frequency: Some(99),
            ..Default::default()
        };
        let env = env_of(&[
            ("HOSTPROF_FREQUENCY", "50"),
            ("HOSTPROF_REPORT_INTERVAL", "3"),
        ]);
        let config = AgentConfig::resolve(flags, &env).unwrap();
        assert_eq!(config.frequency, 99);
        assert_eq!(config.sources["frequency"], Source::Flag);
        assert_eq!(config.report_interval, Duration::from_secs(3));
        assert_eq!(
            config.sources["report-interval"],
            Source::Env("HOSTPROF_REPORT_INTERVAL".into())
        );
        assert_eq!(config.export_queue_mib, 3);
        assert_eq!(config.sources["export-queue-mib"], Source::File(path));
        assert_eq!(
            config.debug_dirs,
            [PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert!(config.off_cpu);
        assert_eq!(config.export_timeout, DEFAULT_EXPORT_TIMEOUT);
        assert!(!config.sources.contains_key("export-timeout"));
    }

    #[test]
    fn hostprof_env_beats_otel_env_beats_file() {
        let (_dir, path) = write_config("otlp-endpoint = \"http://file:1\"\n");
        let flags = || Flags {
            config: Some(path.clone()),
            ..Default::default()
        };
        let config = AgentConfig::resolve(flags(), &|_| None).unwrap();
        assert_eq!(config.otlp_endpoint, "http://file:1");
        let env = env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:2"),
            (
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
                "https://profiles:3/",
            ),
        ]);
        let config = AgentConfig::resolve(flags(), &env).unwrap();
        assert_eq!(config.otlp_endpoint, "https://profiles:3");
        let env = env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:2"),
            ("HOSTPROF_OTLP_ENDPOINT", "http://ours:4"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20x"),
        ]);
        let config = AgentConfig::resolve(flags(), &env).unwrap();
        assert_eq!(config.otlp_endpoint, "http://ours:4");
        assert_eq!(
            config.otlp_headers,
            [("authorization".to_owned(), "Bearer x".to_owned())]
        );
        // Credentials never appear in --print-config.
        assert!(config.to_toml().contains("authorization=<redacted>"));
        assert!(!config.to_toml().contains("Bearer"));
    }

    #[test]
    fn config_file_from_hostprof_config_variable() {
        let (_dir, path) = write_config("frequency = 33\n");
        let path_text: &'static str =
            Box::leak(path.to_string_lossy().into_owned().into_boxed_str());
        let pairs: &'static [(&str, &str)] = Box::leak(Box::new([(CONFIG_ENV, path_text)]));
        let config = AgentConfig::resolve(Flags::default(), &env_of(pairs)).unwrap();
        assert_eq!(config.frequency, 33);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key_on_one_line() {
        let (_dir, path) = write_config("frequncy = 19\n");
        let flags = Flags {
            config: Some(path),
            ..Default::default()
        };
        let err = AgentConfig::resolve(flags, &|_| None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown key `frequncy`"), "{err}");
        assert!(err.contains("frequency, report-interval"), "{err}");
        assert!(!err.contains('\n'), "{err}");

        for (text, key, fragment) in [
            ("frequency = 0\n", "frequency", "1 to 10000"),
            ("frequency = \"fast\"\n", "frequency", "not a whole number"),
            (
                "otlp-endpoint = \"collector:4317\"\n",
                "otlp-endpoint",
                "needs a scheme",
            ),
            ("off-cpu = \"maybe\"\n", "off-cpu", "true or false"),
            ("metrics-addr = \"nowhere\"\n", "metrics-addr", "PORT"),
            ("log-format = \"xml\"\n", "log-format", "text or json"),
            (
                "report-interval = [1]\n",
                "report-interval",
                "expected one value",
            ),
            ("symbol-cache-mib = 1\n", "symbol-cache-mib", "16 or more"),
        ] {
            let err = check_file(text).unwrap_err().to_string();
            assert!(err.contains(&format!("`{key}`")), "{text}: {err}");
            assert!(err.contains(fragment), "{text}: {err}");
            assert!(!err.contains('\n'), "{text}: {err}");
        }
        let err = check_file("frequency = \n").unwrap_err().to_string();
        assert!(
            err.contains("not valid TOML") && !err.contains('\n'),
            "{err}"
        );

        let env = env_of(&[("HOSTPROF_OFF_CPU_PROBABILITY", "2")]);
        let err = AgentConfig::resolve(Flags::default(), &env)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("environment variable HOSTPROF_OFF_CPU_PROBABILITY: invalid value `2`"),
            "{err}"
        );
    }

    #[test]
    fn printed_config_reads_back_the_same() {
        let env = env_of(&[
            ("HOSTPROF_METRICS_ADDR", "9400"),
            ("HOSTPROF_DEBUG_DIR", "/x:/y"),
            ("HOSTPROF_OFF_CPU_THRESHOLD", "250us"),
            ("HOSTPROF_STATUS_INTERVAL", "0"),
            ("OTEL_SERVICE_NAME", "checkout \"eu\""),
        ]);
        let config = AgentConfig::resolve(Flags::default(), &env).unwrap();
        assert_eq!(config.metrics_addr, Some("127.0.0.1:9400".parse().unwrap()));
        assert_eq!(config.status_interval, Duration::ZERO);
        let printed = config.to_toml();
        assert!(printed.contains("# HOSTPROF_METRICS_ADDR"), "{printed}");
        assert!(printed.contains("frequency = 19  # default"), "{printed}");
        let (_dir, path) = write_config(&printed);
        let flags = Flags {
            config: Some(path),
            ..Default::default()
        };
        let reread = AgentConfig::resolve(flags, &|_| None).unwrap();
        assert_eq!(
            AgentConfig {
                sources: BTreeMap::new(),
                ..reread
            },
            AgentConfig {
                sources: BTreeMap::new(),
                ..config
            }
        );
    }

    #[test]
    fn metrics_addr_defaults_to_loopback() {
        assert_eq!(
            parse_metrics_addr(":9400").unwrap().to_string(),
            "127.0.0.1:9400"
        );
        assert_eq!(
            parse_metrics_addr("localhost:1").unwrap().to_string(),
            "127.0.0.1:1"
        );
        assert_eq!(
            parse_metrics_addr("0.0.0.0:9400").unwrap().to_string(),
            "0.0.0.0:9400"
        );
        assert_eq!(
            parse_metrics_addr("[::1]:9").unwrap().to_string(),
            "[::1]:9"
        );
        assert!(parse_metrics_addr("70000").is_err());
    }

    #[test]
    fn every_key_has_an_env_name() {
        assert_eq!(env_name("report-interval"), "HOSTPROF_REPORT_INTERVAL");
        let printed = AgentConfig::resolve(Flags::default(), &|_| None)
            .unwrap()
            .to_toml();
        for (key, _) in KEYS {
            assert!(
                printed.contains(&format!("{key} ")),
                "{key} missing:\n{printed}"
            );
        }
    }
}
