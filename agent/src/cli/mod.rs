//! Command-line interface: clap arguments and the commands they run.
mod agent;
mod priority;
mod progress;
mod record;
mod report;
mod session;
mod top;

pub use record::RECORDING_LINE;
pub(crate) use record::unix_nanos_now;

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

use crate::{config, output::OutputFormat};

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
    /// Show the hottest functions live, full screen, over the last seconds.
    Top(top::TopArgs),
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
    /// Only the samples linked to this trace (32 hex digits, as tracing
    /// UIs show it): taken while a thread of a process publishing an
    /// OpenTelemetry thread context worked for one of its spans.
    #[arg(long = "trace-id", value_name = "HEX32",
          value_parser = crate::model::TraceLink::parse_trace_id)]
    pub trace_id: Option<[u8; 16]>,
    /// Only the samples linked to this span (16 hex digits).
    #[arg(long = "span-id", value_name = "HEX16",
          value_parser = crate::model::TraceLink::parse_span_id)]
    pub span_id: Option<[u8; 8]>,
    /// Only the samples with this attribute (their own, e.g. `thread.id`,
    /// or their resource's, e.g. `service.name`); repeatable, all must
    /// hold. Values compare as text.
    #[arg(long = "attribute", value_name = "KEY=VALUE",
          value_parser = crate::input::SampleFilter::parse_attribute)]
    pub attributes: Vec<(String, String)>,
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
    /// Stop after this many seconds (fractions allowed); default: until
    /// SIGTERM or Ctrl-C. The last window is sent either way.
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = config::parse_seconds)]
    pub duration: Option<Duration>,
    #[command(flatten)]
    pub shared: config::SharedFlags,
    #[command(flatten)]
    pub agent: config::AgentFlags,
}

impl AgentArgs {
    /// The flags as the configuration's top layer.
    pub fn flags(&self) -> config::Flags {
        config::Flags {
            config: self.config.clone(),
            shared: self.shared.clone(),
            agent: self.agent.clone(),
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
    /// With -p: also profile the processes' descendants, those running now
    /// and those they start while recording (for a launcher or a shell
    /// whose work happens in child processes).
    #[arg(long, requires = "pids")]
    pub children: bool,
    /// Stop after this many seconds (fractions allowed); default: until Ctrl-C
    /// or until the profiled processes exit.
    #[arg(short = 'd', long = "duration", value_name = "SECONDS", value_parser = config::parse_seconds)]
    pub duration: Option<Duration>,
    /// Write the profile here; `-` for stdout. The extension picks the format:
    /// `.folded`, `.svg` (flame graph), `.pb.gz` (pprof), `.otlp.pb`, `.otlp.json`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub settings: config::SharedFlags,
    /// Also copy the user registers and the top BYTES of the user stack
    /// (at most 16384) out of the kernel with each CPU sample, to replay the
    /// unwind on the host and check it against the kernel's. Off by default:
    /// stack memory can hold secrets (keys, passwords) and leaves the kernel
    /// only with this flag. Costs a ~18 KiB ring record per sample.
    #[arg(long = "stack-copy", value_name = "BYTES",
          value_parser = clap::value_parser!(u32).range(8..=hostprof_common::MAX_STACK_COPY as i64))]
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
    /// Command to start and profile (with its threads) until it exits.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What the shared settings mean to the running parts.
impl config::SharedSettings {
    /// The sampler's off-CPU options, when off-CPU profiling is on.
    pub fn off_cpu_options(&self) -> Option<crate::sampler::OffCpuOptions> {
        self.off_cpu.then_some(crate::sampler::OffCpuOptions {
            threshold: self.off_cpu_threshold,
            probability: self.off_cpu_probability,
        })
    }

    /// The sampler's (mode, rows map chunks).
    pub fn unwind_options(&self) -> (crate::sampler::UnwindMode, u32) {
        let mode = match self.unwind {
            config::UnwindMethod::Dwarf => crate::sampler::UnwindMode::Tables,
            config::UnwindMethod::Fp => crate::sampler::UnwindMode::FramePointers,
        };
        let chunk = std::mem::size_of::<hostprof_common::RowChunk>() as u64;
        let chunks = (u64::from(self.unwind_table_mib) << 20).div_ceil(chunk);
        (mode, chunks as u32)
    }

    /// Bytes of stack the kernel copies for samples taken before their
    /// process's tables are loaded (0: none; see `unwind::early`).
    pub fn early_copy_bytes(&self) -> u32 {
        if self.early_stack_copy {
            crate::sampler::EARLY_COPY_BYTES
        } else {
            0
        }
    }

    /// Where built unwind tables are kept on disk; `None`: not kept.
    pub fn table_cache_options(&self) -> Option<crate::unwind::cache::CacheOptions> {
        match (&self.unwind_cache_dir, self.unwind) {
            (config::CacheDir::Dir(dir), config::UnwindMethod::Dwarf) => {
                Some(crate::unwind::cache::CacheOptions {
                    dir: dir.clone(),
                    max_bytes: self.unwind_cache_mib.saturating_mul(1 << 20),
                })
            }
            _ => None,
        }
    }

    /// The symbolizer's options.
    pub fn symbolizer_options(&self) -> crate::symbolize::SymbolizerOptions {
        crate::symbolize::SymbolizerOptions {
            debug_dirs: self.debug_dirs.clone(),
            cache_bytes: usize::try_from(self.symbol_cache_mib.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
            // `record` reads no variables into its settings, but
            // DEBUGINFOD_URLS is every debugger's convention.
            debuginfod: match self.debuginfod_urls.as_deref() {
                Some(urls) => crate::symbolize::DebuginfodOptions::with_urls(
                    urls.split_ascii_whitespace().map(str::to_string).collect(),
                ),
                None => crate::symbolize::DebuginfodOptions::from_env(),
            },
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
            let settings = config::record_settings(args.settings.clone())?;
            init_logging(config::LogFormat::Text, &settings.log_level);
            record::run(args, settings).await
        }
        Command::Agent(args) => agent::run(args).await,
        Command::Report(args) => report::run(args),
        Command::Top(args) => top::run(args).await,
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
        assert_eq!(args.settings.frequency, Some(999));
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
        assert_eq!(args.shared.frequency, None);
        assert_eq!(args.agent.report_interval, Some(Duration::from_secs(1)));
        assert_eq!(args.agent.export_timeout, None);
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
        let config = config::AgentConfig::resolve(args.flags(), &|_| None).unwrap();
        let off_cpu = config.shared.off_cpu_options().expect("off-CPU on");
        assert_eq!(off_cpu.threshold, Duration::from_millis(5));
        let symbols = config.shared.symbolizer_options();
        assert_eq!(
            symbols.debug_dirs,
            [PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert_eq!(symbols.cache_bytes, 48 << 20);
        let record = |argv: &[&str]| {
            let cli = Cli::try_parse_from(argv).unwrap();
            let Command::Record(args) = cli.command else {
                panic!("not record")
            };
            config::record_settings(args.settings).unwrap()
        };
        let settings = record(&["hostprof", "record", "-d", "1"]);
        assert!(settings.off_cpu_options().is_none());
        assert!(settings.symbolizer_options().debug_dirs.is_empty());
        assert_eq!(settings.symbolizer_options().cache_bytes, 512 << 20);
        assert_eq!(settings.frequency, 99);
        let settings = record(&["hostprof", "record", "--symbol-cache-mib", "32"]);
        assert_eq!(settings.symbolizer_options().cache_bytes, 32 << 20);
        let settings = record(&["hostprof", "record", "--off-cpu"]);
        assert!(settings.off_cpu);
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
