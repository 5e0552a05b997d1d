//! The `hostprof` binary: parse arguments, run, report errors on one line.
use std::process::ExitCode;

use clap::Parser;
use hostprof::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("hostprof: error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // The whole cause chain on one line, ripgrep style.
            eprintln!("hostprof: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
