//! The JVM's description of itself (`gHotSpotVMStructs`, `gHotSpotVMTypes`,
//! `gHotSpotVMIntConstants`, `gHotSpotVMLongConstants`), read from the
//! process's memory into lookups by name.
//!
//! The tables are data of a process we do not trust: every count, stride,
//! offset and string is bounded, arithmetic is checked, and a table that
//! does not make sense is an error rather than a panic.
use std::collections::HashMap;

use super::HotspotError;

/// Entries read from one table at most (JDK 17 has about 2,000 fields).
pub const MAX_ENTRIES: u64 = 1 << 15;
/// Largest entry stride accepted (the real ones are 24 to 48 bytes).
pub const MAX_STRIDE: u64 = 256;
/// Longest name read (type names such as `GrowableArray<CodeHeap*>` are
/// far shorter).
pub const MAX_NAME: usize = 256;

pub use crate::procs::memory::{Memory, Process};

/// One `VMStructEntry`: a field's offset, or a static's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The C++ type of the field (`address`, `int`, `GrowableArray<CodeHeap*>*`).
    pub type_string: String,
    pub is_static: bool,
    /// Byte offset in its type (fields).
    pub offset: u64,
    /// Address in the process (statics).
    pub address: u64,
}

/// The four tables of one JVM, by name.
#[derive(Clone, Debug, Default)]
pub struct VmStructs {
    fields: HashMap<(String, String), Field>,
    sizes: HashMap<String, u64>,
    ints: HashMap<String, i32>,
    longs: HashMap<String, u64>,
}

/// Addresses (in the process) of the exported variables that describe one
/// table: the variable holding the table's address, and those holding the
/// offsets of an entry's members and the entry stride.
#[derive(Clone, Copy, Debug, Default)]
pub struct TableSymbols {
    pub table: u64,
    pub stride: u64,
    /// Per member, the variable holding its offset in an entry (0 when
    /// the member is not used for this table).
    pub members: [u64; 6],
}

/// Member indices of [`TableSymbols::members`] per table.
pub mod member {
    /// `gHotSpotVMStructs`: type name, field name, type string, is static,
    /// offset, address.
    pub const STRUCT_TYPE: usize = 0;
    pub const STRUCT_FIELD: usize = 1;
    pub const STRUCT_TYPE_STRING: usize = 2;
    pub const STRUCT_IS_STATIC: usize = 3;
    pub const STRUCT_OFFSET: usize = 4;
    pub const STRUCT_ADDRESS: usize = 5;
    /// `gHotSpotVMTypes`: type name, size.
    pub const TYPE_NAME: usize = 0;
    pub const TYPE_SIZE: usize = 1;
    /// Constants: name, value.
    pub const CONSTANT_NAME: usize = 0;
    pub const CONSTANT_VALUE: usize = 1;
}

/// A table's entries as raw bytes, after checking its layout.
struct Table {
    base: u64,
    stride: u64,
    /// Offsets of the used members in an entry.
    members: [u64; 6],
}

impl Table {
    fn locate(
        memory: &impl Memory,
        symbols: &TableSymbols,
        used: usize,
        name: &'static str,
    ) -> Result<Table, HotspotError> {
        let bad = |why: String| HotspotError::Table { table: name, why };
        let read = |address: u64| {
            memory
                .read_u64(address)
                .ok_or_else(|| bad(format!("cannot read {address:#x}")))
        };
        let base = read(symbols.table)?;
        let stride = read(symbols.stride)?;
        // Set by libjvm's static initialisers: not yet when it is loading.
        if base == 0 {
            return Err(HotspotError::NotReady);
        }
        if !(8..=MAX_STRIDE).contains(&stride) {
            return Err(bad(format!("stride {stride}")));
        }
        let mut members = [0u64; 6];
        for (index, member) in members.iter_mut().enumerate().take(used) {
            let offset = read(symbols.members[index])?;
            // Every member is read as 8 bytes at most; it must fit the entry.
            if offset.checked_add(8).is_none_or(|end| end > stride) {
                return Err(bad(format!("member {index} at {offset}, stride {stride}")));
            }
            *member = offset;
        }
        base.checked_add(stride * MAX_ENTRIES)
            .ok_or_else(|| bad("table wraps".into()))?;
        Ok(Table {
            base,
            stride,
            members,
        })
    }

