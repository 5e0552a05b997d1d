//! OTLP profiles without I/O: resolved samples in, one
//! `ExportProfilesServiceRequest` (or `ProfilesData`) per window out.
//!
//! [`ProfileBuilder`] keeps one `ResourceProfiles` per container plus one for
//! host processes, split by the service identity processes publish, all
//! sharing one de-duplicated `ProfilesDictionary` ([`dictionary`]);
//! [`ResourceConfig`] says what each resource carries;
//! [`dictionary_violations`] checks the format's rules on any request.
//!
//! ```
//! use hostprof::profile::{ProfileBuilder, ResourceConfig, dictionary_violations};
//! let resource = ResourceConfig::new("host", None, None, Some("svc")).unwrap();
//! let mut builder = ProfileBuilder::new(resource, 19, 1_000);
//! let request = builder.finish(2_000);
//! assert!(request.resource_profiles.is_empty());
//! ```
mod builder;
pub mod dictionary;
mod resource;
#[cfg(test)]
mod tests;
mod validate;

pub use builder::ProfileBuilder;
pub use resource::{ResourceConfig, ResourceError, host_name, parse_resource_attributes};
pub use validate::dictionary_violations;

/// A random, non-zero 16-byte profile id (the kernel's CSPRNG via getrandom).
pub fn random_profile_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    while id.iter().all(|&byte| byte == 0) {
        fill_random(&mut id);
    }
    id
}

/// Fills `buf` with random bytes; falls back to the clock if getrandom fails
/// (it cannot for 16 bytes on Linux ≥ 3.17, but ids must never be all zero).
pub(crate) fn fill_random(buf: &mut [u8]) {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
    let got = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if usize::try_from(got).ok() != Some(buf.len()) {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|time| time.as_nanos())
            .unwrap_or(1);
        for (at, byte) in buf.iter_mut().enumerate() {
            *byte = (nanos >> ((at % 16) * 8)) as u8 | 1;
        }
    }
}
