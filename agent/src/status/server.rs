//! The optional Prometheus endpoint: `GET /metrics` on `--metrics-addr`.
//!
//! hyper's HTTP/1 server does the parsing (with a header timeout), and a
//! semaphore caps concurrent connections, so a misbehaving scraper cannot
//! make the agent grow.
use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, watch},
};

use super::Snapshot;

const MAX_CONNECTIONS: usize = 8;
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `addr`; the error says which setting to change.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|err| {
        anyhow::anyhow!(
            "cannot serve metrics on {addr}: {err}; choose another --metrics-addr \
             (or HOSTPROF_METRICS_ADDR)"
        )
    })
}

/// Serves the latest snapshot until the task is dropped.
pub async fn serve(listener: TcpListener, snapshots: watch::Receiver<Snapshot>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::debug!("metrics endpoint: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let snapshots = snapshots.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let snapshot = *snapshots.borrow();
                async move { Ok::<_, Infallible>(respond(&request, &snapshot)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            // A scraper that stalls mid-body is cut off too.
            let _ = tokio::time::timeout(HEADER_TIMEOUT * 2, connection).await;
            drop(permit);
        });
    }
}

fn respond(request: &Request<Incoming>, snapshot: &Snapshot) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            snapshot.prometheus(),
        ),
        (&Method::GET, "/") => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "hostprof agent: metrics at /metrics\n".to_owned(),
        ),
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: try /metrics\n".to_owned(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn serves_the_latest_snapshot_and_rejects_the_rest() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = watch::channel(Snapshot::default());
        let server = tokio::spawn(serve(listener, rx));
        let mut snapshot = Snapshot::default();
        snapshot.reader.samples = 1234;
        tx.send(snapshot).unwrap();

        let response = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        assert!(response.contains("text/plain; version=0.0.4"), "{response}");
        assert!(
            response.contains("\nhostprof_samples_total 1234\n"),
            "{response}"
        );

        let response = get(addr, "GET /secret HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 404"), "{response}");
        let response = get(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 405"), "{response}");
        let response = get(addr, "\x00\x01garbage\r\n\r\n").await;
        assert!(
            response.is_empty() || response.starts_with("HTTP/1.1 400"),
            "{response}"
        );
        server.abort();
    }

    #[tokio::test]
    async fn a_taken_port_is_one_clear_error() {
        let first = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let err = bind(first.local_addr().unwrap())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("choose another --metrics-addr"), "{err}");
        assert!(!err.contains('\n'));
    }
}
