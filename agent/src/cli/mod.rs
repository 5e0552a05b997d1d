//! Command-line interface: clap arguments and the commands they run.
mod agent;
mod output;
mod progress;
mod record;
mod report;
mod session;

pub use record::RECORDING_LINE;

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

use crate::config;

/// eBPF host-level sampling profiler.
#[derive(Debug, Parser)]
#[command(name = "hostprof", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Profile the host, some processes, or a command, and write a profile.
    Record(RecordArgs),
    /// Profile the host continuously and export OTLP profiles over gRPC
    /// (for systemd services and Kubernetes DaemonSets).
    Agent(AgentArgs),
    /// Read a profile `record` or `agent` wrote: print its top functions, or
    /// write it in another format.
    Report(ReportArgs),
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The profile: `.otlp.pb` (or an agent's export request), `.otlp.json`,
    /// `.pb.gz` (pprof) or `.folded`; other names, and `-` for stdin, are
    /// recognised by their content.
    #[arg(value_name = "FILE")]
    pub input: PathBuf,
    /// Write the profile here instead of printing its top functions; `-` for
    /// stdout. The extension picks the format, as for `record -o`.
    /// `{container}` in the name writes one file per container, named by its
    /// id (`host` for processes in no container).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Output format, whatever the file name says.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<OutputFormat>,
    /// How many functions the summary lists.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Only the samples of this container (its `container.id`; `host` for
    /// processes in no container). By default, every container's.
    #[arg(long = "container", value_name = "ID")]
    pub container: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// TOML configuration file (keys are these flags' long names); default:
    /// HOSTPROF_CONFIG. Flags beat HOSTPROF_*/OTEL_* variables, which beat the
    /// file, which beats the defaults.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (a valid --config file, each value
    /// annotated with where it came from) and exit.
    #[arg(long = "print-config")]
    pub print_config: bool,
    /// Samples per second on each CPU [default: 19].
    #[arg(short = 'F', long = "frequency", value_name = "HZ", value_parser = config::parse_frequency)]
    pub frequency: Option<u64>,
    /// Stop after this many seconds (fractions allowed); default: until
    /// SIGTERM or Ctrl-C. The last window is sent either way.
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = config::parse_seconds)]
    pub duration: Option<Duration>,
    /// Seconds between exports (each export is one profile window) [default: 5].
    #[arg(long = "report-interval", value_name = "SECONDS", value_parser = config::parse_seconds)]
    pub report_interval: Option<Duration>,
    /// OTLP gRPC endpoint (`http://` for plain text, `https://` for TLS);
    /// default: HOSTPROF_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT,
    /// OTEL_EXPORTER_OTLP_ENDPOINT, the file, then http://localhost:4317.
    /// Headers come from OTEL_EXPORTER_OTLP_HEADERS (or otlp-headers).
    #[arg(long = "otlp-endpoint", value_name = "URL", value_parser = config::parse_endpoint)]
    pub otlp_endpoint: Option<String>,
    /// PEM file of the CA that signs the collector's certificate; default: the
    /// system's roots. TLS certificates are always verified.
    #[arg(long = "otlp-ca", value_name = "FILE")]
    pub otlp_ca: Option<PathBuf>,
    /// Seconds one export call may take [default: 10].
    #[arg(long = "export-timeout", value_name = "SECONDS", value_parser = config::parse_seconds)]
    pub export_timeout: Option<Duration>,
    /// MiB of unsent profiles to keep while the collector is unreachable; the
    /// oldest are dropped beyond it [default: 64].
    #[arg(long = "export-queue-mib", value_name = "MIB", value_parser = config::parse_u64)]
    pub export_queue_mib: Option<u64>,
    /// `service.name` of every resource; default: OTEL_SERVICE_NAME.
    #[arg(long = "service-name", value_name = "NAME")]
    pub service_name: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics: `PORT` or `:PORT`
    /// listen on 127.0.0.1 only; give a host (`0.0.0.0:PORT`) to listen
    /// elsewhere. Off by default: no listening socket.
    #[arg(long = "metrics-addr", value_name = "ADDR", value_parser = config::parse_metrics_addr)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Seconds between one-line status logs; 0 turns them off [default: 60].
    #[arg(long = "status-interval", value_name = "SECONDS", value_parser = config::parse_seconds_or_zero)]
    pub status_interval: Option<Duration>,
    /// Log lines as `text` or `json` objects [default: text].
    #[arg(long = "log-format", value_name = "FORMAT", value_parser = config::parse_log_format)]
    pub log_format: Option<config::LogFormat>,
    /// Log level or RUST_LOG-style filter [default: info; RUST_LOG wins].
    #[arg(long = "log-level", value_name = "FILTER", value_parser = config::parse_log_level)]
    pub log_level: Option<String>,
    #[command(flatten)]
    pub off_cpu: OffCpuArgs,
    #[command(flatten)]
    pub symbols: SymbolArgs,
    #[command(flatten)]
    pub unwind: UnwindArgs,
}

