//! Frames of compiled JavaScript named at the line they were running: the
//! kernel records the frame's `JSFunction` and pc; the function's `Code`
//! says where its instructions are and holds a table from instruction
//! offsets to source positions (Maglev, TurboFan: the format of
//! [`Table`]) or to bytecode offsets (Sparkplug: [`PcMap`], whose
//! bytecodes' positions are the function's bytecode position table), read
//! once per code object and cached.
//!
//! Code that Maglev or TurboFan inlined from other functions is expanded
//! as the symbolizer expands native inlines: a position in inlined code
//! names its inlining, whose entry in the code's deoptimization data gives
//! the inlined function and where its caller called it, up to the frame's
//! own function.
//!
//! A frame whose pc is not in its function's current code (on-stack
//! replacement code, or code replaced since the sample) runs code found
//! from its pc ([`code_search`](super::code_search)); where none is, it
//! keeps its function's first line, as do positions in inlined code whose
//! inlining cannot be read: each counted.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    LineSource, Node,
    baseline::PcMap,
    count,
    layout::{CodeStart, InliningLayout},
    names::{Heap, small_integer},
    positions::{Found, Table, inlining_id, script_offset},
};
use crate::{model::Line, procs::memory::Memory};

/// Code objects whose tables are kept per process, and their entries in
/// all; past either the cache starts over.
const MAX_CODES: usize = 16384;
const MAX_CODE_ENTRIES: usize = 1 << 20;
/// Largest code object believed (TurboFan's biggest are a few hundred
/// kilobytes).
const MAX_CODE_BYTES: u64 = 64 << 20;
/// How long a code object's record is trusted before it is checked again
/// (the collector frees code, and another may take its place).
const CODE_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// Size of one `InliningPosition`: the call's packed source position
/// (`u64`), the inlined function's literal index (`i32`), padding.
const INLINING_POSITION_BYTES: usize = 16;
/// Most functions expanded in one frame (V8 stops inlining far sooner).
const MAX_INLINED_DEPTH: usize = 64;

/// What one code object runs and where.
#[derive(Debug)]
pub struct Compiled {
    start: u64,
    size: u64,
    tier: Tier,
    /// Maglev's and TurboFan's source positions (`None` for other tiers,
    /// or when unreadable).
    table: Option<Arc<Table>>,
    /// Sparkplug's bytecode offsets (`None` for other tiers, or when
    /// unreadable).
    pcs: Option<Arc<PcMap>>,
    /// The functions Maglev or TurboFan inlined, by inlining id (`None`
    /// for other tiers, or when unreadable).
    inlined: Option<Arc<[Inlined]>>,
}

/// A function optimized code inlined, and where it was called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Inlined {
    /// Its `SharedFunctionInfo`.
    shared: u64,
    /// The call's script offset in the caller (`None`: unknown).
    call: Option<u32>,
    /// The caller's inlining id (`None`: the code's own function).
    caller: Option<u16>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tier {
    Baseline,
    Optimized,
    Other,
}

/// A code object's record and what it was read with (its instructions'
/// start and size, its table's and its deoptimization data's addresses),
/// when last checked.
pub type CachedCode = (Arc<Compiled>, (u64, u64, u64, u64), Instant);

/// Where a compiled frame was in its script: the position, the functions
/// inlined there (each with its position, innermost first), and whether
/// its code was found from the pc (not its function's own).
struct Position {
    offset: u32,
    inlined: Vec<(u64, u32)>,
    by_pc: bool,
}

/// The lines of a compiled frame: its own function's (`None`: unknown),
/// and those of the functions its code inlined there, innermost first.
pub struct CompiledLines {
    pub line: Option<u32>,
    pub inlined: Vec<Line>,
}

impl Node {
    /// The `SharedFunctionInfo` of the `JSFunction` at `function`.
    pub(super) fn shared_of(&self, memory: &impl Memory, function: u64) -> Option<u64> {
        let heap = Heap {
            memory,
            layout: &self.layout,
        };
        let kind = heap.instance_type(function)?;
        let first = self.layout.type_function;
        if kind < first || kind >= first + hostprof_common::v8::FUNCTION_TYPES {
            return None;
        }
        heap.field(function, self.layout.function_shared)
    }

