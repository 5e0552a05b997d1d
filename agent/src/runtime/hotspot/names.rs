//! Naming recorded HotSpot frames: a `Method*` to its class, name, source
//! file and line table; an nmethod and pc offset to the methods inlined
//! there (its PcDesc and scope chain); a stub to its blob's name.
//!
//! Everything read here may have been freed and reused since the sample:
//! the frame's checks (compile id, `ConstMethod*`) are verified against
//! the process first, every length is bounded, and a failed read names
//! nothing rather than something wrong.
use std::{collections::HashMap, sync::Arc};

use hostprof_common::{
    hotspot::{NO_BCI, kind},
    runtime::{Frame, tag},
};

use super::{
    JavaFrame, JavaFrameKind, Jvm,
    jvm::{DebugLayout, Int, Metadata, Regions},
    vmstructs::{Memory, Process},
};
use crate::runtime::refusals::{self, Reason, Runtime};

/// Entries per cache before it starts over.
const MAX_METHODS: usize = 1 << 15;
const MAX_NMETHODS: usize = 1 << 12;
const MAX_STUBS: usize = 1 << 10;
/// Largest debug info (metadata, scopes, PcDescs) read from an nmethod.
const MAX_DEBUG_INFO: u64 = 1 << 20;
/// Largest line number table read.
const MAX_LINE_TABLE: usize = 1 << 16;
/// Deepest chain of inlined scopes followed.
const MAX_SCOPES: usize = 64;

/// A method, named.
#[derive(Debug)]
pub(super) struct Method {
    pub const_method: u64,
    pub class: Arc<str>,
    pub name: Arc<str>,
    pub file: Option<Arc<str>>,
    /// (bci, line) pairs of its line number table, in table order.
    pub lines: Vec<(u32, u32)>,
}

impl Method {
    /// The line of `bci`: its own entry, else the closest entry before it
    /// (as HotSpot's `Method::line_number_from_bci`).
    pub fn line(&self, bci: u32) -> Option<u32> {
        let mut best: Option<(u32, u32)> = None;
        for &(start, line) in &self.lines {
            if start == bci {
                return Some(line);
            }
            if start < bci && best.is_none_or(|(best_start, _)| start >= best_start) {
                best = Some((start, line));
            }
        }
        best.map(|(_, line)| line)
    }
}

/// An nmethod's debug info, as far as naming needs it.
#[derive(Debug)]
pub(super) struct Nmethod {
    pub compile_id: u32,
    pub method: u64,
    /// The `Metadata*` array scopes refer to (index 1 is the first).
    pub metadata: Vec<u64>,
    pub scopes: Vec<u8>,
    /// (pc offset from code begin, scope decode offset), by pc offset.
    pub pcs: Vec<(i32, u32)>,
}

/// Bounded caches of one process's names.
#[derive(Default)]
pub(super) struct Caches {
    methods: HashMap<u64, Arc<Method>>,
    nmethods: HashMap<u64, Arc<Nmethod>>,
    stubs: HashMap<u64, String>,
    symbols: HashMap<u64, Arc<str>>,
}

fn bounded<K, V>(map: &mut HashMap<K, V>, max: usize) -> &mut HashMap<K, V> {
    if map.len() >= max {
        map.clear();
    }
    map
}

/// A compressed stream (HotSpot's `CompressedReadStream`): UNSIGNED5
/// numbers, whose bytes from 192 up say another byte follows.
pub(super) struct Stream<'a> {
    bytes: &'a [u8],
    at: usize,
    exclusion: u8,
}

