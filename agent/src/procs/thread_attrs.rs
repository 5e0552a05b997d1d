//! The attributes of an OpenTelemetry thread-context record (OTEP 4947),
//! named by the process context's `threadlocal.attribute_key_map`.
//!
//! The kernel copies a record's `attrs-data` (at most
//! `hostprof_common::trace::MAX_ATTRS` bytes) with the sample; here each
//! entry, `key index: u8, length: u8, value: [u8; length]` (UTF-8),
//! becomes `key → value` under the name the key map gives its index. As
//! the OTEP asks: entries are packed, parsing stops at an entry the bytes
//! cannot hold whole, an index past the map is skipped (and the map read
//! again: [`Attributes::unknown_key`]), and a key given twice keeps its
//! last value.
//!
//! ```
//! use hostprof::procs::thread_attrs::{KeyMap, decode};
//! let keys = KeyMap::new(["http.route", "http.method"]);
//! let attributes = decode(b"\x00\x06/cart/\x01\x03GET", &keys);
//! assert_eq!(attributes.pairs[0].1.as_ref(), "/cart/");
//! assert_eq!(attributes.pairs[1].0.as_ref(), "http.method");
//! ```
use std::sync::Arc;

use hostprof_proto::{
    Message,
    common::{KeyValue, any_value::Value},
};

use super::otel_ctx::{Refusal, count_quietly};

/// The process context's extra attribute that names the key indexes.
pub const KEY_MAP: &str = "threadlocal.attribute_key_map";

/// The process context's extra attribute that says which format the
/// thread context is in (OTEP 4947: "type and version of the schema").
pub const SCHEMA_VERSION: &str = "threadlocal.schema_version";

/// The schemas whose records are the OTEP's, as hostprof reads them: the
/// OTEP's own (`tls_v1`) and its experimental name (`tlsdesc_v1_dev`).
/// Another (a Go SDK's `go_pprof_labels_v1`, a later version) says the
/// thread-local records are not in this format, or not there at all.
pub const KNOWN_SCHEMAS: [&str; 2] = ["tls_v1", "tlsdesc_v1_dev"];

/// Key indexes are one byte: a map has at most this many entries.
pub const MAX_KEYS: usize = 256;

/// Attribute names by key index; an index whose entry is not a string
/// names nothing (the indexes after it keep their place). With the
/// schema the process context names, if any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyMap {
    keys: Vec<Option<Arc<str>>>,
    schema: Option<Arc<str>>,
}

impl KeyMap {
    pub fn new<S: Into<Arc<str>>>(keys: impl IntoIterator<Item = S>) -> Self {
        KeyMap {
            keys: keys.into_iter().map(|key| Some(key.into())).collect(),
            schema: None,
        }
    }

    /// The map with the schema the context names.
    pub fn with_schema(self, schema: Option<Arc<str>>) -> Self {
        KeyMap { schema, ..self }
    }