    /// The lines the compiled frame of `function` (in `script`) was
    /// running at `pc` (`leaf`: where the CPU was; else a return address,
    /// whose call is the byte before). `None` (counted): only the
    /// function's first line is known.
    pub(super) fn compiled_line(
        &mut self,
        memory: &impl Memory,
        function: u64,
        shared: u64,
        script: u64,
        pc: u64,
        leaf: bool,
    ) -> Option<CompiledLines> {
        let found = self.compiled_position(memory, function, shared, pc, leaf);
        let Position {
            offset: position,
            inlined: chain,
            by_pc,
        } = match found {
            Ok(found) => found,
            Err(why) => {
                count(why);
                return None;
            }
        };
        // A script without lines (its source unreadable) still has its
        // inlined frames expanded.
        let line = self.line(memory, script, position);
        count(match line {
            Some(_) if by_pc => LineSource::CompiledFoundByPc,
            Some(_) => LineSource::Compiled,
            None => LineSource::ScriptWithoutLines,
        });
        let inlined = chain
            .into_iter()
            .map(|(shared, position)| self.inlined_line(memory, shared, position))
            .collect();
        Some(CompiledLines { line, inlined })
    }

    /// The line of an inlined function's frame at `position`: unnamed
    /// when its shared info cannot be read (freed or moved since).
    fn inlined_line(&mut self, memory: &impl Memory, shared: u64, position: u32) -> Line {
        let named = self.name(memory, shared);
        let start = named
            .as_deref()
            .and_then(|named| self.line(memory, named.script, named.start?))
            .unwrap_or(0);
        let line = named
            .as_deref()
            .and_then(|named| self.line(memory, named.script, position))
            .unwrap_or(start);
        super::javascript_line(named.as_deref(), line, start)
    }

    /// Where `pc` was in the script.
    fn compiled_position(
        &mut self,
        memory: &impl Memory,
        function: u64,
        shared: u64,
        pc: u64,
        leaf: bool,
    ) -> Result<Position, LineSource> {
        let layout = self
            .layout
            .code
            .as_ref()
            .ok_or(LineSource::CompiledUnknown)?;
        let heap = Heap {
            memory,
            layout: &self.layout,
        };
        let at = pc.wrapping_sub(u64::from(!leaf));
        let Some(function_code) = layout.function_code else {
            // No code to follow from the function: the pc's is searched.
            let compiled = self
                .code_holding(memory, at)
                .ok_or(LineSource::CompiledOtherCode)?;
            return self.position_in(memory, &compiled, shared, at, true);
        };
        let code = heap
            .field(function, function_code)
            .filter(|&code| {
                self.layout.type_code.is_some() && heap.instance_type(code) == self.layout.type_code
            })
            .ok_or(LineSource::CompiledUnreadable);
        let current = code.and_then(|code| self.code(memory, code));
        let (compiled, by_pc) = match current {
            Ok(compiled) if compiled.holds(at) => (compiled, false),
            // Not the function's code (or none readable): the code the pc
            // is in, when it can be found.
            Ok(_) | Err(_) => match self.code_holding(memory, at) {
                Some(compiled) => (compiled, true),
                None => return Err(current.err().unwrap_or(LineSource::CompiledOtherCode)),
            },
        };
        self.position_in(memory, &compiled, shared, at, by_pc)
    }

