//! Every setting, declared once.
//!
//! One entry per setting gives its flag (clap attributes and `--help` text),
//! its key (the TOML key; the variable is `HOSTPROF_` plus the key in upper
//! snake case), the OpenTelemetry variables that mean the same, its parser,
//! its default for each command and how `--print-config` writes it. From the
//! entries [`settings!`] generates the flags struct (flattened into the clap
//! commands), the resolved values struct, the table of keys (for error
//! messages, unknown-key checks and the documented example file's test) and
//! the resolution and printing code. Adding a setting is one entry here.
//!
//! Two groups: [`SharedFlags`] are options of both `record` and `agent`;
//! [`AgentFlags`] only make sense for the long-running agent (export, status,
//! logs as JSON). `record` resolves its group from flags and defaults only.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::{
    ConfigError, Role,
    layers::Resolver,
    parse::{
        CacheDir, LogFormat, UnwindMethod, parse_bool, parse_cache_dir, parse_cache_mib,
        parse_dirs, parse_duration, parse_endpoint, parse_frequency, parse_headers,
        parse_log_format, parse_log_level, parse_metrics_addr, parse_path, parse_probability,
        parse_seconds, parse_seconds_or_zero, parse_text, parse_u64, parse_unwind,
        parse_unwind_table_mib,
    },
};

/// A setting's key, what its value must look like, and the OpenTelemetry
/// variables read after `HOSTPROF_<KEY>`.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub key: &'static str,
    pub allowed: &'static str,
    pub otel_env: &'static [&'static str],
}