impl<'a> Stream<'a> {
    pub fn new(bytes: &'a [u8], exclusion: u8) -> Stream<'a> {
        Stream {
            bytes,
            at: 0,
            exclusion,
        }
    }

    pub fn byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    /// One UNSIGNED5 number (at most 5 bytes).
    pub fn uint(&mut self) -> Option<u32> {
        let mut sum = 0u32;
        for index in 0..5 {
            let byte = self.byte()?;
            let value = u32::from(byte.checked_sub(self.exclusion)?);
            sum = sum.wrapping_add(value << (6 * index));
            if byte < 192 || index == 4 {
                return Some(sum);
            }
        }
        None
    }

    /// A signed number, zigzag encoded.
    pub fn int(&mut self) -> Option<i32> {
        let value = self.uint()?;
        Some((value >> 1) as i32 ^ -((value & 1) as i32))
    }
}

/// Decodes a compressed line number table: `Ok` with its (bci, line)
/// pairs when it ended, `Err(true)` when `bytes` ran out first,
/// `Err(false)` when it is corrupt.
pub(super) fn decode_lines(bytes: &[u8], exclusion: u8) -> Result<Vec<(u32, u32)>, bool> {
    let mut stream = Stream::new(bytes, exclusion);
    let (mut bci, mut line) = (0u32, 0u32);
    let mut lines = Vec::new();
    loop {
        let Some(byte) = stream.byte() else {
            return Err(true);
        };
        match byte {
            0 => return Ok(lines),
            0xff => {
                let (Some(bci_delta), Some(line_delta)) = (stream.int(), stream.int()) else {
                    return Err(stream.at >= bytes.len());
                };
                bci = bci.wrapping_add_signed(bci_delta);
                line = line.wrapping_add_signed(line_delta);
            }
            _ => {
                bci = bci.wrapping_add(u32::from(byte >> 3));
                line = line.wrapping_add(u32::from(byte & 7));
            }
        }
        if lines.len() >= MAX_LINE_TABLE {
            refusals::refuse(Runtime::Hotspot, Reason::TooLong);
            return Err(false);
        }
        lines.push((bci, line));
    }
}

impl Jvm {
    /// Names one recorded HotSpot frame (tag `HOTSPOT | kind`), innermost
    /// first: a compiled frame expands to the methods inlined at its pc,
    /// the outermost with `inlined: false`. Empty when it cannot be named:
    /// the nmethod's compile id or the method's `ConstMethod*` (compared
    /// as the low 32 bits of `ConstMethod* >> 3`) no longer match, or the
    /// memory cannot be read.
    pub fn name_frame(&mut self, frame: Frame) -> Vec<JavaFrame> {
        let frame_tag = tag::of(frame.code);
        if frame_tag & tag::RUNTIME_MASK != tag::HOTSPOT {
            return Vec::new();
        }
        let address = frame.code & tag::ADDRESS_MASK;
        let low = frame.instr as u32;
        let high = (frame.instr >> 32) as u32;
        match frame_tag & !tag::RUNTIME_MASK {
            kind::INTERPRETED => self.name_interpreted(address, low, high),
            kind::COMPILED => self.name_compiled(address, low, high),
            kind::STUB => self
                .stub_name(address)
                .map(|name| {
                    vec![JavaFrame {
                        class: String::new(),
                        method: name,
                        file: None,
                        line: None,
                        inlined: false,
                        kind: JavaFrameKind::Stub,
                    }]
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    fn name_interpreted(&mut self, method: u64, bci: u32, check: u32) -> Vec<JavaFrame> {
        let matches = |named: &Method| (named.const_method >> 3) as u32 == check;
        let named = match self.caches.methods.get(&method) {
            Some(named) if matches(named) => named.clone(),
            // Not cached, or the Method* now holds another method: read
            // it again, and name it only if it is the one sampled.
            _ => match self.method(method, true) {
                Some(named) if matches(&named) => named,
                _ => return Vec::new(),
            },
        };
        let line = (bci != NO_BCI).then(|| named.line(bci)).flatten();
        vec![java_frame(&named, line, false, JavaFrameKind::Interpreted)]
    }

    fn name_compiled(&mut self, address: u64, pc_offset: u32, compile_id: u32) -> Vec<JavaFrame> {
        // Compile ids are unique over a JVM's life: a cached nmethod with
        // the sampled one is the nmethod sampled, even if freed since.
        let nmethod = match self.caches.nmethods.get(&address) {
            Some(nmethod) if nmethod.compile_id == compile_id => nmethod.clone(),
            _ => {
                // Otherwise the memory must still hold it, before and
                // after reading it (it may be freed and reused meanwhile).
                let memory = Process(self.pid);
                let id_at = address.wrapping_add(self.layout.nmethod_compile_id);
                if memory.read_u32(id_at) != Some(compile_id) {
                    return Vec::new();
                }
                let Some(nmethod) = self.nmethod(address, compile_id) else {
                    return Vec::new();
                };
                if memory.read_u32(id_at) != Some(compile_id) {
                    return Vec::new();
                }
                let nmethod = Arc::new(nmethod);
                bounded(&mut self.caches.nmethods, MAX_NMETHODS).insert(address, nmethod.clone());
                nmethod
            }
        };
        let mut frames = self.scopes(&nmethod, pc_offset);
        if frames.is_empty() {
            // No debug info for this pc: the nmethod's own method.
            if let Some(method) = self.method(nmethod.method, false) {
                frames.push(java_frame(&method, None, false, JavaFrameKind::Compiled));
            }
        }
        frames
    }

    /// The frames of the scope chain at `pc_offset`, innermost first; the
    /// outermost is not inlined. Empty when the nmethod has none there.
    fn scopes(&mut self, nmethod: &Nmethod, pc_offset: u32) -> Vec<JavaFrame> {
        // The first PcDesc at or after the pc: a return address has its
        // own, and any other pc belongs to the next call or safepoint.
        let index = nmethod
            .pcs
            .partition_point(|(offset, _)| i64::from(*offset) < i64::from(pc_offset));
        let Some(&(_, mut decode)) = nmethod.pcs.get(index) else {
            return Vec::new();
        };
        let mut frames = Vec::new();
        let mut limit = nmethod.scopes.len();
        // Offset 0 is HotSpot's "no scope"; senders are recorded before
        // the scopes they call, so offsets strictly fall.
        while decode != 0 && (decode as usize) < limit && frames.len() < MAX_SCOPES {
            limit = decode as usize;
            let mut stream = Stream::new(
                &nmethod.scopes[decode as usize..],
                self.layout.unsigned5_exclusion,
            );
            let (Some(sender), Some(method_index), Some(bci)) =
                (stream.uint(), stream.uint(), stream.uint())
            else {
                break;
            };
            decode = sender;
            // Stored bci + 1 (method entry is -1): entry counts as bci 0.
            let bci = bci.saturating_sub(1);
            let Some(&method) = (method_index as usize)
                .checked_sub(1)
                .and_then(|index| nmethod.metadata.get(index))
            else {
                continue;
            };
            let Some(named) = self.method(method, false) else {
                continue;
            };
            frames.push(java_frame(
                &named,
                named.line(bci),
                true,
                JavaFrameKind::Compiled,
            ));
        }
        if let Some(outermost) = frames.last_mut() {
            outermost.inlined = false;
        }
        frames
    }

    /// Reads the debug info of the nmethod at `address`.
    fn nmethod(&self, address: u64, compile_id: u32) -> Option<Nmethod> {
        let memory = Process(self.pid);
        let method = memory.read_u64(address.wrapping_add(self.layout.nmethod_method))?;
        if method == 0 {
            return None;
        }
        let mut nmethod = Nmethod {
            compile_id,
            method,
            metadata: Vec::new(),
            scopes: Vec::new(),
            pcs: Vec::new(),
        };
        if let Some(debug) = self.layout.debug {
            // Debug info that cannot be read leaves the method unexpanded.
            let _ = read_debug_info(&memory, address, &debug, &mut nmethod);
        }
        Some(nmethod)
    }

    /// The method at `method`, from the cache unless `fresh`.
    pub(super) fn method(&mut self, method: u64, fresh: bool) -> Option<Arc<Method>> {
        if !fresh && let Some(named) = self.caches.methods.get(&method) {
            return Some(named.clone());
        }
        let named = Arc::new(self.read_method(method)?);
        bounded(&mut self.caches.methods, MAX_METHODS).insert(method, named.clone());
        Some(named)
    }

    fn read_method(&mut self, method: u64) -> Option<Method> {
        let memory = Process(self.pid);
        let layout = self.layout;
        let const_method = memory.read_u64(method.checked_add(layout.method_const_method)?)?;
        let header = memory.read_vec(const_method, layout.const_method_size as usize)?;
        let u16_at = |at: u64| {
            let at = at as usize;
            header
                .get(at..at + 2)
                .map(|bytes| u16::from_le_bytes([bytes[0], bytes[1]]))
        };
        let u64_at = |at: u64| {
            let at = at as usize;
            header
                .get(at..at + 8)
                .and_then(|bytes| bytes.try_into().ok())
                .map(u64::from_le_bytes)
        };
        let pool = u64_at(layout.const_method_constants)?;
        let name_index = u16_at(layout.const_method_name_index)?;
        let code_size = u16_at(layout.const_method_code_size)?;
        let flags = *header.get(layout.const_method_flags as usize)?;
        let holder = memory.read_u64(pool.checked_add(layout.pool_holder)?)?;
        let class_symbol = memory.read_u64(holder.checked_add(layout.klass_name)?)?;
        let class = self.symbol(class_symbol)?;
        let class: Arc<str> = class.replace('/', ".").into();
        let name = self.pool_symbol(pool, name_index)?;
        let file = layout
            .source_file_index
            .and_then(|(in_pool, at)| {
                let base = if in_pool { pool } else { holder };
                memory.read_u16(base.checked_add(at)?)
            })
            .and_then(|index| self.pool_symbol(pool, index));
        let lines = if u32::from(flags) & self.layout.has_linenumber_table != 0 {
            let table = const_method
                .checked_add(self.layout.const_method_size)?
                .checked_add(code_size.into())?;
            self.line_table(table).unwrap_or_default()
        } else {
            Vec::new()
        };
        Some(Method {
            const_method,
            class,
            name,
            file,
            lines,
        })
    }

    /// Reads the line number table at `address` page by page until it
    /// ends (its length is not stored).
    fn line_table(&self, address: u64) -> Option<Vec<(u32, u32)>> {
        let memory = Process(self.pid);
        let mut bytes = Vec::new();
        while bytes.len() < MAX_LINE_TABLE {
            let at = address.checked_add(bytes.len() as u64)?;
            let chunk = (4096 - (at % 4096) as usize).min(512);
            bytes.extend(memory.read_vec(at, chunk)?);
            match decode_lines(&bytes, self.layout.unsigned5_exclusion) {
                Ok(lines) => return Some(lines),
                Err(true) => continue,
                Err(false) => return None,
            }
        }
        refusals::refuse(Runtime::Hotspot, Reason::TooLong);
        None
    }

    /// The `Symbol*` in slot `index` of constant pool `pool`.
    fn pool_symbol(&mut self, pool: u64, index: u16) -> Option<Arc<str>> {
        if index == 0 {
            return None;
        }
        let slot = pool
            .checked_add(self.layout.pool_size)?
            .checked_add(8 * u64::from(index))?;
        // The low bit has meant "unresolved" in some JDKs: not a pointer bit.
        let symbol = Process(self.pid).read_u64(slot)? & !1;
        self.symbol(symbol)
    }

    /// A `Symbol`'s text.
    fn symbol(&mut self, symbol: u64) -> Option<Arc<str>> {
        if symbol == 0 {
            return None;
        }
        if let Some(text) = self.caches.symbols.get(&symbol) {
            return Some(text.clone());
        }
        let memory = Process(self.pid);
        let length = memory.read_u16(symbol.checked_add(self.layout.symbol_length)?)?;
        let body = memory.read_vec(
            symbol.checked_add(self.layout.symbol_body)?,
            usize::from(length),
        )?;
        // Modified UTF-8: lossless for the names that matter.
        let text: Arc<str> = String::from_utf8_lossy(&body).into();
        bounded(&mut self.caches.symbols, MAX_METHODS * 2).insert(symbol, text.clone());
        Some(text)
    }

    /// A code blob's name (`CodeBlob::_name`).
    fn stub_name(&mut self, blob: u64) -> Option<String> {
        if let Some(name) = self.caches.stubs.get(&blob) {
            return Some(name.clone());
        }
        let memory = Process(self.pid);
        let name = memory.read_u64(blob.checked_add(self.layout.blob_name)?)?;
        let name = memory.read_cstr(name, 256)?;
        bounded(&mut self.caches.stubs, MAX_STUBS).insert(blob, name.clone());
        Some(name)
    }
}

/// An unsigned integer field of `width` bytes at `address` (negative
/// `int`s are refused: every field read this way is a size or offset).
fn read_int(memory: &impl Memory, address: u64, field: Int) -> Option<u64> {
    let address = address.checked_add(field.at)?;
    match field.width {
        1 => memory.read_vec(address, 1).map(|byte| u64::from(byte[0])),
        2 => memory.read_u16(address).map(u64::from),
        4 => u64::try_from(memory.read_u32(address)? as i32).ok(),
        8 => memory.read_u64(address).filter(|value| *value < 1 << 48),
        _ => None,
    }
}

/// Reads an nmethod's metadata, scopes data and PcDescs.
fn read_debug_info(
    memory: &impl Memory,
    address: u64,
    debug: &DebugLayout,
    nmethod: &mut Nmethod,
) -> Option<()> {
    let int = |field: Int| read_int(memory, address, field);
    let pointer = |at: u64| memory.read_u64(address.checked_add(at)?);
    let (metadata, scopes, pcs) = match debug.regions {
        Regions::Inline {
            metadata_offset,
            scopes_data_begin,
            scopes_pcs_offset,
            dependencies_offset,
        } => {
            let metadata = int(metadata_offset)?;
            let scopes = pointer(scopes_data_begin)?.checked_sub(address)?;
            let pcs = int(scopes_pcs_offset)?;
            let end = int(dependencies_offset)?;
            if !(metadata <= scopes
                && scopes <= pcs
                && pcs <= end
                && end - metadata <= MAX_DEBUG_INFO)
            {
                return too_long_if(
                    end.checked_sub(metadata)
                        .is_some_and(|n| n > MAX_DEBUG_INFO),
                );
            }
            let bytes =
                memory.read_vec(address.checked_add(metadata)?, (end - metadata) as usize)?;
            let (scopes, pcs) = ((scopes - metadata) as usize, (pcs - metadata) as usize);
            (
                bytes[..scopes].to_vec(),
                bytes[scopes..pcs].to_vec(),
                bytes[pcs..].to_vec(),
            )
        }
        Regions::Immutable {
            immutable_data,
            immutable_data_size,
            ref_count_offset,
            scopes_pcs_offset,
            scopes_data_offset,
            metadata,
        } => {
            let block = pointer(immutable_data)?;
            let mut size = int(immutable_data_size)?;
            if let Some(ref_count) = ref_count_offset.and_then(int) {
                size = size.min(ref_count);
            }
            let pcs = int(scopes_pcs_offset)?;
            let scopes = int(scopes_data_offset)?;
            if !(pcs <= scopes && scopes <= size && size - pcs <= MAX_DEBUG_INFO) {
                return too_long_if(size.checked_sub(pcs).is_some_and(|n| n > MAX_DEBUG_INFO));
            }
            let bytes = memory.read_vec(block.checked_add(pcs)?, (size - pcs) as usize)?;
            let (start, len) = match metadata {
                Metadata::AfterCode {
                    data_offset,
                    metadata_offset,
                    size,
                } => {
                    let start = int(data_offset)?.checked_add(int(metadata_offset)?)?;
                    (address.checked_add(start)?, int(size)?.checked_sub(start)?)
                }
                Metadata::Mutable {
                    mutable_data,
                    relocation_size,
                    mutable_data_size,
                } => {
                    let relocations = int(relocation_size)?;
                    (
                        pointer(mutable_data)?.checked_add(relocations)?,
                        int(mutable_data_size)?.checked_sub(relocations)?,
                    )
                }
            };
            if len > MAX_DEBUG_INFO {
                return too_long_if(true);
            }
            let split = (scopes - pcs) as usize;
            (
                memory.read_vec(start, len as usize)?,
                bytes[split..].to_vec(),
                bytes[..split].to_vec(),
            )
        }
    };
    nmethod.metadata = metadata
        .chunks_exact(8)
        .filter_map(|word| word.try_into().ok().map(u64::from_le_bytes))
        .collect();
    nmethod.scopes = scopes;
    let size = debug.pc_desc_size as usize;
    let field = |desc: &[u8], at: u64| {
        let at = at as usize;
        desc.get(at..at + 4)
            .and_then(|bytes| bytes.try_into().ok())
            .map(u32::from_le_bytes)
    };
    nmethod.pcs = pcs
        .chunks_exact(size)
        .filter_map(|desc| {
            Some((
                field(desc, debug.pc_desc_pc_offset)? as i32,
                field(desc, debug.pc_desc_scope_decode_offset)?,
            ))
        })
        .collect();
    // HotSpot keeps them sorted; a search needs them so whatever we read.
    nmethod.pcs.sort_by_key(|(offset, _)| *offset);
    Some(())
}

/// No debug information: counted as refused when `too_long` (the
/// regions were consistent but over the cap; inconsistent ones are stale
/// or freed code, not a refusal).
fn too_long_if<T>(too_long: bool) -> Option<T> {
    if too_long {
        refusals::refuse(Runtime::Hotspot, Reason::TooLong);
    }
    None
}

#[cfg(test)]
impl Jvm {
    /// Makes `method` name `named` without reading the process.
    pub(super) fn cache_method(&mut self, method: u64, named: Method) {
        self.caches.methods.insert(method, Arc::new(named));
    }

    pub(super) fn scopes_at(&mut self, nmethod: &Nmethod, pc_offset: u32) -> Vec<JavaFrame> {
        self.scopes(nmethod, pc_offset)
    }

    /// The pc offsets with debug info of a cached nmethod (tests walk them).
    pub(super) fn pc_offsets(&self, nmethod: u64) -> Vec<i32> {
        self.caches
            .nmethods
            .get(&nmethod)
            .map(|nmethod| nmethod.pcs.iter().map(|(offset, _)| *offset).collect())
            .unwrap_or_default()
    }
}

fn java_frame(method: &Method, line: Option<u32>, inlined: bool, kind: JavaFrameKind) -> JavaFrame {
    JavaFrame {
        class: method.class.to_string(),
        method: method.name.to_string(),
        file: method.file.as_ref().map(|file| file.to_string()),
        line,
        inlined,
        kind,
    }
}
