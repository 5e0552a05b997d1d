//! A thread-local of a shared library (`otel_thread_ctx_v1` defined by a
//! library loaded at start or `dlopen`ed later): where each thread's copy
//! is, read from the answers the dynamic loader wrote into the library.
//!
//! Why the loader's relocations and not its bookkeeping: glibc keeps each
//! module's TLS id and static offset in `struct link_map`, reachable from
//! the executable's `DT_DEBUG` (`r_debug`), but only the public head of
//! that struct is ABI; `l_tls_modid` and `l_tls_offset` sit in its private
//! part, whose layout changes between releases (and differs in musl). The
//! GOT slots the loader fills for the library's own TLS relocations are
//! psABI instead, the same in every loader and release:
//! - `R_X86_64_DTPMOD64` / `R_AARCH64_TLS_DTPMOD` (general and local
//!   dynamic): the module id, for the thread's DTV;
//! - `R_X86_64_TPOFF64` / `R_AARCH64_TLS_TPREL` (initial exec): the
//!   variable's offset from the thread pointer;
//! - `R_X86_64_TLSDESC` / `R_AARCH64_TLSDESC` (`-mtls-dialect=gnu2`, the
//!   aarch64 default): a descriptor whose argument is that offset when the
//!   loader placed the module in static TLS, or else points at a
//!   `tls_index {module, offset}` (the argument of `__tls_get_addr`, which
//!   glibc's and musl's dynamic descriptors start with).
//!
//! A library whose code never reaches the variable has none of these; it
//! is reported, not read. Read once per process (the slots do not change
//! once relocated), the file's part once per file.
use object::{
    Object, ObjectSymbol, RelocationFlags, RelocationTarget, SymbolKind, read::elf::ElfFile64,
};

use super::thread_ctx::{TlsVariant, VARIABLE};
use crate::procs::memory::Memory;
use hostprof_common::trace::MAX_MODULE;

/// Largest distance from the thread pointer taken for a static offset
/// (glibc's and musl's static TLS areas are kilobytes to megabytes).
const MAX_STATIC_OFFSET: i64 = 1 << 30;

/// Where the variable is in each thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// Static TLS: at the thread pointer plus this.
    Static(i64),
    /// Dynamic TLS: `offset` into the block of TLS module `module`.
    Dynamic { module: u32, offset: u64 },
}

/// What the loader writes into a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    TpOffset,
    Descriptor,
    Module,
}

/// One slot the loader fills for the variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    /// Link-time address of the slot.
    address: u64,
    answer: Answer,
    addend: i64,
}

/// A library defining [`VARIABLE`], as its file tells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryTls {
    /// The symbol's value: its offset in the module's TLS block.
    offset: u64,
    slots: Vec<Slot>,
    /// (file offset, file size, link-time address) of each segment.
    segments: Vec<(u64, u64, u64)>,
}

/// True when the file at hand has a `PT_TLS` segment, from its first
/// bytes: most libraries have none and need not be read. `read_at` fills
/// a buffer from a file offset.
pub fn has_tls_segment(read_at: impl Fn(&mut [u8], u64) -> bool) -> bool {
    let mut header = [0u8; 64];
    if !read_at(&mut header, 0) || header[..4] != *b"\x7fELF" || header[4] != 2 {
        return false;
    }
    let little = header[5] == 1;
    let word = |bytes: &[u8]| -> u64 {
        let mut value = 0u64;
        for (i, &byte) in bytes.iter().enumerate() {
            let shift = if little { i } else { bytes.len() - 1 - i };
            value |= u64::from(byte) << (8 * shift);
        }
        value
    };
    let phoff = word(&header[32..40]);
    let entry = word(&header[54..56]) as usize;
    let count = word(&header[56..58]) as usize;
    // Program headers are 56 bytes in ELF64; at most 256 looked at.
    if entry < 56 || count > 256 {
        return false;
    }
    let mut table = vec![0u8; entry * count];
    if !read_at(&mut table, phoff) {
        return false;
    }
    table
        .chunks_exact(entry)
        .any(|header| word(&header[..4]) == u64::from(object::elf::PT_TLS))
}

