//! The header and payload parser against fake process memory: what the OTEP
//! asks of a reader, and what hostile publishers try.
use hostprof_proto::{
    Message,
    common::{AnyValue, KeyValue, any_value::Value},
    resource::Resource,
};

use super::*;

const HEADER_AT: u64 = 0x7000_0000;
const PAYLOAD_AT: u64 = 0x7100_0000;

/// Process memory: regions at fixed addresses; a read must fit in one.
#[derive(Default)]
struct Memory {
    regions: Vec<(u64, Vec<u8>)>,
    reads: usize,
}

impl Memory {
    fn with(header: [u8; HEADER_LEN], payload: &[u8]) -> Self {
        Memory {
            regions: vec![(HEADER_AT, header.to_vec()), (PAYLOAD_AT, payload.to_vec())],
            reads: 0,
        }
    }

    fn read(&mut self, address: u64, buf: &mut [u8]) -> bool {
        self.reads += 1;
        self.regions.iter().any(|(start, bytes)| {
            let Some(offset) = address.checked_sub(*start) else {
                return false;
            };
            let Some(source) = bytes.get(offset as usize..offset as usize + buf.len()) else {
                return false;
            };
            buf.copy_from_slice(source);
            true
        })
    }

    fn header_mut(&mut self) -> &mut Vec<u8> {
        &mut self.regions[0].1
    }
}

pub(crate) fn header(
    version: u32,
    size: u32,
    published_at_ns: u64,
    payload: u64,
) -> [u8; HEADER_LEN] {
    let mut bytes = [0u8; HEADER_LEN];
    bytes[..8].copy_from_slice(b"OTEL_CTX");
    bytes[8..12].copy_from_slice(&version.to_le_bytes());
    bytes[12..16].copy_from_slice(&size.to_le_bytes());
    bytes[16..24].copy_from_slice(&published_at_ns.to_le_bytes());
    bytes[24..].copy_from_slice(&payload.to_le_bytes());
    bytes
}

pub(crate) fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

/// A `ProcessContext`: the resource (field 1) between two extra attributes
/// (field 2), as a writer may order them.
pub(crate) fn payload(attributes: Vec<KeyValue>) -> Vec<u8> {
    let resource = Resource {
        attributes,
        ..Default::default()
    }
    .encode_to_vec();
    let extra = text("threadlocal.schema_version", "1").encode_to_vec();
    let mut bytes = Vec::new();
    for (tag, body) in [(0x12, &extra), (0x0a, &resource), (0x12, &extra)] {
        bytes.push(tag);
        let mut len = body.len();
        while len >= 0x80 {
            bytes.push((len as u8) | 0x80);
            len >>= 7;
        }
        bytes.push(len as u8);
        bytes.extend_from_slice(body);
    }
    bytes
}

fn read(memory: &mut Memory, known: Option<u64>) -> Result<Reading, Refusal> {
    read_context(
        &mut |address, buf| memory.read(address, buf),
        HEADER_AT,
        known,
    )
}

#[test]
fn reads_a_published_context_then_only_its_header() {
    let bytes = payload(vec![
        text("service.name", "checkout"),
        text("service.instance.id", "abc-1"),
        KeyValue {
            key: "process.pid".into(),
            value: Some(AnyValue {
                value: Some(Value::IntValue(42)),
            }),
            ..Default::default()
        },
    ]);
    let mut memory = Memory::with(header(2, bytes.len() as u32, 77, PAYLOAD_AT), &bytes);
    let Ok(Reading::Published {
        published_at_ns,
        resource,
        ..
    }) = read(&mut memory, None)
    else {
        panic!("not read");
    };
    assert_eq!(published_at_ns, 77);
    assert_eq!(resource.get("service.name"), Some("checkout"));
    assert_eq!(resource.get("service.instance.id"), Some("abc-1"));
    assert!(
        resource
            .attributes
            .contains(&("process.pid".into(), ResourceValue::Int(42)))
    );
    // The extra attributes are not the resource's.
    assert_eq!(resource.get("threadlocal.schema_version"), None);
    // Header, payload, timestamp again.
    assert_eq!(memory.reads, 3);

    memory.reads = 0;
    assert_eq!(read(&mut memory, Some(77)), Ok(Reading::Unchanged));
    assert_eq!(memory.reads, 1, "an unchanged context costs one read");
}

#[test]
fn a_republished_context_is_read_again() {
    let first = payload(vec![text("service.name", "a")]);
    let mut memory = Memory::with(header(2, first.len() as u32, 10, PAYLOAD_AT), &first);
    assert!(matches!(
        read(&mut memory, None),
        Ok(Reading::Published { .. })
    ));
    let second = payload(vec![text("service.name", "b")]);
    memory.regions[1].1 = second.clone();
    *memory.header_mut() = header(2, second.len() as u32, 11, PAYLOAD_AT).to_vec();
    let Ok(Reading::Published { resource, .. }) = read(&mut memory, Some(10)) else {
        panic!("republished context not read");
    };
    assert_eq!(resource.get("service.name"), Some("b"));
}

