//! Where V8's structures are, from the binary's own postmortem constants:
//! `node` exports `v8dbg_*` symbols (for debuggers such as llnode), each a
//! 32-bit value: frame slot offsets, field offsets, instance types. The
//! few that some versions do not export have kept one value for years and
//! are defaulted, with the version that decides.
use std::collections::HashMap;

use hostprof_common::v8;

use super::V8Error;
use crate::procs::memory::Memory;

/// The V8 constants and symbols one binary has, by name (link-time
/// addresses; the values are read from the process).
pub const SYMBOLS: &[&str] = &[
    "v8dbg_off_fp_context_or_frame_type",
    "v8dbg_off_fp_function",
    "v8dbg_off_fp_bytecode_offset",
    "v8dbg_off_fp_bytecode_array",
    "v8dbg_class_HeapObject__map__Map",
    "v8dbg_class_Map__instance_type__uint16_t",
    "v8dbg_class_JSFunction__shared__SharedFunctionInfo",
    "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object",
    "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_Object_",
    "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_NameOrScopeInfoT_",
    "v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject",
    "v8dbg_class_SharedFunctionInfo__script__Tagged_HeapObject_",
    "v8dbg_class_SharedFunctionInfo__function_data__Object",
    "v8dbg_class_Script__name__Object",
    "v8dbg_class_Script__source__Object",
    "v8dbg_class_Script__line_ends__Object",
    "v8dbg_class_String__length__int32_t",
    "v8dbg_class_SeqOneByteString__chars__char",
    "v8dbg_class_SeqTwoByteString__chars__char",
    "v8dbg_class_ConsString__first__String",
    "v8dbg_class_ConsString__second__String",
    "v8dbg_class_SlicedString__parent__String",
    "v8dbg_class_SlicedString__offset__SMI",
    "v8dbg_class_ThinString__actual__String",
    "v8dbg_class_ExternalString__resource__Object",
    "v8dbg_class_FixedArrayBase__length__SMI",
    "v8dbg_class_FixedArray__data__uintptr_t",
    "v8dbg_class_BytecodeArray__data__uintptr_t",
    "v8dbg_class_BytecodeArray__source_position_table__Object",
    "v8dbg_class_BytecodeArray__wrapper__Tagged_BytecodeWrapper_",
    "v8dbg_class_Code__bytecode_or_interpreter_data__HeapObject",
    "v8dbg_class_Code__wrapper__Tagged_CodeWrapper_",
    "v8dbg_class_InterpreterData__bytecode_array__BytecodeArray",
    "v8dbg_class_JSFunction__code__CodeT",
    "v8dbg_class_JSFunction__code__Tagged_Code_",
    "v8dbg_class_Code__flags__uint32_t",
    "v8dbg_class_Code__instruction_size__int",
    "v8dbg_class_Code__instruction_start__uintptr_t",
    "v8dbg_class_Code__instruction_start__Address",
    "v8dbg_class_InstructionStream__instruction_start__uintptr_t",
    "v8dbg_class_Code__source_position_table__ByteArray",
    "v8dbg_class_Code__deoptimization_data__FixedArray",
    "v8dbg_DeoptimizationDataLiteralArrayIndex",
    "v8dbg_DeoptimizationDataInliningPositionsIndex",
    "v8dbg_CodeKindBaseline",
    "v8dbg_CodeKindFieldMask",
    "v8dbg_CodeKindFieldShift",
    "v8dbg_type_ByteArray__BYTE_ARRAY_TYPE",
    "v8dbg_type_TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE",
    "v8dbg_type_InterpreterData__INTERPRETER_DATA_TYPE",
    "v8dbg_type_Code__CODE_TYPE",
    "v8dbg_type_JSFunction__JS_FUNCTION_TYPE",
    "v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE",
    "v8dbg_type_ScopeInfo__SCOPE_INFO_TYPE",
    "v8dbg_type_Script__SCRIPT_TYPE",
    "v8dbg_type_FixedArray__FIXED_ARRAY_TYPE",
    "v8dbg_type_BytecodeArray__BYTECODE_ARRAY_TYPE",
    "v8dbg_FirstNonstringType",
    "v8dbg_StringRepresentationMask",
    "v8dbg_StringEncodingMask",
    "v8dbg_OneByteStringTag",
    "v8dbg_ConsStringTag",
    "v8dbg_SlicedStringTag",
    "v8dbg_ThinStringTag",
    "v8dbg_ExternalStringTag",
    "v8dbg_scopeinfo_idx_first_vars",
    "v8dbg_scopeinfo_idx_ncontextlocals",
    "_ZN2v88internal7Version6major_E",
    "_ZN2v88internal7Version6minor_E",
    "_ZN2v88internal7Version6patch_E",
    "v8_Default_embedded_blob_code_",
    "v8_Default_embedded_blob_code_data_",
    "v8_Default_embedded_blob_code_size_",
];

