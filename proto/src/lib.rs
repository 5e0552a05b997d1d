//! Generated protobuf types for hostprof: OTLP profiles (opentelemetry-proto
//! v1.11.0, `v1development`, wire-identical to v1.10.0) with the tonic client
//! and server of `ProfilesService`, and pprof's `profile.proto`.
//!
//! Only generated code lives here; the schema files are vendored in `proto/`
//! (see `proto/SOURCE.txt`).
//!
//! ```
//! use hostprof_proto::profiles::ProfilesDictionary;
//! let dictionary = ProfilesDictionary { string_table: vec![String::new()], ..Default::default() };
//! assert_eq!(dictionary.string_table[0], "");
//! ```

/// The `opentelemetry.proto.*` packages, nested as in the schema.
// Generated code: its doc comments come from the .proto files as written.
#[allow(clippy::all, clippy::pedantic)]
pub mod opentelemetry {
    pub mod proto {
        pub mod common {
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.common.v1.rs"
                ));
            }
        }
        pub mod resource {
            pub mod v1 {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.resource.v1.rs"
                ));
            }
        }
        pub mod profiles {
            pub mod v1development {
                include!(concat!(
                    env!("OUT_DIR"),
                    "/opentelemetry.proto.profiles.v1development.rs"
                ));
            }
        }
        pub mod collector {
            pub mod profiles {
                pub mod v1development {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.collector.profiles.v1development.rs"
                    ));
                }
            }
        }
    }
}

/// pprof's `perftools.profiles` package.
#[allow(clippy::all, clippy::pedantic)]
pub mod pprof {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

pub use opentelemetry::proto::collector::profiles::v1development as collector;
pub use opentelemetry::proto::common::v1 as common;
pub use opentelemetry::proto::profiles::v1development as profiles;
pub use opentelemetry::proto::resource::v1 as resource;
pub use prost::Message;
