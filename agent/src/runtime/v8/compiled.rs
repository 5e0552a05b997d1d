//! Frames of compiled JavaScript named at the line they were running: the
//! kernel records the frame's `JSFunction` and pc; the function's `Code`
//! says where its instructions are and holds a table from instruction
//! offsets to source positions (Maglev, TurboFan: the format of
//! [`Table`]) or to bytecode offsets (Sparkplug: [`PcMap`], whose
//! bytecodes' positions are the function's bytecode position table), read
//! once per code object and cached.
//!
//! A frame whose pc is not in its function's current code (on-stack
//! replacement code, or code replaced since the sample) keeps its
//! function's first line, as do positions in code inlined from another
//! function (not expanded yet): each counted.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    LineSource, Node,
    baseline::PcMap,
    count,
    layout::CodeStart,
    names::Heap,
    positions::{Found, Table},
};
use crate::procs::memory::Memory;

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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tier {
    Baseline,
    Optimized,
    Other,
}

/// A code object's record and what it was read with (its instructions'
/// start and size, its table's address), when last checked.
pub type CachedCode = (Arc<Compiled>, (u64, u64, u64), Instant);

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

    /// The line the compiled frame of `function` (in `script`) was running
    /// at `pc` (`leaf`: where the CPU was; else a return address, whose
    /// call is the byte before). `None` (counted) keeps the function's
    /// first line.
    pub(super) fn compiled_line(
        &mut self,
        memory: &impl Memory,
        function: u64,
        shared: u64,
        script: u64,
        pc: u64,
        leaf: bool,
    ) -> Option<u32> {
        let found = self.compiled_position(memory, function, shared, pc, leaf);
        let position = match found {
            Ok(position) => position,
            Err(why) => {
                count(why);
                return None;
            }
        };
        let Some(line) = self.line(memory, script, position) else {
            count(LineSource::CompiledUnreadable);
            return None;
        };
        count(LineSource::Compiled);
        Some(line)
    }

    fn compiled_position(
        &mut self,
        memory: &impl Memory,
        function: u64,
        shared: u64,
        pc: u64,
        leaf: bool,
    ) -> Result<u32, LineSource> {
        let layout = self
            .layout
            .code
            .as_ref()
            .ok_or(LineSource::CompiledUnknown)?;
        let heap = Heap {
            memory,
            layout: &self.layout,
        };
        let code = heap
            .field(function, layout.function_code)
            .filter(|&code| {
                self.layout.type_code.is_some() && heap.instance_type(code) == self.layout.type_code
            })
            .ok_or(LineSource::CompiledUnreadable)?;
        let compiled = self.code(memory, code)?;
        let at = pc.wrapping_sub(u64::from(!leaf));
        if at < compiled.start || at - compiled.start >= compiled.size {
            return Err(LineSource::CompiledOtherCode);
        }
        match compiled.tier {
            Tier::Baseline => {
                let pcs = compiled.pcs.as_ref().ok_or(LineSource::CompiledBaseline)?;
                let bytecode = pcs
                    .bytecode_offset_at(at - compiled.start)
                    .ok_or(LineSource::CompiledBaseline)?;
                let table = self
                    .table(memory, shared)
                    .map_err(|_| LineSource::CompiledUnreadable)?;
                return table
                    .script_offset_at(bytecode)
                    .ok_or(LineSource::CompiledUnreadable);
            }
            Tier::Other => return Err(LineSource::CompiledOtherCode),
            Tier::Optimized => {}
        }
        let table = compiled
            .table
            .as_ref()
            .ok_or(LineSource::CompiledUnreadable)?;
        let entry = table
            .entry_at((at - compiled.start) as i64)
            .ok_or(LineSource::CompiledUnreadable)?;
        if entry.inlining_id.is_some() {
            return Err(LineSource::CompiledInlined);
        }
        entry.script_offset.ok_or(LineSource::CompiledUnreadable)
    }

    /// The record of the `Code` at `code`, cached, checked again now and
    /// then: read again when its instructions or its table moved.
    fn code(&mut self, memory: &impl Memory, code: u64) -> Result<Arc<Compiled>, LineSource> {
        let layout = self
            .layout
            .code
            .clone()
            .ok_or(LineSource::CompiledUnknown)?;
        let heap = Heap {
            memory,
            layout: &self.layout,
        };
        let token = || -> Option<(u64, u64, u64)> {
            let start = match layout.start {
                CodeStart::Inline(offset) => code.checked_add(offset)?,
                CodeStart::Field(offset) => heap.word(code.checked_add(offset)?)?,
            };
            let size = memory.read_u32(code.checked_add(layout.size)?)?;
            let table = heap.word(code.checked_add(layout.positions)?)?;
            Some((start, u64::from(size), table))
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
        let (start, size, _) = seen;
        if size == 0 || size > MAX_CODE_BYTES || start.checked_add(size).is_none() {
            crate::runtime::refusals::refuse(
                crate::runtime::refusals::Runtime::V8js,
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
                Found::Table(bytes) => Some(Arc::new(Table::decode(&bytes))),
                Found::Absent | Found::Unreadable => None,
            },
            Tier::Baseline | Tier::Other => None,
        };
        let pcs = match tier {
            Tier::Baseline => self.baseline_pcs(memory, code, layout.positions),
            Tier::Optimized | Tier::Other => None,
        };
        let entries =
            table.as_ref().map_or(0, |table| table.len()) + pcs.as_ref().map_or(0, |pcs| pcs.len());
        if self.codes.len() >= MAX_CODES || self.code_entries + entries > MAX_CODE_ENTRIES {
            self.codes.clear();
            self.code_entries = 0;
        }
        let compiled = Arc::new(Compiled {
            start,
            size,
            tier,
            table,
            pcs,
        });
        let replaced = self
            .codes
            .insert(code, (compiled.clone(), seen, Instant::now()));
        let replaced = replaced.map_or(0, |(old, _, _)| {
            old.table.as_ref().map_or(0, |table| table.len())
                + old.pcs.as_ref().map_or(0, |pcs| pcs.len())
        });
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