    /// Where `at` (in `compiled`, of the function of `shared`) was in the
    /// script (`by_pc`: the code was found from the pc, not the function).
    fn position_in(
        &mut self,
        memory: &impl Memory,
        compiled: &Compiled,
        shared: u64,
        at: u64,
        by_pc: bool,
    ) -> Result<Position, LineSource> {
        match compiled.tier {
            Tier::Baseline => {
                let pcs = compiled.pcs.as_ref().ok_or(LineSource::CompiledBaseline)?;
                let bytecode = pcs
                    .bytecode_offset_at(at - compiled.start)
                    .ok_or(LineSource::CompiledBaseline)?;
                let table = self
                    .table(memory, shared)
                    .map_err(|_| LineSource::CompiledUnreadable)?;
                let position = table
                    .script_offset_at(bytecode)
                    .ok_or(LineSource::CompiledUnreadable)?;
                return Ok(Position {
                    offset: position,
                    inlined: Vec::new(),
                    by_pc,
                });
            }
            Tier::Other => return Err(LineSource::CompiledOtherCode),
            Tier::Optimized => {}
        }
        let table = compiled
            .table
            .as_ref()
            .ok_or(LineSource::CompiledUnreadable)?;
        if table.is_empty() {
            return Err(LineSource::CompiledNoPositions);
        }
        let entry = table
            .entry_at((at - compiled.start) as i64)
            .ok_or(LineSource::CompiledUnreadable)?;
        let position = entry.script_offset.ok_or(LineSource::CompiledUnreadable)?;
        let (offset, inlined) = match entry.inlining_id {
            None => (position, Vec::new()),
            Some(id) => {
                let inlined = compiled
                    .inlined
                    .as_deref()
                    .ok_or(LineSource::CompiledInlined)?;
                expand(inlined, id, position).ok_or(LineSource::CompiledInlined)?
            }
        };
        Ok(Position {
            offset,
            inlined,
            by_pc,
        })
    }

    /// The record of the `Code` at `code`, cached, checked again now and
    /// then: read again when its instructions or its table moved.
    pub(super) fn code(
        &mut self,
        memory: &impl Memory,
        code: u64,
    ) -> Result<Arc<Compiled>, LineSource> {
        let layout = self
            .layout
            .code
            .clone()
            .ok_or(LineSource::CompiledUnknown)?;
        let heap = Heap {
            memory,
            layout: &self.layout,
        };
        let token = || -> Option<(u64, u64, u64, u64)> {
            let start = match layout.start {
                CodeStart::Inline(offset) => code.checked_add(offset)?,
                CodeStart::Field(offset) => heap.word(code.checked_add(offset)?)?,
            };
            let size = memory.read_u32(code.checked_add(layout.size)?)?;
            let table = heap.word(code.checked_add(layout.positions)?)?;
            let data = heap.word(code.checked_add(layout.inlining.data)?)?;
            Some((start, u64::from(size), table, data))
        };
        if let Some((compiled, seen, at)) = self.codes.get_mut(&code) {
            if at.elapsed() < CODE_CHECK_INTERVAL {
                return Ok(compiled.clone());
            }
            if token() == Some(*seen) {
                *at = Instant::now();
                return Ok(compiled.clone());
            }
        }
        let seen = token().ok_or(LineSource::CompiledUnreadable)?;
        let (start, size, _, _) = seen;
        if size == 0 || size > MAX_CODE_BYTES || start.checked_add(size).is_none() {
            crate::runtime::refusals::refuse(
                crate::runtime::refusals::Runtime::V8,
                crate::runtime::refusals::Reason::TooLong,
            );
            return Err(LineSource::CompiledUnreadable);
        }
        let flags = memory
            .read_u32(code.wrapping_add(layout.flags))
            .ok_or(LineSource::CompiledUnreadable)?;
        let kind = (flags >> layout.kind_shift) & layout.kind_mask;
        let tier = match kind.checked_sub(layout.kind_baseline) {
            Some(0) => Tier::Baseline,
            // Maglev, TurboFan.
            Some(1 | 2) => Tier::Optimized,
            _ => Tier::Other,
        };
        let table = match tier {
            Tier::Optimized => match heap.byte_array_at(code, layout.positions) {
                Found::Table(bytes) => {
                    Some(Arc::new(Table::decode(&bytes, self.layout.encoding())))
                }
                Found::Absent | Found::Unreadable => None,
            },
            Tier::Baseline | Tier::Other => None,
        };
        let pcs = match tier {
            Tier::Baseline => self.baseline_pcs(memory, code, layout.positions),
            Tier::Optimized | Tier::Other => None,
        };
        let inlined = match tier {
            Tier::Optimized => inlined_functions(&heap, code, &layout.inlining),
            Tier::Baseline | Tier::Other => None,
        };
        let compiled = Compiled {
            start,
            size,
            tier,
            table,
            pcs,
            inlined,
        };
        let entries = compiled.entries();
        if self.codes.len() >= MAX_CODES || self.code_entries + entries > MAX_CODE_ENTRIES {
            self.codes.clear();
            self.code_entries = 0;
        }
        let compiled = Arc::new(compiled);
        let replaced = self
            .codes
            .insert(code, (compiled.clone(), seen, Instant::now()));
        let replaced = replaced.map_or(0, |(old, _, _)| old.entries());
        self.code_entries = self.code_entries + entries - replaced;
        Ok(compiled)
    }

