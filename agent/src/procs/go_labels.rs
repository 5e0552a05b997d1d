//! The pprof labels of a goroutine, as the kernel packed them into a
//! sample (`hostprof_common::golang`): each entry `key length: u8, value
//! length: u8 (| VALUE_CUT), key, value`. Keys keep Go's names; what the
//! process wrote is untrusted: an entry the bytes cannot hold ends the
//! list, a key or value that is not UTF-8 is left out, a cut value is cut
//! back to a whole character; each counted under
//! `hostprof_context_refused_total`.
//!
//! ```
//! use hostprof::procs::go_labels::decode;
//! let labels = decode(b"\x05\x05route/cart");
//! assert_eq!(labels[0].0.as_ref(), "route");
//! assert_eq!(labels[0].1.as_ref(), "/cart");
//! ```
use std::sync::Arc;

use hostprof_common::golang::{MAX_KEY, MAX_VALUE, VALUE_CUT};

use super::otel_ctx::{Refusal, count_quietly};

/// `key → value`, each key once (Go's maps and slices have each once;
/// a damaged record keeps the last), in the order the kernel read them.
pub fn decode(mut bytes: &[u8]) -> Vec<(Arc<str>, Arc<str>)> {
    let mut pairs: Vec<(Arc<str>, Arc<str>)> = Vec::new();
    while !bytes.is_empty() {
        let [key_len, value_len, rest @ ..] = bytes else {
            count_quietly(Refusal::GoLabelsTruncated);
            break;
        };
        let (key_len, cut) = (usize::from(*key_len), value_len & VALUE_CUT != 0);
        let value_len = usize::from(value_len & !VALUE_CUT);
        if key_len > MAX_KEY || value_len > MAX_VALUE || rest.len() < key_len + value_len {
            count_quietly(Refusal::GoLabelsTruncated);
            break;
        }
        let (key, rest) = rest.split_at(key_len);
        let (value, rest) = rest.split_at(value_len);
        bytes = rest;
        let Ok(key) = std::str::from_utf8(key) else {
            count_quietly(Refusal::GoLabelsUtf8);
            continue;
        };
        let value = match (std::str::from_utf8(value), cut) {
            (Ok(value), _) => value,
            // Cut inside a character: keep the whole ones before it.
            (Err(err), true) if err.error_len().is_none() => {
                std::str::from_utf8(&value[..err.valid_up_to()]).unwrap_or_default()
            }
            (Err(_), _) => {
                count_quietly(Refusal::GoLabelsUtf8);
                continue;
            }
        };
        if cut {
            count_quietly(Refusal::GoLabelsCut);
        }
        pairs.retain(|(existing, _)| existing.as_ref() != key);
        pairs.push((key.into(), value.into()));
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(bytes: &[u8]) -> Vec<(String, String)> {
        decode(bytes)
            .into_iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    #[test]
    fn reads_every_entry() {
        assert_eq!(
            pairs(b"\x05\x05route/cart\x01\x00k"),
            [
                ("route".into(), "/cart".into()),
                ("k".into(), String::new())
            ]
        );
        assert!(pairs(b"").is_empty());
    }

    #[test]
    fn stops_at_an_entry_the_bytes_cannot_hold() {
        assert_eq!(pairs(b"\x01\x01ab\x05\x05rou"), [("a".into(), "b".into())]);
        assert_eq!(pairs(b"\x01\x01ab\x05"), [("a".into(), "b".into())]);
        // Lengths past the kernel's caps: not the kernel's writing.
        assert!(pairs(b"\xff\x01ab").is_empty());
        assert!(pairs(b"\x01\x7fab").is_empty());
    }

    #[test]
    fn leaves_out_what_is_not_utf8_and_trims_a_cut_value() {
        assert_eq!(
            pairs(b"\x01\x01\xffb\x01\x01ab"),
            [("a".into(), "b".into())]
        );
        assert!(pairs(b"\x01\x01a\xff").is_empty());
        // "é" is two bytes: a value cut after its first keeps what precedes.
        assert_eq!(pairs(b"\x01\x82ax\xc3"), [("a".into(), "x".into())]);
    }

    #[test]
    fn a_key_given_twice_keeps_its_last_value() {
        assert_eq!(pairs(b"\x01\x01ab\x01\x01ac"), [("a".into(), "c".into())]);
    }
}
