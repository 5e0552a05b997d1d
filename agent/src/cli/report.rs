//! `hostprof report`: read a profile `record` or `agent` wrote, and print its
//! top functions or write it in another format (one file per container
//! with `{container}` in the output name).
use std::{
    collections::{HashMap, HashSet},
    io::Read as _,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};

use super::ReportArgs;
use crate::{
    input::{self, InputFormat, InputProfile, SampleFilter},
    output::{OutputFormat, ProfileFile, Sink, Summary, write_output},
    profile::ResourceConfig,
};

/// In an output name: replaced by each container's id (`host` for host
/// processes), one file each.
const CONTAINER_PLACEHOLDER: &str = "{container}";

/// The sampling rate assumed when a file does not say (`record`'s default).
const DEFAULT_FREQUENCY_HZ: u64 = 99;

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let format = OutputFormat::chosen(args.format, args.output.as_deref())?;
    let name = args.input.display().to_string();
    let data = read_input(&args.input)?;
    let input_format = InputFormat::for_name(&name).unwrap_or_else(|| InputFormat::sniff(&data));
    let mut profile = input::read(&data, input_format).with_context(|| name.clone())?;
    drop(data);
    if !profile.skipped.is_empty() {
        eprintln!(
            "hostprof: {name}: left out samples of types hostprof does not know: {}",
            profile.skipped.join(", ")
        );
    }
    if let Some(container) = &args.container {
        let known: Vec<String> = profile
            .group_names()
            .into_iter()
            .map(str::to_owned)
            .collect();
        if !profile.select(container) {
            bail!(
                "{name}: no container `{container}`; the file holds: {}",
                if known.is_empty() {
                    "nothing".to_owned()
                } else {
                    known.join(", ")
                }
            );
        }
    }
    let filter = SampleFilter::new(args.trace_id, args.span_id, args.attributes.clone());
    if !filter.is_empty() {
        if input_format == InputFormat::Folded {
            bail!(
                "{name}: folded stacks keep no trace links or attributes, so `{filter}` cannot \
                 select from them; use the OTLP or pprof file they came from"
            );
        }
        let matched = profile.keep_matching(&filter);
        eprintln!("hostprof: {name}: {}", matched.line(&filter));
    }
    let (Some(path), Some(format)) = (&args.output, format) else {
        print!("{}", summary_text(&profile, args.top));
        return Ok(());
    };
    let path_text = path.to_string_lossy();
    if !path_text.contains(CONTAINER_PLACEHOLDER) {
        write_profile(&profile, None, path, format)?;
        return Ok(());
    }
    let names: Vec<String> = profile
        .group_names()
        .into_iter()
        .map(str::to_owned)
        .collect();
    if names.is_empty() {
        bail!("{name}: no samples, so no container to write a file for");
    }
    for group in names {
        let mut one = profile.clone();
        one.select(&group);
        // Ids are hex; anything else (a hand-made file) must not walk paths.
        let safe: String = group
            .chars()
            .map(|ch| match ch {
                '/' | '\0' => '_',
                ch => ch,
            })
            .collect();
        let file = PathBuf::from(path_text.replace(CONTAINER_PLACEHOLDER, &safe));
        write_profile(&one, Some(&group), &file, format)?;
    }
    Ok(())
}

fn read_input(path: &Path) -> anyhow::Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut data = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut data)
            .context("cannot read stdin")?;
        return Ok(data);
    }
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Writes every sample of `profile` to `path` in `format`.
fn write_profile(
    profile: &InputProfile,
    group: Option<&str>,
    path: &Path,
    format: OutputFormat,
) -> anyhow::Result<()> {
    let period_ns = profile
        .period_ns
        .filter(|&period| period > 0)
        .unwrap_or(1_000_000_000 / DEFAULT_FREQUENCY_HZ);
    let frequency = ((1e9 / period_ns as f64).round() as u64).max(1);
    let resource = ResourceConfig::from_attributes(
        profile
            .resource_attributes
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str())),
    );
    let mut output = ProfileFile::new(
        Some(format),
        frequency,
        profile.start_unix_nano,
        profile.has_off_cpu().then_some(period_ns),
        resource,
    );
    for counted in profile.groups.iter().flat_map(|group| &group.samples) {
        output.push_counted(counted);
    }
    let title = match group {
        Some(group) => format!("hostprof: {group}"),
        None => "hostprof".to_owned(),
    };
    let end = profile.end_unix_nano.max(profile.start_unix_nano);
    write_output(path, |out| output.write(format, end, &title, out))?;
    if path.as_os_str() != "-" {
        eprintln!("hostprof: wrote {}", path.display());
    }
    Ok(())
}

/// What `report` prints without `-o`: the totals, then the top functions as
/// `record` lists them.
fn summary_text(profile: &InputProfile, top: usize) -> String {
    let mut summary = Summary::new();
    for counted in profile.groups.iter().flat_map(|group| &group.samples) {
        summary.push_count(&counted.sample, counted.count);
    }
    let mut text = format!(
        "hostprof: {} samples from {} processes",
        summary.samples(),
        summary.processes()
    );
    let (off_cpu_events, off_cpu_ns) = summary.off_cpu();
    if off_cpu_events > 0 {
        text.push_str(&format!(
            "; off-CPU: {off_cpu_events} periods, {:.3} s in all",
            off_cpu_ns as f64 / 1e9
        ));
    }
    text.push('\n');
    if summary.samples() > 0 || off_cpu_events > 0 {
        text.push_str(&summary.top(top));
    }
    text.push_str(&traces_text(profile, summary.samples(), top));
    text
}

/// The traces with the most CPU samples, with how many spans each had, so
/// one can be picked for `--trace-id`; nothing when no sample is linked.
fn traces_text(profile: &InputProfile, samples: u64, top: usize) -> String {
    let mut traces: HashMap<[u8; 16], (u64, HashSet<[u8; 8]>)> = HashMap::new();
    for counted in profile.groups.iter().flat_map(|group| &group.samples) {
        if let (Some(link), None) = (&counted.sample.trace, &counted.sample.off_cpu) {
            let (count, spans) = traces.entry(link.trace_id).or_default();
            *count = count.saturating_add(counted.count);
            spans.insert(link.span_id);
        }
    }
    if traces.is_empty() {
        return String::new();
    }
    let mut ranked: Vec<_> = traces.into_iter().collect();
    ranked.sort_unstable_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(&b.0)));
    let mut text = match ranked.len() {
        1 => "top traces by samples (1 trace):\n".to_owned(),
        n => format!("top traces by samples ({n} traces):\n"),
    };
    for (trace_id, (count, spans)) in ranked.into_iter().take(top) {
        let percent = 100.0 * count as f64 / samples.max(1) as f64;
        let link = crate::model::TraceLink {
            trace_id,
            span_id: [0; 8],
        };
        text.push_str(&format!(
            "  {percent:6.2}%  {count:>8}  {}  {} spans\n",
            link.trace_hex(),
            spans.len()
        ));
    }
    text
}
