//! The kernel's names: `/proc/kallsyms`, read again when a module or BPF
//! program may have come since, and the running kernel's build id.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::{KernelSymbols, Line, Modules, Symbolizer};

/// The kernel's symbols and when they were read.
pub(super) struct KernelTable {
    symbols: Arc<KernelSymbols>,
    /// `/proc/modules` just before `symbols` were read.
    modules: Modules,
    /// When `symbols` were read, or last found still current.
    read_at: Instant,
}

impl KernelTable {
    /// Reads the symbols (and the module list just before them).
    pub(super) fn read() -> Self {
        let modules = Modules::load();
        let symbols = read_kallsyms();
        if symbols.is_empty() {
            tracing::warn!(
                "/proc/kallsyms hides kernel addresses: run as root or set kernel.kptr_restrict=0"
            );
        }
        KernelTable {
            symbols: Arc::new(symbols),
            modules,
            read_at: Instant::now(),
        }
    }
}

impl Symbolizer {
    /// Reads `/proc/kallsyms` again for an address outside the kernel image
    /// when the symbols are older than `every` (default 30 s; each reading
    /// costs ~0.1 s of CPU).
    pub fn with_kernel_recheck(mut self, every: Duration) -> Self {
        self.kernel_recheck = every;
        self
    }

    /// The kernel function containing `address`: `name`, or `name [module]`
    /// in a module or BPF program. Outside the kernel image, the symbols are
    /// read again (at most every 30 s, [`Symbolizer::with_kernel_recheck`])
    /// when they may be older than the module or program holding the address:
    /// not for a module's code while `/proc/modules` lists what it listed
    /// at the reading.
    pub fn kernel_symbol(&self, address: u64) -> Option<Line> {
        let symbols = {
            let mut table = self.kernel_table();
            let symbols = table.symbols.clone();
            if symbols.in_image(address) || table.read_at.elapsed() < self.kernel_recheck {
                return symbols.lookup(address);
            }
            // Claimed before reading, so one reading serves every caller.
            table.read_at = Instant::now();
            let modules = Modules::load();
            if modules == table.modules && symbols.names_module_code(&modules, address) {
                return symbols.lookup(address);
            }
            table.modules = modules;
            symbols
        };
        let fresh = Arc::new(read_kallsyms());
        if fresh.is_empty() && !symbols.is_empty() {
            return symbols.lookup(address);
        }
        self.kernel_table().symbols = fresh.clone();
        fresh.lookup(address)
    }

    fn kernel_table(&self) -> std::sync::MutexGuard<'_, KernelTable> {
        // Replaced whole, never left half-updated by a panic.
        self.kernel
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The running kernel's GNU build-id (`/sys/kernel/notes`).
    pub fn kernel_build_id(&self) -> Option<Arc<str>> {
        self.kernel_build_id.clone()
    }
}

/// The kernel's symbols, empty (after a warning) when unreadable.
fn read_kallsyms() -> KernelSymbols {
    KernelSymbols::load().unwrap_or_else(|err| {
        tracing::warn!("cannot read /proc/kallsyms ({err}): kernel frames will show as addresses");
        KernelSymbols::default()
    })
}
