//! Resource attributes (OpenTelemetry semantic conventions): what every
//! `ResourceProfiles` shares (`host.name`, `host.arch`, `os.type`,
//! `service.name`, `OTEL_RESOURCE_ATTRIBUTES`) plus what tells the groups
//! apart (`container.id`, `k8s.pod.uid`, and what the processes say they
//! are: their process context or environment).
use hostprof_proto::{
    common::{AnyValue, KeyValue, any_value},
    resource::Resource,
};

use crate::model::{BadEntry, ResourceValue, ServiceResource, parse_key_values};

/// What the agent detects itself and a process cannot restate: an SDK in a
/// container sees the container's host name, not the node's.
const DETECTED: [&str; 5] = [
    "host.name",
    "host.arch",
    "os.type",
    "container.id",
    "k8s.pod.uid",
];

/// Errors in resource configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResourceError {
    #[error(
        "OTEL_RESOURCE_ATTRIBUTES entry `{0}` is not key=value: write it as key1=value1,key2=value2"
    )]
    NotKeyValue(String),
    #[error("OTEL_RESOURCE_ATTRIBUTES entry `{0}` has a bad %-escape: escape `%` as %25")]
    BadEscape(String),
}

/// The attributes every resource of this agent carries, in order; later
/// entries win over earlier ones with the same key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    attributes: Vec<(String, String)>,
}

impl ResourceConfig {
    /// Detected host attributes, then `resource_attributes`
    /// (`OTEL_RESOURCE_ATTRIBUTES` syntax), then the service name: from
    /// `service_name` (the flag) or else `env_service_name` (`OTEL_SERVICE_NAME`).
    pub fn new(
        host_name: &str,
        resource_attributes: Option<&str>,
        env_service_name: Option<&str>,
        service_name: Option<&str>,
    ) -> Result<Self, ResourceError> {
        let mut config = ResourceConfig::default();
        config.set("host.name", host_name);
        config.set("host.arch", host_arch());
        config.set("os.type", "linux");
        if let Some(text) = resource_attributes {
            for (key, value) in parse_resource_attributes(text)? {
                config.set(&key, &value);
            }
        }
        let service = service_name
            .or(env_service_name)
            .filter(|name| !name.is_empty());
        if let Some(name) = service {
            config.set("service.name", name);
        }
        Ok(config)
    }

    /// From this process's environment and the kernel's host name. A malformed
    /// `OTEL_RESOURCE_ATTRIBUTES` is an error, so a typo is not silently lost.
    pub fn from_env(service_name: Option<&str>) -> Result<Self, ResourceError> {
        let attributes = std::env::var("OTEL_RESOURCE_ATTRIBUTES").ok();
        let env_service = std::env::var("OTEL_SERVICE_NAME").ok();
        Self::new(
            &host_name(),
            attributes.as_deref(),
            env_service.as_deref(),
            service_name,
        )
    }

    /// Exactly these attributes (from a profile read back from a file),
    /// less the per-group `container.id` and `k8s.pod.uid`.
    pub fn from_attributes<'a>(attributes: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut config = ResourceConfig::default();
        for (key, value) in attributes {
            if key != "container.id" && key != "k8s.pod.uid" {
                config.set(key, value);
            }
        }
        config
    }

    fn set(&mut self, key: &str, value: &str) {
        self.attributes.retain(|(existing, _)| existing != key);
        self.attributes.push((key.to_owned(), value.to_owned()));
    }

    /// Value of an attribute, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(existing, _)| existing == key)
            .map(|(_, value)| value.as_str())
    }

    /// The resource of one group: the shared attributes, then what its
    /// processes say they are (`service`: their `service.name` replaces the
    /// agent's), then the container and pod, which are detected and so
    /// override configured and published values.
    pub fn resource(
        &self,
        container_id: Option<&str>,
        pod_uid: Option<&str>,
        service: Option<&ServiceResource>,
    ) -> Resource {
        let mut config = self.clone();
        if let Some(id) = container_id {
            config.set("container.id", id);
        }
        if let Some(uid) = pod_uid {
            config.set("k8s.pod.uid", uid);
        }
        let published = service
            .map(|service| service.attributes.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|(key, _)| !DETECTED.contains(&key.as_str()));
        let mut attributes: Vec<KeyValue> = config
            .attributes
            .into_iter()
            .filter(|(key, _)| !published.clone().any(|(published, _)| published == key))
            .map(|(key, value)| string_attribute(key, value))
            .collect();
        attributes.extend(published.map(|(key, value)| KeyValue {
            key: key.clone(),
            value: Some(AnyValue {
                value: Some(any_value(value)),
            }),
            ..Default::default()
        }));
        Resource {
            attributes,
            ..Default::default()
        }
    }
}