#[test]
fn refuses_bad_signature_version_and_size() {
    let mut bad = header(2, 4, 1, PAYLOAD_AT);
    bad[0] = b'o';
    assert_eq!(parse_header(&bad), Err(Refusal::Signature));
    assert_eq!(
        parse_header(&header(1, 4, 1, PAYLOAD_AT)),
        Err(Refusal::Version)
    );
    assert_eq!(
        parse_header(&header(3, 4, 1, PAYLOAD_AT)),
        Err(Refusal::Version)
    );
    // 100 MiB: refused from the header, the payload never read.
    let mut memory = Memory::with(header(2, 100 << 20, 1, PAYLOAD_AT), &[]);
    assert_eq!(read(&mut memory, None), Err(Refusal::TooLarge));
    assert_eq!(memory.reads, 1);
    assert!(parse_header(&header(2, MAX_PAYLOAD, 1, PAYLOAD_AT)).is_ok());
}

#[test]
fn refuses_a_payload_in_unmapped_memory_or_no_header() {
    let mut memory = Memory::with(header(2, 16, 5, 0xdead_0000), &[]);
    assert_eq!(read(&mut memory, None), Err(Refusal::Unreadable));
    let mut memory = Memory::default();
    assert_eq!(read(&mut memory, None), Err(Refusal::Unreadable));
}

#[test]
fn refuses_invalid_protobuf_and_utf8() {
    let garbage = [0xff_u8; 12];
    let mut memory = Memory::with(header(2, 12, 5, PAYLOAD_AT), &garbage);
    assert_eq!(read(&mut memory, None), Err(Refusal::Protobuf));
    // A length past the end; a resource that is not a message.
    assert_eq!(decode_payload(&[0x0a, 0x7f, 1]), Err(Refusal::Protobuf));
    assert_eq!(decode_payload(&[0x08, 0x01]), Err(Refusal::Protobuf));
    assert_eq!(
        decode_payload(&[0x0a, 2, 0xff, 0xff]),
        Err(Refusal::Protobuf)
    );
    // Empty: a context with no attributes, which is no refusal.
    assert_eq!(decode_payload(&[]), Ok(ServiceResource::default()));
    // service.name = "\xff\xfe", encoded by hand: the encoder would not.
    let key = b"service.name";
    let mut value = vec![0x0a, 2, 0xff, 0xfe]; // AnyValue.string_value
    let mut key_value = vec![0x0a, key.len() as u8];
    key_value.extend_from_slice(key);
    key_value.extend([0x12, value.len() as u8]);
    key_value.append(&mut value);
    let mut resource = vec![0x0a, key_value.len() as u8];
    resource.extend(key_value);
    let mut context = vec![0x0a, resource.len() as u8];
    context.extend(resource);
    assert_eq!(decode_payload(&context), Err(Refusal::Utf8));
}

#[test]
fn gives_up_on_a_context_that_never_settles() {
    // Being updated for good: timestamp 0 at every look.
    let mut memory = Memory::with(header(2, 0, 0, PAYLOAD_AT), &[]);
    assert_eq!(read(&mut memory, None), Err(Refusal::Unsettled));
    assert_eq!(memory.reads, ATTEMPTS);
    // Republished between every two reads (a tight loop).
    let bytes = payload(vec![text("service.name", "busy")]);
    let memory = std::cell::RefCell::new(Memory::with(
        header(2, bytes.len() as u32, 1, PAYLOAD_AT),
        &bytes,
    ));
    let mut stamp = 1u64;
    let mut racing = |address: u64, buf: &mut [u8]| {
        let mut memory = memory.borrow_mut();
        stamp += 1;
        memory.header_mut()[16..24].copy_from_slice(&stamp.to_le_bytes());
        memory.read(address, buf)
    };
    assert_eq!(
        read_context(&mut racing, HEADER_AT, None),
        Err(Refusal::Unsettled)
    );
    assert_eq!(memory.borrow().reads, 3 * ATTEMPTS, "bounded");
}

#[test]
fn locates_each_name_the_otep_lists() {
    let maps = b"\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 123  /usr/bin/app
7f0000000000-7f0000001000 rw-p 00000000 00:00 0    [anon:OTEL_CTXX]
7f0000002000-7f0000003000 r--p 00000000 08:01 9    /tmp/OTEL_CTX
7f1000000000-7f1000001000 rw-p 00000000 00:01 77   /memfd:OTEL_CTX (deleted)
";
    assert_eq!(locate(maps), Some(0x7f10_0000_0000));
    let maps = b"7f2000000000-7f2000001000 rw-s 00000000 00:01 5 [anon_shmem:OTEL_CTX]\n";
    assert_eq!(locate(maps), Some(0x7f20_0000_0000));
    let maps = b"7f3000000000-7f3000002000 rw-p 00000000 00:00 0 [anon:OTEL_CTX]\n";
    assert_eq!(locate(maps), Some(0x7f30_0000_0000));
    assert_eq!(
        locate(b"7f3000000000-7f3000002000 rw-p 00000000 00:00 0\n"),
        None
    );
    assert_eq!(locate(b""), None);
}

#[test]
fn refusals_are_counted_by_reason() {
    let before = refusals();
    count_refusal(1, Refusal::TooLarge);
    let after = refusals();
    let reasons: Vec<&str> = after.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        reasons,
        [
            "signature",
            "version",
            "too_large",
            "unreadable",
            "unsettled",
            "protobuf",
            "utf8",
            "environment",
            "key_map",
            "attrs_over_cap",
            "attrs_unreadable",
            "attrs_utf8",
            "attrs_unknown_key",
            "attrs_truncated",
            "go_labels_truncated",
            "go_labels_utf8",
            "go_labels_cut",
            "tls_unreachable",
            "schema",
        ]
    );
    assert!(after[2].1 > before[2].1);
}
