//! OTLP profiles export over gRPC (`ProfilesService/Export`).
//!
//! [`ExportConfig`] resolves the endpoint, headers and TLS from flags and the
//! `OTEL_EXPORTER_OTLP_*` variables; [`run_exporter`] sends each window's
//! request, gzipped, and on UNAVAILABLE, RESOURCE_EXHAUSTED or
//! DEADLINE_EXCEEDED keeps it in a [`ByteQueue`] and retries with jittered
//! exponential [`Backoff`]. A collector that is down never blocks sampling:
//! the queue drops its oldest requests (and counts them) instead.
mod client;
mod config;
mod queue;

pub use client::{ExportStats, run_exporter};
pub use config::{DEFAULT_ENDPOINT, ExportConfig, parse_headers, resolve_endpoint};
pub use queue::{Backoff, ByteQueue};

use std::path::PathBuf;

/// Errors in setting up the exporter (sending errors are retried or logged).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(
        "OTLP endpoint `{0}` needs a scheme: write http://HOST:PORT (plain) or https://HOST:PORT (TLS)"
    )]
    Scheme(String),
    #[error(
        "OTEL_EXPORTER_OTLP_HEADERS entry `{0}` is not key=value: write it as key1=value1,key2=value2 with %-escapes"
    )]
    Header(String),
    #[error("header `{0}` is not valid gRPC metadata: use ASCII letters, digits and `-` in keys")]
    Metadata(String),
    #[error("--otlp-ca was given but the endpoint `{0}` is plain text: use an https:// endpoint")]
    CaWithoutTls(String),
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
