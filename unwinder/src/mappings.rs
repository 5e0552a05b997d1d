//! A process's executable mappings as the kernel holds them, and the
//! lookup of a pc's unwind row through them (the same code in the kernel
//! and, over memory, on the host).
use super::*;

/// What a search of [`lookup_in`] runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sorted {
    /// The process's mappings, keyed by start address.
    Mappings,
    /// A table's rows from row `start` on, keyed by pc.
    Rows { start: u32 },
}

/// A process's executable mapping, as the kernel sees it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// `address - bias` is the ELF virtual address the table uses.
    pub bias: u64,
    /// First word of the table in the rows map (a multiple of
    /// [`ROW_CHUNK`]; see [`packed`](crate::packed)).
    pub table_start: u32,
    /// Rows in the table; 0 when there is none (`table_start` is then
    /// [`FRAME_POINTER_TABLE`] for code known to keep frame pointers).
    pub table_len: u32,
}

/// `ExecMapping::table_start` of a table-less mapping whose code keeps frame
/// pointers.
pub const FRAME_POINTER_TABLE: u32 = u32::MAX;
/// `ExecMapping::table_start` of a table-less mapping of a language
/// runtime's code (a JVM's code cache), which that runtime's walker steps;
/// its `bias` is then the runtime's tag (`hostprof_common::runtime::tag`).
pub const RUNTIME_TABLE: u32 = u32::MAX - 1;

/// Executable mappings kept per process (a power of two: indices are masked
/// for the verifier). Real processes map hundreds of executable regions (a
/// JVM or a browser: its libraries, each often in several pieces); 256
/// slots of 32 bytes make a process's entry 8 KiB, and the kernel's
/// process map (`MAX_UNWIND_PROCESSES` entries, preallocated: perf_event
/// programs on kernels before 6.1 accept no other hash map) 8 MiB in all,
/// a quarter of the default rows map. Past it, the loader keeps the
/// file-backed mappings first.
pub const MAX_PROCESS_MAPPINGS: usize = 256;
const _: () = assert!(MAX_PROCESS_MAPPINGS.is_power_of_two());

/// A process's executable mappings, sorted by start (the value of the
/// per-process map).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessMappings {
    pub len: u32,
    /// [`COPY_UNMAPPED`], or 0.
    pub flags: u32,
    pub mappings: [ExecMapping; MAX_PROCESS_MAPPINGS],
}

/// [`ProcessMappings::flags`]: a sample whose walk reaches an address in
/// none of the process's mappings takes a copy of its stack, as a sample of
/// a process without mappings does, for the agent to walk again once the
/// mapping is loaded. Just after an exec the loader can only write the
/// executable and the loader's mappings (the libraries come a millisecond
/// later), and a library `dlopen`ed since is in no mapping until the next
/// load: those samples would otherwise stop there. Set for a process's
/// first seconds only, and never for the agent's own process, whose
/// executable is left out on purpose.
pub const COPY_UNMAPPED: u32 = 1;

impl Default for ProcessMappings {
    fn default() -> Self {
        ProcessMappings {
            len: 0,
            flags: 0,
            mappings: [ExecMapping::default(); MAX_PROCESS_MAPPINGS],
        }
    }
}

/// [`lookup_in`] over rows and mappings held in memory (the host: replay
/// snapshots, early samples), with the same searches the kernel runs.
pub fn lookup_in_memory(mappings: &ProcessMappings, rows: &[UnwindRow], pc: u64) -> Lookup {
    let search = |what, len, target| {
        search_last_le(len, target, |i| match what {
            Sorted::Mappings => mappings.mappings.get(i as usize).map(|m| m.start),
            Sorted::Rows { start } => rows
                .get(start.wrapping_add(i) as usize)
                .map(|row| row.pc as u64),
        })
    };
    lookup_in(mappings, pc, search, |start, _len, found| {
        rows.get(start.wrapping_add(found) as usize).copied()
    })
}

/// Finds `pc`'s mapping in `mappings`, then its row. `search(what, len,
/// target)` runs a [`Search`] over `what`; `row(start, len, found)` reads
/// row `found` of the table of `len` rows at `start` (in the rows map:
/// [`packed_row`]).
#[inline(always)]
pub fn lookup_in(
    mappings: &ProcessMappings,
    pc: u64,
    mut search: impl FnMut(Sorted, u32, u64) -> Option<u32>,
    row: impl FnOnce(u32, u32, u32) -> Option<UnwindRow>,
) -> Lookup {
    let len = if (mappings.len as usize) < MAX_PROCESS_MAPPINGS {
        mappings.len
    } else {
        MAX_PROCESS_MAPPINGS as u32
    };
    let Some(index) = search(Sorted::Mappings, len, pc) else {
        return Lookup::NoMapping;
    };
    if index as usize >= MAX_PROCESS_MAPPINGS {
        return Lookup::NoMapping;
    }
    // The mask, not just the check, is what the BPF verifier sees; through
    // `opaque`, or LLVM drops it when the search's own checks imply it.
    let mapping =
        &mappings.mappings[opaque(u64::from(index)) as usize & (MAX_PROCESS_MAPPINGS - 1)];
    if pc >= mapping.end {
        return Lookup::NoMapping;
    }
    if mapping.table_len == 0 {
        if mapping.table_start == FRAME_POINTER_TABLE {
            return Lookup::FramePointers;
        }
        if mapping.table_start == RUNTIME_TABLE {
            // A runtime mapping has no table to bias: `bias` holds its tag.
            return Lookup::Runtime(mapping.bias as u8);
        }
        return Lookup::NoTable;
    }
    let vaddr = pc.wrapping_sub(mapping.bias);
    let start = mapping.table_start;
    let Some(found) = search(Sorted::Rows { start }, mapping.table_len, vaddr) else {
        return Lookup::NotCovered;
    };
    match row(start, mapping.table_len, found) {
        Some(row) if row.cfa_rule == cfa::NOT_COVERED => Lookup::NotCovered,
        Some(row) => Lookup::Row(row),
        None => Lookup::NotCovered,
    }
}

// The agent reads and writes the per-process mappings through aya's typed maps.
#[cfg(feature = "user")]
mod user {
    // SAFETY: `ProcessMappings` is `repr(C)`, `Copy`, integers only, with no
    // padding (asserted below).
    unsafe impl aya::Pod for super::ProcessMappings {}

    const _: () = assert!(
        core::mem::size_of::<super::ProcessMappings>() == 8 + 32 * super::MAX_PROCESS_MAPPINGS
    );
}
