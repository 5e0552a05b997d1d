//! Language runtimes whose frames the kernel walks and the host names:
//! what they share. Each runtime has a folder of its own (`crate::python`,
//! `hotspot`), and reads the process's memory through [`memory`].
pub mod memory;