    /// The schema the context names, if it names one.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// Whether the context names a schema other than the OTEP's: its
    /// threads' records are not read as the OTEP's.
    pub fn foreign_schema(&self) -> bool {
        self.schema()
            .is_some_and(|schema| !KNOWN_SCHEMAS.contains(&schema))
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn get(&self, index: u8) -> Option<&Arc<str>> {
        self.keys.get(usize::from(index))?.as_ref()
    }
}

/// The key map among a process context's extra attributes (each the bytes
/// of a `KeyValue`); empty when none is published. A map of more than
/// [`MAX_KEYS`] entries, or not an array, is refused whole: its indexes
/// cannot be what the writer meant.
pub fn key_map(extra: &[&[u8]]) -> Result<KeyMap, Refusal> {
    let mut found = None;
    let mut schema = None;
    for bytes in extra {
        // Only the key map's entry needs decoding; another extra attribute
        // that is no `KeyValue` is not ours to refuse.
        let Ok(attribute) = KeyValue::decode(*bytes) else {
            if mentions_key_map(bytes) {
                return Err(Refusal::KeyMap);
            }
            continue;
        };
        if attribute.key == KEY_MAP {
            // The last one wins, as for any repeated key.
            found = Some(attribute);
        } else if attribute.key == SCHEMA_VERSION {
            // Anything but a string names a schema nobody knows.
            schema = Some(match attribute.value.and_then(|value| value.value) {
                Some(Value::StringValue(schema)) => Arc::from(schema),
                _ => Arc::from("(not a string)"),
            });
        }
    }
    let Some(attribute) = found else {
        return Ok(KeyMap::default().with_schema(schema));
    };
    let Some(Value::ArrayValue(array)) = attribute.value.and_then(|value| value.value) else {
        return Err(Refusal::KeyMap);
    };
    if array.values.len() > MAX_KEYS {
        return Err(Refusal::KeyMap);
    }
    let keys = array
        .values
        .into_iter()
        .map(|value| match value.value {
            Some(Value::StringValue(key)) if !key.is_empty() => Some(Arc::from(key)),
            _ => None,
        })
        .collect();
    Ok(KeyMap { keys, schema })
}

/// Whether undecodable `KeyValue` bytes start with the key map's key
/// (field 1, length-delimited): a damaged key map, rather than some
/// other attribute.
fn mentions_key_map(bytes: &[u8]) -> bool {
    bytes.len() > 2
        && bytes[0] == 0x0a
        && bytes[2..].starts_with(KEY_MAP.as_bytes())
        && usize::from(bytes[1]) == KEY_MAP.len()
}

/// A record's attributes, named.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// `key → value`, each key once (its last value), in record order.
    pub pairs: Vec<(Arc<str>, Arc<str>)>,
    /// An index past the map was seen: the map may have grown since it
    /// was read, so read it again.
    pub unknown_key: bool,
}

/// Names the entries of `bytes` (a record's `attrs-data`) with `keys`,
/// counting what is refused (`hostprof_context_refused_total`).
pub fn decode(mut bytes: &[u8], keys: &KeyMap) -> Attributes {
    let mut attributes = Attributes::default();
    while !bytes.is_empty() {
        let [index, length, rest @ ..] = bytes else {
            count_quietly(Refusal::AttrsTruncated);
            break;
        };
        let Some(value) = rest.get(..usize::from(*length)) else {
            count_quietly(Refusal::AttrsTruncated);
            break;
        };
        bytes = &rest[usize::from(*length)..];
        let Some(key) = keys.get(*index) else {
            count_quietly(Refusal::AttrsUnknownKey);
            attributes.unknown_key |= usize::from(*index) >= keys.len();
            continue;
        };
        let Ok(value) = std::str::from_utf8(value) else {
            count_quietly(Refusal::AttrsUtf8);
            continue;
        };
        attributes.pairs.retain(|(existing, _)| existing != key);
        attributes.pairs.push((key.clone(), value.into()));
    }
    attributes
}

/// Whether `bytes` name a key index past `keys` (the map may have grown
/// since it was read): a walk of the entries, nothing decoded or counted.
pub fn names_unknown_key(mut bytes: &[u8], keys: &KeyMap) -> bool {
    while let [index, length, rest @ ..] = bytes {
        if usize::from(*index) >= keys.len() {
            return true;
        }
        let Some(rest) = rest.get(usize::from(*length)..) else {
            return false;
        };
        bytes = rest;
    }
    false
}

/// Counts a record not used: its process's context names another schema.
pub fn count_foreign_record() {
    count_quietly(Refusal::Schema);
}

/// Counts a record whose attributes the kernel did not copy
/// (`hostprof_common::trace::Link::attrs_refused`).
pub fn count_kernel_refusal(refused: u8) {
    match refused {
        hostprof_common::trace::attrs::OVER_CAP => count_quietly(Refusal::AttrsOverCap),
        hostprof_common::trace::attrs::UNREADABLE => count_quietly(Refusal::AttrsUnreadable),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
