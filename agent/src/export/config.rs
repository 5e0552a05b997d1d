//! Where and how to export: endpoint, headers, TLS. The values are resolved
//! (flags, `HOSTPROF_*`/`OTEL_EXPORTER_OTLP_*` variables, file) by
//! [`crate::config`].
use std::{path::PathBuf, time::Duration};

use crate::config::AgentSettings;

/// A validated exporter configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportConfig {
    /// `http://host:port` (plain text) or `https://host:port` (TLS).
    pub endpoint: String,
    /// gRPC metadata added to every call, keys lowercase.
    pub headers: Vec<(String, String)>,
    /// CA certificate (PEM) for TLS; the system roots when `None`.
    pub ca: Option<PathBuf>,
    /// Limit of one export call.
    pub timeout: Duration,
    /// Bytes of unsent requests kept while the collector is unreachable.
    pub queue_bytes: usize,
}

impl ExportConfig {
    /// The agent configuration's export settings.
    pub fn from_agent(config: &AgentSettings) -> Self {
        ExportConfig {
            endpoint: config.otlp_endpoint.clone(),
            headers: config.otlp_headers.clone().unwrap_or_default(),
            ca: config.otlp_ca.clone(),
            timeout: config.export_timeout,
            queue_bytes: usize::try_from(config.export_queue_mib.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
        }
    }

    /// True when the connection uses TLS.
    pub fn tls(&self) -> bool {
        self.endpoint.starts_with("https://")
    }
}
