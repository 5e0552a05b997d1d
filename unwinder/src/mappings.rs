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
    /// Rows in the table ([`TABLE_LEN_MASK`]); 0 when there is none
    /// (`table_start` is then [`FRAME_POINTER_TABLE`] for code known to
    /// keep frame pointers). Above them, the mapping's mark
    /// ([`ExecMapping::mark`]).
    pub table_len: u32,
}

/// Where a mapping's mark sits in [`ExecMapping::table_len`]: 0 for none,
/// else a language runtime's number for code with a table whose frames
/// stand for that runtime's (an interpreter's loop, each of whose calls
/// ran some interpreted frames). The unwinder steps such a frame as any
/// other and copies the mark into its stack entry ([`STACK_MARK_SHIFT`]),
/// so the host knows where the runtime's frames go without knowing its
/// symbols.
pub const TABLE_MARK_SHIFT: u32 = 29;
/// The row count's bits of [`ExecMapping::table_len`]: a table fits the
/// rows map (at most 2^29 words), so its rows do too.
pub const TABLE_LEN_MASK: u32 = (1 << TABLE_MARK_SHIFT) - 1;
/// Where a marked frame's mark sits in its user stack entry: above every
/// bit a user address has (56 with 5-level page tables), below the top
/// nibble, which `hostprof_common::runtime::FRAME_MARK` sets.
pub const STACK_MARK_SHIFT: u32 = 57;
/// The mark's bits of a user stack entry ([`STACK_MARK_SHIFT`]).
pub const STACK_MARK_MASK: u64 = 7 << STACK_MARK_SHIFT;

impl ExecMapping {
    /// Rows in its table.
    #[inline(always)]
    pub const fn rows(&self) -> u32 {
        self.table_len & TABLE_LEN_MASK
    }

    /// Its mark ([`TABLE_MARK_SHIFT`]); 0 for none.
    #[inline(always)]
    pub const fn mark(&self) -> u32 {
        self.table_len >> TABLE_MARK_SHIFT
    }

    /// Gives it `mark` (at most 7), its rows unchanged.
    pub const fn set_mark(&mut self, mark: u32) {
        self.table_len = self.rows() | (mark << TABLE_MARK_SHIFT);
    }
}

/// The mark of a user stack entry ([`STACK_MARK_SHIFT`]); 0 for an
/// unmarked address (and for an entry with its top nibble set, which is
/// no address).
#[inline(always)]
pub const fn stack_mark(entry: u64) -> u32 {
    if entry >> 60 != 0 {
        return 0;
    }
    ((entry & STACK_MARK_MASK) >> STACK_MARK_SHIFT) as u32
}

/// A user stack entry without its mark.
#[inline(always)]
pub const fn without_mark(entry: u64) -> u64 {
    if entry >> 60 != 0 {
        return entry;
    }
    entry & !STACK_MARK_MASK
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
    /// [`COPY_UNMAPPED`] and [`MARKED`], or 0.
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
/// [`ProcessMappings::flags`]: some mapping carries a mark
/// ([`TABLE_MARK_SHIFT`]), so a walk that reached the end of the stack
/// and marked no frame never ran that runtime's loop (its interpreter
/// frames need no walk).
pub const MARKED: u32 = 2;

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
    search: impl FnMut(Sorted, u32, u64) -> Option<u32>,
    row: impl FnOnce(u32, u32, u32) -> Option<UnwindRow>,
) -> Lookup {
    lookup_marked(mappings, pc, search, row, |_| {})
}

/// [`lookup_in`], telling `note` the mark of `pc`'s mapping when that
/// mapping has a table (not at all otherwise: the mark is then 0). A
/// callback, not a value returned: the kernel stores the mark in its map
/// memory where it reads it, since a value the verifier sees on the
/// stack, 0 on some paths and unknown on others, keeps it from merging
/// the paths of the rest of the frame (a sixfold longer walk).
#[inline(always)]
pub fn lookup_marked(
    mappings: &ProcessMappings,
    pc: u64,
    mut search: impl FnMut(Sorted, u32, u64) -> Option<u32>,
    row: impl FnOnce(u32, u32, u32) -> Option<UnwindRow>,
    note: impl FnOnce(u32),
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
    let rows = mapping.rows();
    if rows == 0 {
        if mapping.table_start == FRAME_POINTER_TABLE {
            return Lookup::FramePointers;
        }
        if mapping.table_start == RUNTIME_TABLE {
            // A runtime mapping has no table to bias: `bias` holds its tag.
            return Lookup::Runtime(mapping.bias as u8);
        }
        return Lookup::NoTable;
    }
    note(mapping.mark());
    let vaddr = pc.wrapping_sub(mapping.bias);
    let start = mapping.table_start;
    let Some(found) = search(Sorted::Rows { start }, rows, vaddr) else {
        return Lookup::NotCovered;
    };
    match row(start, rows, found) {
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
