//! Command-line interface: clap arguments and the commands they run.
mod agent;
mod record;
mod session;

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

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
}

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// Samples per second on each CPU.
    #[arg(short = 'F', long = "frequency", value_name = "HZ", default_value_t = 19,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub frequency: u64,
    /// Stop after this many seconds (fractions allowed); default: until
    /// SIGTERM or Ctrl-C. The last window is sent either way.
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = parse_seconds)]
    pub duration: Option<Duration>,
    /// Seconds between exports (each export is one profile window).
    #[arg(long = "report-interval", value_name = "SECONDS", default_value = "5",
          value_parser = parse_seconds)]
    pub report_interval: Duration,
    /// OTLP gRPC endpoint (`http://` for plain text, `https://` for TLS);
    /// default: OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT,
    /// then http://localhost:4317. Headers come from OTEL_EXPORTER_OTLP_HEADERS.
    #[arg(long = "otlp-endpoint", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// PEM file of the CA that signs the collector's certificate; default: the
    /// system's roots.
    #[arg(long = "otlp-ca", value_name = "FILE")]
    pub otlp_ca: Option<PathBuf>,
    /// Seconds one export call may take.
    #[arg(long = "export-timeout", value_name = "SECONDS", default_value = "10",
          value_parser = parse_seconds)]
    pub export_timeout: Duration,
    /// MiB of unsent profiles to keep while the collector is unreachable; the
    /// oldest are dropped beyond it.
    #[arg(long = "export-queue-mib", value_name = "MIB", default_value_t = 64)]
    pub export_queue_mib: u64,
    /// `service.name` of every resource; default: OTEL_SERVICE_NAME.
    #[arg(long = "service-name", value_name = "NAME")]
    pub service_name: Option<String>,
    #[command(flatten)]
    pub off_cpu: OffCpuArgs,
    #[command(flatten)]
    pub symbols: SymbolArgs,
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
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = parse_seconds)]
    pub duration: Option<Duration>,
    /// Write the profile here; `-` for stdout. The extension picks the format:
    /// `.folded`, `.svg` (flame graph), `.pb.gz` (pprof), `.otlp.pb`, `.otlp.json`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub off_cpu: OffCpuArgs,
    #[command(flatten)]
    pub symbols: SymbolArgs,
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

fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim_end_matches('s')
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(format!(
            "`{text}`: the duration must be more than 0 seconds"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Off-CPU profiling options, shared by `record` and `agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct OffCpuArgs {
    /// Also record when threads are off CPU (blocked, sleeping, waiting for a
    /// CPU), with their stacks and state. Folded values then become
    /// microseconds, CPU stacks weighing one sampling period each.
    #[arg(long = "off-cpu")]
    pub enabled: bool,
    /// Shortest off-CPU period to record (e.g. 1ms, 500us, 0.01s).
    #[arg(long = "off-cpu-threshold", value_name = "DURATION", default_value = "1ms", value_parser = parse_duration)]
    pub threshold: Duration,
    /// Share (0 to 1) of context switches to track, to bound overhead on busy hosts.
    #[arg(long = "off-cpu-probability", value_name = "P", default_value_t = 1.0, value_parser = parse_probability)]
    pub probability: f64,
}

impl OffCpuArgs {
    /// The sampler's off-CPU options, when off-CPU profiling is on.
    pub fn options(&self) -> Option<crate::sampler::OffCpuOptions> {
        self.enabled.then_some(crate::sampler::OffCpuOptions {
            threshold: self.threshold,
            probability: self.probability,
        })
    }
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
    #[arg(long = "symbol-cache-mib", value_name = "MIB")]
    pub cache_mib: Option<u64>,
}

/// `agent`'s symbol cache: it shares every node for months, next to
/// everything else (the soak's RSS target is 100 MB).
pub const AGENT_SYMBOL_CACHE_MIB: u64 = 48;
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

/// A duration with a unit: `ns`, `us`, `ms` or `s` (seconds when bare).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = [("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)]
        .iter()
        .find_map(|(unit, scale)| text.strip_suffix(unit).map(|number| (number, *scale)))
        .unwrap_or((text, 1.0));
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a duration such as 1ms or 0.5s"))?;
    if !(value >= 0.0 && value.is_finite()) {
        return Err(format!("`{text}`: a duration cannot be negative"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

fn parse_probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) && p > 0.0 => Ok(p),
        _ => Err(format!(
            "`{text}`: give a probability above 0 and at most 1"
        )),
    }
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Record(args) => record::run(args).await,
        Command::Agent(args) => agent::run(args).await,
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
        assert_eq!(args.frequency, 19);
        assert_eq!(args.report_interval, Duration::from_secs(1));
        assert_eq!(args.export_timeout, Duration::from_secs(10));
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
        let cli = Cli::try_parse_from(["hostprof", "record", "--symbol-cache-mib", "8"]).unwrap();
        let Command::Record(args) = cli.command else {
            panic!("not record")
        };
        assert_eq!(args.symbols.options(512).cache_bytes, 8 << 20);
    }

    #[test]
    fn parses_durations_with_units() {
        assert_eq!(parse_duration("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("0.25s"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("-1ms").is_err());
    }
}