/// Finds [`VARIABLE`] defined among `data`'s dynamic symbols and the
/// relocations the library's code reaches it through.
pub fn find(data: &[u8]) -> Option<LibraryTls> {
    let elf = ElfFile64::<object::Endianness>::parse(data).ok()?;
    let symbol = elf.dynamic_symbols().find(|symbol| {
        symbol.kind() == SymbolKind::Tls && !symbol.is_undefined() && symbol.name() == Ok(VARIABLE)
    })?;
    let (module, tp_offset, descriptor) = match elf.elf_header().e_machine.get(elf.endian()) {
        object::elf::EM_X86_64 => (
            object::elf::R_X86_64_DTPMOD64,
            object::elf::R_X86_64_TPOFF64,
            object::elf::R_X86_64_TLSDESC,
        ),
        object::elf::EM_AARCH64 => (
            object::elf::R_AARCH64_TLS_DTPMOD,
            object::elf::R_AARCH64_TLS_TPREL,
            object::elf::R_AARCH64_TLSDESC,
        ),
        _ => return None,
    };
    let mut slots = Vec::new();
    for (address, relocation) in elf.dynamic_relocations().into_iter().flatten() {
        let RelocationFlags::Elf { r_type } = relocation.flags() else {
            continue;
        };
        let ours = relocation.target() == RelocationTarget::Symbol(symbol.index());
        let answer = match r_type {
            _ if r_type == tp_offset && ours => Answer::TpOffset,
            _ if r_type == descriptor && ours => Answer::Descriptor,
            // Local dynamic names no symbol: the module's own id.
            _ if r_type == module
                && (ours || relocation.target() == RelocationTarget::Absolute) =>
            {
                Answer::Module
            }
            _ => continue,
        };
        slots.push(Slot {
            address,
            answer,
            addend: relocation.addend(),
        });
        if slots.len() >= 64 {
            break;
        }
    }
    // Static answers first: one read fewer per sample, and no DTV.
    slots.sort_by_key(|slot| slot.answer as u8);
    let file = object::File::parse(data).ok()?;
    Some(LibraryTls {
        offset: symbol.address(),
        slots,
        segments: super::elf::segments(&file),
    })
}

