//! One JVM process's layout, derived from its VMStructs: the field offsets
//! the kernel's walk and the host's naming read (with the names they had
//! across JDK 11 to 25; tested on 17 and 25), its code heaps and its
//! version.
use std::{collections::HashMap, sync::Arc};

use hostprof_common::hotspot::{Heap, MAX_HEAPS, Process};
use object::{Object, ObjectSymbol};

use super::{
    HotspotError,
    names::Caches,
    vmstructs::{self, Memory, TableSymbols, VmStructs},
};
use crate::{model::Mapping, runtime::elf};

/// Largest field offset or type size believed (real ones are below 1 KiB,
/// but for `InstanceKlass` and `Thread`): the kernel keeps them as `u32`
/// and the host reads whole headers of this size.
const MAX_OFFSET: u64 = 1 << 16;

/// Offsets and sizes, in bytes, of what the kernel walk and the naming
/// read. Field names follow HotSpot's.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Layout {
    pub blob_name: u64,
    pub blob_frame_size: u64,
    pub blob_frame_complete: u64,
    pub blob_code_begin: u64,
    pub code_begin_is_offset: bool,
    pub nmethod_compile_id: u64,
    pub nmethod_method: u64,
    /// Where nmethods keep their debug info; `None` on layouts not known.
    pub debug: Option<DebugLayout>,
    pub method_const_method: u64,
    pub const_method_size: u64,
    pub const_method_constants: u64,
    pub const_method_code_size: u64,
    pub const_method_flags: u64,
    pub const_method_name_index: u64,
    /// `ConstMethod`'s flag that a line number table follows the bytecodes.
    pub has_linenumber_table: u32,
    pub pool_size: u64,
    pub pool_holder: u64,
    /// `ConstantPool::_source_file_name_index` (JDK 15+) or
    /// `InstanceKlass::_source_file_name_index` (older): (in the pool?, offset).
    pub source_file_index: Option<(bool, u64)>,
    pub klass_name: u64,
    pub symbol_length: u64,
    pub symbol_body: u64,
    pub heap_block_size: u64,
    /// `HeapBlock::Header::_length` (in segments: `size_t` up to JDK 24,
    /// `uint32_t` since) as (offset, width), and `_used`: what a walk of
    /// the heap's blocks on the host reads (the kernel uses the segment
    /// map instead).
    pub heap_block_length: Option<(u64, u8)>,
    pub heap_block_used: Option<u64>,
    /// Bytes of a compressed stream's lowest values excluded (JDK 20+'s
    /// UNSIGNED5 never writes a 0 byte).
    pub unsigned5_exclusion: u8,
}

/// An integer field: its offset and width in bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Int {
    pub at: u64,
    pub width: u8,
}

