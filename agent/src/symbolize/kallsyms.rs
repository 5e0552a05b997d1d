//! Kernel symbols from `/proc/kallsyms`: the kernel image, modules
//! (`ext4_readdir [ext4]`) and JIT-compiled BPF programs
//! (`bpf_prog_6deef7357e7b4530_sample_cpu [bpf]`, with
//! `net.core.bpf_jit_kallsyms=1`, the default when the JIT is hardened or
//! always on).
use std::{io, sync::Arc};

use super::names::{NameAt, Names};
use crate::model::Line;

/// [`KernelSymbols`] being read, line by line.
#[derive(Default)]
struct Parser {
    /// `_stext` and `_etext`, when seen.
    image: (Option<u64>, Option<u64>),
    names: Names,
    symbols: Vec<(u64, NameAt)>,
}

impl Parser {
    /// Takes in one line; false when no more names fit.
    fn line(&mut self, line: &str) -> bool {
        let mut fields = line.split_ascii_whitespace();
        let (Some(address), Some(kind), Some(name)) = (fields.next(), fields.next(), fields.next())
        else {
            return true;
        };
        // Only code: text symbols (t/T) and weak ones (w/W) that are code.
        if !matches!(kind, "t" | "T" | "w" | "W") {
            return true;
        }
        let Ok(address) = u64::from_str_radix(address, 16) else {
            return true;
        };
        if address == 0 {
            return true;
        }
        let at = match fields.next() {
            Some(module) => self.names.push(&[name, " ", module]),
            None => {
                match name {
                    "_stext" => self.image.0 = Some(address),
                    "_etext" => self.image.1 = Some(address),
                    _ => {}
                }
                self.names.push(&[name])
            }
        };
        let Some(at) = at else {
            return false;
        };
        self.symbols.push((address, at));
        true
    }

    fn finish(self) -> KernelSymbols {
        let Parser {
            image,
            mut names,
            mut symbols,
        } = self;
        symbols.sort_unstable_by_key(|(address, _)| *address);
        symbols.dedup_by_key(|(address, _)| *address);
        symbols.shrink_to_fit();
        names.shrink_to_fit();
        KernelSymbols {
            symbols,
            names,
            image: image.0.zip(image.1),
        }
    }
}

/// A sorted table of kernel text symbols.
#[derive(Debug, Default)]
pub struct KernelSymbols {
    /// (start address, its name in `names`), sorted by address. Symbols of
    /// modules and BPF programs carry their module: `name [module]`. About
    /// 120,000 of them: as separate strings they cost twice the memory and
    /// a third of the parsing.
    symbols: Vec<(u64, NameAt)>,
    names: Names,
    /// The kernel image's text, `_stext..=_etext`: unlike modules and BPF
    /// programs, it never changes while the system runs.
    image: Option<(u64, u64)>,
}

impl KernelSymbols {
    /// Reads `/proc/kallsyms`. Addresses read as zero when `kptr_restrict` hides
    /// them from us; then the table is empty and kernel frames stay addresses.
    ///
    /// Parsed as it is read, a block at a time: read whole, its 5 MB (and
    /// the doublings of the buffer on the way, for a file whose size reads
    /// as 0) were two thirds of the time `record` took to read it, in page
    /// faults and copies, and a step in its peak memory.
    pub fn load() -> io::Result<Self> {
        use io::BufRead;
        let file = std::fs::File::open("/proc/kallsyms")?;
        let mut reader = io::BufReader::with_capacity(256 << 10, file);
        let mut parser = Parser::default();
        let mut line = Vec::new();
        loop {
            line.clear();
            if reader.read_until(b'\n', &mut line)? == 0 {
                break;
            }
            let Ok(text) = std::str::from_utf8(&line) else {
                continue;
            };
            if !parser.line(text.trim_end_matches('\n')) {
                break;
            }
        }
        Ok(parser.finish())
    }

    /// Parses kallsyms text: `ADDR TYPE NAME` per line, then a tab and
    /// `[MODULE]` for symbols outside the kernel image.
    pub fn parse(text: &str) -> Self {
        let mut parser = Parser::default();
        for line in text.lines() {
            if !parser.line(line) {
                break;
            }
        }
        parser.finish()
    }

    /// True when no symbol could be read (e.g. hidden by `kptr_restrict`).
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// Whether `address` is in the kernel image's text, which a newer
    /// reading of `/proc/kallsyms` would name the same way.
    pub fn in_image(&self, address: u64) -> bool {
        self.image
            .is_some_and(|(start, end)| (start..=end).contains(&address))
    }

