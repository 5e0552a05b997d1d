//! Demangling of Rust (legacy and v0) and C++ (Itanium) symbol names.
//!
//! The raw name is kept by the caller as `Line::system_name`; this module only
//! turns it into what a human reads.
use std::sync::Arc;

/// Demangles Rust and C++ names; other names (C, Go) are returned as they are.
pub fn demangle(name: &str) -> Arc<str> {
    // Rust first: legacy Rust names are valid Itanium names too, and
    // rustc-demangle drops the hash suffix that a C++ demangler would print.
    if let Ok(demangled) = rustc_demangle::try_demangle(name) {
        return format!("{demangled:#}").into();
    }
    if name.starts_with("_Z")
        && let Ok(symbol) = cpp_demangle::Symbol::new(name)
        && let Ok(demangled) = symbol.demangle()
    {
        return demangled.into();
    }
    name.into()
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn rust_legacy_and_v0() {
        assert_eq!(
            &*demangle("_ZN3std2io5stdio6_print17h0123456789abcdefE"),
            "std::io::stdio::_print"
        );
        assert_eq!(
            &*demangle("_RNvCs15kBYyAo9fc_7mycrate7example"),
            "mycrate::example"
        );
    }

    #[test]
    fn cpp_names() {
        assert_eq!(
            &*demangle("_ZN9namespace5Klass6methodEi"),
            "namespace::Klass::method(int)"
        );
    }

    #[test]
    fn plain_names_stay() {
        assert_eq!(&*demangle("main.main"), "main.main");
        assert_eq!(&*demangle("memcpy"), "memcpy");
        // Not a valid mangling: kept as is rather than half-decoded.
        assert_eq!(&*demangle("_Zfoo"), "_Zfoo");
    }
}