impl AgentArgs {
    /// The flags as the configuration's top layer.
    pub fn flags(&self) -> config::Flags {
        config::Flags {
            config: self.config.clone(),
            frequency: self.frequency,
            report_interval: self.report_interval,
            otlp_endpoint: self.otlp_endpoint.clone(),
            otlp_ca: self.otlp_ca.clone(),
            export_timeout: self.export_timeout,
            export_queue_mib: self.export_queue_mib,
            service_name: self.service_name.clone(),
            off_cpu: self.off_cpu.enabled.then_some(true),
            off_cpu_threshold: self.off_cpu.threshold,
            off_cpu_probability: self.off_cpu.probability,
            debug_dirs: self.symbols.debug_dirs.clone(),
            symbol_cache_mib: self.symbols.cache_mib,
            metrics_addr: self.metrics_addr,
            status_interval: self.status_interval,
            log_format: self.log_format,
            log_level: self.log_level.clone(),
            unwind: self.unwind.method,
            unwind_table_mib: self.unwind.table_mib,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Profile only this process and all its threads (repeatable).
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        conflicts_with = "command"
    )]
    pub pids: Vec<u32>,
    /// Samples per second on each CPU.
    #[arg(short = 'F', long = "frequency", value_name = "HZ", default_value_t = 99,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub frequency: u64,
    /// Stop after this many seconds (fractions allowed); default: until Ctrl-C
    /// or until the profiled processes exit.
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = config::parse_seconds)]
    pub duration: Option<Duration>,
    /// Write the profile here; `-` for stdout. The extension picks the format:
    /// `.folded`, `.svg` (flame graph), `.pb.gz` (pprof), `.otlp.pb`, `.otlp.json`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub off_cpu: OffCpuArgs,
    #[command(flatten)]
    pub symbols: SymbolArgs,
    #[command(flatten)]
    pub unwind: UnwindArgs,
    /// Also copy the user registers and the top BYTES of the user stack
    /// (at most 16384) out of the kernel with each CPU sample, to replay the
    /// unwind on the host and check it against the kernel's. Off by default:
    /// stack memory can hold secrets (keys, passwords) and leaves the kernel
    /// only with this flag. Costs a ~18 KiB ring record per sample.
    #[arg(long = "stack-copy", value_name = "BYTES",
          value_parser = clap::value_parser!(u32).range(8..=agent_ebpf::MAX_STACK_COPY as i64))]
    pub stack_copy: Option<u32>,
    /// With --stack-copy: write each sample's snapshot (registers, stack
    /// bytes, mappings, and the frames the kernel found) to a file in DIR,
    /// for replay tests (`hostprof::unwind::replay::RecordedSample`).
    #[arg(long = "stack-copy-dir", value_name = "DIR", requires = "stack_copy")]
    pub stack_copy_dir: Option<PathBuf>,
    /// Report the eBPF program's own run time per sample (turns on the
    /// kernel's BPF statistics while recording; used by `cargo xtask bench`).
    #[arg(long, hide = true)]
    pub bpf_stats: bool,
    /// Output format, whatever the file name says.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<OutputFormat>,
    /// How many functions the summary lists.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,
    /// Log level or RUST_LOG-style filter for messages on stderr (`debug`
    /// shows, among others, the kernel verifier's log when a program is
    /// rejected) [default: warn; RUST_LOG wins].
    #[arg(long = "log-level", value_name = "FILTER", value_parser = config::parse_log_level)]
    pub log_level: Option<String>,
    /// Command to start and profile (with its threads) until it exits.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What `hostprof record -o` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Folded stacks (flamegraph.pl / inferno input).
    Folded,
    /// Flame graph SVG.
    Svg,
    /// pprof profile.proto, gzipped (`go tool pprof`).
    Pprof,
    /// OTLP `ProfilesData`, protobuf.
    Otlp,
    /// OTLP `ProfilesData`, OTLP/JSON.
    OtlpJson,
}

/// Off-CPU profiling options, shared by `record` and `agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct OffCpuArgs {
    /// Also record when threads are off CPU (blocked, sleeping, waiting for a
    /// CPU), with their stacks and state. Folded values then become
    /// microseconds, CPU stacks weighing one sampling period each.
    #[arg(long = "off-cpu")]
    pub enabled: bool,
    /// Shortest off-CPU period to record (e.g. 1ms, 500us, 0.01s) [default: 1ms].
    #[arg(long = "off-cpu-threshold", value_name = "DURATION", value_parser = config::parse_duration)]
    pub threshold: Option<Duration>,
    /// Share (0 to 1) of context switches to track, to bound overhead on busy
    /// hosts [default: 1].
    #[arg(long = "off-cpu-probability", value_name = "P", value_parser = config::parse_probability)]
    pub probability: Option<f64>,
}