/// The newest V8 major whose code layout and lines were checked against
/// `--cpu-prof` (node 26's): a later one keeps its frames' first lines.
const NEWEST_CHECKED: u32 = 14;

/// Largest field offset believed (V8's objects are a few hundred bytes).
const MAX_OFFSET: i64 = 4096;

/// The offsets and constants the walk and the naming use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub version: (u32, u32, u32),
    pub fp_marker: i64,
    pub fp_function: i64,
    pub fp_bytecode_offset: i64,
    pub fp_bytecode_array: i64,
    pub map: u64,
    pub instance_type: u64,
    pub function_shared: u64,
    pub shared_name: u64,
    pub shared_script: u64,
    pub shared_function_data: u64,
    pub script_name: u64,
    pub script_source: u64,
    pub script_line_ends: u64,
    pub string_length: u64,
    pub seq_one_byte_chars: u64,
    pub seq_two_byte_chars: u64,
    pub cons_first: u64,
    pub cons_second: u64,
    pub sliced_parent: u64,
    pub sliced_offset: u64,
    pub thin_actual: u64,
    /// `ExternalString::resource`, the embedder's object holding the
    /// characters; V8 keeps a copy of its data pointer in the word after
    /// (`None`: not exported, external strings are not read).
    pub external_resource: Option<u64>,
    pub array_length: u64,
    pub fixed_array_data: u64,
    pub bytecode_data: u64,
    /// `BytecodeArray::source_position_table`.
    pub bytecode_positions: u64,
    /// Where a `ByteArray`'s (or `TrustedByteArray`'s) bytes start.
    pub byte_array_data: u64,
    /// The type of source position tables (`TrustedByteArray` from V8
    /// 12), and of other byte arrays (V8 12's inlining positions).
    pub type_byte_array: u32,
    pub type_plain_byte_array: u32,
    /// `InterpreterData` and its `bytecode_array` (a function's data with
    /// a copy of the interpreter's trampoline).
    pub type_interpreter_data: Option<u32>,
    pub interpreter_data_bytecode: Option<u64>,
    /// `Code` and where baseline (Sparkplug) code keeps its bytecode (a
    /// function's data once compiled by Sparkplug).
    pub type_code: Option<u32>,
    pub code_bytecode: Option<u64>,
    /// Where compiled code keeps what maps its pcs to source positions
    /// (`None`: a V8 whose `Code` this agent does not know).
    pub code: Option<CodeLayout>,
    pub type_function: u32,
    pub type_shared_info: u32,
    pub type_scope_info: u32,
    pub type_script: u32,
    pub type_fixed_array: u32,
    pub type_bytecode_array: u32,
    pub first_nonstring_type: u32,
    pub representation_mask: u32,
    pub encoding_mask: u32,
    pub one_byte_tag: u32,
    pub cons_tag: u32,
    pub sliced_tag: u32,
    pub thin_tag: u32,
    pub external_tag: u32,
    pub scope_first_vars: u64,
    pub scope_context_locals: u64,
}

