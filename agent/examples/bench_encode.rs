//! Encoding cost of OTLP profiles next to pprof, on real samples: records the
//! whole host for a while (real eBPF, as root), then builds and encodes the
//! same samples both ways and prints time and gzipped bytes per sample.
//!
//! `cargo run --release -p hostprof --example bench_encode -- [SECONDS] [HZ]`
//! (defaults: 10 s at 99 Hz). Used by `cargo xtask bench`.
use std::{
    io::Write,
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use flate2::{Compression, write::GzEncoder};
use hostprof::{
    model::ResolvedSample,
    output::{PprofProfile, Sink},
    pipeline,
    profile::{ProfileBuilder, ResourceConfig},
    sampler::{Sampler, SamplerOptions, read_ring},
    symbolize::Symbolizer,
};
use hostprof_proto::Message;

/// Repetitions of each encoding, to smooth out timer noise.
const ROUNDS: u32 = 5;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(10.0);
    let frequency: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(99);
    let samples = record(Duration::from_secs_f64(seconds), frequency).await?;
    anyhow::ensure!(!samples.is_empty(), "no samples: is the host idle?");
    let n = samples.len() as f64;
    eprintln!(
        "bench_encode: {} samples in {seconds} s at {frequency} Hz (host-wide)",
        samples.len()
    );

    let resource = ResourceConfig::from_env(Some("bench"))?;
    let start = samples.iter().map(|s| s.time_unix_nano).min().unwrap_or(0);
    let end = samples.iter().map(|s| s.time_unix_nano).max().unwrap_or(0) + 1;
    let (otlp_time, otlp_bytes, otlp_gz) = measure(|| {
        let mut builder = ProfileBuilder::new(resource.clone(), frequency, start);
        for sample in &samples {
            builder.add(sample);
        }
        builder.finish(end).encode_to_vec()
    });
    let (pprof_time, pprof_bytes, pprof_gz) = measure(|| {
        let mut pprof = PprofProfile::new(frequency, start, false);
        for sample in &samples {
            pprof.push(sample);
        }
        pprof.finish(end).encode_to_vec()
    });
    println!("format  build+encode/sample  bytes/sample  gzipped bytes/sample");
    for (name, time, bytes, gz) in [
        ("otlp", otlp_time, otlp_bytes, otlp_gz),
        ("pprof", pprof_time, pprof_bytes, pprof_gz),
    ] {
        println!(
            "{name:<6}  {:>16.2} µs  {:>12.1}  {:>20.1}",
            time.as_secs_f64() * 1e6 / n,
            bytes as f64 / n,
            gz as f64 / n
        );
    }
    Ok(())
}

/// Best-of-ROUNDS time of `encode`, its size, and its gzipped size.
fn measure(encode: impl Fn() -> Vec<u8>) -> (Duration, usize, usize) {
    let mut best = Duration::MAX;
    let mut bytes = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        bytes = encode();
        best = best.min(started.elapsed());
    }
    let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
    let gz = gzip
        .write_all(&bytes)
        .and_then(|()| gzip.finish())
        .map_or(0, |v| v.len());
    (best, bytes.len(), gz)
}

async fn record(duration: Duration, frequency: u64) -> anyhow::Result<Vec<ResolvedSample>> {
    let options = SamplerOptions {
        frequency_hz: frequency,
        ..Default::default()
    };
    let mut sampler = Sampler::start(&options)?;
    let ring = sampler.take_ring()?;
    let events = hostprof::procs::EventSource::new(sampler.take_process_events()?);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (batch_tx, batch_rx) = mpsc::sync_channel(256);
    let (progress, _) = tokio::sync::watch::channel(Default::default());
    let reader = tokio::spawn(read_ring(ring, batch_tx, stop_rx, progress));
    let worker = std::thread::spawn(move || {
        let mut resolved = Vec::new();
        let Ok(batches) = pipeline::spawn(
            batch_rx,
            Arc::new(Symbolizer::new()),
            None,
            Some(events),
            None,
            Vec::new(),
            Default::default(),
        ) else {
            return resolved;
        };
        for batch in batches {
            resolved.extend(batch);
        }
        resolved
    });
    tokio::time::sleep(duration).await;
    sampler.stop();
    let _ = stop_tx.send(true);
    reader.await??;
    worker
        .join()
        .map_err(|_| anyhow::anyhow!("the resolver thread panicked"))
}
