//! The OpenTelemetry process context: resource attributes (`service.name`,
//! `service.instance.id`, …) an SDK publishes in a mapping named `OTEL_CTX`
//! for readers outside the process.
//!
//! Layout and protocol follow OTEP 4719 ("Process Context: Sharing Resource
//! Attributes with External Readers", opentelemetry-specification,
//! `oteps/profiles/4719-process-ctx.md` at commit 1377f53b2bc0, 2026-08-19),
//! whose header the reference C writer (open-telemetry/sig-profiling,
//! `process-context/c-and-cpp`) lays out the same way. The header, 32 bytes,
//! little-endian, at the start of the mapping:
//!
//! | offset | field                       | type       |
//! |--------|-----------------------------|------------|
//! | 0      | `signature`                 | `"OTEL_CTX"` (8 bytes, no NUL) |
//! | 8      | `version`                   | `u32`, 2   |
//! | 12     | `payload_size`              | `u32`      |
//! | 16     | `monotonic_published_at_ns` | `u64`, `CLOCK_BOOTTIME`; 0 while being updated |
//! | 24     | `payload`                   | `u64`, address of the payload in the process |
//!
//! The payload is a protobuf `ProcessContext` (package
//! `opentelemetry.proto.processcontext.v1development`: `Resource resource = 1`,
//! `repeated KeyValue attributes = 2`). hostprof-proto has no generated type
//! for that envelope, so its fields are walked here and the resource decoded
//! with the generated `Resource`. A publisher zeroes the timestamp, swaps the payload,
//! then writes a new timestamp; a reader reads the timestamp before and
//! after the payload and keeps the payload only when both are the same and
//! non-zero. The timestamp is also the cache key: while it stays, nothing
//! changed, so a re-check costs one 32-byte read.
//!
//! The extra attributes (field 2) matter to one reader here: the thread
//! context's `threadlocal.attribute_key_map` (OTEP 4947), decoded into a
//! [`KeyMap`] with the resource, so a republished map is picked up the
//! same way.
//!
//! A publisher may be hostile: every field is checked, the payload capped,
//! retries bounded, and each refusal counted by reason ([`refusals`]); the
//! thread records' attributes are refused under the same counter
//! ([`super::thread_attrs`]).
use std::sync::atomic::{AtomicU64, Ordering};

use hostprof_proto::{Message, common::any_value::Value, resource::Resource};

use super::thread_attrs::{self, KeyMap};
use crate::model::{ResourceValue, ServiceResource};

/// Bytes of the header.
pub const HEADER_LEN: usize = 32;
const SIGNATURE: &[u8; 8] = b"OTEL_CTX";
/// The only version the OTEP defines for readers (1 was for development).
const VERSION: u32 = 2;
const PUBLISHED_AT_OFFSET: u64 = 16;

/// Payloads larger than this are refused: a resource is a few hundred
/// bytes, and the agent must not copy megabytes from any process that asks.
pub const MAX_PAYLOAD: u32 = 64 << 10;

/// Reads of header and payload before giving up on a context that keeps
/// changing (or stays at timestamp 0): a publisher in a tight loop costs a
/// bounded number of reads per refresh, and is tried again at the next one.
const ATTEMPTS: usize = 3;

/// The names `/proc/PID/maps` shows for the mapping, by how the writer
/// managed to create and name it (memfd and `prctl` name, `prctl` name
/// only, memfd only). The OTEP asks readers to match the start of the name:
/// a memfd's reads `/memfd:OTEL_CTX (deleted)` once the fd is closed.
const MAPPING_NAMES: [&str; 3] = [
    "[anon_shmem:OTEL_CTX]",
    "[anon:OTEL_CTX]",
    "/memfd:OTEL_CTX",
];

/// Why a process's context was not taken; the order is [`Refusal::ALL`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the OTEL_CTX mapping does not start with its signature")]
    Signature,
    #[error("the OTEL_CTX mapping's version is not 2, the one hostprof reads")]
    Version,
    #[error("the process context's payload is over the 64 KiB cap")]
    TooLarge,
    #[error("the process context's header or payload is not readable memory")]
    Unreadable,
    #[error("the process context kept changing while being read")]
    Unsettled,
    #[error("the process context's payload is not a ProcessContext protobuf")]
    Protobuf,
    #[error("the process context's payload holds text that is not UTF-8")]
    Utf8,
    #[error("OTEL_RESOURCE_ATTRIBUTES in the process's environment is not key=value,…")]
    Environment,
    #[error("threadlocal.attribute_key_map is not an array of at most 256 strings")]
    KeyMap,
    #[error("a thread record's attributes are over the 612-byte cap (640-byte record)")]
    AttrsOverCap,
    #[error("a thread record's attributes are not readable memory")]
    AttrsUnreadable,
    #[error("a thread record's attribute value is not UTF-8")]
    AttrsUtf8,
    #[error("a thread record's attribute key index is past the key map")]
    AttrsUnknownKey,
    #[error("a thread record's attributes end with a partial entry")]
    AttrsTruncated,
    #[error("a goroutine's pprof labels end with a partial entry")]
    GoLabelsTruncated,
    #[error("a goroutine's pprof label key or value is not UTF-8")]
    GoLabelsUtf8,
    #[error("a goroutine's pprof label value was cut at 64 bytes")]
    GoLabelsCut,
    #[error(
        "otel_thread_ctx_v1 is in a library whose code reaches it in no way the loader answers, \
         or at an offset past any TLS block: its threads' records are not read"
    )]
    TlsUnreachable,
    #[error(
        "the process context's threadlocal.schema_version is not one hostprof reads (tls_v1, \
         tlsdesc_v1_dev): its threads' records are not used"
    )]
    Schema,
}