impl OffCpuArgs {
    /// The sampler's off-CPU options, when off-CPU profiling is on.
    pub fn options(&self) -> Option<crate::sampler::OffCpuOptions> {
        self.enabled.then_some(crate::sampler::OffCpuOptions {
            threshold: self.threshold.unwrap_or(config::DEFAULT_OFF_CPU_THRESHOLD),
            probability: self.probability.unwrap_or(1.0),
        })
    }
}

/// How user stacks are walked, shared by `record` and `agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct UnwindArgs {
    /// `dwarf`: in-kernel unwinding with tables built from each binary's
    /// `.eh_frame` (complete stacks without frame pointers), frame pointers
    /// where a binary has none; `fp`: frame pointers only [default: dwarf].
    #[arg(long = "unwind", value_name = "METHOD", value_parser = config::parse_unwind)]
    pub method: Option<config::UnwindMethod>,
    /// Kernel memory for unwind tables, in MiB; tables beyond it fall back
    /// to frame pointers (and are counted) [default: 32].
    #[arg(long = "unwind-table-mib", value_name = "MIB", value_parser = config::parse_unwind_table_mib)]
    pub table_mib: Option<u32>,
}

impl UnwindArgs {
    /// The sampler's (mode, rows map chunks).
    pub fn options(&self) -> (crate::sampler::UnwindMode, u32) {
        unwind_options(
            self.method.unwrap_or(config::UnwindMethod::Dwarf),
            self.table_mib.unwrap_or(config::DEFAULT_UNWIND_TABLE_MIB),
        )
    }
}

/// The sampler's (mode, rows map chunks) for `method` and `table_mib`.
pub fn unwind_options(
    method: config::UnwindMethod,
    table_mib: u32,
) -> (crate::sampler::UnwindMode, u32) {
    let mode = match method {
        config::UnwindMethod::Dwarf => crate::sampler::UnwindMode::Tables,
        config::UnwindMethod::Fp => crate::sampler::UnwindMode::FramePointers,
    };
    let chunk = std::mem::size_of::<agent_ebpf::RowChunk>() as u64;
    (mode, (u64::from(table_mib) << 20).div_ceil(chunk) as u32)
}

/// Symbolization options, shared by `record` and `agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct SymbolArgs {
    /// Another directory of debug files (`.build-id/xx/rest.debug` or
    /// `.gnu_debuglink` names), searched before /usr/lib/debug (repeatable).
    #[arg(long = "debug-dir", value_name = "DIR")]
    pub debug_dirs: Vec<PathBuf>,
    /// Memory for parsed binaries and cached names, in MiB (default: 48 for
    /// `agent`, 512 for `record`). A file whose DWARF would need more than
    /// half of it is named from its symbol tables only (no lines, no inlined
    /// calls).
    #[arg(long = "symbol-cache-mib", value_name = "MIB", value_parser = config::parse_cache_mib)]
    pub cache_mib: Option<u64>,
}

/// `agent`'s symbol cache: it shares every node for months, next to
/// everything else (the soak's RSS target is 100 MB).
pub const AGENT_SYMBOL_CACHE_MIB: u64 = config::DEFAULT_SYMBOL_CACHE_MIB;
/// `record`'s: a developer's one-off, where DWARF of big binaries matters.
pub const RECORD_SYMBOL_CACHE_MIB: u64 = 512;