    /// The pc map of the Sparkplug code at `code`: its bytecode offset
    /// table (field `positions`) along its bytecodes.
    fn baseline_pcs(&self, memory: &impl Memory, code: u64, positions: u64) -> Option<Arc<PcMap>> {
        let sizes = self.bytecode_sizes.as_ref()?;
        let heap = Heap {
            memory,
            layout: &self.layout,
        };
        let Found::Table(table) = heap.byte_array_at(code, positions) else {
            return None;
        };
        let bytecodes = heap.code_bytecodes(code)?;
        Some(Arc::new(PcMap::decode(&table, &bytecodes, sizes)))
    }
}

impl Compiled {
    /// Whether its instructions hold `at`.
    pub(super) fn holds(&self, at: u64) -> bool {
        at.checked_sub(self.start)
            .is_some_and(|offset| offset < self.size)
    }

    /// Where its instructions start and end.
    pub(super) fn range(&self) -> (u64, u64) {
        (self.start, self.start + self.size)
    }

    /// The entries its tables hold, counted against the cache's bound.
    fn entries(&self) -> usize {
        self.table.as_ref().map_or(0, |table| table.len())
            + self.pcs.as_ref().map_or(0, |pcs| pcs.len())
            + self.inlined.as_ref().map_or(0, |inlined| inlined.len())
    }
}

/// The chain of inlined frames at `position` of inlining `id`: each
/// inlined function and the position it was at, innermost first, then
/// the position of the call in the code's own function. `None` when the
/// chain leads nowhere (an id past the table, an unknown call, a cycle).
fn expand(inlined: &[Inlined], mut id: u16, mut position: u32) -> Option<(u32, Vec<(u64, u32)>)> {
    let mut chain = Vec::new();
    loop {
        let function = inlined.get(usize::from(id))?;
        chain.push((function.shared, position));
        position = function.call?;
        match function.caller {
            None => return Some((position, chain)),
            Some(_) if chain.len() >= MAX_INLINED_DEPTH.min(inlined.len()) => return None,
            Some(caller) => id = caller,
        }
    }
}

/// The functions the optimized code at `code` inlined, by inlining id,
/// from its deoptimization data; `None` when unreadable (or not V8's).
fn inlined_functions(
    heap: &Heap<'_, impl Memory>,
    code: u64,
    layout: &InliningLayout,
) -> Option<Arc<[Inlined]>> {
    let data = heap.field(code, layout.data)?;
    // Code that inlined nothing may have no data (an empty array).
    let length = heap
        .word(data.checked_add(heap.layout.array_length)?)
        .and_then(small_integer)?;
    let end = heap
        .layout
        .fixed_array_data
        .checked_add(8 * u64::try_from(length).ok()?)?;
    if end <= layout.positions.max(layout.literals) {
        return Some(Arc::from(Vec::new()));
    }
    let Found::Table(positions) = heap.byte_array_at(data, layout.positions) else {
        return None;
    };
    if positions.len() % INLINING_POSITION_BYTES != 0 {
        return None;
    }
    let literals = heap.field(data, layout.literals)?;
    let length = heap
        .word(literals.checked_add(heap.layout.array_length)?)
        .and_then(small_integer)?;
    positions
        .chunks_exact(INLINING_POSITION_BYTES)
        .map(|entry| {
            let raw = i64::from_le_bytes(entry[..8].try_into().ok()?);
            let index = i32::from_le_bytes(entry[8..12].try_into().ok()?);
            let index = u64::try_from(index)
                .ok()
                .filter(|&index| (index as i64) < length)?;
            let slot = literals
                .checked_add(heap.layout.fixed_array_data)?
                .checked_add(8 * index)?;
            // Held strongly (tagged 1) or weakly (tagged 3; cleared: 3).
            let word = heap.word(slot)?;
            let shared = (word & 1 == 1).then_some(word & !3).filter(|&at| at != 0)?;
            Some(Inlined {
                shared,
                call: script_offset(raw),
                caller: inlining_id(raw),
            })
        })
        .collect()
}
