//! hostprof: an eBPF host-level sampling profiler.
//!
//! Data flows one way, one module per stage:
//! [`sampler`] (kernel samples) → [`procs`] (who and what is mapped) →
//! [`pipeline`] (frames) → [`symbolize`] (names) → [`output`] (files) or
//! [`profile`] (OTLP profiles) → [`export`] (gRPC).
//! [`model`] is the vocabulary they share; [`cli`] wires them for the user,
//! with the agent's layered [`config`]. Every file read on behalf of a
//! process goes through [`files`]; [`input`] reads profiles back from files
//! (`hostprof report`); [`top`] ranks live samples for `hostprof top`.
pub mod cli;
pub mod config;
pub mod export;
pub mod files;
pub mod input;
pub mod model;
pub mod output;
pub mod pipeline;
pub mod privileges;
pub mod procs;
pub mod profile;
pub mod runtime;
pub mod sampler;
pub mod status;
pub mod symbolize;
#[cfg(test)]
mod test_rng;
pub mod top;
pub mod unwind;