fn any_value(value: &ResourceValue) -> any_value::Value {
    match value {
        ResourceValue::Str(text) => any_value::Value::StringValue(text.clone()),
        ResourceValue::Int(number) => any_value::Value::IntValue(*number),
        ResourceValue::Bool(flag) => any_value::Value::BoolValue(*flag),
        ResourceValue::Double(bits) => any_value::Value::DoubleValue(f64::from_bits(*bits)),
    }
}

fn string_attribute(key: String, value: String) -> KeyValue {
    KeyValue {
        key,
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value)),
        }),
        ..Default::default()
    }
}

/// `host.arch` as the semantic conventions spell it.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "x86",
        "arm" => "arm32",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        other => other,
    }
}

/// The kernel's host name (`uname -n`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default()
}

/// Parses `key1=value1,key2=value2` with %-encoded values (the W3C Baggage
/// syntax the OpenTelemetry spec uses for `OTEL_RESOURCE_ATTRIBUTES`).
pub fn parse_resource_attributes(text: &str) -> Result<Vec<(String, String)>, ResourceError> {
    parse_key_values(text).map_err(|bad| match bad {
        BadEntry::NotKeyValue(entry) => ResourceError::NotKeyValue(entry),
        BadEntry::BadEscape(entry) => ResourceError::BadEscape(entry),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_beats_env_service_name_beats_attributes() {
        let config = ResourceConfig::new(
            "box",
            Some("service.name=attr, deployment.environment=prod%20eu"),
            Some("env"),
            Some("flag"),
        )
        .unwrap();
        assert_eq!(config.get("service.name"), Some("flag"));
        assert_eq!(config.get("deployment.environment"), Some("prod eu"));
        assert_eq!(config.get("host.name"), Some("box"));
        assert_eq!(config.get("os.type"), Some("linux"));
        let config = ResourceConfig::new("box", Some("service.name=attr"), None, None).unwrap();
        assert_eq!(config.get("service.name"), Some("attr"));
        let config = ResourceConfig::new("box", None, Some("env"), None).unwrap();
        assert_eq!(config.get("service.name"), Some("env"));
    }

    #[test]
    fn container_attributes_are_added_per_group() {
        let config = ResourceConfig::new("box", Some("container.id=wrong"), None, None).unwrap();
        let resource = config.resource(Some("abc"), Some("uid"), None);
        let get = |key: &str| {
            resource
                .attributes
                .iter()
                .find(|kv| kv.key == key)
                .and_then(|kv| kv.value.clone())
        };
        let text = |value: &str| {
            Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.into())),
            })
        };
        assert_eq!(get("container.id"), text("abc"));
        assert_eq!(get("k8s.pod.uid"), text("uid"));
        let host = config.resource(None, None, None);
        assert!(!host.attributes.iter().any(|kv| kv.key == "k8s.pod.uid"));
    }

    #[test]
    fn a_process_names_its_service_but_not_the_host() {
        let config = ResourceConfig::new("node", Some("team=infra"), None, Some("agent")).unwrap();
        let service = ServiceResource::new([
            ("service.name".into(), ResourceValue::Str("checkout".into())),
            (
                "service.instance.id".into(),
                ResourceValue::Str("i-1".into()),
            ),
            (
                "host.name".into(),
                ResourceValue::Str("container-host".into()),
            ),
            ("container.id".into(), ResourceValue::Str("forged".into())),
            ("process.runtime.version".into(), ResourceValue::Int(21)),
        ]);
        let resource = config.resource(Some("abc"), None, Some(&service));
        let value = |key: &str| {
            let found: Vec<_> = resource
                .attributes
                .iter()
                .filter(|kv| kv.key == key)
                .collect();
            assert!(found.len() <= 1, "{key} twice");
            found.first().and_then(|kv| kv.value.clone()?.value)
        };
        let text = |text: &str| Some(any_value::Value::StringValue(text.into()));
        assert_eq!(value("service.name"), text("checkout"));
        assert_eq!(value("service.instance.id"), text("i-1"));
        assert_eq!(value("host.name"), text("node"));
        assert_eq!(value("container.id"), text("abc"));
        assert_eq!(value("team"), text("infra"));
        assert_eq!(
            value("process.runtime.version"),
            Some(any_value::Value::IntValue(21))
        );
    }

    #[test]
    fn rejects_malformed_attributes() {
        assert!(matches!(
            parse_resource_attributes("a=1,b"),
            Err(ResourceError::NotKeyValue(_))
        ));
        assert!(matches!(
            parse_resource_attributes("a=%zz"),
            Err(ResourceError::BadEscape(_))
        ));
        assert_eq!(parse_resource_attributes("").unwrap(), []);
    }
}