    /// Calls `each` on each entry until the terminating one (whose first
    /// name is null) or [`MAX_ENTRIES`].
    fn entries(
        &self,
        memory: &impl Memory,
        name: &'static str,
        mut each: impl FnMut(&Entry) -> Result<(), HotspotError>,
    ) -> Result<(), HotspotError> {
        let mut buf = vec![0u8; self.stride as usize];
        for index in 0..MAX_ENTRIES {
            // No overflow: checked in `locate`.
            let address = self.base + index * self.stride;
            if !memory.read(address, &mut buf) {
                return Err(HotspotError::Table {
                    table: name,
                    why: format!("cannot read entry {index} at {address:#x}"),
                });
            }
            let entry = Entry {
                bytes: &buf,
                members: &self.members,
            };
            if entry.u64(0) == 0 {
                return Ok(());
            }
            each(&entry)?;
        }
        Err(HotspotError::Table {
            table: name,
            why: format!("more than {MAX_ENTRIES} entries"),
        })
    }
}

struct Entry<'a> {
    bytes: &'a [u8],
    members: &'a [u64; 6],
}

impl Entry<'_> {
    /// Member `index` as a `u64` (bounds checked in `Table::locate`).
    fn u64(&self, index: usize) -> u64 {
        let at = self.members[index] as usize;
        self.bytes
            .get(at..at + 8)
            .and_then(|bytes| bytes.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    }

    fn i32(&self, index: usize) -> i32 {
        self.u64(index) as u32 as i32
    }
}

/// Strings by address: the tables repeat type names a lot.
struct Names<'m, M: Memory> {
    memory: &'m M,
    cache: HashMap<u64, Option<String>>,
}

impl<M: Memory> Names<'_, M> {
    fn get(&mut self, address: u64) -> Option<String> {
        if self.cache.len() > MAX_ENTRIES as usize * 2 {
            self.cache.clear();
        }
        self.cache
            .entry(address)
            .or_insert_with(|| self.memory.read_cstr(address, MAX_NAME))
            .clone()
    }
}

impl VmStructs {
    /// Reads the four tables. The structs and types tables are required;
    /// the constants help but are optional.
    pub fn read(
        memory: &impl Memory,
        structs: &TableSymbols,
        types: &TableSymbols,
        ints: Option<&TableSymbols>,
        longs: Option<&TableSymbols>,
    ) -> Result<VmStructs, HotspotError> {
        let mut names = Names {
            memory,
            cache: HashMap::new(),
        };
        let mut out = VmStructs::default();

        let table = Table::locate(memory, structs, 6, "gHotSpotVMStructs")?;
        table.entries(memory, "gHotSpotVMStructs", |entry| {
            let (Some(type_name), Some(field)) = (
                names.get(entry.u64(member::STRUCT_TYPE)),
                names.get(entry.u64(member::STRUCT_FIELD)),
            ) else {
                // An unreadable name loses one entry, not the table.
                return Ok(());
            };
            let type_string = names
                .get(entry.u64(member::STRUCT_TYPE_STRING))
                .unwrap_or_default();
            out.fields.insert(
                (type_name, field),
                Field {
                    type_string,
                    is_static: entry.i32(member::STRUCT_IS_STATIC) != 0,
                    offset: entry.u64(member::STRUCT_OFFSET),
                    address: entry.u64(member::STRUCT_ADDRESS),
                },
            );
            Ok(())
        })?;

        let table = Table::locate(memory, types, 2, "gHotSpotVMTypes")?;
        table.entries(memory, "gHotSpotVMTypes", |entry| {
            if let Some(name) = names.get(entry.u64(member::TYPE_NAME)) {
                out.sizes.insert(name, entry.u64(member::TYPE_SIZE));
            }
            Ok(())
        })?;

        // Constants are a bonus: a broken table leaves them out.
        if let Some(symbols) = ints
            && let Ok(table) = Table::locate(memory, symbols, 2, "gHotSpotVMIntConstants")
        {
            let mut ints = HashMap::new();
            let read = table.entries(memory, "gHotSpotVMIntConstants", |entry| {
                if let Some(name) = names.get(entry.u64(member::CONSTANT_NAME)) {
                    ints.insert(name, entry.i32(member::CONSTANT_VALUE));
                }
                Ok(())
            });
            if read.is_ok() {
                out.ints = ints;
            }
        }
        if let Some(symbols) = longs
            && let Ok(table) = Table::locate(memory, symbols, 2, "gHotSpotVMLongConstants")
        {
            let mut longs = HashMap::new();
            let read = table.entries(memory, "gHotSpotVMLongConstants", |entry| {
                if let Some(name) = names.get(entry.u64(member::CONSTANT_NAME)) {
                    longs.insert(name, entry.u64(member::CONSTANT_VALUE));
                }
                Ok(())
            });
            if read.is_ok() {
                out.longs = longs;
            }
        }
        Ok(out)
    }