impl SymbolArgs {
    /// The symbolizer's options; `default_mib` when `--symbol-cache-mib` is absent.
    pub fn options(&self, default_mib: u64) -> crate::symbolize::SymbolizerOptions {
        let mib = self.cache_mib.unwrap_or(default_mib);
        crate::symbolize::SymbolizerOptions {
            debug_dirs: self.debug_dirs.clone(),
            cache_bytes: usize::try_from(mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
        }
    }
}

/// Sends logs to stderr as text or JSON lines, at `level` unless RUST_LOG
/// says otherwise. Only the first call has an effect.
pub fn init_logging(format: config::LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    let _ = match format {
        config::LogFormat::Text => builder.try_init(),
        config::LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Record(args) => {
            // aya warns when it cannot raise RLIMIT_MEMLOCK, which only
            // matters before 5.11 and precedes a clearer error of ours.
            init_logging(
                config::LogFormat::Text,
                args.log_level.as_deref().unwrap_or("warn,aya=error"),
            );
            record::run(args).await
        }
        Command::Agent(args) => agent::run(args).await,
        Command::Report(args) => report::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_record_flags_and_command() {
        let cli = Cli::try_parse_from([
            "hostprof", "record", "-F", "999", "-d", "2.5", "-o", "x.folded", "--", "sleep", "1",
        ])
        .unwrap();
        let Command::Record(args) = cli.command else {
            panic!("not record")
        };
        assert_eq!(args.frequency, 999);
        assert_eq!(args.duration, Some(Duration::from_millis(2500)));
        assert_eq!(args.command, ["sleep", "1"]);
    }

    #[test]
    fn parses_agent_flags_with_defaults() {
        let cli = Cli::try_parse_from([
            "hostprof",
            "agent",
            "--report-interval",
            "1s",
            "--otlp-endpoint",
            "http://127.0.0.1:4317",
        ])
        .unwrap();
        let Command::Agent(args) = cli.command else {
            panic!("not agent")
        };
        assert_eq!(args.frequency, None);
        assert_eq!(args.report_interval, Some(Duration::from_secs(1)));
        assert_eq!(args.export_timeout, None);
        assert_eq!(args.duration, None);
        let cli = Cli::try_parse_from(["hostprof", "record", "-o", "x", "--format", "otlp-json"])
            .unwrap();
        let Command::Record(args) = cli.command else {
            panic!("not record")
        };
        assert_eq!(args.format, Some(OutputFormat::OtlpJson));
    }

    #[test]
    fn rejects_bad_values() {
        assert!(Cli::try_parse_from(["hostprof", "record", "-F", "0"]).is_err());
        assert!(Cli::try_parse_from(["hostprof", "record", "-d", "-1"]).is_err());
        assert!(Cli::try_parse_from(["hostprof", "record", "-p", "abc"]).is_err());
        assert!(Cli::try_parse_from(["hostprof", "record", "-p", "1", "--", "true"]).is_err());
        assert!(
            Cli::try_parse_from(["hostprof", "record", "--off-cpu-probability", "1.5"]).is_err()
        );
        assert!(
            Cli::try_parse_from(["hostprof", "record", "--off-cpu-threshold", "soon"]).is_err()
        );
    }

    #[test]
    fn record_and_agent_share_off_cpu_and_symbol_options() {
        let cli = Cli::try_parse_from([
            "hostprof",
            "agent",
            "--off-cpu",
            "--off-cpu-threshold",
            "5ms",
            "--debug-dir",
            "/a",
            "--debug-dir",
            "/b",
        ])
        .unwrap();
        let Command::Agent(args) = cli.command else {
            panic!("not agent")
        };
        let off_cpu = args.off_cpu.options().expect("off-CPU on");
        assert_eq!(off_cpu.threshold, Duration::from_millis(5));
        let symbols = args.symbols.options(AGENT_SYMBOL_CACHE_MIB);
        assert_eq!(
            symbols.debug_dirs,
            [PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert_eq!(symbols.cache_bytes, 48 << 20);
        let cli = Cli::try_parse_from(["hostprof", "record", "-d", "1"]).unwrap();
        let Command::Record(args) = cli.command else {
            panic!("not record")
        };
        assert!(args.off_cpu.options().is_none());
        assert!(
            args.symbols
                .options(RECORD_SYMBOL_CACHE_MIB)
                .debug_dirs
                .is_empty()
        );
        let cli = Cli::try_parse_from(["hostprof", "record", "--symbol-cache-mib", "32"]).unwrap();
        let Command::Record(args) = cli.command else {
            panic!("not record")
        };
        assert_eq!(args.symbols.options(512).cache_bytes, 32 << 20);
    }

    #[test]
    fn stack_copy_is_off_unless_asked_and_bounded() {
        let cli = Cli::try_parse_from(["hostprof", "record", "-d", "1"]).unwrap();
        let Command::Record(args) = cli.command else {
            panic!("not record")
        };
        assert_eq!(args.stack_copy, None);
        let cli = Cli::try_parse_from(["hostprof", "record", "--stack-copy", "8192"]).unwrap();
        let Command::Record(args) = cli.command else {
            panic!("not record")
        };
        assert_eq!(args.stack_copy, Some(8192));
        assert!(Cli::try_parse_from(["hostprof", "record", "--stack-copy", "16385"]).is_err());
        assert!(Cli::try_parse_from(["hostprof", "record", "--stack-copy-dir", "/tmp"]).is_err());
    }

    #[test]
    fn parses_durations_with_units() {
        use config::parse_duration;
        assert_eq!(parse_duration("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("0.25s"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("-1ms").is_err());
    }
}
