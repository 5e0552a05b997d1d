//! HotSpot (the JVM) on the host: reads a Java process's description of
//! itself ([`vmstructs`]), derives from it what the kernel's walk needs
//! ([`Jvm::kernel_process`], [`Jvm::code_ranges`]) and names the Java
//! frames the walk recorded ([`Jvm::name_frame`], in [`names`]).
mod jvm;
mod names;
pub mod vmstructs;

pub use jvm::{Jvm, LibjvmCache};

/// Why a JVM could not be attached to.
#[derive(Debug, thiserror::Error)]
pub enum HotspotError {
    #[error("cannot read libjvm: {0}")]
    Elf(String),
    #[error("libjvm has no symbol {0}")]
    MissingSymbol(&'static str),
    #[error("{table}: {why}")]
    Table { table: &'static str, why: String },
    #[error("the JVM describes no {0}")]
    Missing(String),
    #[error("cannot read {what} at {address:#x}")]
    Read { what: &'static str, address: u64 },
    /// A JVM still starting: try again later.
    #[error("the JVM has not set up its code cache yet")]
    NotReady,
    #[error("implausible {what}: {value:#x}")]
    Implausible { what: &'static str, value: u64 },
}

/// What kind of code a Java frame ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JavaFrameKind {
    Interpreted,
    Compiled,
    Stub,
}

/// One named Java frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JavaFrame {
    /// Dotted, e.g. "java.util.HashMap" or "Hot$Worker".
    pub class: String,
    pub method: String,
    /// Source file name from the class (e.g. "Hot.java"), if known.
    pub file: Option<String>,
    /// Line from the method's line number table for the bci, if known.
    pub line: Option<u32>,
    pub inlined: bool,
    /// Interpreted / compiled / stub (stubs: method = the blob's name,
    /// class empty).
    pub kind: JavaFrameKind,
}

#[cfg(test)]
mod tests;
