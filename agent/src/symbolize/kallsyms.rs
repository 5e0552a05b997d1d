//! Kernel symbols from `/proc/kallsyms`, modules included.
use std::{io, sync::Arc};

use crate::model::Line;

/// A sorted table of kernel text symbols.
#[derive(Debug, Default)]
pub struct KernelSymbols {
    /// (start address, name), sorted by address.
    symbols: Vec<(u64, Arc<str>)>,
}

impl KernelSymbols {
    /// Reads `/proc/kallsyms`. Addresses read as zero when `kptr_restrict` hides
    /// them from us; then the table is empty and kernel frames stay addresses.
    pub fn load() -> io::Result<Self> {
        Ok(Self::parse(&std::fs::read_to_string("/proc/kallsyms")?))
    }

    /// Parses kallsyms text: `ADDR TYPE NAME [MODULE]` per line.
    pub fn parse(text: &str) -> Self {
        let mut symbols: Vec<(u64, Arc<str>)> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_ascii_whitespace();
                let address = u64::from_str_radix(fields.next()?, 16).ok()?;
                let kind = fields.next()?;
                let name = fields.next()?;
                // Only code: text symbols (t/T) and weak ones (w/W) that are code.
                if address == 0 || !matches!(kind, "t" | "T" | "w" | "W") {
                    return None;
                }
                let name: Arc<str> = match fields.next() {
                    Some(module) => format!("{name} {module}").into(),
                    None => name.into(),
                };
                Some((address, name))
            })
            .collect();
        symbols.sort_unstable_by_key(|(address, _)| *address);
        symbols.dedup_by_key(|(address, _)| *address);
        KernelSymbols { symbols }
    }

    /// True when no symbol could be read (e.g. hidden by `kptr_restrict`).
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The function containing `address`, if any.
    pub fn lookup(&self, address: u64) -> Option<Line> {
        let index = self.symbols.partition_point(|(start, _)| *start <= address);
        let (_, name) = self.symbols.get(index.checked_sub(1)?)?;
        Some(Line::named(name.clone(), name.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_enclosing_text_symbol_and_module() {
        let table = KernelSymbols::parse(
            "ffffffff81000000 T _stext\n\
             ffffffff81000100 t do_syscall_64\n\
             ffffffff81000200 D some_data\n\
             ffffffffc0000000 t ext4_read [ext4]\n",
        );
        assert_eq!(
            &*table.lookup(0xffffffff81000150).unwrap().function,
            "do_syscall_64"
        );
        // Data symbols do not end a function.
        assert_eq!(
            &*table.lookup(0xffffffff81000250).unwrap().function,
            "do_syscall_64"
        );
        assert_eq!(
            &*table.lookup(0xffffffffc0000010).unwrap().function,
            "ext4_read [ext4]"
        );
        assert!(table.lookup(0x1000).is_none());
    }

    #[test]
    fn hidden_addresses_leave_the_table_empty() {
        let table = KernelSymbols::parse("0000000000000000 T _stext\n0000000000000000 t foo\n");
        assert!(table.is_empty());
    }
}
