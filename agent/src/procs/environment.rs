//! The environment fallback: a process that publishes no process context
//! but was started with `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES`
//! is named as its SDK would name it.
//!
//! `/proc/PID/environ` holds every variable the process started with,
//! secrets included: only those two are kept, nothing of it is logged, and
//! the buffer is dropped once they are found.
use std::io::Read;

use super::otel_ctx::Refusal;
use crate::model::{ResourceValue, ServiceResource, parse_key_values};

/// Bytes of `/proc/PID/environ` read at most; the kernel caps a process's
/// arguments and environment together far above what any SDK variable
/// needs, and a huge environment must not cost a huge read.
const MAX_ENVIRON: u64 = 1 << 20;

const SERVICE_NAME: &[u8] = b"OTEL_SERVICE_NAME=";
const RESOURCE_ATTRIBUTES: &[u8] = b"OTEL_RESOURCE_ATTRIBUTES=";

/// The service of process `pid` from its environment; `None` when neither
/// variable is set (or the file cannot be read: a process gone, another
/// user's process without the rights).
pub fn read(pid: u32) -> Option<ServiceResource> {
    let mut environ = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/environ"))
        .and_then(|file| file.take(MAX_ENVIRON).read_to_end(&mut environ))
        .ok()?;
    let (service, refusal) = from_environ(&environ);
    if let Some(reason) = refusal {
        super::otel_ctx::count_refusal(pid, reason);
    }
    service
}

/// What the two variables in a NUL-separated environment say, as the SDK
/// specification resolves them: `OTEL_RESOURCE_ATTRIBUTES` is
/// `key=value,…` with %-encoded values, and `OTEL_SERVICE_NAME` wins over
/// its `service.name`. A malformed `OTEL_RESOURCE_ATTRIBUTES` is dropped
/// whole (what SDKs do), with [`Refusal::Environment`]; empty means unset.
pub fn from_environ(environ: &[u8]) -> (Option<ServiceResource>, Option<Refusal>) {
    let mut service_name = None;
    let mut resource_attributes = None;
    for entry in environ.split(|&byte| byte == 0) {
        if let Some(value) = entry.strip_prefix(SERVICE_NAME) {
            service_name = Some(value);
        } else if let Some(value) = entry.strip_prefix(RESOURCE_ATTRIBUTES) {
            resource_attributes = Some(value);
        }
    }
    let mut refusal = None;
    let mut attributes = Vec::new();
    if let Some(text) = resource_attributes.filter(|text| !text.is_empty()) {
        match std::str::from_utf8(text).ok().map(parse_key_values) {
            Some(Ok(pairs)) => attributes.extend(pairs),
            _ => refusal = Some(Refusal::Environment),
        }
    }
    match service_name.map(std::str::from_utf8) {
        Some(Ok(name)) if !name.is_empty() => {
            attributes.push(("service.name".to_owned(), name.to_owned()));
        }
        Some(Err(_)) => refusal = Some(Refusal::Environment),
        _ => {}
    }
    let service = (!attributes.is_empty()).then(|| {
        ServiceResource::new(
            attributes
                .into_iter()
                .map(|(key, value)| (key, ResourceValue::Str(value))),
        )
    });
    (service, refusal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_name_wins_and_values_are_decoded() {
        let environ = b"PATH=/bin\0OTEL_RESOURCE_ATTRIBUTES=service.name=attr,deployment.environment.name=prod%20eu\0SECRET=x\0OTEL_SERVICE_NAME=checkout\0";
        let (service, refusal) = from_environ(environ);
        let service = service.expect("a service");
        assert_eq!(refusal, None);
        assert_eq!(service.get("service.name"), Some("checkout"));
        assert_eq!(service.get("deployment.environment.name"), Some("prod eu"));
        assert_eq!(service.attributes.len(), 2, "nothing else is kept");
    }

    #[test]
    fn attributes_alone_or_nothing() {
        let (service, _) = from_environ(b"OTEL_RESOURCE_ATTRIBUTES=service.name=attr\0");
        assert_eq!(service.unwrap().get("service.name"), Some("attr"));
        assert_eq!(
            from_environ(b"HOME=/root\0OTEL_SERVICE_NAME=\0"),
            (None, None)
        );
        assert_eq!(from_environ(b""), (None, None));
        // A name-alike that is not the variable.
        assert_eq!(from_environ(b"XOTEL_SERVICE_NAME=no\0"), (None, None));
    }

    #[test]
    fn malformed_attributes_are_dropped_whole_and_counted() {
        let (service, refusal) =
            from_environ(b"OTEL_RESOURCE_ATTRIBUTES=a=1,b,c=%zz\0OTEL_SERVICE_NAME=svc\0");
        assert_eq!(refusal, Some(Refusal::Environment));
        let service = service.unwrap();
        assert_eq!(service.get("service.name"), Some("svc"));
        assert_eq!(service.get("a"), None);
        let (service, refusal) = from_environ(b"OTEL_SERVICE_NAME=\xff\xfe\0");
        assert_eq!((service, refusal), (None, Some(Refusal::Environment)));
    }

    #[test]
    fn reads_its_own_environment_without_panicking() {
        // The test runner's environment may or may not set the variables.
        let _ = read(std::process::id());
        assert_eq!(read(u32::MAX), None);
    }
}
