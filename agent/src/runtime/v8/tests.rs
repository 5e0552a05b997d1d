//! The naming of JavaScript frames, on heaps built in memory with the
//! layout of Node.js 20 (V8 11.3).
use super::{
    blob_ranges,
    layout::Layout,
    names::{Heap, line_at},
};
use crate::{model::Mapping, procs::memory::Image};
use std::sync::Arc;

const BASE: u64 = 0x10_0000;

/// Node 20's constants (`v8dbg_*` of node 20.18.0).
fn layout() -> Layout {
    Layout {
        version: (11, 3, 244),
        fp_marker: -8,
        fp_function: -16,
        fp_bytecode_offset: -40,
        map: 0,
        instance_type: 12,
        function_shared: 24,
        shared_name: 16,
        shared_script: 32,
        shared_function_data: 8,
        script_name: 16,
        script_source: 8,
        script_line_ends: 56,
        string_length: 12,
        seq_one_byte_chars: 16,
        seq_two_byte_chars: 16,
        cons_first: 16,
        cons_second: 24,
        sliced_parent: 16,
        sliced_offset: 24,
        thin_actual: 16,
        array_length: 8,
        fixed_array_data: 16,
        bytecode_data: 54,
        type_function: 2066,
        type_shared_info: 262,
        type_scope_info: 261,
        type_script: 167,
        type_fixed_array: 175,
        type_bytecode_array: 191,
        first_nonstring_type: 128,
        representation_mask: 7,
        encoding_mask: 8,
        one_byte_tag: 8,
        cons_tag: 1,
        sliced_tag: 3,
        thin_tag: 5,
        external_tag: 2,
        scope_first_vars: 3,
        scope_context_locals: 2,
    }
}

/// A heap under construction: objects at 8-aligned offsets from BASE.
struct Builder {
    bytes: Vec<u8>,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            bytes: vec![0; 0x10000],
        }
    }
    fn word(&mut self, at: u64, value: u64) {
        let at = (at - BASE) as usize;
        self.bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
    fn tagged(at: u64) -> u64 {
        at | 1
    }
    fn smi(value: i64) -> u64 {
        (value as u64) << 32
    }
    /// A map at `at` giving instance type `kind`.
    fn map(&mut self, at: u64, kind: u16) -> u64 {
        let at_index = (at - BASE) as usize + 12;
        self.bytes[at_index..at_index + 2].copy_from_slice(&kind.to_le_bytes());
        at
    }
    /// An object at `at` with the map at `map`.
    fn object(&mut self, at: u64, map: u64) -> u64 {
        self.word(at, Self::tagged(map));
        at
    }
    /// A sequential one-byte string at `at`.
    fn string(&mut self, at: u64, map: u64, text: &str) -> u64 {
        self.object(at, map);
        let len = (at - BASE) as usize + 12;
        self.bytes[len..len + 4].copy_from_slice(&(text.len() as u32).to_le_bytes());
        let chars = (at - BASE) as usize + 16;
        self.bytes[chars..chars + text.len()].copy_from_slice(text.as_bytes());
        at
    }
    fn image(&self) -> Image<'_> {
        Image {
            base: BASE,
            bytes: &self.bytes,
        }
    }
}