    /// The entry of `type_name::field`.
    pub fn field(&self, type_name: &str, field: &str) -> Option<&Field> {
        self.fields.get(&(type_name.to_owned(), field.to_owned()))
    }

    /// The offset of the first of `fields` found in the first of `types`
    /// that has it (names move between JDK versions and base classes).
    pub fn offset(&self, types: &[&str], fields: &[&str]) -> Option<(u64, &Field)> {
        fields.iter().find_map(|field| {
            types.iter().find_map(|type_name| {
                self.field(type_name, field)
                    .filter(|entry| !entry.is_static)
                    .map(|entry| (entry.offset, entry))
            })
        })
    }

    /// The address of static `type_name::field`.
    pub fn static_address(&self, type_name: &str, field: &str) -> Option<u64> {
        self.field(type_name, field)
            .filter(|entry| entry.is_static && entry.address != 0)
            .map(|entry| entry.address)
    }

    /// `sizeof(type_name)`.
    pub fn size(&self, type_name: &str) -> Option<u64> {
        self.sizes.get(type_name).copied()
    }

    pub fn int(&self, name: &str) -> Option<i32> {
        self.ints.get(name).copied()
    }

    pub fn long(&self, name: &str) -> Option<u64> {
        self.longs.get(name).copied()
    }

    /// Entries read (fields, types, int and long constants).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        (
            self.fields.len(),
            self.sizes.len(),
            self.ints.len(),
            self.longs.len(),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A byte image mapped at `base`.
    pub struct Image {
        pub base: u64,
        pub bytes: Vec<u8>,
    }

    impl Memory for Image {
        fn read(&self, address: u64, buf: &mut [u8]) -> bool {
            let image = crate::procs::memory::Image {
                base: self.base,
                bytes: &self.bytes,
            };
            image.read(address, buf)
        }
    }

    impl Image {
        fn put_u64(&mut self, at: u64, value: u64) {
            let at = (at - self.base) as usize;
            self.bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }

        fn put_str(&mut self, at: u64, text: &str) {
            let at = (at - self.base) as usize;
            self.bytes[at..at + text.len()].copy_from_slice(text.as_bytes());
            self.bytes[at + text.len()] = 0;
        }
    }

    const BASE: u64 = 0x10000;
    // Variables: table pointers, strides and member offsets.
    const VARS: u64 = BASE;
    const STRINGS: u64 = BASE + 0x400;
    const STRUCTS: u64 = BASE + 0x800;
    const TYPES: u64 = BASE + 0xc00;