/// `BytecodeArray::source_position_table`, not exported by node 18 to 22:
/// after the length, the constant pool and the handler table (V8 10 and
/// 11), or after the length and the wrapper (V8 12, whose wrapper is
/// exported), as the OpenTelemetry profiler derives it.
fn bytecode_positions(value: &dyn Fn(&'static str) -> Option<i64>) -> Option<i64> {
    if let Some(exported) = value("v8dbg_class_BytecodeArray__source_position_table__Object") {
        return Some(exported);
    }
    if let Some(wrapper) = value("v8dbg_class_BytecodeArray__wrapper__Tagged_BytecodeWrapper_") {
        return Some(wrapper + 8);
    }
    Some(value("v8dbg_class_FixedArrayBase__length__SMI")? + 24)
}

/// Where a baseline `Code` keeps its bytecode (or interpreter data):
/// exported by V8 11; before the position table in V8 10 (16), first
/// after the map in V8 12 (its wrapper, exported, 16 bytes on).
fn baseline_bytecode(
    value: &dyn Fn(&'static str) -> Option<i64>,
    version: (u32, u32, u32),
) -> Option<i64> {
    if let Some(exported) = value("v8dbg_class_Code__bytecode_or_interpreter_data__HeapObject") {
        return Some(exported);
    }
    if version.0 >= 12 {
        return Some(value("v8dbg_class_Code__wrapper__Tagged_CodeWrapper_")? - 16);
    }
    (version.0 == 10).then_some(16)
}

/// A function's code and what in it maps a pc to a source position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    /// `JSFunction::code` (`None`: V8 13 and later, whose functions reach
    /// their code through a process-wide dispatch table; a compiled frame's
    /// code is then found from its pc).
    pub function_code: Option<u64>,
    /// `Code::flags` (`u32`), whose kind bits say the tier.
    pub flags: u64,
    pub kind_mask: u32,
    pub kind_shift: u32,
    /// `CodeKind::BASELINE` (Sparkplug); Maglev's and TurboFan's follow.
    pub kind_baseline: u32,
    pub start: CodeStart,
    /// Where an `InstructionStream`'s instructions start in it (V8 11 and
    /// later, whose `Code` points at them; the stream's word after its map
    /// points back at the `Code`): how code is found from a pc in it.
    pub stream: Option<u64>,
    /// `Code::instruction_size` (`i32`).
    pub size: u64,
    /// `Code::source_position_table` (baseline code keeps its bytecode
    /// offset table there).
    pub positions: u64,
    /// What optimized code inlined.
    pub inlining: InliningLayout,
}

/// Where optimized code says which functions it inlined: its
/// `DeoptimizationData`, a fixed array holding the inlining positions (a
/// byte array of `InliningPosition`s: the call's packed source position,
/// then the inlined function's index among the literals) and the literals
/// (a weak fixed array whose first entries are the inlined functions'
/// `SharedFunctionInfo`s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InliningLayout {
    /// `Code::deoptimization_data`.
    pub data: u64,
    /// The literals' and the inlining positions' fields in the data.
    pub literals: u64,
    pub positions: u64,
}

/// Where a `Code`'s instructions start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeStart {
    /// In the object, this many bytes on (V8 10 and older).
    Inline(u64),
    /// At the address this field holds (V8 11 and later).
    Field(u64),
}

