//! The layout read from a binary's own constants: node 24's (V8 13, whose
//! functions no longer point at their code), 26's (V8 14) and 22's (V8
//! 12), as `cargo xtask setup`'s builds of them export them.
use std::collections::HashMap;

use super::super::layout::{CodeStart, Layout, SYMBOLS};
use crate::procs::memory::Image;

/// The constants node 24.22.3 exports of those the agent reads (those it
/// exports as 0, in its zeroed data, left out).
const NODE_24: &[(&str, i32)] = &[
    ("v8dbg_off_fp_context_or_frame_type", -8),
    ("v8dbg_off_fp_function", -16),
    ("v8dbg_off_fp_bytecode_offset", -40),
    ("v8dbg_off_fp_bytecode_array", -32),
    ("v8dbg_class_Map__instance_type__uint16_t", 12),
    ("v8dbg_class_JSFunction__shared__SharedFunctionInfo", 32),
    (
        "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_NameOrScopeInfoT_",
        24,
    ),
    (
        "v8dbg_class_SharedFunctionInfo__script__Tagged_HeapObject_",
        40,
    ),
    ("v8dbg_class_Script__name__Object", 16),
    ("v8dbg_class_Script__source__Object", 8),
    ("v8dbg_class_Script__line_ends__Object", 56),
    ("v8dbg_class_String__length__int32_t", 12),
    ("v8dbg_class_SeqOneByteString__chars__char", 16),
    ("v8dbg_class_SeqTwoByteString__chars__char", 16),
    ("v8dbg_class_ConsString__first__String", 16),
    ("v8dbg_class_ConsString__second__String", 24),
    ("v8dbg_class_SlicedString__parent__String", 16),
    ("v8dbg_class_SlicedString__offset__SMI", 24),
    ("v8dbg_class_ThinString__actual__String", 16),
    ("v8dbg_class_ExternalString__resource__Object", 16),
    ("v8dbg_class_FixedArrayBase__length__SMI", 8),
    ("v8dbg_class_FixedArray__data__uintptr_t", 16),
    ("v8dbg_class_BytecodeArray__data__uintptr_t", 64),
    (
        "v8dbg_class_BytecodeArray__wrapper__Tagged_BytecodeWrapper_",
        16,
    ),
    ("v8dbg_class_Code__wrapper__Tagged_CodeWrapper_", 24),
    ("v8dbg_class_Code__flags__uint32_t", 52),
    ("v8dbg_class_Code__instruction_size__int", 56),
    ("v8dbg_class_Code__instruction_start__Address", 40),
    (
        "v8dbg_class_InstructionStream__instruction_start__uintptr_t",
        32,
    ),
    ("v8dbg_DeoptimizationDataLiteralArrayIndex", 3),
    ("v8dbg_DeoptimizationDataInliningPositionsIndex", 8),
    ("v8dbg_CodeKindBaseline", 10),
    ("v8dbg_CodeKindFieldMask", 15),
    ("v8dbg_type_ByteArray__BYTE_ARRAY_TYPE", 217),
    ("v8dbg_type_TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE", 196),
    ("v8dbg_type_InterpreterData__INTERPRETER_DATA_TYPE", 188),
    ("v8dbg_type_Code__CODE_TYPE", 187),
    ("v8dbg_type_JSFunction__JS_FUNCTION_TYPE", 2065),
    (
        "v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE",
        282,
    ),
    ("v8dbg_type_ScopeInfo__SCOPE_INFO_TYPE", 280),
    ("v8dbg_type_Script__SCRIPT_TYPE", 167),
    ("v8dbg_type_FixedArray__FIXED_ARRAY_TYPE", 205),
    ("v8dbg_type_BytecodeArray__BYTECODE_ARRAY_TYPE", 186),
    ("v8dbg_FirstNonstringType", 128),
    ("v8dbg_StringRepresentationMask", 7),
    ("v8dbg_StringEncodingMask", 8),
    ("v8dbg_OneByteStringTag", 8),
    ("v8dbg_ConsStringTag", 1),
    ("v8dbg_SlicedStringTag", 3),
    ("v8dbg_ThinStringTag", 5),
    ("v8dbg_ExternalStringTag", 2),
    ("v8dbg_scopeinfo_idx_first_vars", 5),
    ("v8dbg_scopeinfo_idx_ncontextlocals", 2),
    ("_ZN2v88internal7Version6major_E", 13),
    ("_ZN2v88internal7Version6minor_E", 6),
    ("_ZN2v88internal7Version6patch_E", 17),
];