    /// The function containing `address`, if any. Past the kernel image's
    /// text only symbols of modules and BPF programs count: that is where
    /// they live (maybe loaded after this reading), and the image's symbols
    /// there (init code, freed after boot) do not extend over them.
    pub fn lookup(&self, address: u64) -> Option<Line> {
        let name: Arc<str> = self.name_at(address)?.into();
        Some(Line::named(name.clone(), name))
    }

    /// [`KernelSymbols::lookup`]'s name, borrowed.
    fn name_at(&self, address: u64) -> Option<&str> {
        let index = self.symbols.partition_point(|(start, _)| *start <= address);
        let (_, at) = self.symbols.get(index.checked_sub(1)?)?;
        let name = self.names.get(*at);
        let in_module = name.ends_with(']');
        if !in_module && self.image.is_some_and(|(_, end)| address > end) {
            return None;
        }
        Some(name)
    }
}

/// The kernel's loaded modules as `/proc/modules` lists them (name, size,
/// base address): while this list stays the same, a reading of
/// `/proc/kallsyms` still names every module's code right. A module's
/// frame then needs no new reading, which costs about 0.1 s of CPU: on a
/// node whose network or file system is a module, that would otherwise be
/// every 30 s, a third of the agent's budget on an idle host.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Modules {
    /// (name, start, end) of each module's memory, as listed.
    spans: Vec<(String, u64, u64)>,
}

impl Modules {
    /// Reads `/proc/modules`; empty when unreadable, or without modules.
    pub fn load() -> Self {
        std::fs::read_to_string("/proc/modules")
            .map(|text| Self::parse(&text))
            .unwrap_or_default()
    }

    /// `NAME SIZE REFCOUNT DEPS STATE ADDRESS [TAINT]` per line. Addresses
    /// hidden by `kptr_restrict` read as 0: no span.
    pub fn parse(text: &str) -> Self {
        let spans = text
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_ascii_whitespace().collect();
                let (name, size, address) = (fields.first()?, fields.get(1)?, fields.get(5)?);
                let size: u64 = size.parse().ok()?;
                let start = u64::from_str_radix(address.strip_prefix("0x")?, 16).ok()?;
                let end = start.checked_add(size)?;
                (start != 0).then(|| (name.to_string(), start, end))
            })
            .collect();
        Modules { spans }
    }

    /// The module whose memory holds `address` (the size counts all of a
    /// module's memory, so this may say yes for a little more than its
    /// code; [`KernelSymbols::names_module_code`] also wants its symbol).
    fn module_at(&self, address: u64) -> Option<&str> {
        self.spans
            .iter()
            .find(|(_, start, end)| (*start..*end).contains(&address))
            .map(|(name, _, _)| name.as_str())
    }
}

