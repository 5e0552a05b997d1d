//! External strings (characters outside V8's heap, as node's own modules'
//! sources are, in the binary): read through the data pointer V8 keeps
//! next to the embedder's resource; an "uncached" one, which has none, is
//! not read.
use super::*;

/// An external string at `at` with instance type `kind` and `text` at
/// `chars` (its resource's data, which V8 copies into the string).
fn external(heap: &mut Builder, at: u64, kind: u16, chars: u64, text: &[u8]) -> u64 {
    let map = heap.map(at + 0x40, kind);
    heap.object(at, map);
    let length = (at - BASE) as usize + 12;
    let count = if kind & 8 == 8 {
        text.len()
    } else {
        text.len() / 2
    };
    heap.bytes[length..length + 4].copy_from_slice(&(count as u32).to_le_bytes());
    // The resource (an object of the embedder's, never read), then its data.
    heap.word(at + 16, BASE + 0x7000);
    heap.word(at + 24, chars);
    let offset = (chars - BASE) as usize;
    heap.bytes[offset..offset + text.len()].copy_from_slice(text);
    at
}

#[test]
fn external_sources_are_read_through_v8s_copy_of_their_data_pointer() {
    let layout = layout();
    let mut heap = Builder::new();
    let maps = heap.maps();
    let source = b"function f() {\n  return 1;\n}\n";
    // One-byte (type 42 in node 20), two-byte (34), uncached one-byte (58).
    let one_byte = external(&mut heap, BASE + 0x3000, 42, BASE + 0x5000, source);
    let wide: Vec<u8> = "é\nx".encode_utf16().flat_map(u16::to_le_bytes).collect();
    let two_byte = external(&mut heap, BASE + 0x3100, 34, BASE + 0x5100, &wide);
    let uncached = external(&mut heap, BASE + 0x3200, 58, BASE + 0x5200, source);
    // A script whose source is the one-byte string, without V8's line ends.
    let script = heap.object(BASE + 0x1000, maps.script);
    heap.word(script + 8, Builder::tagged(one_byte));
    let image = heap.image();
    let reader = Heap {
        memory: &image,
        layout: &layout,
    };
    let text = std::str::from_utf8(source).unwrap();
    assert_eq!(reader.string(one_byte, 1 << 20, 0).as_deref(), Some(text));
    assert_eq!(reader.string(one_byte, 8, 0).as_deref(), Some("function"));
    assert_eq!(reader.string(two_byte, 100, 0).as_deref(), Some("é\nx"));
    assert_eq!(reader.string(uncached, 100, 0), None);
    assert_eq!(reader.line_ends(script), Some(vec![14, 26, 28]));
    assert_eq!(line_at(&[14, 26, 28], 18), 2);
}
