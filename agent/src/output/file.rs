//! The profile files `record` and `report` write: the format a name asks
//! for, the sink building it ([`ProfileFile`]), and writing it to a file or
//! stdout.
use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::Path,
};

use anyhow::{Context, bail};
use hostprof_proto::Message;

use super::{FoldedStacks, PprofProfile, Sink, otlp_json, write_flamegraph};
use crate::{
    input::Counted,
    model::ResolvedSample,
    profile::{ProfileBuilder, ResourceConfig},
};

/// What `hostprof record -o` and `hostprof report -o` write.
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

impl OutputFormat {
    /// The format a `-o` name says.
    pub fn for_path(path: &Path) -> anyhow::Result<Self> {
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
    pub fn chosen(
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
pub enum ProfileFile {
    None,
    /// Folded stacks, written as text or drawn as SVG.
    Folded(FoldedStacks),
    Pprof(PprofProfile),
    /// OTLP `ProfilesData`, binary or JSON.
    Otlp(ProfileBuilder),
}

impl ProfileFile {
    /// `off_cpu_period_ns`: set when off-CPU samples are recorded (folded
    /// values become microseconds, a CPU sample weighing this period).
    /// `resource`: the attributes of OTLP resources.
    pub fn new(
        format: Option<OutputFormat>,
        frequency: u64,
        start: u64,
        off_cpu_period_ns: Option<u64>,
        resource: ResourceConfig,
    ) -> Self {
        match format {
            None => ProfileFile::None,
            Some(OutputFormat::Folded | OutputFormat::Svg) => {
                ProfileFile::Folded(match off_cpu_period_ns {
                    Some(period) => FoldedStacks::in_microseconds(period),
                    None => FoldedStacks::new(),
                })
            }
            Some(OutputFormat::Pprof) => ProfileFile::Pprof(PprofProfile::new(
                frequency,
                start,
                off_cpu_period_ns.is_some(),
            )),
            Some(OutputFormat::Otlp | OutputFormat::OtlpJson) => {
                ProfileFile::Otlp(ProfileBuilder::new(resource, frequency, start))
            }
        }
    }

    /// The sink inside, if any format was chosen.
    fn sink(&mut self) -> Option<&mut dyn Sink> {
        match self {
            ProfileFile::None => None,
            ProfileFile::Folded(folded) => Some(folded),
            ProfileFile::Pprof(pprof) => Some(pprof),
            ProfileFile::Otlp(builder) => Some(builder),
        }
    }

    /// Writes the profile, its time span ending at `end`; `title` heads a
    /// flame graph.
    pub fn write(
        self,
        format: OutputFormat,
        end: u64,
        title: &str,
        out: &mut dyn Write,
    ) -> io::Result<()> {
        match (self, format) {
            (ProfileFile::Folded(folded), OutputFormat::Svg) => {
                write_flamegraph(&folded, title, out)
            }
            (ProfileFile::Folded(folded), _) => folded.write(out),
            (ProfileFile::Pprof(pprof), _) => pprof.write(end, out),
            (ProfileFile::Otlp(mut builder), OutputFormat::OtlpJson) => {
                let json = otlp_json::to_json(&builder.finish_data(end));
                out.write_all(json.as_bytes())?;
                out.write_all(b"\n")?;
                out.flush()
            }
            (ProfileFile::Otlp(mut builder), _) => {
                out.write_all(&builder.finish_data(end).encode_to_vec())?;
                out.flush()
            }
            (ProfileFile::None, _) => Ok(()),
        }
    }
}

impl Sink for ProfileFile {
    fn push(&mut self, sample: &ResolvedSample) {
        if let Some(sink) = self.sink() {
            sink.push(sample);
        }
    }

    fn push_count(&mut self, sample: &ResolvedSample, count: u64) {
        if let Some(sink) = self.sink() {
            sink.push_count(sample, count);
        }
    }

    fn push_counted(&mut self, counted: &Counted) {
        if let Some(sink) = self.sink() {
            sink.push_counted(counted);
        }
    }
}

/// Writes to `path`, or stdout for `-`.
pub fn write_output(
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