impl LibraryTls {
    /// True when the library's code reaches the variable in a way the
    /// loader answers (see the module's doc).
    pub fn has_slots(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Its segments, for the load bias.
    pub fn segments(&self) -> &[(u64, u64, u64)] {
        &self.segments
    }

    /// Where the variable is, from the slots in `memory` of the library
    /// loaded at `bias`; `None` while no slot holds a plausible answer
    /// (not relocated yet, or not a loader this knows).
    pub fn locate(&self, memory: &impl Memory, bias: u64, variant: TlsVariant) -> Option<Location> {
        let plausible = |offset: i64| match variant {
            TlsVariant::Below => (-MAX_STATIC_OFFSET..0).contains(&offset),
            TlsVariant::Above => (16..MAX_STATIC_OFFSET).contains(&offset),
        };
        self.slots.iter().find_map(|slot| {
            let at = slot.address.wrapping_add(bias);
            match slot.answer {
                Answer::TpOffset => {
                    let offset = (memory.read_u64(at)? as i64).wrapping_sub(slot.addend);
                    plausible(offset).then_some(Location::Static(offset))
                }
                Answer::Module => {
                    let module = u32::try_from(memory.read_u64(at)?).ok()?;
                    (1..=MAX_MODULE)
                        .contains(&module)
                        .then_some(Location::Dynamic {
                            module,
                            offset: self.offset,
                        })
                }
                Answer::Descriptor => {
                    let argument = memory.read_u64(at.wrapping_add(8))?;
                    let index = (
                        memory.read_u64(argument),
                        memory.read_u64(argument.wrapping_add(8)),
                    );
                    let wanted = self.offset.wrapping_add(slot.addend as u64);
                    if let (Some(module), Some(offset)) = index
                        && offset == wanted
                        && let Ok(module) = u32::try_from(module)
                        && (1..=MAX_MODULE).contains(&module)
                    {
                        return Some(Location::Dynamic {
                            module,
                            offset: self.offset,
                        });
                    }
                    let offset = (argument as i64).wrapping_sub(slot.addend);
                    plausible(offset).then_some(Location::Static(offset))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::memory::Image;

    fn library(answer: Answer) -> LibraryTls {
        LibraryTls {
            offset: 0x10,
            slots: vec![Slot {
                address: 0x100,
                answer,
                addend: 0,
            }],
            segments: Vec::new(),
        }
    }

    /// Memory from 0x1000 on: `words` little-endian.
    fn memory(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|word| word.to_le_bytes()).collect()
    }

    #[test]
    fn reads_each_answer_of_the_loader() {
        let bias = 0xf00;
        // Initial exec: the offset from the thread pointer.
        let bytes = memory(&[(-0x40i64) as u64]);
        let image = Image {
            base: 0x1000,
            bytes: &bytes,
        };
        let tp = library(Answer::TpOffset);
        assert_eq!(
            tp.locate(&image, bias, TlsVariant::Below),
            Some(Location::Static(-0x40))
        );
        // The wrong sign for the layout: not taken.
        assert_eq!(tp.locate(&image, bias, TlsVariant::Above), None);
        // General dynamic: the module id.
        let bytes = memory(&[3]);
        let image = Image {
            base: 0x1000,
            bytes: &bytes,
        };
        assert_eq!(
            library(Answer::Module).locate(&image, bias, TlsVariant::Below),
            Some(Location::Dynamic {
                module: 3,
                offset: 0x10
            })
        );
        // A descriptor for static TLS: its argument is the offset.
        let bytes = memory(&[0xdead, (-0x80i64) as u64]);
        let image = Image {
            base: 0x1000,
            bytes: &bytes,
        };
        let descriptor = library(Answer::Descriptor);
        assert_eq!(
            descriptor.locate(&image, bias, TlsVariant::Below),
            Some(Location::Static(-0x80))
        );
        // A dynamic descriptor: its argument points at {module, offset}.
        let bytes = memory(&[0xdead, 0x1010, 5, 0x10]);
        let image = Image {
            base: 0x1000,
            bytes: &bytes,
        };
        assert_eq!(
            descriptor.locate(&image, bias, TlsVariant::Below),
            Some(Location::Dynamic {
                module: 5,
                offset: 0x10
            })
        );
        // Not relocated yet (zeros): nothing.
        let bytes = memory(&[0, 0]);
        let image = Image {
            base: 0x1000,
            bytes: &bytes,
        };
        assert_eq!(descriptor.locate(&image, bias, TlsVariant::Below), None);
        assert_eq!(
            library(Answer::Module).locate(&image, bias, TlsVariant::Below),
            None
        );
    }

    #[test]
    fn tells_a_tls_segment_from_the_first_bytes() {
        let exe = std::fs::read("/proc/self/exe").expect("this test binary");
        let read_at = |buf: &mut [u8], offset: u64| {
            let start = offset as usize;
            match exe.get(start..start + buf.len()) {
                Some(bytes) => {
                    buf.copy_from_slice(bytes);
                    true
                }
                None => false,
            }
        };
        let file = object::File::parse(&*exe).expect("an ELF file");
        let tls = file.segments().count() > 0
            && ElfFile64::<object::Endianness>::parse(&*exe)
                .map(|elf| {
                    use object::read::elf::ProgramHeader;
                    elf.elf_program_headers()
                        .iter()
                        .any(|header| header.p_type(elf.endian()) == object::elf::PT_TLS)
                })
                .unwrap_or(false);
        assert_eq!(has_tls_segment(read_at), tls);
        assert!(!has_tls_segment(|_: &mut [u8], _| false));
    }
}
