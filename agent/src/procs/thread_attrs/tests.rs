//! The key map and attribute decoders against what the OTEP allows and
//! what a hostile writer may publish.
use hostprof_proto::common::{AnyValue, ArrayValue, KeyValue, any_value::Value};

use super::*;
use crate::procs::otel_ctx::refusals;

fn refused(reason: &str) -> u64 {
    refusals()
        .iter()
        .find(|(name, _)| *name == reason)
        .map(|(_, count)| *count)
        .expect("a known reason")
}

fn string(text: &str) -> AnyValue {
    AnyValue {
        value: Some(Value::StringValue(text.into())),
    }
}

fn map_of(values: Vec<AnyValue>) -> Vec<u8> {
    KeyValue {
        key: KEY_MAP.into(),
        value: Some(AnyValue {
            value: Some(Value::ArrayValue(ArrayValue { values })),
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn pairs(attributes: &Attributes) -> Vec<(&str, &str)> {
    attributes
        .pairs
        .iter()
        .map(|(key, value)| (key.as_ref(), value.as_ref()))
        .collect()
}

#[test]
fn reads_the_key_map_among_other_extra_attributes() {
    let schema = KeyValue {
        key: "threadlocal.schema_version".into(),
        value: Some(string("tls_v1")),
        ..Default::default()
    }
    .encode_to_vec();
    let map = map_of(vec![
        string("http.route"),
        AnyValue {
            value: Some(Value::IntValue(7)),
        },
        string("user.id"),
    ]);
    let keys = key_map(&[&schema, &map, &schema]).expect("a key map");
    assert_eq!(keys.len(), 3);
    // The entry that is no string names nothing; the next keeps index 2.
    let attributes = decode(b"\x00\x02/a\x01\x01x\x02\x02u1", &keys);
    assert_eq!(
        pairs(&attributes),
        [("http.route", "/a"), ("user.id", "u1")]
    );
    assert!(!attributes.unknown_key);
    // No key map published: nothing named, nothing refused; the schema
    // is kept.
    let keys = key_map(&[&schema]).expect("no key map");
    assert!(keys.is_empty());
    assert_eq!(keys.schema(), Some("tls_v1"));
}

#[test]
fn refuses_key_maps_too_long_or_of_the_wrong_type() {
    let huge = map_of((0..100_000).map(|i| string(&format!("k{i}"))).collect());
    assert!(huge.len() > 500_000);
    assert_eq!(key_map(&[&huge]), Err(Refusal::KeyMap));
    let full = map_of((0..256).map(|i| string(&format!("k{i}"))).collect());
    assert_eq!(key_map(&[&full]).map(|keys| keys.len()), Ok(256));
    let scalar = KeyValue {
        key: KEY_MAP.into(),
        value: Some(string("http.route")),
        ..Default::default()
    }
    .encode_to_vec();
    assert_eq!(key_map(&[&scalar]), Err(Refusal::KeyMap));
    // A key map whose entries are not UTF-8 is damaged, not skipped.
    let mut bad = map_of(vec![string("http.route")]);
    let at = bad.len() - 2;
    bad[at] = 0xff;
    assert_eq!(key_map(&[&bad]), Err(Refusal::KeyMap));
}

#[test]
fn the_last_value_of_a_key_wins() {
    let keys = KeyMap::new(["http.route", "http.method"]);
    let attributes = decode(b"\x00\x02/a\x01\x03GET\x00\x02/b", &keys);
    assert_eq!(
        pairs(&attributes),
        [("http.method", "GET"), ("http.route", "/b")]
    );
    assert_eq!(decode(b"", &keys), Attributes::default());
}

#[test]
fn hostile_entries_are_skipped_and_counted() {
    let keys = KeyMap::new(["http.route"]);

    let before = refused("attrs_utf8");
    let attributes = decode(b"\x00\x02\xff\xfe\x00\x02/a", &keys);
    assert_eq!(pairs(&attributes), [("http.route", "/a")]);
    assert!(refused("attrs_utf8") > before);

    // An index past the map: skipped, and the map is to be read again.
    let before = refused("attrs_unknown_key");
    let attributes = decode(b"\x05\x01x\x00\x02/a", &keys);
    assert_eq!(pairs(&attributes), [("http.route", "/a")]);
    assert!(attributes.unknown_key);
    assert!(refused("attrs_unknown_key") > before);
    // No key map at all: every index is unknown.
    assert!(decode(b"\x00\x02/a", &KeyMap::default()).unknown_key);
    // The look before decoding sees the same.
    assert!(names_unknown_key(b"\x00\x02/a\x05\x01x", &keys));
    assert!(names_unknown_key(b"\x00\x02/a", &KeyMap::default()));
    assert!(!names_unknown_key(b"\x00\x02/a\x00\x01b", &keys));
    // An index after a cut-off entry is never decoded: not unknown.
    assert!(!names_unknown_key(b"\x00\x09/a\x05\x01x", &keys));
    assert!(!names_unknown_key(b"", &keys));

    // A length past the end, or a lone key byte: parsing stops there.
    let before = refused("attrs_truncated");
    assert_eq!(
        pairs(&decode(b"\x00\x02/a\x00\xff/b", &keys)),
        [("http.route", "/a")]
    );
    assert_eq!(
        pairs(&decode(b"\x00\x02/a\x00", &keys)),
        [("http.route", "/a")]
    );
    assert!(refused("attrs_truncated") >= before + 2);
}

#[test]
fn any_bytes_decode_within_their_length() {
    // Every byte pattern a record may hold, up to the kernel's cap: no
    // panic, no value longer than the input.
    let keys = KeyMap::new((0..256).map(|i| format!("k{i}")));
    let mut rng = crate::test_rng::XorShift::new(0x2545_f491_4f6c_dd1d);
    for round in 0..2000 {
        let len = round % (hostprof_common::trace::MAX_ATTRS + 1);
        let bytes = rng.bytes(len);
        let attributes = decode(&bytes, &keys);
        let total: usize = attributes
            .pairs
            .iter()
            .map(|(_, value)| value.len() + 2)
            .sum();
        assert!(total <= len);
    }
}

#[test]
fn kernel_refusals_are_counted() {
    let before = refused("attrs_over_cap");
    count_kernel_refusal(hostprof_common::trace::attrs::OVER_CAP);
    assert!(refused("attrs_over_cap") > before);
    let before = refused("attrs_unreadable");
    count_kernel_refusal(hostprof_common::trace::attrs::UNREADABLE);
    assert!(refused("attrs_unreadable") > before);
}

#[test]
fn a_schema_other_than_the_oteps_is_foreign() {
    let schema = |value: AnyValue| {
        KeyValue {
            key: SCHEMA_VERSION.into(),
            value: Some(value),
            ..Default::default()
        }
        .encode_to_vec()
    };
    let map = map_of(vec![string("http.route")]);
    let read = |extra: &[&[u8]]| key_map(extra).expect("a key map");
    // None named: read as the OTEP's.
    assert!(!read(&[&map]).foreign_schema());
    for known in KNOWN_SCHEMAS {
        let keys = read(&[&schema(string(known)), &map]);
        assert_eq!(keys.schema(), Some(known));
        assert!(!keys.foreign_schema(), "{known}");
    }
    // A Go SDK's, a later version's, one that is no string; with or
    // without a key map.
    assert!(read(&[&schema(string("go_pprof_labels_v1"))]).foreign_schema());
    assert!(read(&[&map, &schema(string("tls_v2"))]).foreign_schema());
    let number = AnyValue {
        value: Some(Value::IntValue(1)),
    };
    assert!(read(&[&schema(number), &map]).foreign_schema());
}
