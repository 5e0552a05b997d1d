//! OTLP profiles export over gRPC (`ProfilesService/Export`).
//!
//! [`Windows`] is the agent's sink: it cuts the samples into one request per
//! window. [`ExportConfig`] says where and how (endpoint, headers, TLS);
//! [`run_exporter`] sends each window's
//! request, gzipped, and on UNAVAILABLE, RESOURCE_EXHAUSTED or
//! DEADLINE_EXCEEDED keeps it in a [`ByteQueue`] and retries with jittered
//! exponential [`Backoff`]. A collector that is down never blocks sampling:
//! the queue drops its oldest requests (and counts them) instead.
mod client;
mod config;
mod queue;
mod windows;

pub use client::{ExportStats, run_exporter};
pub use config::ExportConfig;
pub use queue::{Backoff, ByteQueue};
pub use windows::Windows;

use std::path::PathBuf;

/// Errors in setting up the exporter (sending errors are retried or logged).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("header `{0}` is not valid gRPC metadata: use ASCII letters, digits and `-` in keys")]
    Metadata(String),
    #[error("cannot read the CA certificate {}: check the --otlp-ca path", path.display())]
    ReadCa {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid OTLP endpoint `{endpoint}`: check host and port")]
    Endpoint {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
}
