//! Where and how to export: endpoint, headers, TLS, per the OTLP exporter
//! environment variables.
use std::{path::PathBuf, time::Duration};

use super::ExportError;
use crate::profile::{BadEntry, parse_key_values};

/// The default OTLP/gRPC endpoint.
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4317";

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
    /// From the flags, falling back on the process environment.
    pub fn from_env(
        endpoint: Option<&str>,
        ca: Option<PathBuf>,
        timeout: Duration,
        queue_bytes: usize,
    ) -> Result<Self, ExportError> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let endpoint = resolve_endpoint(
            endpoint,
            env("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT").as_deref(),
            env("OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
        )?;
        let headers = match env("OTEL_EXPORTER_OTLP_HEADERS") {
            Some(text) => parse_headers(&text)?,
            None => Vec::new(),
        };
        if ca.is_some() && !endpoint.starts_with("https://") {
            return Err(ExportError::CaWithoutTls(endpoint));
        }
        Ok(ExportConfig {
            endpoint,
            headers,
            ca,
            timeout,
            queue_bytes,
        })
    }

    /// True when the connection uses TLS.
    pub fn tls(&self) -> bool {
        self.endpoint.starts_with("https://")
    }
}

/// The flag, else the profiles endpoint variable, else the generic one, else
/// the default; it must say `http://` or `https://`.
pub fn resolve_endpoint(
    flag: Option<&str>,
    profiles_env: Option<&str>,
    generic_env: Option<&str>,
) -> Result<String, ExportError> {
    let endpoint = flag
        .or(profiles_env)
        .or(generic_env)
        .unwrap_or(DEFAULT_ENDPOINT)
        .trim()
        .trim_end_matches('/');
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(ExportError::Scheme(endpoint.to_owned()));
    }
    Ok(endpoint.to_owned())
}

/// Parses `key1=value1,key2=value2` (values %-encoded) into gRPC metadata.
pub fn parse_headers(text: &str) -> Result<Vec<(String, String)>, ExportError> {
    let headers = parse_key_values(text).map_err(|bad| match bad {
        BadEntry::NotKeyValue(entry) | BadEntry::BadEscape(entry) => ExportError::Header(entry),
    })?;
    // gRPC metadata keys are lowercase.
    Ok(headers
        .into_iter()
        .map(|(key, value)| (key.to_ascii_lowercase(), value))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_precedence_and_scheme() {
        assert_eq!(
            resolve_endpoint(Some("http://a:1"), Some("http://b:2"), Some("http://c:3")).unwrap(),
            "http://a:1"
        );
        assert_eq!(
            resolve_endpoint(None, Some("https://b:2/"), Some("http://c:3")).unwrap(),
            "https://b:2"
        );
        assert_eq!(
            resolve_endpoint(None, None, Some("http://c:3")).unwrap(),
            "http://c:3"
        );
        assert_eq!(
            resolve_endpoint(None, None, None).unwrap(),
            DEFAULT_ENDPOINT
        );
        assert!(matches!(
            resolve_endpoint(Some("collector:4317"), None, None),
            Err(ExportError::Scheme(_))
        ));
    }

    #[test]
    fn headers_are_lowercased_and_decoded() {
        assert_eq!(
            parse_headers("Authorization=Bearer%20xyz, x-tenant = a ").unwrap(),
            [
                ("authorization".to_owned(), "Bearer xyz".to_owned()),
                ("x-tenant".to_owned(), "a".to_owned())
            ]
        );
        assert!(parse_headers("novalue").is_err());
    }
}
