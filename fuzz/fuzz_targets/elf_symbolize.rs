//! An ELF file, as a process could map it: build ids, symbol tables,
//! MiniDebugInfo, `.gopclntab`, DWARF (lines, inlined calls, compressed
//! sections) and the `.gnu_debuglink` / build-id debug-file lookup, then
//! lookups at the addresses and file offsets the file itself names.
#![no_main]

use hostprof::symbolize::Module;
use libfuzzer_sys::fuzz_target;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

/// Lookups per input: enough to reach every unit of a small file's DWARF.
const MAX_LOOKUPS: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Ok(module) = Module::from_bytes(data, &[]) else {
        return;
    };
    let _ = (module.build_ids(), module.is_go(), module.estimated_size());
    let Ok(object) = object::File::parse(data) else {
        return;
    };
    let symbols = object
        .symbols()
        .chain(object.dynamic_symbols())
        .flat_map(|symbol| [symbol.address(), symbol.address().wrapping_add(1)]);
    let sections = object.sections().flat_map(|section| {
        [
            section.address(),
            section.address().wrapping_add(section.size()),
        ]
    });
    for address in symbols.chain(sections).take(MAX_LOOKUPS) {
        let _ = module.lookup_address(address);
    }
    for segment in object.segments().take(8) {
        let (offset, size) = segment.file_range();
        for offset in [
            offset,
            offset.wrapping_add(size / 2),
            offset.wrapping_add(size),
        ] {
            let _ = module.lookup_offset(offset);
        }
    }
    let _ = module.lookup_offset(u64::MAX);
    let _ = module.lookup_address(u64::MAX);
});
