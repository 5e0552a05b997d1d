//! The profile files `record` and `report` write: the format a name asks
//! for, the sink building it, and writing it to a file or stdout.
use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::Path,
};

use anyhow::{Context, bail};
use hostprof_proto::Message;

use super::OutputFormat;
use crate::{
    input::Counted,
    model::ResolvedSample,
    output::{FoldedStacks, PprofProfile, otlp_json, write_flamegraph},
    pipeline::SampleSink,
    profile::{ProfileBuilder, ResourceConfig},
};

impl OutputFormat {
    /// The format a `-o` name says.
    pub(super) fn for_path(path: &Path) -> anyhow::Result<Self> {
        let name = path.to_string_lossy();
        let format = match name.as_ref() {
            "-" => OutputFormat::Folded,
            name if name.ends_with(".folded") => OutputFormat::Folded,
            name if name.ends_with(".svg") => OutputFormat::Svg,
            name if name.ends_with(".pb.gz") => OutputFormat::Pprof,
            name if name.ends_with(".otlp.pb") => OutputFormat::Otlp,
            name if name.ends_with(".otlp.json") => OutputFormat::OtlpJson,
            _ => bail!(
                "cannot tell the output format of `{name}`: use a name ending in .folded, .svg, \
                 .pb.gz (pprof), .otlp.pb or .otlp.json, - for stdout, or pass --format"
            ),
        };
        Ok(format)
    }

    /// The format of `--format` and `-o` together (`record` and `report`):
    /// `--format` wins, else the name says; `None` without `-o`.
    pub(super) fn chosen(
        format: Option<OutputFormat>,
        output: Option<&Path>,
    ) -> anyhow::Result<Option<Self>> {
        match (format, output) {
            (Some(_), None) => bail!("--format needs -o FILE (or -o - for stdout)"),
            (Some(format), Some(_)) => Ok(Some(format)),
            (None, Some(path)) => Ok(Some(OutputFormat::for_path(path)?)),
            (None, None) => Ok(None),
        }
    }
}

/// The profile being built for `-o`, in the chosen format.
pub(super) enum Output {
    None,
    /// Folded stacks, written as text or drawn as SVG.
    Folded(FoldedStacks),
    Pprof(PprofProfile),
    /// OTLP `ProfilesData`, binary or JSON.
    Otlp(ProfileBuilder),
}

impl Output {
    /// `off_cpu_period_ns`: set when off-CPU samples are recorded (folded
    /// values become microseconds, a CPU sample weighing this period).
    /// `resource`: the attributes of OTLP resources.
    pub(super) fn new(
        format: Option<OutputFormat>,
        frequency: u64,
        start: u64,
        off_cpu_period_ns: Option<u64>,
        resource: ResourceConfig,
    ) -> Self {
        match format {
            None => Output::None,
            Some(OutputFormat::Folded | OutputFormat::Svg) => {
                Output::Folded(match off_cpu_period_ns {
                    Some(period) => FoldedStacks::in_microseconds(period),
                    None => FoldedStacks::new(),
                })
            }
            Some(OutputFormat::Pprof) => Output::Pprof(PprofProfile::new(
                frequency,
                start,
                off_cpu_period_ns.is_some(),
            )),
            Some(OutputFormat::Otlp | OutputFormat::OtlpJson) => {
                Output::Otlp(ProfileBuilder::new(resource, frequency, start))
            }
        }
    }

    pub(super) fn push(&mut self, sample: &ResolvedSample) {
        match self {
            Output::None => {}
            Output::Folded(folded) => folded.push(sample),
            Output::Pprof(pprof) => pprof.push(sample),
            Output::Otlp(builder) => builder.push(sample),
        }
    }

    /// A sample read from a file, with its count (and, for OTLP, its times).
    pub(super) fn push_counted(&mut self, counted: &Counted) {
        match self {
            Output::None => {}
            Output::Folded(folded) => folded.push_count(&counted.sample, counted.count),
            Output::Pprof(pprof) => pprof.push_count(&counted.sample, counted.count),
            Output::Otlp(builder) if !counted.timestamps.is_empty() => {
                let mut sample = counted.sample.clone();
                for &time in &counted.timestamps {
                    sample.time_unix_nano = time;
                    builder.push(&sample);
                }
            }
            Output::Otlp(builder) => builder.push_count(&counted.sample, counted.count),
        }
    }

    /// Writes the profile, its time span ending at `end`; `title` heads a
    /// flame graph.
    pub(super) fn write(
        self,
        format: OutputFormat,
        end: u64,
        title: &str,
        out: &mut dyn Write,
    ) -> io::Result<()> {
        match (self, format) {
            (Output::Folded(folded), OutputFormat::Svg) => write_flamegraph(&folded, title, out),
            (Output::Folded(folded), _) => folded.write(out),
            (Output::Pprof(pprof), _) => pprof.write(end, out),
            (Output::Otlp(mut builder), OutputFormat::OtlpJson) => {
                let json = otlp_json::to_json(&builder.finish_data(end));
                out.write_all(json.as_bytes())?;
                out.write_all(b"\n")?;
                out.flush()
            }
            (Output::Otlp(mut builder), _) => {
                out.write_all(&builder.finish_data(end).encode_to_vec())?;
                out.flush()
            }
            (Output::None, _) => Ok(()),
        }
    }
}

/// Writes to `path`, or stdout for `-`.
pub(super) fn write_output(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> anyhow::Result<()> {
    let result = if path.as_os_str() == "-" {
        write(&mut io::stdout().lock())
    } else {
        let file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        write(&mut BufWriter::new(file))
    };
    match result {
        // `hostprof record -o - | head` is fine.
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.with_context(|| format!("cannot write {}", path.display())),
    }
}