/// A function `hotLoop` at line 3 of `/app/hot.js`, named through its
/// ScopeInfo (past one context local), and another named by a string.
#[test]
fn functions_are_named_with_their_script_and_first_line() {
    let layout = layout();
    let mut heap = Builder::new();
    let string_map = heap.map(BASE + 0x100, 8 | 64);
    let shared_map = heap.map(BASE + 0x200, 262);
    let scope_map = heap.map(BASE + 0x300, 261);
    let script_map = heap.map(BASE + 0x400, 167);
    let array_map = heap.map(BASE + 0x500, 175);
    let source = "// x\n\nfunction hotLoop(n) {\n  return n;\n}\n";
    let name = heap.string(BASE + 0x1000, string_map, "hotLoop");
    let local = heap.string(BASE + 0x1100, string_map, "n");
    let empty = heap.string(BASE + 0x1180, string_map, "");
    let file = heap.string(BASE + 0x1200, string_map, "/app/hot.js");
    let text = heap.string(BASE + 0x1300, string_map, source);
    // ScopeInfo: map, flags, parameters, one context local (name, info),
    // the function's name, its start and end.
    let scope = heap.object(BASE + 0x2000, scope_map);
    let start = source.find("function").unwrap() as i64;
    let slots = [
        Builder::smi(0),
        Builder::smi(1),
        Builder::smi(1),
        Builder::tagged(local),
        Builder::smi(0),
        Builder::tagged(empty),
        Builder::tagged(name),
        Builder::smi(start),
        Builder::smi(start + 30),
    ];
    for (index, value) in slots.iter().enumerate() {
        heap.word(scope + 8 + 8 * index as u64, *value);
    }
    let script = heap.object(BASE + 0x3000, script_map);
    heap.word(script + 16, Builder::tagged(file));
    heap.word(script + 8, Builder::tagged(text));
    heap.word(script + 56, Builder::smi(0)); // no line ends yet: from the source
    let shared = heap.object(BASE + 0x4000, shared_map);
    heap.word(shared + 16, Builder::tagged(scope));
    heap.word(shared + 32, Builder::tagged(script));
    let plain = heap.object(BASE + 0x5000, shared_map);
    heap.word(plain + 16, Builder::tagged(name));
    let ends = heap.object(BASE + 0x6000, array_map);
    heap.word(ends + 8, Builder::smi(2));
    heap.word(ends + 16, Builder::smi(4));
    heap.word(ends + 24, Builder::smi(5));

    let image = heap.image();
    let reader = Heap {
        memory: &image,
        layout: &layout,
    };
    let named = reader.name(shared).expect("named");
    assert_eq!(named.function, "hotLoop");
    assert_eq!(named.file.as_deref(), Some("/app/hot.js"));
    let found = reader.line_ends(named.script).expect("line ends");
    assert_eq!(line_at(&found, named.start.unwrap()), 3);
    let named = reader.name(plain).expect("named by a string");
    assert_eq!((named.function.as_str(), named.file), ("hotLoop", None));
    // Not a SharedFunctionInfo: no name at all.
    assert_eq!(reader.name(script), None);
    assert_eq!(line_at(&[4, 5], 0), 1);
    assert_eq!(line_at(&[4, 5], 5), 2);
    assert_eq!(line_at(&[4, 5], 6), 3);
}

/// Strings nested in each other (cons strings pointing at themselves)
/// end at the depth limit, and a huge length is not read.
#[test]
fn hostile_strings_are_refused() {
    let layout = layout();
    let mut heap = Builder::new();
    let cons_map = heap.map(BASE + 0x100, 1 | 8);
    let string_map = heap.map(BASE + 0x200, 8 | 64);
    let cyclic = heap.object(BASE + 0x1000, cons_map);
    heap.word(cyclic + 16, Builder::tagged(cyclic));
    heap.word(cyclic + 24, Builder::tagged(cyclic));
    let huge = heap.string(BASE + 0x2000, string_map, "x");
    heap.word(huge + 8, u64::from(u32::MAX) << 32);
    let image = heap.image();
    let reader = Heap {
        memory: &image,
        layout: &layout,
    };
    let count = |reason: &str| {
        crate::runtime::refusals::refusals()
            .into_iter()
            .find(|&(runtime, why, _)| runtime == "v8js" && why == reason)
            .map_or(0, |(_, _, count)| count)
    };
    let before = (count("too_deep"), count("too_long"));
    assert_eq!(reader.string(cyclic, 100, 0), None);
    assert_eq!(reader.string(huge, 100, 0), None);
    // Counted (other tests may count too: at least ours).
    assert!(count("too_deep") > before.0);
    assert!(count("too_long") > before.1);
}

#[test]
fn builtins_are_found_in_every_mapping_of_the_binary() {
    let mapping = |start: u64, end: u64, file_offset: u64, inode: u64| {
        Arc::new(Mapping {
            start,
            end,
            file_offset,
            path: "/usr/bin/node".into(),
            dev: 1,
            inode,
            build_ids: Default::default(),
        })
    };
    let mappings = [
        // The binary's text, holding the builtins at file 0x14c4000…
        mapping(0xb72000, 0x25fe000, 0x772000, 7),
        // … and V8's copy of them, next to its code space.
        mapping(0x7f00_0000_0000, 0x7f00_0019_2000, 0x14c4000, 7),
        // Another file.
        mapping(0x7f10_0000_0000, 0x7f10_1000_0000, 0x14c4000, 8),
    ];
    let blobs = blob_ranges(&mappings, (1, 7), (0x14c4000, 0x1656000));
    assert_eq!(
        blobs,
        [(0x18c4000, 0x1a56000), (0x7f00_0000_0000, 0x7f00_0019_2000)]
    );
}