impl Refusal {
    /// Every reason, in the order of [`refusals`].
    pub const ALL: [Refusal; 19] = [
        Refusal::Signature,
        Refusal::Version,
        Refusal::TooLarge,
        Refusal::Unreadable,
        Refusal::Unsettled,
        Refusal::Protobuf,
        Refusal::Utf8,
        Refusal::Environment,
        Refusal::KeyMap,
        Refusal::AttrsOverCap,
        Refusal::AttrsUnreadable,
        Refusal::AttrsUtf8,
        Refusal::AttrsUnknownKey,
        Refusal::AttrsTruncated,
        Refusal::GoLabelsTruncated,
        Refusal::GoLabelsUtf8,
        Refusal::GoLabelsCut,
        Refusal::TlsUnreachable,
        Refusal::Schema,
    ];

    /// The `reason` label of `hostprof_context_refused_total`.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Signature => "signature",
            Refusal::Version => "version",
            Refusal::TooLarge => "too_large",
            Refusal::Unreadable => "unreadable",
            Refusal::Unsettled => "unsettled",
            Refusal::Protobuf => "protobuf",
            Refusal::Utf8 => "utf8",
            Refusal::Environment => "environment",
            Refusal::KeyMap => "key_map",
            Refusal::AttrsOverCap => "attrs_over_cap",
            Refusal::AttrsUnreadable => "attrs_unreadable",
            Refusal::AttrsUtf8 => "attrs_utf8",
            Refusal::AttrsUnknownKey => "attrs_unknown_key",
            Refusal::AttrsTruncated => "attrs_truncated",
            Refusal::GoLabelsTruncated => "go_labels_truncated",
            Refusal::GoLabelsUtf8 => "go_labels_utf8",
            Refusal::GoLabelsCut => "go_labels_cut",
            Refusal::TlsUnreachable => "tls_unreachable",
            Refusal::Schema => "schema",
        }
    }
}

static REFUSED: [AtomicU64; Refusal::ALL.len()] = [const { AtomicU64::new(0) }; Refusal::ALL.len()];

/// Contexts refused since the agent started, by reason, as [`Refusal::ALL`].
pub fn refusals() -> [(&'static str, u64); Refusal::ALL.len()] {
    Refusal::ALL.map(|reason| {
        (
            reason.name(),
            REFUSED[reason as usize].load(Ordering::Relaxed),
        )
    })
}

/// Counts and logs a refusal (pid and reason only: nothing the process wrote).
pub(crate) fn count_refusal(pid: u32, reason: Refusal) {
    REFUSED[reason as usize].fetch_add(1, Ordering::Relaxed);
    tracing::debug!("pid {pid}: process context refused: {reason}");
}

/// Counts a refusal without a log line: for what may come with every
/// sample (a thread record's attributes).
pub(crate) fn count_quietly(reason: Refusal) {
    REFUSED[reason as usize].fetch_add(1, Ordering::Relaxed);
}

/// The header's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub payload_size: u32,
    /// 0 while the publisher is updating the context.
    pub published_at_ns: u64,
    pub payload: u64,
}

/// Checks signature, version and size of a header read from the process.
pub fn parse_header(bytes: &[u8; HEADER_LEN]) -> Result<Header, Refusal> {
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    if &bytes[..8] != SIGNATURE {
        return Err(Refusal::Signature);
    }
    if u32_at(8) != VERSION {
        return Err(Refusal::Version);
    }
    let payload_size = u32_at(12);
    if payload_size > MAX_PAYLOAD {
        return Err(Refusal::TooLarge);
    }
    Ok(Header {
        payload_size,
        published_at_ns: u64_at(PUBLISHED_AT_OFFSET as usize),
        payload: u64_at(24),
    })
}

/// The start address of the process's `OTEL_CTX` mapping in the text of
/// its `/proc/PID/maps`, if it has one.
pub fn locate(maps: &[u8]) -> Option<u64> {
    maps.split(|&byte| byte == b'\n').find_map(|line| {
        let line = std::str::from_utf8(line).ok()?;
        // address perms offset dev inode, then the name (which may hold spaces).
        let name = line.splitn(6, char::is_whitespace).nth(5)?.trim_start();
        if !MAPPING_NAMES.iter().any(|known| name.starts_with(known)) {
            return None;
        }
        let start = line.split('-').next()?;
        u64::from_str_radix(start, 16).ok()
    })
}