impl KernelSymbols {
    /// True when this table, read while `modules` were loaded (and they
    /// still are), names `address` as code of the module whose memory
    /// holds it: no newer reading would name it otherwise. BPF programs
    /// come and go without a trace in `/proc/modules`: never vouched for.
    pub fn names_module_code(&self, modules: &Modules, address: u64) -> bool {
        let Some(module) = modules.module_at(address) else {
            return false;
        };
        self.name_at(address)
            .and_then(|name| name.strip_suffix(']'))
            .and_then(|name| name.rsplit_once(" ["))
            .is_some_and(|(_, owner)| owner == module)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the kernel prints it: a tab before `[module]`.
    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81000100 t do_syscall_64
ffffffff81000200 D some_data
ffffffff81000300 W weak_code
ffffffff81002000 T _etext
ffffffff83783000 T _sinittext
ffffffffc0000000 t ext4_read\t[ext4]
ffffffffc0000100 t ext4_write\t[ext4]
ffffffffc0000200 d ext4_data\t[ext4]
ffffffffc0022064 t bpf_prog_59f4a931744dcdc6_hp_named_prog\t[bpf]
ffffffffc0201000 t ftrace_trampoline\t[__builtin__ftrace]
";

    fn name(table: &KernelSymbols, address: u64) -> Option<String> {
        table.lookup(address).map(|line| {
            assert_eq!(line.function, line.system_name);
            line.function.to_string()
        })
    }

    #[test]
    fn read_as_it_comes_the_kernel_image_reads_as_when_read_whole() {
        let whole = KernelSymbols::parse(&std::fs::read_to_string("/proc/kallsyms").unwrap());
        let streamed = KernelSymbols::load().unwrap();
        assert!(
            !streamed.is_empty(),
            "run as root: kptr_restrict hides addresses"
        );
        assert_eq!(streamed.image, whole.image);
        // Modules and BPF programs come and go between the two reads; the
        // image does not.
        let image = |table: &KernelSymbols| -> Vec<(u64, String)> {
            table
                .symbols
                .iter()
                .filter(|(address, _)| table.in_image(*address))
                .map(|(address, at)| (*address, table.names.get(*at).to_string()))
                .collect()
        };
        let (whole, streamed) = (image(&whole), image(&streamed));
        assert!(streamed.len() > 1000, "{} image symbols", streamed.len());
        assert_eq!(streamed, whole);
    }

    #[test]
    fn names_the_enclosing_text_symbol_with_its_module() {
        let table = KernelSymbols::parse(KALLSYMS);
        assert_eq!(name(&table, 0xffffffff81000150).unwrap(), "do_syscall_64");
        // Data symbols do not end a function; weak code symbols are code.
        assert_eq!(name(&table, 0xffffffff81000250).unwrap(), "do_syscall_64");
        assert_eq!(name(&table, 0xffffffff81000300).unwrap(), "weak_code");
        assert_eq!(
            name(&table, 0xffffffffc0000010).unwrap(),
            "ext4_read [ext4]"
        );
        assert_eq!(
            name(&table, 0xffffffffc0000250).unwrap(),
            "ext4_write [ext4]"
        );
        assert_eq!(
            name(&table, 0xffffffffc0022064 + 0x10).unwrap(),
            "bpf_prog_59f4a931744dcdc6_hp_named_prog [bpf]"
        );
        assert_eq!(
            name(&table, 0xffffffffc0201000).unwrap(),
            "ftrace_trampoline [__builtin__ftrace]"
        );
        assert!(table.lookup(0x1000).is_none());
    }

    #[test]
    fn past_the_image_only_modules_and_programs_name_addresses() {
        let table = KernelSymbols::parse(KALLSYMS);
        assert!(table.in_image(0xffffffff81000000) && table.in_image(0xffffffff81002000));
        assert!(!table.in_image(0xffffffff81002001) && !table.in_image(0xffffffffc0000000));
        // Between the image and the first module, or in the module area
        // before any module symbol (a program loaded since this reading):
        // no name rather than the image's last symbol, or its init code's.
        assert!(table.lookup(0xffffffff81002010).is_none());
        assert!(table.lookup(0xffffffffa0000000).is_none());
        assert!(table.lookup(0xffffffffbfffffff).is_none());
        assert!(table.lookup(0xffffffffc0000000).is_some());
    }

    #[test]
    fn a_module_listed_as_at_the_reading_needs_no_new_reading() {
        let table = KernelSymbols::parse(KALLSYMS);
        let modules = Modules::parse(
            "ext4 4096 1 - Live 0xffffffffc0000000\n\
             hidden 4096 0 - Live 0x0000000000000000\n\
             nfsd 8192 0 - Live 0xffffffffc0100000 (O)\n",
        );
        assert_eq!(modules.spans.len(), 2, "{modules:?}");
        // ext4's code, named from ext4's symbols.
        assert!(table.names_module_code(&modules, 0xffffffffc0000010));
        assert!(table.names_module_code(&modules, 0xffffffffc0000250));
        // A BPF program: /proc/modules says nothing of programs.
        assert!(!table.names_module_code(&modules, 0xffffffffc0022070));
        // nfsd, loaded after the reading: its memory holds the address,
        // but the nearest symbol is another's.
        assert!(!table.names_module_code(&modules, 0xffffffffc0100010));
        // In no listed module.
        assert!(!table.names_module_code(&modules, 0xffffffffc0300000));
        // Unreadable list: nothing is vouched for.
        assert!(!table.names_module_code(&Modules::default(), 0xffffffffc0000010));
    }

    #[test]
    fn hidden_addresses_leave_the_table_empty() {
        let table = KernelSymbols::parse("0000000000000000 T _stext\n0000000000000000 t foo\n");
        assert!(table.is_empty());
        assert!(!table.in_image(0));
        assert!(table.lookup(0xffffffff81000000).is_none());
    }
}