/// Where an nmethod keeps its debug info: its metadata (the `Method*`s
/// scopes refer to), its scopes data and its PcDescs.
#[derive(Clone, Copy, Debug)]
pub(super) struct DebugLayout {
    pub pc_desc_size: u64,
    pub pc_desc_pc_offset: u64,
    pub pc_desc_scope_decode_offset: u64,
    pub regions: Regions,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Regions {
    /// JDK 9 to 22: one after the other in the nmethod, from
    /// `_metadata_offset` (from the nmethod) to `_scopes_data_begin` (a
    /// pointer), `_scopes_pcs_offset` and `_dependencies_offset`.
    Inline {
        metadata_offset: Int,
        scopes_data_begin: u64,
        scopes_pcs_offset: Int,
        dependencies_offset: Int,
    },
    /// JDK 23+: PcDescs then scopes in a block of their own
    /// (`_immutable_data`, offsets into it, `_immutable_data_size` bytes);
    /// the metadata after the code (`CodeBlob::_data_offset` +
    /// `nmethod::_metadata_offset`, up to `CodeBlob::_size`), or (JDK 25+)
    /// in the mutable data, after the relocations.
    Immutable {
        immutable_data: u64,
        immutable_data_size: Int,
        /// JDK 26+: the block ends with a reference count from here.
        ref_count_offset: Option<Int>,
        scopes_pcs_offset: Int,
        scopes_data_offset: Int,
        metadata: Metadata,
    },
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Metadata {
    AfterCode {
        data_offset: Int,
        metadata_offset: Int,
        size: Int,
    },
    Mutable {
        mutable_data: u64,
        relocation_size: Int,
        mutable_data_size: Int,
    },
}

/// A JVM process: its layout, code heaps and naming caches.
pub struct Jvm {
    pub(super) pid: u32,
    pub(super) layout: Layout,
    heaps: Vec<Heap>,
    version: Option<String>,
    pub(super) caches: Caches,
}

/// The libjvm symbols that locate the four tables.
const TABLES: [(&str, &[&str]); 4] = [
    (
        "gHotSpotVMStructs",
        &[
            "gHotSpotVMStructEntryArrayStride",
            "gHotSpotVMStructEntryTypeNameOffset",
            "gHotSpotVMStructEntryFieldNameOffset",
            "gHotSpotVMStructEntryTypeStringOffset",
            "gHotSpotVMStructEntryIsStaticOffset",
            "gHotSpotVMStructEntryOffsetOffset",
            "gHotSpotVMStructEntryAddressOffset",
        ],
    ),
    (
        "gHotSpotVMTypes",
        &[
            "gHotSpotVMTypeEntryArrayStride",
            "gHotSpotVMTypeEntryTypeNameOffset",
            "gHotSpotVMTypeEntrySizeOffset",
        ],
    ),
    (
        "gHotSpotVMIntConstants",
        &[
            "gHotSpotVMIntConstantEntryArrayStride",
            "gHotSpotVMIntConstantEntryNameOffset",
            "gHotSpotVMIntConstantEntryValueOffset",
        ],
    ),
    (
        "gHotSpotVMLongConstants",
        &[
            "gHotSpotVMLongConstantEntryArrayStride",
            "gHotSpotVMLongConstantEntryNameOffset",
            "gHotSpotVMLongConstantEntryValueOffset",
        ],
    ),
];

/// libjvm files read (by content: see [`elf::FileKey`]) before starting over.
const MAX_LIBJVMS: usize = 16;

/// What a libjvm file tells: its segments and the link-time addresses of
/// the table symbols it has.
#[derive(Debug)]
struct LibjvmFile {
    segments: Vec<(u64, u64, u64)>,
    symbols: Vec<(&'static str, u64)>,
}

impl LibjvmFile {
    fn read(data: &crate::files::FileData) -> Result<Arc<LibjvmFile>, HotspotError> {
        let file =
            object::File::parse(&**data).map_err(|err| HotspotError::Elf(err.to_string()))?;
        let wanted: HashMap<&str, &'static str> = TABLES
            .iter()
            .flat_map(|(table, members)| std::iter::once(*table).chain(members.iter().copied()))
            .map(|name| (name, name))
            .collect();
        let mut symbols = Vec::new();
        for symbol in file.dynamic_symbols().chain(file.symbols()) {
            if let Ok(name) = symbol.name()
                && let Some(name) = wanted.get(name)
                && !symbols.iter().any(|(found, _)| found == name)
            {
                symbols.push((*name, symbol.address()));
            }
        }
        Ok(Arc::new(LibjvmFile {
            segments: elf::segments(&file),
            symbols,
        }))
    }
}

/// libjvm files already read (their symbols), for [`Jvm::attach_cached`],
/// by what they are ([`elf::FileKey`]): the same libjvm in two containers
/// is read once, an upgraded one again.
#[derive(Debug)]
pub struct LibjvmCache {
    files: elf::ByFile<Arc<LibjvmFile>>,
}

impl Default for LibjvmCache {
    fn default() -> Self {
        LibjvmCache {
            files: elf::ByFile::new(MAX_LIBJVMS),
        }
    }
}

impl Jvm {
    /// `libjvm` is the process's executable mapping of libjvm.so.
    /// [`HotspotError::NotReady`] while the JVM is starting (try again
    /// later); other errors will not go away for this process.
    pub fn attach(pid: u32, libjvm: &Mapping) -> Result<Jvm, HotspotError> {
        Jvm::attach_cached(pid, libjvm, &mut LibjvmCache::default())
    }

    /// [`Jvm::attach`], reading each libjvm file once for all the JVMs
    /// (and attempts) that map it: reading its symbols takes a good part
    /// of a second.
    pub fn attach_cached(
        pid: u32,
        libjvm: &Mapping,
        cache: &mut LibjvmCache,
    ) -> Result<Jvm, HotspotError> {
        // Not cached when it fails: the file may be readable later.
        let unreadable = |err: crate::files::FileError| HotspotError::Elf(err.to_string());
        let file = cache
            .files
            .read(pid, libjvm, unreadable, LibjvmFile::read)?;
        let bias = elf::load_bias(&file.segments, libjvm)
            .ok_or_else(|| HotspotError::Elf("no segment holds the mapping".into()))?;
        let symbols: HashMap<&str, u64> = file
            .symbols
            .iter()
            .map(|(name, address)| (*name, address.wrapping_add(bias)))
            .collect();
        let table = |index: usize| -> Result<TableSymbols, HotspotError> {
            let (name, members) = TABLES[index];
            let find = |name: &'static str| {
                symbols
                    .get(name)
                    .copied()
                    .ok_or(HotspotError::MissingSymbol(name))
            };
            let mut out = TableSymbols {
                table: find(name)?,
                stride: find(members[0])?,
                members: [0; 6],
            };
            for (slot, name) in out.members.iter_mut().zip(&members[1..]) {
                *slot = find(name)?;
            }
            Ok(out)
        };
        let (structs, types) = (table(0)?, table(1)?);
        let (ints, longs) = (table(2).ok(), table(3).ok());
        let memory = vmstructs::Process(pid);
        let vm = VmStructs::read(&memory, &structs, &types, ints.as_ref(), longs.as_ref())?;
        let (version, major) = version(&memory, &vm);
        let layout = Layout::new(&vm, major)?;
        let heaps = heaps(&memory, &vm)?;
        Ok(Jvm {
            pid,
            layout,
            heaps,
            version,
            caches: Caches::default(),
        })
    }

    /// Everything the kernel walk needs.
    pub fn kernel_process(&self) -> Process {
        let layout = &self.layout;
        let mut heaps = [Heap::default(); MAX_HEAPS];
        for (slot, heap) in heaps.iter_mut().zip(&self.heaps) {
            *slot = *heap;
        }
        // Offsets were checked below `MAX_OFFSET` when read: they fit.
        let small = |value: u64| value as u32;
        Process {
            heaps,
            heap_count: self.heaps.len() as u32,
            heap_block_size: small(layout.heap_block_size),
            blob_name: small(layout.blob_name),
            blob_frame_size: small(layout.blob_frame_size),
            blob_frame_complete: small(layout.blob_frame_complete),
            blob_code_begin: small(layout.blob_code_begin),
            code_begin_is_offset: u32::from(layout.code_begin_is_offset),
            nmethod_compile_id: small(layout.nmethod_compile_id),
            method_const_method: small(layout.method_const_method),
            const_method_size: small(layout.const_method_size),
            interp_bcp_slot: if cfg!(target_arch = "aarch64") { 9 } else { 8 },
            _pad: 0,
        }
    }

    /// [low, high) of each code heap.
    pub fn code_ranges(&self) -> Vec<(u64, u64)> {
        self.heaps
            .iter()
            .map(|heap| (heap.low, heap.high))
            .collect()
    }

    /// e.g. "17.0.15" — best effort.
    pub fn version(&self) -> Option<String> {
        self.version.clone()
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A JVM of `layout` without heaps, for tests of the naming.
    #[cfg(test)]
    pub(super) fn for_tests(pid: u32, layout: Layout) -> Jvm {
        Jvm {
            pid,
            layout,
            heaps: Vec::new(),
            version: None,
            caches: Caches::default(),
        }
    }

    /// (address, name) of every code blob in use, walking each heap block
    /// by block (a block's header holds its length in segments and
    /// whether it is used; the blob follows the header). A system call or
    /// three per block: for diagnostics and tests, not per sample.
    pub fn blobs(&self) -> Vec<(u64, String)> {
        /// Blocks walked at most (a 240 MiB cache of 128-byte segments
        /// has under two million).
        const MAX_BLOCKS: usize = 1 << 21;
        let memory = vmstructs::Process(self.pid);
        let layout = &self.layout;
        let (Some((length_at, width)), Some(used_at)) =
            (layout.heap_block_length, layout.heap_block_used)
        else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut blocks = 0;
        for heap in &self.heaps {
            let mut block = heap.low;
            while block < heap.high && blocks < MAX_BLOCKS {
                blocks += 1;
                let length = match width {
                    8 => memory.read_u64(block.wrapping_add(length_at)),
                    4 => memory
                        .read_u32(block.wrapping_add(length_at))
                        .map(u64::from),
                    _ => None,
                };
                let used = memory
                    .read_vec(block.wrapping_add(used_at), 1)
                    .map(|byte| byte[0] != 0);
                // Past the committed part, or a length that would not move on.
                let (Some(length), Some(used)) = (length, used) else {
                    break;
                };
                let Some(next) = length
                    .checked_shl(heap.log2_segment)
                    .filter(|step| *step != 0 && length < 1 << 32)
                    .and_then(|step| block.checked_add(step))
                else {
                    break;
                };
                let blob = block.wrapping_add(layout.heap_block_size);
                if used
                    && let Some(name) = memory
                        .read_u64(blob.wrapping_add(layout.blob_name))
                        .and_then(|name| memory.read_cstr(name, 256))
                {
                    out.push((blob, name));
                }
                block = next;
            }
        }
        out
    }
}

/// The first of `fields` in the first of `types` having it, checked to be
/// a plausible offset.
fn offset(vm: &VmStructs, types: &[&str], fields: &[&str]) -> Result<u64, HotspotError> {
    let (offset, _) = vm
        .offset(types, fields)
        .ok_or_else(|| HotspotError::Missing(format!("{}::{}", types[0], fields[0])))?;
    plausible(offset, "field offset")
}

fn size(vm: &VmStructs, type_name: &str) -> Result<u64, HotspotError> {
    let size = vm
        .size(type_name)
        .ok_or_else(|| HotspotError::Missing(format!("sizeof({type_name})")))?;
    plausible(size, "type size")
}

fn plausible(value: u64, what: &'static str) -> Result<u64, HotspotError> {
    if value < MAX_OFFSET {
        Ok(value)
    } else {
        Err(HotspotError::Implausible { what, value })
    }
}

/// Whether a VMStructs type string names a pointer (`address`, `Foo*`)
/// rather than an integer.
fn is_pointer(type_string: &str) -> bool {
    type_string == "address" || type_string.ends_with('*')
}

/// Bytes of an integer of a VMStructs type string, when known.
fn width(type_string: &str) -> Option<u8> {
    match type_string {
        "size_t" | "uintptr_t" | "intptr_t" | "uint64_t" | "u8" | "jlong" => Some(8),
        "uint32_t" | "int32_t" | "u4" | "int" | "unsigned int" | "uint" | "jint" => Some(4),
        "uint16_t" | "u2" | "unsigned short" => Some(2),
        "uint8_t" | "u1" | "bool" | "char" => Some(1),
        _ => None,
    }
}

/// nmethod's fields sit in `nmethod`, or its base `CompiledMethod`
/// (JDK 9 to 22) or `CodeBlob`.
const NMETHOD: &[&str] = &["nmethod", "CompiledMethod", "CodeBlob"];

impl Layout {
    fn new(vm: &VmStructs, major: Option<u32>) -> Result<Layout, HotspotError> {
        let blob = &["CodeBlob"];
        let (blob_code_begin, code_begin) = vm
            .offset(blob, &["_code_begin", "_code_offset"])
            .ok_or_else(|| HotspotError::Missing("CodeBlob::_code_begin".into()))?;
        let code_begin_is_offset = !is_pointer(&code_begin.type_string);
        let (const_method_flags, _) = vm
            .offset(&["ConstMethod"], &["_flags", "_flags._flags"])
            .ok_or_else(|| HotspotError::Missing("ConstMethod::_flags".into()))?;
        let source_file_index = match vm.offset(&["ConstantPool"], &["_source_file_name_index"]) {
            Some((at, _)) => Some((true, plausible(at, "field offset")?)),
            None => vm
                .offset(&["InstanceKlass"], &["_source_file_name_index"])
                .map(|(at, _)| plausible(at, "field offset").map(|at| (false, at)))
                .transpose()?,
        };
        // JDK 12+ keeps the length in the high half of a 32-bit word.
        let symbol_length = match vm.offset(&["Symbol"], &["_length"]) {
            Some((at, _)) => at,
            None => offset(vm, &["Symbol"], &["_length_and_refcount"])? + 2,
        };
        Ok(Layout {
            blob_name: offset(vm, blob, &["_name"])?,
            blob_frame_size: offset(vm, blob, &["_frame_size"])?,
            blob_frame_complete: offset(vm, blob, &["_frame_complete_offset"])?,
            blob_code_begin: plausible(blob_code_begin, "field offset")?,
            code_begin_is_offset,
            nmethod_compile_id: offset(vm, NMETHOD, &["_compile_id"])?,
            nmethod_method: offset(vm, NMETHOD, &["_method"])?,
            debug: debug_layout(vm),
            method_const_method: offset(vm, &["Method"], &["_constMethod"])?,
            const_method_size: size(vm, "ConstMethod")?,
            const_method_constants: offset(vm, &["ConstMethod"], &["_constants"])?,
            const_method_code_size: offset(vm, &["ConstMethod"], &["_code_size"])?,
            const_method_flags: plausible(const_method_flags, "field offset")?,
            const_method_name_index: offset(vm, &["ConstMethod"], &["_name_index"])?,
            // Bit 0 in every JDK since 8; taken from the JVM when it says.
            has_linenumber_table: vm
                .int("ConstMethod::_has_linenumber_table")
                .and_then(|flag| u32::try_from(flag).ok())
                .filter(|flag| flag.is_power_of_two())
                .unwrap_or(1),
            pool_size: size(vm, "ConstantPool")?,
            pool_holder: offset(vm, &["ConstantPool"], &["_pool_holder"])?,
            source_file_index,
            klass_name: offset(vm, &["Klass"], &["_name"])?,
            symbol_length: plausible(symbol_length, "field offset")?,
            symbol_body: offset(vm, &["Symbol"], &["_body"])?,
            heap_block_size: size(vm, "HeapBlock")?,
            heap_block_length: vm
                .offset(&["HeapBlock::Header"], &["_length"])
                .filter(|(at, _)| *at < MAX_OFFSET)
                .and_then(|(at, field)| Some((at, width(&field.type_string)?))),
            heap_block_used: vm
                .offset(&["HeapBlock::Header"], &["_used"])
                .map(|(at, _)| at)
                .filter(|at| *at < MAX_OFFSET),
            unsigned5_exclusion: u8::from(major.is_some_and(|major| major >= 20)),
        })
    }
}

/// The debug info layout, when the JVM describes one we know (without
/// it, compiled frames are named without inlining or lines).
fn debug_layout(vm: &VmStructs) -> Option<DebugLayout> {
    let int = |types: &[&str], field: &str| {
        let (at, entry) = vm.offset(types, &[field])?;
        let width = width(&entry.type_string)?;
        (at < MAX_OFFSET).then_some(Int { at, width })
    };
    let pointer = |types: &[&str], field: &str| {
        let (at, entry) = vm.offset(types, &[field])?;
        (at < MAX_OFFSET && is_pointer(&entry.type_string)).then_some(at)
    };
    let regions = if let Some(immutable_data) = pointer(NMETHOD, "_immutable_data") {
        let metadata = match pointer(NMETHOD, "_mutable_data") {
            Some(mutable_data) => Metadata::Mutable {
                mutable_data,
                relocation_size: int(NMETHOD, "_relocation_size")?,
                mutable_data_size: int(NMETHOD, "_mutable_data_size")?,
            },
            None => Metadata::AfterCode {
                data_offset: int(NMETHOD, "_data_offset")?,
                metadata_offset: int(NMETHOD, "_metadata_offset")?,
                size: int(NMETHOD, "_size")?,
            },
        };
        Regions::Immutable {
            immutable_data,
            immutable_data_size: int(NMETHOD, "_immutable_data_size")?,
            ref_count_offset: int(NMETHOD, "_immutable_data_ref_count_offset"),
            scopes_pcs_offset: int(NMETHOD, "_scopes_pcs_offset")?,
            scopes_data_offset: int(NMETHOD, "_scopes_data_offset")?,
            metadata,
        }
    } else {
        Regions::Inline {
            metadata_offset: int(NMETHOD, "_metadata_offset")?,
            scopes_data_begin: pointer(NMETHOD, "_scopes_data_begin")?,
            scopes_pcs_offset: int(NMETHOD, "_scopes_pcs_offset")?,
            dependencies_offset: int(NMETHOD, "_dependencies_offset")?,
        }
    };
    Some(DebugLayout {
        pc_desc_size: vm.size("PcDesc").filter(|size| (8..=64).contains(size))?,
        pc_desc_pc_offset: int(&["PcDesc"], "_pc_offset")?.at,
        pc_desc_scope_decode_offset: int(&["PcDesc"], "_scope_decode_offset")?.at,
        regions,
    })
}

/// The version string ("17.0.15") and the major version, from
/// `Abstract_VM_Version`'s statics (JDK 9+).
fn version(memory: &impl Memory, vm: &VmStructs) -> (Option<String>, Option<u32>) {
    let number = |field: &str| {
        vm.static_address("Abstract_VM_Version", field)
            .and_then(|address| memory.read_u32(address))
            .filter(|value| *value < 1000)
    };
    if let (Some(major), Some(minor), Some(security)) = (
        number("_vm_major_version"),
        number("_vm_minor_version"),
        number("_vm_security_version"),
    ) && major > 0
    {
        return (Some(format!("{major}.{minor}.{security}")), Some(major));
    }
    // The release string, e.g. "17.0.15+6-Debian-1deb12u1": its numbers.
    let release = vm
        .static_address("Abstract_VM_Version", "_s_vm_release")
        .and_then(|address| memory.read_u64(address))
        .and_then(|string| memory.read_cstr(string, 128));
    let Some(release) = release else {
        return (None, None);
    };
    let numbers = release
        .split(['+', '-'])
        .next()
        .unwrap_or_default()
        .to_owned();
    let major = numbers
        .split('.')
        .next()
        .and_then(|major| major.parse().ok());
    (Some(numbers).filter(|numbers| !numbers.is_empty()), major)
}

/// The code heaps, from `CodeCache::_heaps` (a `GrowableArray<CodeHeap*>*`).
fn heaps(memory: &impl Memory, vm: &VmStructs) -> Result<Vec<Heap>, HotspotError> {
    let read = |what: &'static str, address: u64| {
        memory
            .read_u64(address)
            .ok_or(HotspotError::Read { what, address })
    };
    let read_u32 = |what: &'static str, address: u64| {
        memory
            .read_u32(address)
            .ok_or(HotspotError::Read { what, address })
    };
    let heaps_static = vm
        .static_address("CodeCache", "_heaps")
        .ok_or_else(|| HotspotError::Missing("CodeCache::_heaps".into()))?;
    let array = read("CodeCache::_heaps", heaps_static)?;
    let len_at = offset(
        vm,
        &["GrowableArrayBase", "GenericGrowableArray"],
        &["_len"],
    )?;
    let data_at = offset(vm, &["GrowableArray<int>"], &["_data"])?;
    if array == 0 {
        return Err(HotspotError::NotReady);
    }
    let count = read_u32("GrowableArray::_len", array.wrapping_add(len_at))?;
    if count == 0 {
        return Err(HotspotError::NotReady);
    }
    if count as usize > MAX_HEAPS {
        return Err(HotspotError::Implausible {
            what: "code heap count",
            value: count.into(),
        });
    }
    let data = read("GrowableArray::_data", array.wrapping_add(data_at))?;
    let memory_at = offset(vm, &["CodeHeap"], &["_memory"])?;
    let segmap_at = offset(vm, &["CodeHeap"], &["_segmap"])?;
    let log2_at = offset(vm, &["CodeHeap"], &["_log2_segment_size"])?;
    let low_at = offset(vm, &["VirtualSpace"], &["_low_boundary"])?;
    let high_at = offset(vm, &["VirtualSpace"], &["_high_boundary"])?;
    let mut heaps = Vec::new();
    for index in 0..u64::from(count) {
        let heap = read("CodeHeap*", data.wrapping_add(8 * index))?;
        if heap == 0 {
            return Err(HotspotError::NotReady);
        }
        let low = read("CodeHeap::_memory", heap.wrapping_add(memory_at + low_at))?;
        let high = read("CodeHeap::_memory", heap.wrapping_add(memory_at + high_at))?;
        let segmap = read("CodeHeap::_segmap", heap.wrapping_add(segmap_at + low_at))?;
        let log2_segment = read_u32("CodeHeap::_log2_segment_size", heap.wrapping_add(log2_at))?;
        if low == 0 || high <= low || segmap == 0 || !(4..=16).contains(&log2_segment) {
            return Err(HotspotError::Implausible {
                what: "code heap",
                value: heap,
            });
        }
        heaps.push(Heap {
            low,
            high,
            segmap,
            log2_segment,
            _pad: 0,
        });
    }
    Ok(heaps)
}
