//! Naming JavaScript frames on heaps built in memory (node 20's layout).
use super::{
    Node, blob_ranges,
    layout::Layout,
    names::{Heap, line_at},
};
use crate::{model::Mapping, procs::memory::Image};
use std::sync::Arc;

mod code_search;
mod constants;
mod strings;

const BASE: u64 = 0x10_0000;

/// Node 20's constants (`v8dbg_*` of node 20.18.0).
fn layout() -> Layout {
    Layout {
        version: (11, 3, 244),
        fp_marker: -8,
        fp_function: -16,
        fp_bytecode_offset: -40,
        fp_bytecode_array: -32,
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
        external_resource: Some(16),
        array_length: 8,
        fixed_array_data: 16,
        bytecode_data: 54,
        bytecode_positions: 32,
        byte_array_data: 16,
        type_byte_array: 190,
        type_plain_byte_array: 190,
        type_interpreter_data: Some(159),
        interpreter_data_bytecode: Some(8),
        type_code: Some(245),
        code_bytecode: Some(16),
        code: Some(super::layout::CodeLayout {
            function_code: Some(48),
            flags: 48,
            kind_mask: 15,
            kind_shift: 0,
            kind_baseline: 11,
            start: super::layout::CodeStart::Field(40),
            stream: Some(16),
            size: 56,
            positions: 24,
            inlining: super::layout::InliningLayout {
                data: 16,
                literals: 32,
                positions: 72,
            },
        }),
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

impl Node {
    fn new_for_tests(layout: Layout) -> Node {
        Node {
            layout,
            binary: (0, 0),
            blob_file: (0, 0),
            blobs: Vec::new(),
            names: Default::default(),
            tables: Default::default(),
            table_entries: 0,
            scripts: Default::default(),
            codes: Default::default(),
            code_entries: 0,
            found: Default::default(),
            bytecode_sizes: None,
            recent: Default::default(),
        }
    }
}

/// The maps of [`Builder::maps`], by the type they give (`layout()`'s).
struct Maps {
    string: u64,
    function: u64,
    shared: u64,
    scope: u64,
    script: u64,
    array: u64,
    bytecode: u64,
    byte_array: u64,
    interpreter: u64,
    code: u64,
    oddball: u64,
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
    /// The maps of the types the tests build, each at its own address
    /// below the objects (which start at `BASE + 0x1000`).
    fn maps(&mut self) -> Maps {
        let mut at = BASE + 0x100;
        let mut map = |kind: u16| {
            at += 0x40;
            self.map(at, kind)
        };
        Maps {
            string: map(8 | 64),
            function: map(2066),
            shared: map(262),
            scope: map(261),
            script: map(167),
            array: map(175),
            bytecode: map(191),
            byte_array: map(190),
            interpreter: map(159),
            code: map(245),
            oddball: map(131),
        }
    }
    /// A script at `at` whose lines end at `ends` (its line ends, an
    /// array, 0x100 bytes on).
    fn script(&mut self, maps: &Maps, at: u64, ends: &[i64]) -> u64 {
        let script = self.object(at, maps.script);
        let array = self.object(at + 0x100, maps.array);
        self.word(script + 56, Self::tagged(array));
        self.word(array + 8, Self::smi(ends.len() as i64));
        for (index, end) in ends.iter().enumerate() {
            self.word(array + 16 + 8 * index as u64, Self::smi(*end));
        }
        script
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
    let maps = heap.maps();
    let source = "// x\n\nfunction hotLoop(n) {\n  return n;\n}\n";
    let name = heap.string(BASE + 0x1000, maps.string, "hotLoop");
    let local = heap.string(BASE + 0x1100, maps.string, "n");
    let empty = heap.string(BASE + 0x1180, maps.string, "");
    let file = heap.string(BASE + 0x1200, maps.string, "/app/hot.js");
    let text = heap.string(BASE + 0x1300, maps.string, source);
    // ScopeInfo: map, flags, parameters, one context local (name, info),
    // the function's name, its start and end.
    let scope = heap.object(BASE + 0x2000, maps.scope);
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
    let script = heap.object(BASE + 0x3000, maps.script);
    heap.word(script + 16, Builder::tagged(file));
    heap.word(script + 8, Builder::tagged(text));
    heap.word(script + 56, Builder::smi(0)); // no line ends yet: from the source
    let shared = heap.object(BASE + 0x4000, maps.shared);
    heap.word(shared + 16, Builder::tagged(scope));
    heap.word(shared + 32, Builder::tagged(script));
    let plain = heap.object(BASE + 0x5000, maps.shared);
    heap.word(plain + 16, Builder::tagged(name));
    let ends = heap.object(BASE + 0x6000, maps.array);
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

/// An interpreted frame of `f` (lines 1 to 3 of its script) at bytecode
/// offsets 4 and 12 is on lines 2 and 3 through its bytecode's position
/// table, whether the function's data is its bytecode, interpreter data
/// or baseline code; without a table (V8 collects them lazily), or with
/// one past the cap, it is nowhere (its caller keeps the first line).
#[test]
fn interpreted_frames_are_at_their_position_tables_line() {
    let layout = layout();
    let mut heap = Builder::new();
    let maps = heap.maps();
    // "function f(n) {\n" ends at 15, line 2 at 35, line 3 at 55.
    let script = heap.script(&maps, BASE + 0x1000, &[15, 35, 55]);
    // Offsets 0 → position 20 (line 2), 10 → 50 (line 3): deltas from
    // (-1, 0), zig-zag; positions packed (offset + 1) << 1.
    let table = heap.object(BASE + 0x1200, maps.byte_array);
    heap.word(table + 8, Builder::smi(4));
    heap.bytes[0x1210..0x1214].copy_from_slice(&[0x02, 0x54, 0x14, 0x78]);
    let undefined = heap.object(BASE + 0x1300, maps.oddball);
    let huge = heap.object(BASE + 0x1380, maps.byte_array);
    heap.word(huge + 8, Builder::smi(1 << 30));
    let bytecode = |heap: &mut Builder, at: u64, table: u64| {
        heap.object(at, maps.bytecode);
        heap.word(at + 32, Builder::tagged(table));
        at
    };
    let shared = |heap: &mut Builder, at: u64, data: u64| {
        heap.object(at, maps.shared);
        heap.word(at + 8, Builder::tagged(data));
        heap.word(at + 32, Builder::tagged(script));
        at
    };
    let direct = bytecode(&mut heap, BASE + 0x2000, table);
    let direct = shared(&mut heap, BASE + 0x2100, direct);
    let wrapped = bytecode(&mut heap, BASE + 0x2200, table);
    let interpreter = heap.object(BASE + 0x2300, maps.interpreter);
    heap.word(interpreter + 8, Builder::tagged(wrapped));
    let via_interpreter = shared(&mut heap, BASE + 0x2400, interpreter);
    let code = heap.object(BASE + 0x2500, maps.code);
    heap.word(code + 16, Builder::tagged(interpreter));
    let via_baseline = shared(&mut heap, BASE + 0x2600, code);
    let lazy = bytecode(&mut heap, BASE + 0x2700, undefined);
    let lazy = shared(&mut heap, BASE + 0x2800, lazy);
    let too_long = bytecode(&mut heap, BASE + 0x2900, huge);
    let too_long = shared(&mut heap, BASE + 0x2a00, too_long);
    let not_code = shared(&mut heap, BASE + 0x2b00, script);

    let image = heap.image();
    let mut node = Node::new_for_tests(layout.clone());
    // The frame's slot holds the offset from the tagged array.
    let slot = |offset: u64| offset + layout.bytecode_data - 1;
    for function in [direct, via_interpreter, via_baseline] {
        let mut line = |offset| node.running_line(&image, function, script, slot(offset));
        assert_eq!(line(0), Some(2), "function at {function:#x}");
        assert_eq!(line(4), Some(2));
        assert_eq!(line(12), Some(3));
    }
    let counted = |source| super::line_count(&super::line_counts(), source);
    let before = counted(super::LineSource::NoPositions);
    assert_eq!(node.running_line(&image, lazy, script, slot(4)), None);
    assert!(counted(super::LineSource::NoPositions) > before);
    // No bytecode, or a table past the cap: unreadable, not "V8 had no
    // positions".
    let (absent, unreadable) = (
        counted(super::LineSource::NoPositions),
        counted(super::LineSource::Unreadable),
    );
    assert_eq!(node.running_line(&image, too_long, script, slot(4)), None);
    assert_eq!(node.running_line(&image, not_code, script, slot(4)), None);
    assert!(counted(super::LineSource::Unreadable) >= unreadable + 2);
    assert_eq!(counted(super::LineSource::NoPositions), absent);
    // A slot below the header (never V8's): nowhere, no fault.
    assert_eq!(node.running_line(&image, direct, script, 0), None);
}

/// A compiled frame of `f` (lines 1 to 3) is at the line its code's
/// source position table gives the pc's offset (a caller's return
/// address looked up a byte back); it keeps its first line (counted) when
/// the pc is outside the function's current code, in inlined code, in
/// Sparkplug code, or when the code is implausible or not code at all.
#[test]
fn compiled_frames_are_at_their_code_tables_line() {
    let layout = layout();
    let mut heap = Builder::new();
    let maps = heap.maps();
    let script = heap.script(&maps, BASE + 0x1000, &[15, 35, 55]);
    // Instruction offsets 0 → position 20 (line 2), 0x40 → 50 (line 3),
    // 0x80 → 40 inlined (id 0): zig-zag deltas from (-1, 0); positions
    // packed (offset + 1) << 1, inlining id + 1 from bit 31.
    let table = heap.object(BASE + 0x1200, maps.byte_array);
    let inlined = (41i64 << 1) | (1 << 31);
    let mut bytes = Vec::new();
    for value in [1, 42, 0x40, 102 - 42, 0x40, inlined - 102] {
        super::positions::tests::write_int(&mut bytes, value);
    }
    heap.word(table + 8, Builder::smi(bytes.len() as i64));
    let at = (table + 16 - BASE) as usize;
    heap.bytes[at..at + bytes.len()].copy_from_slice(&bytes);
    let shared = heap.object(BASE + 0x1300, maps.shared);
    heap.word(shared + 32, Builder::tagged(script));
    // Code objects (node 20's: entry point at 40, flags at 48, size at
    // 56, table at 24), of kind `kind` and `size` bytes at 0x4000.
    let code = |heap: &mut Builder, at: u64, kind: u64, size: u64| {
        heap.object(at, maps.code);
        heap.word(at + 24, Builder::tagged(table));
        heap.word(at + 40, BASE + 0x4000);
        heap.word(at + 48, kind);
        heap.word(at + 56, size);
        at
    };
    let function = |heap: &mut Builder, at: u64, code: u64| {
        heap.object(at, maps.function);
        heap.word(at + 24, Builder::tagged(shared));
        heap.word(at + 48, Builder::tagged(code));
        at
    };
    let turbofan = code(&mut heap, BASE + 0x2000, 13, 0x100);
    let turbofan = function(&mut heap, BASE + 0x2100, turbofan);
    let baseline = code(&mut heap, BASE + 0x2200, 11, 0x100);
    let baseline = function(&mut heap, BASE + 0x2300, baseline);
    let huge = code(&mut heap, BASE + 0x2400, 13, 0xffff_ffff);
    let huge = function(&mut heap, BASE + 0x2500, huge);
    let not_code = function(&mut heap, BASE + 0x2600, script);
    let not_function = heap.object(BASE + 0x2700, maps.script);
    // Sparkplug code of `shared`'s bytecodes (5, 3 bytes long, at 0;
    // 4, 1 byte, at 3), whose position table puts offset 0 on line 2 and
    // 3 on line 3: entry 0x10 bytes, then 0x20 each.
    let maps = heap.maps();
    let bytecode = heap.object(BASE + 0x2800, maps.bytecode);
    heap.word(bytecode + 8, Builder::smi(4));
    let at = (bytecode + 54 - BASE) as usize;
    heap.bytes[at..at + 4].copy_from_slice(&[5, 0, 0, 4]);
    let positions = heap.object(BASE + 0x2900, maps.byte_array);
    heap.word(positions + 8, Builder::smi(6));
    let at = (positions + 16 - BASE) as usize;
    // The entry (-1) at 10 (packed 22), +1 → 20 (+20), +3 → 50 (+60):
    // zig-zag.
    heap.bytes[at..at + 6].copy_from_slice(&[0, 44, 2, 40, 6, 120]);
    heap.word(bytecode + 32, Builder::tagged(positions));
    heap.word(shared + 8, Builder::tagged(bytecode));
    let offsets = heap.object(BASE + 0x2a00, maps.byte_array);
    heap.word(offsets + 8, Builder::smi(3));
    let at = (offsets + 16 - BASE) as usize;
    heap.bytes[at..at + 3].copy_from_slice(&[0x10, 0x20, 0x20]);
    let sparkplug = code(&mut heap, BASE + 0x2b00, 11, 0x100);
    heap.word(sparkplug + 24, Builder::tagged(offsets));
    heap.word(sparkplug + 16, Builder::tagged(bytecode));
    let sparkplug = function(&mut heap, BASE + 0x2c00, sparkplug);

    let image = heap.image();
    let mut node = Node::new_for_tests(layout);
    assert_eq!(node.shared_of(&image, turbofan), Some(shared));
    assert_eq!(node.shared_of(&image, not_function), None);
    let pc = |offset: u64| BASE + 0x4000 + offset;
    let counted = |source| super::line_count(&super::line_counts(), source);
    let mut line = |function, pc, leaf| {
        node.compiled_line(&image, function, shared, script, pc, leaf)
            .and_then(|lines| lines.line)
    };
    assert_eq!(line(turbofan, pc(0), true), Some(2));
    assert_eq!(line(turbofan, pc(0x3f), true), Some(2));
    assert_eq!(line(turbofan, pc(0x40), true), Some(3));
    // A return address at 0x40 returns to a call in the code before.
    assert_eq!(line(turbofan, pc(0x40), false), Some(2));
    let before = counted(super::LineSource::CompiledInlined);
    assert_eq!(line(turbofan, pc(0x80), true), None);
    assert!(counted(super::LineSource::CompiledInlined) > before);
    let before = counted(super::LineSource::CompiledOtherCode);
    assert_eq!(line(turbofan, pc(0x100), true), None);
    assert_eq!(line(turbofan, BASE, true), None);
    assert!(counted(super::LineSource::CompiledOtherCode) >= before + 2);
    // Without the bytecodes' lengths, Sparkplug code is not mapped.
    let before = counted(super::LineSource::CompiledBaseline);
    assert_eq!(line(baseline, pc(0x40), true), None);
    assert_eq!(line(sparkplug, pc(0x10), true), None);
    assert!(counted(super::LineSource::CompiledBaseline) >= before + 2);
    let before = counted(super::LineSource::CompiledUnreadable);
    assert_eq!(line(huge, pc(0x40), true), None);
    assert_eq!(line(not_code, pc(0x40), true), None);
    assert!(counted(super::LineSource::CompiledUnreadable) >= before + 2);

    // A script without lines (none here): no line, counted as such.
    let before = counted(super::LineSource::ScriptWithoutLines);
    let lines = node.compiled_line(&image, turbofan, shared, 0, pc(0), true);
    assert_eq!(lines.map(|lines| lines.line), Some(None));
    assert!(counted(super::LineSource::ScriptWithoutLines) > before);

    let mut sizes = vec![1u8; 3 * 6];
    sizes[5] = 3;
    let mut node = Node::new_for_tests(node.layout.clone());
    node.bytecode_sizes = super::baseline::BytecodeSizes::new(&sizes).map(Arc::new);
    let mut line = |function, pc, leaf| {
        node.compiled_line(&image, function, shared, script, pc, leaf)
            .and_then(|lines| lines.line)
    };
    // The entry (0 to 0x10) is the function's first position (line 1).
    assert_eq!(line(sparkplug, pc(0x0f), true), Some(1));
    assert_eq!(line(sparkplug, pc(0x10), true), Some(2));
    assert_eq!(line(sparkplug, pc(0x2f), true), Some(2));
    assert_eq!(line(sparkplug, pc(0x30), true), Some(3));
    // A call returning at 0x30 ran the bytecode before.
    assert_eq!(line(sparkplug, pc(0x30), false), Some(2));
    // Past the last piece: no bytecode.
    assert_eq!(line(sparkplug, pc(0x50), true), None);
}

/// Optimized code of `handler` that inlined `round`, which inlined
/// `hotLoop` (script lines end at 15, 35, 55, 75): a pc in `hotLoop`'s
/// code is `hotLoop` at its line, in `round` at the line of the call, in
/// `handler` at the line of that call; inlining that leads nowhere (a
/// caller that is itself, a literal past the array) keeps the frame's
/// first line, counted.
#[test]
fn inlined_code_is_expanded_into_its_functions() {
    let layout = layout();
    let mut heap = Builder::new();
    let maps = heap.maps();
    let script = heap.script(&maps, BASE + 0x1000, &[15, 35, 55, 75]);
    let file = heap.string(BASE + 0x1080, maps.string, "/app/hot.js");
    heap.word(script + 16, Builder::tagged(file));
    let shared = |heap: &mut Builder, at: u64, name: &str| {
        let name = heap.string(at + 0x80, maps.string, name);
        heap.object(at, maps.shared);
        heap.word(at + 16, Builder::tagged(name));
        heap.word(at + 32, Builder::tagged(script));
        at
    };
    let handler = shared(&mut heap, BASE + 0x1200, "handler");
    let round = shared(&mut heap, BASE + 0x1300, "round");
    let hot = shared(&mut heap, BASE + 0x1400, "hotLoop");
    let packed = |offset: i64, inlining: i64| ((offset + 1) << 1) | ((inlining + 1) << 31);
    // Offsets 0 → 20 in `handler`, 0x40 → 60 in inlining 1, 0x80 → 40
    // in inlining 0, 0xc0 → 40 in inlining 2.
    let table = heap.object(BASE + 0x1800, maps.byte_array);
    let mut bytes = Vec::new();
    let mut last = 0;
    for (code, position) in [
        (0, packed(20, -1)),
        (0x40, packed(60, 1)),
        (0x80, packed(40, 0)),
        (0xc0, packed(40, 2)),
    ] {
        super::positions::tests::write_int(&mut bytes, if code == 0 { 1 } else { 0x40 });
        super::positions::tests::write_int(&mut bytes, position - last);
        last = position;
    }
    heap.word(table + 8, Builder::smi(bytes.len() as i64));
    let at = (table + 16 - BASE) as usize;
    heap.bytes[at..at + bytes.len()].copy_from_slice(&bytes);
    // Inlining 0: `round` (literal 0), called at 22 of `handler`; 1:
    // `hotLoop` (literal 1), called at 45 of inlining 0; 2: a caller
    // that is itself.
    let positions = heap.object(BASE + 0x1900, maps.byte_array);
    let inlinings = [
        (packed(22, -1), 0i32),
        (packed(45, 0), 1),
        (packed(50, 2), 0),
    ];
    heap.word(positions + 8, Builder::smi(16 * inlinings.len() as i64));
    for (index, (position, literal)) in inlinings.iter().enumerate() {
        let at = positions + 16 + 16 * index as u64;
        heap.word(at, *position as u64);
        heap.word(at + 8, *literal as u64);
    }
    // Literals: `round` held weakly, `hotLoop` strongly.
    let literals = heap.object(BASE + 0x1a00, maps.array);
    heap.word(literals + 8, Builder::smi(2));
    heap.word(literals + 16, round | 3);
    heap.word(literals + 24, Builder::tagged(hot));
    let data = |heap: &mut Builder, at: u64, literals: u64| {
        heap.object(at, maps.array);
        heap.word(at + 8, Builder::smi(8));
        heap.word(at + 32, Builder::tagged(literals));
        heap.word(at + 72, Builder::tagged(positions));
        at
    };
    let good = data(&mut heap, BASE + 0x1b00, literals);
    // Literals too short for `hotLoop`.
    let short = heap.object(BASE + 0x1c00, maps.array);
    heap.word(short + 8, Builder::smi(1));
    heap.word(short + 16, Builder::tagged(round));
    let bad = data(&mut heap, BASE + 0x1d00, short);
    // TurboFan code (kind 13) at 0x4000, 0x100 bytes, and its function.
    let function = |heap: &mut Builder, at: u64, data: u64| {
        let code = heap.object(at, maps.code);
        heap.word(code + 16, Builder::tagged(data));
        heap.word(code + 24, Builder::tagged(table));
        heap.word(code + 40, BASE + 0x4000);
        heap.word(code + 48, 13);
        heap.word(code + 56, 0x100);
        heap.object(at + 0x80, maps.function);
        heap.word(at + 0x80 + 24, Builder::tagged(handler));
        heap.word(at + 0x80 + 48, Builder::tagged(code));
        at + 0x80
    };
    let function_good = function(&mut heap, BASE + 0x2000, good);
    let function_bad = function(&mut heap, BASE + 0x2200, bad);

    let image = heap.image();
    let mut node = Node::new_for_tests(layout);
    let pc = |offset: u64| BASE + 0x4000 + offset;
    // Each inlined function as `name:line`, innermost first, then the
    // frame's own line.
    let mut lines = |function, pc| {
        let lines = node.compiled_line(&image, function, handler, script, pc, true)?;
        let inlined = lines.inlined.iter();
        let inlined: Vec<_> = inlined
            .map(|l| format!("{}:{}", l.function, l.line))
            .collect();
        Some((inlined, lines.line))
    };
    assert_eq!(lines(function_good, pc(0x10)), Some((vec![], Some(2))));
    let expected = |names: &[&str]| Some((names.iter().map(|n| n.to_string()).collect(), Some(2)));
    assert_eq!(
        lines(function_good, pc(0x50)),
        expected(&["hotLoop:4", "round:3"])
    );
    assert_eq!(lines(function_good, pc(0x90)), expected(&["round:3"]));
    let counted = |source| super::line_count(&super::line_counts(), source);
    let before = counted(super::LineSource::CompiledInlined);
    assert_eq!(lines(function_good, pc(0xd0)), None);
    assert_eq!(lines(function_bad, pc(0x50)), None);
    assert!(counted(super::LineSource::CompiledInlined) >= before + 2);
}

/// A recorded frame named once is reused (its line sources counted
/// again) until `recent::REUSE` has passed: a compiled frame whose function
/// now points at another function's shared info keeps its first name for
/// the same recorded frame (function and pc), and is named afresh for
/// another pc.
#[test]
fn a_named_frame_is_reused_for_the_same_recorded_frame() {
    use hostprof_common::{runtime::tag, v8};
    let layout = layout();
    let function = BASE + 0x2000;
    let heap = |shared: u64| {
        let mut heap = Builder::new();
        let maps = heap.maps();
        for (at, name) in [(BASE + 0x1000, "first"), (BASE + 0x3000, "second")] {
            let name = heap.string(at + 0x100, maps.string, name);
            heap.object(at, maps.shared);
            heap.word(at + 16, Builder::tagged(name));
        }
        heap.object(function, maps.function);
        heap.word(function + 24, Builder::tagged(shared));
        heap
    };
    let (first, second) = (heap(BASE + 0x1000), heap(BASE + 0x3000));
    let at = |pc: u64| hostprof_common::runtime::Frame {
        code: tag::apply(tag::V8 | v8::kind::COMPILED, function),
        instr: pc,
    };
    let mut node = Node::new_for_tests(layout);
    let name = |frame: crate::model::Frame| frame.lines[0].function.to_string();
    let counted = || super::line_counts().iter().sum::<u64>();
    assert_eq!(
        name(node.named_frame(&first.image(), at(0x10), true)),
        "first"
    );
    let before = counted();
    assert_eq!(
        name(node.named_frame(&second.image(), at(0x10), true)),
        "first"
    );
    // The naming counted (no code: unreadable), and so did its reuse.
    assert!(counted() > before);
    assert_eq!(
        name(node.named_frame(&second.image(), at(0x20), true)),
        "second"
    );
}
