//! A minimal OTLP profiles collector that counts what it receives and keeps
//! nothing: the sink `cargo xtask soak` points `hostprof agent` at.
//!
//! `otlp_sink [ADDR]` (default `127.0.0.1:0`) prints `listening on ADDR`,
//! then one line per export request: `request BYTES SAMPLES`.
use std::io::Write;

use hostprof_proto::{
    Message,
    collector::{
        ExportProfilesServiceRequest, ExportProfilesServiceResponse,
        profiles_service_server::{ProfilesService, ProfilesServiceServer},
    },
};
use tonic::codec::CompressionEncoding;

struct Sink;

#[tonic::async_trait]
impl ProfilesService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        let request = request.into_inner();
        let samples: usize = request
            .resource_profiles
            .iter()
            .flat_map(|group| &group.scope_profiles)
            .flat_map(|scope| &scope.profiles)
            .map(|profile| profile.samples.len())
            .sum();
        let mut out = std::io::stdout().lock();
        // The reader may be gone; the sink keeps accepting regardless.
        let _ = writeln!(out, "request {} {samples}", request.encoded_len());
        let _ = out.flush();
        Ok(tonic::Response::new(
            ExportProfilesServiceResponse::default(),
        ))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let service = ProfilesServiceServer::new(Sink).accept_compressed(CompressionEncoding::Gzip);
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await?;
    Ok(())
}
