//! Language runtimes whose frames the kernel walks and the host names:
//! what they share. Each runtime has a folder of its own (`crate::python`,
//! [`hotspot`]), reads the process's memory through [`memory`] and the
//! runtime's library through [`elf`].
pub mod elf;
pub mod hotspot;
pub mod memory;
