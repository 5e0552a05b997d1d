//! Compiles the vendored `.proto` files with protox (pure Rust, so no system
//! `protoc` is needed) and generates prost messages plus the tonic client and
//! server of `ProfilesService`.
use std::path::Path;

const PROTOS: &[&str] = &[
    "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
    "perftools/profile.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new("proto");
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(PROTOS, [root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
