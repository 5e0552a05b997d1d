//! The exporter task: a queue of requests in, gRPC calls out.
use std::time::Duration;

use hostprof_proto::{
    Message,
    collector::{
        ExportProfilesServiceRequest, ExportProfilesServiceResponse,
        profiles_service_client::ProfilesServiceClient,
    },
};
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};
use tonic::{
    Code,
    codec::CompressionEncoding,
    metadata::{MetadataKey, MetadataMap, MetadataValue},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

use super::{Backoff, ByteQueue, ExportConfig, ExportError};

const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(10);

/// What the exporter did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Requests the collector accepted.
    pub sent: u64,
    /// Their encoded size (before gzip).
    pub sent_bytes: u64,
    /// Requests given up: queue full, rejected by the collector, or still
    /// unsent at shutdown.
    pub dropped: u64,
    /// Calls that failed (each retry counts).
    pub failed_calls: u64,
    /// Bytes of requests waiting in the retry queue now.
    pub queue_bytes: u64,
}

/// Sends every request from `requests` until the channel closes, then tries
/// what is still queued once more and returns. `progress` always holds the
/// stats so far (for status lines and metrics).
pub async fn run_exporter(
    config: ExportConfig,
    mut requests: mpsc::UnboundedReceiver<ExportProfilesServiceRequest>,
    progress: watch::Sender<ExportStats>,
) -> Result<ExportStats, ExportError> {
    let mut client = connect(&config)?;
    let metadata = metadata(&config.headers)?;
    let mut queue = ByteQueue::new(config.queue_bytes);
    let mut backoff = Backoff::new(FIRST_RETRY, MAX_RETRY);
    let mut stats = ExportStats::default();
    let mut retry_at: Option<Instant> = None;
    let mut failing = false;
    let mut open = true;
    loop {
        progress.send_replace(ExportStats {
            dropped: stats.dropped + queue.dropped_items,
            queue_bytes: queue.bytes() as u64,
            ..stats
        });
        if queue.is_empty() || retry_at.is_some() {
            if !open {
                break;
            }
            let wake = retry_at.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                request = requests.recv() => match request {
                    Some(request) => {
                        let size = request.encoded_len();
                        queue.push(request, size);
                    }
                    None => open = false,
                },
                _ = tokio::time::sleep_until(wake), if retry_at.is_some() => retry_at = None,
            }
            continue;
        }
        let Some(request) = queue.front().cloned() else {
            continue;
        };
        let size = request.encoded_len() as u64;
        match export(&mut client, &metadata, &config, request).await {
            Ok(response) => {
                queue.pop();
                stats.sent += 1;
                stats.sent_bytes += size;
                backoff.reset();
                log_partial_success(&response);
                if failing {
                    failing = false;
                    tracing::warn!(
                        endpoint = %config.endpoint,
                        dropped = queue.dropped_items,
                        "the OTLP collector is reachable again; exporting resumed"
                    );
                }
            }
            Err(status) if retryable(status.code()) => {
                stats.failed_calls += 1;
                if !failing {
                    failing = true;
                    tracing::warn!(
                        "cannot export profiles to {}: {} ({:?}); sampling goes on, retrying with backoff and keeping up to {} MiB",
                        config.endpoint,
                        status.message(),
                        status.code(),
                        config.queue_bytes >> 20
                    );
                }
                let mut random = [0u8; 8];
                crate::profile::fill_random(&mut random);
                let random = u64::from_le_bytes(random) as f64 / u64::MAX as f64;
                retry_at = Some(Instant::now() + backoff.next_delay(random));
            }
            Err(status) => {
                stats.failed_calls += 1;
                stats.dropped += 1;
                queue.pop();
                tracing::error!(
                    "the OTLP collector at {} rejected a profile export: {} ({:?}); dropped it",
                    config.endpoint,
                    status.message(),
                    status.code()
                );
            }
        }
    }
    // Shutting down: one last try for what is queued, no more backoff.
    while let Some(request) = queue.front().cloned() {
        let size = request.encoded_len() as u64;
        match export(&mut client, &metadata, &config, request).await {
            Ok(response) => {
                stats.sent += 1;
                stats.sent_bytes += size;
                log_partial_success(&response);
                queue.pop();
            }
            Err(status) => {
                stats.failed_calls += 1;
                stats.dropped += queue.len() as u64;
                tracing::warn!(
                    "cannot export the last {} profile windows to {} at shutdown: {}",
                    queue.len(),
                    config.endpoint,
                    status.message()
                );
                break;
            }
        }
    }
    stats.dropped += queue.dropped_items;
    stats.queue_bytes = 0;
    progress.send_replace(stats);
    Ok(stats)
}

fn connect(config: &ExportConfig) -> Result<ProfilesServiceClient<Channel>, ExportError> {
    let invalid = |source| ExportError::Endpoint {
        endpoint: config.endpoint.clone(),
        source,
    };
    let mut endpoint = Endpoint::from_shared(config.endpoint.clone())
        .map_err(invalid)?
        .timeout(config.timeout)
        .connect_timeout(config.timeout.min(Duration::from_secs(5)));
    if config.tls() {
        let tls = match &config.ca {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|source| ExportError::ReadCa {
                    path: path.clone(),
                    source,
                })?;
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem))
            }
            None => ClientTlsConfig::new().with_native_roots(),
        };
        endpoint = endpoint.tls_config(tls).map_err(invalid)?;
    }
    // Lazy: a collector that is down at start is retried like any other outage.
    Ok(ProfilesServiceClient::new(endpoint.connect_lazy())
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip))
}

fn metadata(headers: &[(String, String)]) -> Result<MetadataMap, ExportError> {
    let mut map = MetadataMap::new();
    for (key, value) in headers {
        let bad = || ExportError::Metadata(key.clone());
        let name = MetadataKey::from_bytes(key.as_bytes()).map_err(|_| bad())?;
        let value = MetadataValue::try_from(value.as_str()).map_err(|_| bad())?;
        map.insert(name, value);
    }
    Ok(map)
}

async fn export(
    client: &mut ProfilesServiceClient<Channel>,
    metadata: &MetadataMap,
    config: &ExportConfig,
    request: ExportProfilesServiceRequest,
) -> Result<ExportProfilesServiceResponse, tonic::Status> {
    let mut request = tonic::Request::new(request);
    *request.metadata_mut() = metadata.clone();
    request.set_timeout(config.timeout);
    client
        .export(request)
        .await
        .map(tonic::Response::into_inner)
}

/// The codes OTLP says to retry.
fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded
    )
}

fn log_partial_success(response: &ExportProfilesServiceResponse) {
    if let Some(partial) = &response.partial_success
        && (partial.rejected_profiles > 0 || !partial.error_message.is_empty())
    {
        tracing::warn!(
            "the OTLP collector rejected {} profiles of an export: {}",
            partial.rejected_profiles,
            partial.error_message
        );
    }
}