/// Generates, from one list of entries, the flags struct, the values struct,
/// the key table and the code that resolves and prints them. An entry
/// without `default` resolves to an `Option`.
macro_rules! settings {
    (@value_ty $ty:ty) => { Option<$ty> };
    (@value_ty $ty:ty, $default:expr) => { $ty };
    (@finish $picked:ident, $role:ident) => { $picked };
    (@finish $picked:ident, $role:ident, $default:expr) => {
        $picked.unwrap_or_else(|| ($default)($role))
    };
    (@show $value:expr, $show:expr) => { $value.as_ref().map($show) };
    (@show $value:expr, $show:expr, $default:expr) => { Some(($show)($value)) };
    (
        $(#[$flags_meta:meta])*
        flags $Flags:ident, values $Values:ident, table $TABLE:ident;
        $(
            $(#[$attr:meta])*
            $field:ident: $ty:ty {
                key: $key:literal,
                allowed: $allowed:literal,
                otel_env: [$($env:literal),* $(,)?],
                parse: $parse:path,
                $(default: $default:expr,)?
                show: $show:expr $(,)?
            }
        )*
    ) => {
        $(#[$flags_meta])*
        #[derive(Clone, Debug, Default, clap::Args)]
        pub struct $Flags {
            $( $(#[$attr])* pub $field: Option<$ty>, )*
        }

        /// The resolved values of the settings of [`
        #[doc = stringify!($Flags)]
        /// `].
        #[derive(Clone, Debug, PartialEq)]
        pub struct $Values {
            $( pub $field: settings!(@value_ty $ty $(, $default)?), )*
        }

        pub const $TABLE: &[Setting] = &[
            $( Setting { key: $key, allowed: $allowed, otel_env: &[$($env),*] }, )*
        ];

        impl $Flags {
            /// Each flag, else the environment, else the file, else the
            /// default for `role`.
            pub(crate) fn resolve(
                self,
                layers: &mut Resolver<'_>,
                role: Role,
            ) -> Result<$Values, ConfigError> {
                Ok($Values {
                    $( $field: {
                        let picked = layers.pick($key, self.$field, &[$($env),*], $parse)?;
                        settings!(@finish picked, role $(, $default)?)
                    }, )*
                })
            }
        }

        impl $Values {
            /// Calls `line` with each key and its value as TOML (`None`: unset).
            pub(crate) fn write_toml(&self, line: &mut dyn FnMut(&'static str, Option<String>)) {
                $( line($key, settings!(@show &self.$field, $show $(, $default)?)); )*
            }
        }
    };
}

fn toml_text(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

fn toml_seconds(duration: &Duration) -> String {
    toml::Value::Float(duration.as_secs_f64()).to_string()
}

settings! {
    /// Options of both `record` and `agent`.
    flags SharedFlags, values SharedSettings, table SHARED_SETTINGS;

    /// Samples per second on each CPU [default: 19 for agent, 99 for record].
    #[arg(short = 'F', long = "frequency", value_name = "HZ", value_parser = parse_frequency)]
    frequency: u64 {
        key: "frequency",
        allowed: "samples per second per CPU, 1 to 10000",
        otel_env: [],
        parse: parse_frequency,
        // 19 Hz keeps a node agent's cost small and avoids aliasing with
        // 10 ms timers; a developer's record wants detail.
        default: |role| match role { Role::Agent => 19, Role::Record => 99 },
        show: |hz: &u64| hz.to_string(),
    }
    /// Also record when threads are off CPU (blocked, sleeping, waiting for a
    /// CPU), with their stacks and state. Folded values then become
    /// microseconds, CPU stacks weighing one sampling period each.
    #[arg(long = "off-cpu", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_name = "BOOL", value_parser = parse_bool)]
    off_cpu: bool {
        key: "off-cpu",
        allowed: "true or false",
        otel_env: [],
        parse: parse_bool,
        default: |_| false,
        show: |on: &bool| on.to_string(),
    }
    /// Shortest off-CPU period to record (e.g. 1ms, 500us, 0.01s) [default: 1ms].
    #[arg(long = "off-cpu-threshold", value_name = "DURATION", value_parser = parse_duration)]
    off_cpu_threshold: Duration {
        key: "off-cpu-threshold",
        allowed: "a duration such as \"1ms\" or \"500us\"",
        otel_env: [],
        parse: parse_duration,
        default: |_| Duration::from_millis(1),
        show: |d: &Duration| toml_text(&format!("{}us", d.as_micros())),
    }
    /// Share (0 to 1) of context switches to track, to bound overhead on busy
    /// hosts [default: 1].
    #[arg(long = "off-cpu-probability", value_name = "P", value_parser = parse_probability)]
    off_cpu_probability: f64 {
        key: "off-cpu-probability",
        allowed: "a share above 0 and at most 1",
        otel_env: [],
        parse: parse_probability,
        default: |_| 1.0,
        show: |p: &f64| format!("{p:?}"),
    }
    /// Another directory of debug files (`.build-id/xx/rest.debug` or
    /// `.gnu_debuglink` names), searched before /usr/lib/debug (repeatable;
    /// `:`-separated in HOSTPROF_DEBUG_DIR, a list in the file).
    #[arg(long = "debug-dir", value_name = "DIR")]
    debug_dirs: Vec<PathBuf> {
        key: "debug-dir",
        allowed: "a directory or a list of directories",
        otel_env: [],
        parse: parse_dirs,
        default: |_| Vec::new(),
        show: |dirs: &Vec<PathBuf>| {
            let dirs = dirs
                .iter()
                .map(|dir| toml::Value::String(dir.to_string_lossy().into_owned()))
                .collect();
            toml::Value::Array(dirs).to_string()
        },
    }
    /// debuginfod servers to fetch debug files the host lacks from
    /// (space-separated URLs, as gdb and perf read DEBUGINFOD_URLS); off
    /// unless set. Fetched in the background, cached on disk.
    #[arg(long = "debuginfod-urls", value_name = "URLS")]
    debuginfod_urls: String {
        key: "debuginfod-urls",
        allowed: "space-separated http:// or https:// URLs",
        otel_env: ["DEBUGINFOD_URLS"],
        parse: parse_text,
        show: |urls: &String| toml_text(urls),
    }
    /// Memory for parsed binaries and cached names, in MiB [default: 48 for
    /// agent, 512 for record]. A file whose DWARF would need more than half of
    /// it is named from its symbol tables only (no lines, no inlined calls).
    #[arg(long = "symbol-cache-mib", value_name = "MIB", value_parser = parse_cache_mib)]
    symbol_cache_mib: u64 {
        key: "symbol-cache-mib",
        allowed: "MiB of parsed symbols to keep, 16 or more",
        otel_env: [],
        parse: parse_cache_mib,
        // The agent shares every node for months next to everything else;
        // record is a developer's one-off, where DWARF of big binaries matters.
        default: |role| match role { Role::Agent => 48, Role::Record => 512 },
        show: |mib: &u64| mib.to_string(),
    }
    /// `dwarf`: in-kernel unwinding with tables built from each binary's
    /// `.eh_frame` (complete stacks without frame pointers), frame pointers
    /// where a binary has none; `fp`: frame pointers only [default: dwarf].
    #[arg(long = "unwind", value_name = "METHOD", value_parser = parse_unwind)]
    unwind: UnwindMethod {
        key: "unwind",
        allowed: "dwarf (in-kernel tables) or fp (frame pointers)",
        otel_env: [],
        parse: parse_unwind,
        default: |_| UnwindMethod::Dwarf,
        show: |method: &UnwindMethod| toml_text(match method {
            UnwindMethod::Dwarf => "dwarf",
            UnwindMethod::Fp => "fp",
        }),
    }
    /// Kernel memory for unwind tables, in MiB; tables beyond it fall back
    /// to frame pointers (and are counted) [default: 32].
    #[arg(long = "unwind-table-mib", value_name = "MIB", value_parser = parse_unwind_table_mib)]
    unwind_table_mib: u32 {
        key: "unwind-table-mib",
        allowed: "MiB of kernel memory for unwind tables, 1 to 4096",
        otel_env: [],
        parse: parse_unwind_table_mib,
        default: |_| 32,
        show: |mib: &u32| mib.to_string(),
    }
    /// Directory where built unwind tables are kept (by the SHA-256 of each
    /// binary), so a restart does not build them again; `off` keeps none. Made
    /// private (0700) [default: /var/cache/hostprof/tables for agent, off for
    /// record and top].
    #[arg(long = "unwind-cache-dir", value_name = "DIR", value_parser = parse_cache_dir)]
    unwind_cache_dir: CacheDir {
        key: "unwind-cache-dir",
        allowed: "a directory, or off",
        otel_env: [],
        parse: parse_cache_dir,
        default: |role| match role {
            Role::Agent => CacheDir::Dir(PathBuf::from("/var/cache/hostprof/tables")),
            Role::Record => CacheDir::Off,
        },
        show: |dir: &CacheDir| toml_text(&match dir {
            CacheDir::Off => "off".into(),
            CacheDir::Dir(dir) => dir.to_string_lossy(),
        }),
    }
    /// Disk space for the unwind table cache, in MiB; the least recently
    /// used tables are deleted beyond it [default: 256].
    #[arg(long = "unwind-cache-mib", value_name = "MIB", value_parser = parse_u64)]
    unwind_cache_mib: u64 {
        key: "unwind-cache-mib",
        allowed: "MiB of disk for cached unwind tables, 0 or more",
        otel_env: [],
        parse: parse_u64,
        default: |_| 256,
        show: |mib: &u64| mib.to_string(),
    }
    /// Do not copy the top of the user stack of samples taken before their
    /// process's unwind tables are loaded (they then keep frame-pointer
    /// stacks). The copies stay in memory only until unwound, never in any
    /// output (README, Security).
    #[arg(long = "no-early-stack-copy", num_args = 0, default_missing_value = "false",
          value_parser = parse_bool)]
    early_stack_copy: bool {
        key: "early-stack-copy",
        allowed: "true or false",
        otel_env: [],
        parse: parse_bool,
        default: |_| true,
        show: |on: &bool| on.to_string(),
    }
    /// Do not read `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` from
    /// the environment of processes that publish no OpenTelemetry process
    /// context (only those two are kept; README, Service identity).
    #[arg(long = "no-process-environment", num_args = 0, default_missing_value = "false",
          value_parser = parse_bool)]
    process_environment: bool {
        key: "process-environment",
        allowed: "true or false",
        otel_env: [],
        parse: parse_bool,
        default: |_| true,
        show: |on: &bool| on.to_string(),
    }
    /// Log level or RUST_LOG-style filter for messages on stderr (`debug`
    /// shows, among others, the kernel verifier's log when a program is
    /// rejected) [default: info for agent, warn for record; RUST_LOG wins].
    #[arg(long = "log-level", value_name = "FILTER", value_parser = parse_log_level)]
    log_level: String {
        key: "log-level",
        allowed: "error, warn, info, debug, trace or a RUST_LOG filter",
        otel_env: [],
        parse: parse_log_level,
        // aya warns when it cannot raise RLIMIT_MEMLOCK, which only matters
        // before 5.11 and precedes a clearer error of ours.
        default: |role| match role {
            Role::Agent => "info".to_owned(),
            Role::Record => "warn,aya=error".to_owned(),
        },
        show: |level: &String| toml_text(level),
    }
}

settings! {
    /// Options of `agent` only.
    flags AgentFlags, values AgentSettings, table AGENT_SETTINGS;

    /// Seconds between exports (each export is one profile window) [default: 5].
    #[arg(long = "report-interval", value_name = "SECONDS", value_parser = parse_seconds)]
    report_interval: Duration {
        key: "report-interval",
        allowed: "seconds between exports, e.g. 5 or \"10s\"",
        otel_env: [],
        parse: parse_seconds,
        default: |_| Duration::from_secs(5),
        show: toml_seconds,
    }
    /// OTLP gRPC endpoint (`http://` for plain text, `https://` for TLS);
    /// default: HOSTPROF_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT,
    /// OTEL_EXPORTER_OTLP_ENDPOINT, the file, then http://localhost:4317.
    /// Headers come from OTEL_EXPORTER_OTLP_HEADERS (or otlp-headers).
    #[arg(long = "otlp-endpoint", value_name = "URL", value_parser = parse_endpoint)]
    otlp_endpoint: String {
        key: "otlp-endpoint",
        allowed: "http://HOST:PORT or https://HOST:PORT",
        otel_env: ["OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"],
        parse: parse_endpoint,
        default: |_| "http://localhost:4317".to_owned(),
        show: |endpoint: &String| toml_text(endpoint),
    }
    // No flag: headers usually carry credentials, which do not belong in a
    // process's command line.
    #[arg(skip)]
    otlp_headers: Vec<(String, String)> {
        key: "otlp-headers",
        allowed: "key1=value1,key2=value2 (values %-escaped)",
        otel_env: ["OTEL_EXPORTER_OTLP_PROFILES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"],
        parse: parse_headers,
        // Values hidden from --print-config.
        show: |headers: &Vec<(String, String)>| {
            let redacted: Vec<String> =
                headers.iter().map(|(key, _)| format!("{key}=<redacted>")).collect();
            toml_text(&redacted.join(","))
        },
    }
    /// PEM file of the CA that signs the collector's certificate; default: the
    /// system's roots. TLS certificates are always verified.
    #[arg(long = "otlp-ca", value_name = "FILE")]
    otlp_ca: PathBuf {
        key: "otlp-ca",
        allowed: "path of a PEM CA certificate",
        otel_env: [],
        parse: parse_path,
        show: |path: &PathBuf| toml_text(&path.to_string_lossy()),
    }
    /// Seconds one export call may take [default: 10].
    #[arg(long = "export-timeout", value_name = "SECONDS", value_parser = parse_seconds)]
    export_timeout: Duration {
        key: "export-timeout",
        allowed: "seconds one export may take",
        otel_env: [],
        parse: parse_seconds,
        default: |_| Duration::from_secs(10),
        show: toml_seconds,
    }
    /// MiB of unsent profiles to keep while the collector is unreachable; the
    /// oldest are dropped beyond it [default: 64].
    #[arg(long = "export-queue-mib", value_name = "MIB", value_parser = parse_u64)]
    export_queue_mib: u64 {
        key: "export-queue-mib",
        allowed: "MiB of unsent profiles to keep, 0 or more",
        otel_env: [],
        parse: parse_u64,
        default: |_| 64,
        show: |mib: &u64| mib.to_string(),
    }
    /// `service.name` of every resource; default: OTEL_SERVICE_NAME.
    #[arg(long = "service-name", value_name = "NAME")]
    service_name: String {
        key: "service-name",
        allowed: "the resources' service.name",
        otel_env: ["OTEL_SERVICE_NAME"],
        parse: parse_text,
        show: |name: &String| toml_text(name),
    }
    /// Serve Prometheus metrics at http://ADDR/metrics: `PORT` or `:PORT`
    /// listen on 127.0.0.1 only; give a host (`0.0.0.0:PORT`) to listen
    /// elsewhere. Off by default: no listening socket.
    #[arg(long = "metrics-addr", value_name = "ADDR", value_parser = parse_metrics_addr)]
    metrics_addr: SocketAddr {
        key: "metrics-addr",
        allowed: "PORT, :PORT, HOST:PORT or [IPv6]:PORT",
        otel_env: [],
        parse: parse_metrics_addr,
        show: |addr: &SocketAddr| toml_text(&addr.to_string()),
    }
    /// Seconds between one-line status logs; 0 turns them off [default: 60].
    #[arg(long = "status-interval", value_name = "SECONDS", value_parser = parse_seconds_or_zero)]
    status_interval: Duration {
        key: "status-interval",
        allowed: "seconds between status log lines; 0 turns them off",
        otel_env: [],
        parse: parse_seconds_or_zero,
        default: |_| Duration::from_secs(60),
        show: toml_seconds,
    }
    /// Log lines as `text` or `json` objects [default: text].
    #[arg(long = "log-format", value_name = "FORMAT", value_parser = parse_log_format)]
    log_format: LogFormat {
        key: "log-format",
        allowed: "text or json",
        otel_env: [],
        parse: parse_log_format,
        default: |_| LogFormat::Text,
        show: |format: &LogFormat| toml_text(match format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }),
    }
}

/// Every setting: the shared ones first.
pub fn all() -> impl Iterator<Item = &'static Setting> {
    SHARED_SETTINGS.iter().chain(AGENT_SETTINGS)
}
