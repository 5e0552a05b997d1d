//! Compiled frames whose pc is outside their function's current code
//! (on-stack replacement): named from the code found by looking back from
//! the pc, in node 20's layout (an `InstructionStream` pointing back at
//! its `Code`) and node 18's (instructions inside the `Code`).
use super::{super::LineSource, *};
use crate::runtime::v8::layout::CodeStart;

/// Where the code found from the pc has its instructions.
const STREAM: u64 = BASE + 0x8000;

/// A heap with `f` (lines 1 to 3), whose current code is elsewhere, and
/// code at [`STREAM`] (0x100 bytes: offset 0 on line 2, 0x40 on line 3)
/// held as `layout` says; decoys before it that look like headers but
/// whose `Code` does not start there. Returns the heap, `f`'s
/// `JSFunction`, its shared info and script, and where its current code's
/// instructions start.
fn heap_with_replaced_code(layout: &Layout) -> (Builder, u64, u64, u64, u64) {
    let code_layout = layout.code.as_ref().unwrap();
    let mut heap = Builder::new();
    let maps = heap.maps();
    let script = heap.script(&maps, BASE + 0x1000, &[15, 35, 55]);
    let table = heap.object(BASE + 0x1200, maps.byte_array);
    let mut bytes = Vec::new();
    for value in [1, 42, 0x40, 60] {
        super::super::positions::tests::write_int(&mut bytes, value);
    }
    heap.word(table + 8, Builder::smi(bytes.len() as i64));
    let at = (table + 16 - BASE) as usize;
    heap.bytes[at..at + bytes.len()].copy_from_slice(&bytes);
    let shared = heap.object(BASE + 0x1300, maps.shared);
    heap.word(shared + 32, Builder::tagged(script));
    // A TurboFan `Code` whose instructions start at `start`.
    let code = |heap: &mut Builder, at: u64, start: u64| {
        heap.object(at, maps.code);
        heap.word(at + 24, Builder::tagged(table));
        if let CodeStart::Field(field) = code_layout.start {
            heap.word(at + field, start);
        }
        heap.word(at + 48, 13);
        heap.word(at + 56, 0x100);
        at
    };
    let current = code(&mut heap, BASE + 0x2000, BASE + 0x5000);
    let current_start = match code_layout.start {
        CodeStart::Field(_) => BASE + 0x5000,
        CodeStart::Inline(header) => current + header,
    };
    let function = heap.object(BASE + 0x2100, maps.function);
    heap.word(function + 24, Builder::tagged(shared));
    heap.word(function + 48, Builder::tagged(current));
    let stream_map = heap.map(BASE + 0x600, 200);
    match code_layout.start {
        CodeStart::Field(_) => {
            let header = code_layout.stream.unwrap();
            let found = code(&mut heap, BASE + 0x2200, STREAM);
            heap.object(STREAM - header, stream_map);
            heap.word(STREAM - header + 8, Builder::tagged(found));
            // Decoys at later starts: a stream of `current` (which starts
            // elsewhere), a tagged word that is no object.
            heap.object(STREAM + 0x40 - header, stream_map);
            heap.word(STREAM + 0x40 - header + 8, Builder::tagged(current));
            heap.word(STREAM + 0x80 - header, Builder::tagged(BASE + 0x3000));
        }
        CodeStart::Inline(header) => {
            code(&mut heap, STREAM - header, STREAM);
            // A decoy: a tagged word that is no object.
            heap.word(STREAM + 0x40 - header, Builder::tagged(BASE + 0x3000));
        }
    }
    (heap, function, shared, script, current_start)
}

fn node_18_layout() -> Layout {
    let mut layout = layout();
    let code = layout.code.as_mut().unwrap();
    code.start = CodeStart::Inline(128);
    code.stream = None;
    layout
}

#[test]
fn a_pc_outside_the_functions_code_is_named_from_the_code_holding_it() {
    for layout in [layout(), node_18_layout()] {
        let (heap, function, shared, script, current) = heap_with_replaced_code(&layout);
        let image = heap.image();
        let mut node = Node::new_for_tests(layout.clone());
        let counted = |source| super::super::line_count(&super::super::line_counts(), source);
        let before = counted(LineSource::CompiledFoundByPc);
        let mut line = |pc, leaf| {
            node.compiled_line(&image, function, shared, script, pc, leaf)
                .and_then(|lines| lines.line)
        };
        assert_eq!(line(STREAM + 0x50, true), Some(3), "{:?}", layout.code);
        assert_eq!(line(STREAM + 0x10, true), Some(2));
        // A return address at the code's start is a call before it: in
        // other code, none here.
        assert_eq!(line(STREAM + 0x40, false), Some(2));
        assert!(counted(LineSource::CompiledFoundByPc) >= before + 3);
        // Past the code's end, no code holds the pc (and nothing before
        // the heap is read): the first line, counted.
        let before = counted(LineSource::CompiledOtherCode);
        assert_eq!(line(STREAM + 0x180, true), None);
        assert!(counted(LineSource::CompiledOtherCode) > before);
        // The function's own code still wins where it holds the pc.
        assert_eq!(line(current + 0x40, true), Some(3));
    }
}