    /// A well-formed image: `Foo::_bar` at offset 24, static `Foo::_baz`,
    /// `sizeof(Foo)` 40.
    fn sample() -> (Image, TableSymbols, TableSymbols) {
        let mut image = Image {
            base: BASE,
            bytes: vec![0; 0x1000],
        };
        image.put_str(STRINGS, "Foo");
        image.put_str(STRINGS + 0x10, "_bar");
        image.put_str(STRINGS + 0x20, "int");
        image.put_str(STRINGS + 0x30, "_baz");
        let mut structs = TableSymbols {
            table: VARS,
            stride: VARS + 8,
            members: [0; 6],
        };
        image.put_u64(VARS, STRUCTS);
        image.put_u64(VARS + 8, 48);
        for (index, member) in structs.members.iter_mut().enumerate() {
            *member = VARS + 16 + 8 * index as u64;
            image.put_u64(*member, 8 * index as u64);
        }
        // Foo::_bar, offset 24.
        image.put_u64(STRUCTS, STRINGS);
        image.put_u64(STRUCTS + 8, STRINGS + 0x10);
        image.put_u64(STRUCTS + 16, STRINGS + 0x20);
        image.put_u64(STRUCTS + 32, 24);
        // static Foo::_baz at 0x1234.
        image.put_u64(STRUCTS + 48, STRINGS);
        image.put_u64(STRUCTS + 56, STRINGS + 0x30);
        image.put_u64(STRUCTS + 72, 1);
        image.put_u64(STRUCTS + 88, 0x1234);
        let types = TableSymbols {
            table: VARS + 0x100,
            stride: VARS + 0x108,
            members: [VARS + 0x110, VARS + 0x118, 0, 0, 0, 0],
        };
        image.put_u64(VARS + 0x100, TYPES);
        image.put_u64(VARS + 0x108, 16);
        image.put_u64(VARS + 0x110, 0);
        image.put_u64(VARS + 0x118, 8);
        image.put_u64(TYPES, STRINGS);
        image.put_u64(TYPES + 8, 40);
        (image, structs, types)
    }

    #[test]
    fn reads_a_well_formed_table() {
        let (image, structs, types) = sample();
        let vm = VmStructs::read(&image, &structs, &types, None, None).expect("parses");
        assert_eq!(vm.offset(&["Foo"], &["_bar"]).map(|(at, _)| at), Some(24));
        assert_eq!(
            vm.field("Foo", "_bar").map(|f| f.type_string.as_str()),
            Some("int")
        );
        assert_eq!(vm.static_address("Foo", "_baz"), Some(0x1234));
        assert_eq!(vm.offset(&["Foo"], &["_baz"]), None);
        assert_eq!(vm.size("Foo"), Some(40));
        assert_eq!(vm.counts(), (2, 1, 0, 0));
    }

    #[test]
    fn rejects_hostile_tables_without_panicking() {
        // Garbage strides.
        for stride in [0, 1, 7, MAX_STRIDE + 1, u64::MAX] {
            let (mut image, structs, types) = sample();
            image.put_u64(VARS + 8, stride);
            assert!(VmStructs::read(&image, &structs, &types, None, None).is_err());
        }
        // A member offset past the entry, or one that overflows.
        for offset in [48, 41, u64::MAX - 3] {
            let (mut image, structs, types) = sample();
            image.put_u64(structs.members[member::STRUCT_OFFSET], offset);
            assert!(VmStructs::read(&image, &structs, &types, None, None).is_err());
        }
        // A table that wraps the address space, or one never terminated.
        let (mut image, structs, types) = sample();
        image.put_u64(VARS, u64::MAX - 64);
        assert!(VmStructs::read(&image, &structs, &types, None, None).is_err());
        let (mut image, structs, types) = sample();
        // Entries up to the end of the image: the one after is unreadable.
        for entry in 0..(0x1000 - 0x800) / 48 {
            image.put_u64(STRUCTS + entry * 48, STRINGS);
        }
        assert!(VmStructs::read(&image, &structs, &types, None, None).is_err());
        // An unterminated name: the entry is dropped, nothing panics.
        let (mut image, structs, types) = sample();
        for at in (STRINGS..STRINGS + 0x400).step_by(8) {
            image.put_u64(at, 0x4141_4141_4141_4141);
        }
        let vm = VmStructs::read(&image, &structs, &types, None, None).expect("parses");
        assert_eq!(vm.counts(), (0, 0, 0, 0));
        // Names pointing nowhere.
        let (mut image, structs, types) = sample();
        image.put_u64(STRUCTS + 8, u64::MAX);
        let vm = VmStructs::read(&image, &structs, &types, None, None).expect("parses");
        assert_eq!(vm.counts().0, 1);
    }
}