/// Where node 22.11.0's differ that matter here (the rest alike, or
/// instance types the test does not look at).
const NODE_22_CHANGES: &[(&str, &str, i32)] = &[
    (
        "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_NameOrScopeInfoT_",
        "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_Object_",
        16,
    ),
    (
        "v8dbg_class_SharedFunctionInfo__script__Tagged_HeapObject_",
        "",
        32,
    ),
    ("v8dbg_class_Code__flags__uint32_t", "", 48),
    ("v8dbg_class_Code__instruction_size__int", "", 52),
    ("v8dbg_DeoptimizationDataLiteralArrayIndex", "", 2),
    ("v8dbg_DeoptimizationDataInliningPositionsIndex", "", 7),
    ("_ZN2v88internal7Version6major_E", "", 12),
    ("_ZN2v88internal7Version6minor_E", "", 4),
    ("_ZN2v88internal7Version6patch_E", "", 21),
];

/// Where node 26.12.1's differ (V8 14: a code kind before baseline's; the
/// rest, instance types), as its build from the registry exports them.
const NODE_26_CHANGES: &[(&str, &str, i32)] = &[
    ("v8dbg_CodeKindBaseline", "", 11),
    ("_ZN2v88internal7Version6major_E", "", 14),
    ("_ZN2v88internal7Version6patch_E", "", 34),
];

/// Node 24's constants with `changes`: (name, its new name if renamed,
/// value).
fn changed(changes: &[(&'static str, &'static str, i32)]) -> Vec<(&'static str, i32)> {
    let mut constants = NODE_24.to_vec();
    for &(name, renamed, value) in changes {
        let entry = constants
            .iter_mut()
            .find(|(known, _)| *known == name)
            .unwrap();
        *entry = (if renamed.is_empty() { name } else { renamed }, value);
    }
    constants
}

/// The layout `constants` give, each at an address of its own.
fn read(constants: &[(&str, i32)]) -> Layout {
    const BASE: u64 = 0x1000;
    let mut bytes = vec![0; 4 * SYMBOLS.len()];
    let mut symbols = HashMap::new();
    for (&(name, value), at) in constants.iter().zip(0..) {
        let name = *SYMBOLS.iter().find(|known| **known == name).unwrap();
        bytes[4 * at..4 * at + 4].copy_from_slice(&value.to_le_bytes());
        symbols.insert(name, BASE + 4 * at as u64);
    }
    let image = Image {
        base: BASE,
        bytes: &bytes,
    };
    Layout::read(&image, &symbols, 0).unwrap()
}

#[test]
fn node_24_finds_compiled_code_from_the_pc() {
    let layout = read(NODE_24);
    assert_eq!(layout.version, (13, 6, 17));
    assert_eq!(layout.shared_name, 24);
    assert_eq!(layout.shared_script, 40);
    let code = layout.code.expect("V8 13's code layout");
    // No `JSFunction::code`: a dispatch handle is where it was.
    assert_eq!(code.function_code, None);
    assert_eq!(code.start, CodeStart::Field(40));
    assert_eq!(code.stream, Some(32));
    assert_eq!((code.flags, code.size), (52, 56));
    // Before the wrapper (24): the position table, then the
    // deoptimization data (as in V8 12).
    assert_eq!(code.positions, 16);
    assert_eq!(code.inlining.data, 8);
    assert_eq!((code.inlining.literals, code.inlining.positions), (40, 80));
    assert_eq!(layout.code_bytecode, Some(8));
}

#[test]
fn node_26_reads_as_node_24() {
    let layout = read(&changed(NODE_26_CHANGES));
    assert_eq!(layout.version, (14, 6, 34));
    assert!(layout.lines_checked());
    assert_ne!(layout.encoding(), read(NODE_24).encoding());
    let code = layout.code.expect("V8 14's code layout");
    assert_eq!(code.function_code, None);
    assert_eq!(code.kind_baseline, 11);
    assert_eq!(code.start, CodeStart::Field(40));
    assert_eq!((code.positions, code.inlining.data), (16, 8));
}

#[test]
fn node_22_follows_the_function_to_its_code() {
    let mut constants = changed(NODE_22_CHANGES);
    constants.push(("v8dbg_class_JSFunction__code__Tagged_Code_", 24));
    let layout = read(&constants);
    assert_eq!(layout.version, (12, 4, 21));
    assert_eq!(layout.shared_name, 16);
    let code = layout.code.expect("V8 12's code layout");
    assert_eq!(code.function_code, Some(24));
    assert_eq!((code.flags, code.size, code.positions), (48, 52, 16));
    assert_eq!((code.inlining.literals, code.inlining.positions), (32, 72));
}