/// The `Code` layout of V8 10 to 14 (node 18 to 26): what the binary
/// exports, and the few fields it does not, which these versions agree
/// on (checked on node 18.20.4, 20.18.0, 22.11.0, 24.11.1 and 26.12.1's
/// objects).
fn code_layout(
    value: &dyn Fn(&'static str) -> Option<i64>,
    version: (u32, u32, u32),
) -> Option<CodeLayout> {
    let offset = |value: i64| (0..MAX_OFFSET).contains(&value).then_some(value as u64);
    let function_code = match value("v8dbg_class_JSFunction__code__CodeT")
        .or_else(|| value("v8dbg_class_JSFunction__code__Tagged_Code_"))
    {
        Some(exported) => Some(offset(exported)?),
        // Not exported by V8 11: between the feedback cell and the
        // prototype, as in V8 10.
        None if version.0 == 11 => Some(48),
        // Leaptiering (V8 13 and 14): a dispatch handle where the code was.
        None if (13..=NEWEST_CHECKED).contains(&version.0) => None,
        None => return None,
    };
    let start = match version.0 {
        10 => CodeStart::Inline(offset(value(
            "v8dbg_class_Code__instruction_start__uintptr_t",
        )?)?),
        // V8 11's entry point: after the instruction stream.
        11 => CodeStart::Field(40),
        12..=NEWEST_CHECKED => CodeStart::Field(offset(value(
            "v8dbg_class_Code__instruction_start__Address",
        )?)?),
        _ => return None,
    };
    let size = value("v8dbg_class_Code__instruction_size__int")
        .or((version.0 == 11).then_some(56))
        .and_then(offset)?;
    let positions = match version.0 {
        10 => Some(24),
        11 => value("v8dbg_class_Code__source_position_table__ByteArray"),
        // Before the wrapper.
        _ => value("v8dbg_class_Code__wrapper__Tagged_CodeWrapper_").map(|wrapper| wrapper - 8),
    }
    .and_then(offset)?;
    let small = |name| value(name).and_then(|value| u32::try_from(value).ok());
    // A fixed array's element: a word, after the array's header.
    let elements = value("v8dbg_class_FixedArray__data__uintptr_t")?;
    let element = |index: i64| {
        (0..64)
            .contains(&index)
            .then(|| elements + 8 * index)
            .and_then(offset)
    };
    let inlining = InliningLayout {
        data: match version.0 {
            // Exported by V8 11; after the relocation info in V8 10; first
            // after the map in V8 12 (as baseline code's bytecode).
            12..=NEWEST_CHECKED => {
                offset(value("v8dbg_class_Code__wrapper__Tagged_CodeWrapper_")? - 16)?
            }
            _ => offset(value("v8dbg_class_Code__deoptimization_data__FixedArray").unwrap_or(16))?,
        },
        // Exported by V8 11 and 12; the same in V8 10 (its sources say).
        literals: element(value("v8dbg_DeoptimizationDataLiteralArrayIndex").unwrap_or(2))?,
        positions: element(value("v8dbg_DeoptimizationDataInliningPositionsIndex").unwrap_or(7))?,
    };
    Some(CodeLayout {
        function_code,
        flags: value("v8dbg_class_Code__flags__uint32_t")
            .or(Some(48))
            .and_then(offset)?,
        kind_mask: small("v8dbg_CodeKindFieldMask")?,
        kind_shift: small("v8dbg_CodeKindFieldShift").unwrap_or(0).min(31),
        kind_baseline: small("v8dbg_CodeKindBaseline")?,
        start,
        // The word after the stream's map is its `Code` in both (checked
        // on node 20.18.0's and 22.11.0's objects).
        stream: match start {
            CodeStart::Inline(_) => None,
            CodeStart::Field(_) => {
                value("v8dbg_class_InstructionStream__instruction_start__uintptr_t")
                    .and_then(offset)
                    .filter(|&header| header >= 16)
            }
        },
        size,
        positions,
        inlining,
    })
}

/// A binary's V8 symbols, link-time addresses by name.
pub type Symbols = HashMap<&'static str, u64>;

impl Layout {
    /// Reads the constants at `symbols` (moved by `bias`) from `memory`.
    pub fn read(memory: &impl Memory, symbols: &Symbols, bias: u64) -> Result<Layout, V8Error> {
        let value = |name: &'static str| -> Option<i64> {
            let address = symbols.get(name)?.wrapping_add(bias);
            memory
                .read_u32(address)
                .map(|value| i64::from(value as i32))
        };
        let need = |name: &'static str| value(name).ok_or(V8Error::MissingConstant(name));
        let either = |a: &'static str, b: &'static str| value(a).or_else(|| value(b));
        let offset = |value: i64, what: &'static str| -> Result<u64, V8Error> {
            if (0..MAX_OFFSET).contains(&value) {
                Ok(value as u64)
            } else {
                Err(V8Error::Implausible(what))
            }
        };
        let field = |name: &'static str| offset(need(name)?, name);
        let small = |name: &'static str| -> Result<u32, V8Error> {
            u32::try_from(need(name)?).map_err(|_| V8Error::Implausible(name))
        };
        let version = (
            need("_ZN2v88internal7Version6major_E")? as u32,
            need("_ZN2v88internal7Version6minor_E")? as u32,
            need("_ZN2v88internal7Version6patch_E")? as u32,
        );
        let layout = Layout {
            version,
            fp_marker: need("v8dbg_off_fp_context_or_frame_type")?,
            fp_function: need("v8dbg_off_fp_function")?,
            fp_bytecode_offset: need("v8dbg_off_fp_bytecode_offset")?,
            fp_bytecode_array: need("v8dbg_off_fp_bytecode_array")?,
            // The map is every heap object's first field.
            map: offset(
                value("v8dbg_class_HeapObject__map__Map").unwrap_or(0),
                "map",
            )?,
            instance_type: field("v8dbg_class_Map__instance_type__uint16_t")?,
            function_shared: field("v8dbg_class_JSFunction__shared__SharedFunctionInfo")?,
            shared_name: offset(
                either(
                    "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object",
                    "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_Object_",
                )
                .or_else(|| {
                    value("v8dbg_class_SharedFunctionInfo__name_or_scope_info__Tagged_NameOrScopeInfoT_")
                })
                .ok_or(V8Error::MissingConstant(
                    "SharedFunctionInfo::name_or_scope_info",
                ))?,
                "name_or_scope_info",
            )?,
            shared_script: offset(
                either(
                    "v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject",
                    "v8dbg_class_SharedFunctionInfo__script__Tagged_HeapObject_",
                )
                .ok_or(V8Error::MissingConstant("SharedFunctionInfo::script"))?,
                "script",
            )?,
            // Not exported since V8 11.x; 8 since V8 8 (node's builds have
            // no sandbox, which would move it).
            shared_function_data: offset(
                value("v8dbg_class_SharedFunctionInfo__function_data__Object").unwrap_or(8),
                "function_data",
            )?,
            script_name: field("v8dbg_class_Script__name__Object")?,
            script_source: field("v8dbg_class_Script__source__Object")?,
            script_line_ends: field("v8dbg_class_Script__line_ends__Object")?,
            string_length: field("v8dbg_class_String__length__int32_t")?,
            seq_one_byte_chars: field("v8dbg_class_SeqOneByteString__chars__char")?,
            seq_two_byte_chars: field("v8dbg_class_SeqTwoByteString__chars__char")?,
            cons_first: field("v8dbg_class_ConsString__first__String")?,
            cons_second: field("v8dbg_class_ConsString__second__String")?,
            sliced_parent: field("v8dbg_class_SlicedString__parent__String")?,
            sliced_offset: field("v8dbg_class_SlicedString__offset__SMI")?,
            thin_actual: field("v8dbg_class_ThinString__actual__String")?,
            external_resource: field("v8dbg_class_ExternalString__resource__Object").ok(),
            array_length: field("v8dbg_class_FixedArrayBase__length__SMI")?,
            fixed_array_data: field("v8dbg_class_FixedArray__data__uintptr_t")?,
            bytecode_data: field("v8dbg_class_BytecodeArray__data__uintptr_t")?,
            bytecode_positions: offset(
                bytecode_positions(&value).ok_or(V8Error::MissingConstant(
                    "BytecodeArray::source_position_table",
                ))?,
                "source_position_table",
            )?,
            // A byte array's bytes follow its map and length.
            byte_array_data: field("v8dbg_class_FixedArray__data__uintptr_t")?,
            type_byte_array: small(
                if symbols.contains_key("v8dbg_type_TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE") {
                    "v8dbg_type_TrustedByteArray__TRUSTED_BYTE_ARRAY_TYPE"
                } else {
                    "v8dbg_type_ByteArray__BYTE_ARRAY_TYPE"
                },
            )?,
            type_plain_byte_array: small("v8dbg_type_ByteArray__BYTE_ARRAY_TYPE")?,
            type_interpreter_data: small("v8dbg_type_InterpreterData__INTERPRETER_DATA_TYPE").ok(),
            // Not exported; after the map (V8 10 to 12).
            interpreter_data_bytecode: Some(
                value("v8dbg_class_InterpreterData__bytecode_array__BytecodeArray").unwrap_or(8),
            )
            .and_then(|value| offset(value, "bytecode_array").ok()),
            type_code: small("v8dbg_type_Code__CODE_TYPE").ok(),
            code_bytecode: baseline_bytecode(&value, version)
                .and_then(|value| offset(value, "bytecode_or_interpreter_data").ok()),
            code: code_layout(&value, version),
            type_function: small("v8dbg_type_JSFunction__JS_FUNCTION_TYPE")?,
            type_shared_info: small("v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE")?,
            type_scope_info: small("v8dbg_type_ScopeInfo__SCOPE_INFO_TYPE")?,
            type_script: small("v8dbg_type_Script__SCRIPT_TYPE")?,
            type_fixed_array: small("v8dbg_type_FixedArray__FIXED_ARRAY_TYPE")?,
            type_bytecode_array: small("v8dbg_type_BytecodeArray__BYTECODE_ARRAY_TYPE")?,
            first_nonstring_type: small("v8dbg_FirstNonstringType")?,
            representation_mask: small("v8dbg_StringRepresentationMask")?,
            encoding_mask: small("v8dbg_StringEncodingMask")?,
            one_byte_tag: small("v8dbg_OneByteStringTag")?,
            cons_tag: small("v8dbg_ConsStringTag")?,
            sliced_tag: small("v8dbg_SlicedStringTag")?,
            thin_tag: small("v8dbg_ThinStringTag")?,
            external_tag: small("v8dbg_ExternalStringTag")?,
            scope_first_vars: field("v8dbg_scopeinfo_idx_first_vars")?,
            scope_context_locals: field("v8dbg_scopeinfo_idx_ncontextlocals")?,
        };
        layout.slots()?;
        Ok(layout)
    }

    /// The frame slots' word indices in the kernel's window.
    fn slots(&self) -> Result<[u32; 4], V8Error> {
        let slot = |offset: i64, what: &'static str| -> Result<u32, V8Error> {
            let from_low = offset + v8::WINDOW_LOW as i64;
            if offset < 0 && from_low >= 0 && from_low % 8 == 0 {
                Ok((from_low / 8) as u32)
            } else {
                Err(V8Error::Implausible(what))
            }
        };
        Ok([
            slot(self.fp_marker, "frame marker slot")?,
            slot(self.fp_function, "frame function slot")?,
            slot(self.fp_bytecode_offset, "frame bytecode offset slot")?,
            slot(self.fp_bytecode_array, "frame bytecode array slot")?,
        ])
    }

    /// The kernel's record of a process with this layout and `blobs`.
    pub fn kernel_process(&self, blobs: &[(u64, u64)]) -> v8::Process {
        let [
            slot_marker,
            slot_function,
            slot_bytecode_offset,
            slot_bytecode_array,
        ] = self.slots().unwrap_or_default();
        let mut ranges = [v8::Range::default(); v8::MAX_BLOBS];
        for (slot, &(low, high)) in ranges.iter_mut().zip(blobs) {
            *slot = v8::Range { low, high };
        }
        v8::Process {
            blobs: ranges,
            slot_marker,
            slot_function,
            slot_bytecode_offset,
            heap_object_map: self.map as u32,
            map_instance_type: self.instance_type as u32,
            function_shared: self.function_shared as u32,
            type_function_first: self.type_function,
            type_function_last: self.type_function + v8::FUNCTION_TYPES - 1,
            type_shared_info: self.type_shared_info,
            slot_bytecode_array,
            type_bytecode_array: self.type_bytecode_array,
            _pad: 0,
        }
    }

    /// Whether this V8's lines were checked against `--cpu-prof`'s.
    pub fn lines_checked(&self) -> bool {
        self.version.0 <= NEWEST_CHECKED
    }

    /// How its source position tables are encoded.
    pub fn encoding(&self) -> super::positions::Encoding {
        super::positions::Encoding::of(self.version.0)
    }

    /// True for V8 12.8.44 and later, whose `ScopeInfo` keeps the
    /// function's source positions at fixed slots.
    pub fn fixed_scope_positions(&self) -> bool {
        self.version >= (12, 8, 44)
    }
}