/// What one look at a context found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Published at the timestamp already known: nothing to do.
    Unchanged,
    /// A new or republished context.
    Published {
        published_at_ns: u64,
        resource: ServiceResource,
        /// The thread context's key map (empty when none is published).
        keys: KeyMap,
    },
}

/// Reads the context whose header is at `address`, with `read` filling a
/// buffer from the process's memory (false: not readable). `known` is the
/// timestamp of the context read last time: while it stands, only the
/// header is read.
///
/// Each `read` is a system call (`process_vm_readv`), so the reads happen in
/// program order, which is all the OTEP's reader-side barriers ask for.
pub fn read_context(
    read: &mut dyn FnMut(u64, &mut [u8]) -> bool,
    address: u64,
    known: Option<u64>,
) -> Result<Reading, Refusal> {
    for _ in 0..ATTEMPTS {
        let mut bytes = [0u8; HEADER_LEN];
        if !read(address, &mut bytes) {
            return Err(Refusal::Unreadable);
        }
        let header = parse_header(&bytes)?;
        if header.published_at_ns == 0 {
            continue;
        }
        if known == Some(header.published_at_ns) {
            return Ok(Reading::Unchanged);
        }
        let mut payload = vec![0u8; header.payload_size as usize];
        let copied = read(header.payload, &mut payload);
        let mut after = [0u8; 8];
        if !read(address + PUBLISHED_AT_OFFSET, &mut after) {
            return Err(Refusal::Unreadable);
        }
        if u64::from_le_bytes(after) != header.published_at_ns {
            // Republished meanwhile: the pointer may have moved, so even a
            // failed payload read is worth another attempt.
            continue;
        }
        if !copied {
            return Err(Refusal::Unreadable);
        }
        let (resource, keys) = decode_context(&payload)?;
        return Ok(Reading::Published {
            published_at_ns: header.published_at_ns,
            resource,
            keys,
        });
    }
    Err(Refusal::Unsettled)
}

/// The resource and the thread context's key map of a `ProcessContext`
/// payload. A key map that is not one is refused (counted, without
/// `pid`) and left empty: the resource still stands.
pub fn decode_context(payload: &[u8]) -> Result<(ServiceResource, KeyMap), Refusal> {
    let resource = decode_payload(payload)?;
    let (_, extra) = fields(payload).ok_or(Refusal::Protobuf)?;
    let keys = thread_attrs::key_map(&extra).unwrap_or_else(|reason| {
        count_quietly(reason);
        KeyMap::default()
    });
    Ok((resource, keys))
}

/// The resource attributes of a `ProcessContext` payload. Scalar values are
/// kept; arrays, maps and bytes are dropped (no resource convention uses
/// them). The extra `attributes` (field 2) are for thread-context readers,
/// not the resource, and are not kept here ([`decode_context`]).
pub fn decode_payload(payload: &[u8]) -> Result<ServiceResource, Refusal> {
    // A message field seen more than once merges, as protobuf says; the
    // concatenation of its pieces decodes as that merge.
    let (resource, _) = fields(payload).ok_or(Refusal::Protobuf)?;
    let resource = Resource::decode(&*resource).map_err(|err| {
        // prost checks strings as it decodes; its message says so.
        if err.to_string().contains("UTF-8") {
            Refusal::Utf8
        } else {
            Refusal::Protobuf
        }
    })?;
    let attributes = resource
        .attributes
        .into_iter()
        .filter(|kv| !kv.key.is_empty())
        .filter_map(|kv| {
            let value = match kv.value?.value? {
                Value::StringValue(text) => ResourceValue::Str(text),
                Value::IntValue(number) => ResourceValue::Int(number),
                Value::BoolValue(flag) => ResourceValue::Bool(flag),
                Value::DoubleValue(number) => ResourceValue::Double(number.to_bits()),
                _ => return None,
            };
            Some((kv.key, value))
        });
    Ok(ServiceResource::new(attributes))
}

/// The bytes of every field 1 (`resource`) of a `ProcessContext`, joined,
/// and each field 2 (an extra attribute, a `KeyValue`); `None` when the
/// bytes are not protobuf's wire format.
fn fields(mut bytes: &[u8]) -> Option<(Vec<u8>, Vec<&[u8]>)> {
    let mut resource = Vec::new();
    let mut extra = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let (field, wire_type) = (key >> 3, key & 7);
        let skip = match wire_type {
            0 => {
                varint(&mut bytes)?;
                0
            }
            1 => 8,
            2 => usize::try_from(varint(&mut bytes)?).ok()?,
            5 => 4,
            // Groups (3, 4) are long deprecated; nothing else exists.
            _ => return None,
        };
        if field == 0 || skip > bytes.len() {
            return None;
        }
        let (value, rest) = bytes.split_at(skip);
        if field == 1 {
            if wire_type != 2 {
                return None;
            }
            resource.extend_from_slice(value);
        }
        if field == 2 && wire_type == 2 {
            extra.push(value);
        }
        bytes = rest;
    }
    Some((resource, extra))
}

/// A base-128 varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (at, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * at);
        if byte & 0x80 == 0 {
            *bytes = &bytes[at + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
pub(super) mod tests;
