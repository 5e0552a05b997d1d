//! OTLP/JSON encoding of `ProfilesData` (`.otlp.json`).
//!
//! The OTLP spec's rules over proto3's JSON mapping: lowerCamelCase field
//! names, enums as integers, trace/span ids as hex (not base64); hostprof also
//! writes `profileId` as hex, as the collector does. 64-bit integers are
//! written as decimal strings (proto3 JSON; OTLP receivers accept both).
//! Fields with their default value are left out, but every table entry is
//! kept, so indices stay valid (`{}` is a zero-value entry).
use std::fmt::Write as _;

use hostprof_proto::{
    common::{AnyValue, InstrumentationScope, KeyValue, any_value},
    profiles::{
        Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesData,
        ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
    },
    resource::Resource,
};

/// The JSON text of `data`.
pub fn to_json(data: &ProfilesData) -> String {
    let mut out = Obj::new();
    out.list(
        "resourceProfiles",
        &data.resource_profiles,
        resource_profiles,
    );
    if let Some(dictionary) = &data.dictionary {
        out.raw("dictionary", &self::dictionary(dictionary));
    }
    out.end()
}

/// Builds one JSON object, skipping default values.
struct Obj(String);

impl Obj {
    fn new() -> Self {
        Obj(String::from("{"))
    }

    fn key(&mut self, key: &str) {
        if self.0.len() > 1 {
            self.0.push(',');
        }
        string(&mut self.0, key);
        self.0.push(':');
    }

    fn raw(&mut self, key: &str, json: &str) {
        self.key(key);
        self.0.push_str(json);
    }

    fn str(&mut self, key: &str, value: &str) {
        if !value.is_empty() {
            self.key(key);
            string(&mut self.0, value);
        }
    }

    fn i32(&mut self, key: &str, value: i32) {
        if value != 0 {
            self.raw(key, &value.to_string());
        }
    }

    /// 64-bit integers as strings, as proto3 JSON writes them.
    fn i64(&mut self, key: &str, value: impl Into<i128>) {
        let value = value.into();
        if value != 0 {
            self.raw(key, &format!("\"{value}\""));
        }
    }

    fn hex(&mut self, key: &str, bytes: &[u8]) {
        if !bytes.is_empty() {
            let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
            self.raw(key, &format!("\"{hex}\""));
        }
    }

    fn i32s(&mut self, key: &str, values: &[i32]) {
        if !values.is_empty() {
            let items: Vec<_> = values.iter().map(i32::to_string).collect();
            self.raw(key, &format!("[{}]", items.join(",")));
        }
    }

    fn i64s(&mut self, key: &str, values: impl ExactSizeIterator<Item = i128>) {
        if values.len() > 0 {
            let items: Vec<_> = values.map(|value| format!("\"{value}\"")).collect();
            self.raw(key, &format!("[{}]", items.join(",")));
        }
    }

    /// A repeated message field; every element is kept, zero values as `{}`.
    fn list<T>(&mut self, key: &str, items: &[T], encode: fn(&T) -> String) {
        if !items.is_empty() {
            let items: Vec<_> = items.iter().map(encode).collect();
            self.raw(key, &format!("[{}]", items.join(",")));
        }
    }

    fn message<T>(&mut self, key: &str, item: &Option<T>, encode: fn(&T) -> String) {
        if let Some(item) = item {
            self.raw(key, &encode(item));
        }
    }

    fn end(mut self) -> String {
        self.0.push('}');
        self.0
    }
}

fn string(out: &mut String, text: &str) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ch if (ch as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", ch as u32);
            }
            ch => out.push(ch),
        }
    }
    out.push('"');
}

fn resource_profiles(item: &ResourceProfiles) -> String {
    let mut out = Obj::new();
    out.message("resource", &item.resource, resource);
    out.list("scopeProfiles", &item.scope_profiles, scope_profiles);
    out.str("schemaUrl", &item.schema_url);
    out.end()
}

fn resource(item: &Resource) -> String {
    let mut out = Obj::new();
    out.list("attributes", &item.attributes, key_value);
    out.i32(
        "droppedAttributesCount",
        item.dropped_attributes_count as i32,
    );
    out.end()
}

fn key_value(item: &KeyValue) -> String {
    let mut out = Obj::new();
    out.str("key", &item.key);
    out.message("value", &item.value, any_value);
    out.i32("keyStrindex", item.key_strindex);
    out.end()
}

fn any_value(item: &AnyValue) -> String {
    use any_value::Value;
    let mut out = Obj::new();
    match &item.value {
        Some(Value::StringValue(text)) => {
            out.key("stringValue");
            string(&mut out.0, text);
        }
        Some(Value::IntValue(number)) => out.raw("intValue", &format!("\"{number}\"")),
        Some(Value::BoolValue(flag)) => out.raw("boolValue", &flag.to_string()),
        Some(Value::DoubleValue(number)) if number.is_finite() => {
            out.raw("doubleValue", &number.to_string())
        }
        Some(Value::StringValueStrindex(index)) => {
            out.raw("stringValueStrindex", &index.to_string())
        }
        // hostprof emits no arrays, maps, bytes or non-finite doubles.
        _ => {}
    }
    out.end()
}

fn scope_profiles(item: &ScopeProfiles) -> String {
    let mut out = Obj::new();
    out.message("scope", &item.scope, scope);
    out.list("profiles", &item.profiles, profile);
    out.str("schemaUrl", &item.schema_url);
    out.end()
}

fn scope(item: &InstrumentationScope) -> String {
    let mut out = Obj::new();
    out.str("name", &item.name);
    out.str("version", &item.version);
    out.list("attributes", &item.attributes, key_value);
    out.end()
}

fn profile(item: &Profile) -> String {
    let mut out = Obj::new();
    out.message("sampleType", &item.sample_type, value_type);
    out.list("samples", &item.samples, sample);
    out.i64("timeUnixNano", item.time_unix_nano);
    out.i64("durationNano", item.duration_nano);
    out.message("periodType", &item.period_type, value_type);
    out.i64("period", item.period);
    out.hex("profileId", &item.profile_id);
    out.i32(
        "droppedAttributesCount",
        item.dropped_attributes_count as i32,
    );
    out.str("originalPayloadFormat", &item.original_payload_format);
    out.i32s("attributeIndices", &item.attribute_indices);
    out.end()
}

fn value_type(item: &ValueType) -> String {
    let mut out = Obj::new();
    out.i32("typeStrindex", item.type_strindex);
    out.i32("unitStrindex", item.unit_strindex);
    out.end()
}

fn sample(item: &Sample) -> String {
    let mut out = Obj::new();
    out.i32("stackIndex", item.stack_index);
    out.i32s("attributeIndices", &item.attribute_indices);
    out.i32("linkIndex", item.link_index);
    out.i64s("values", item.values.iter().map(|&v| v.into()));
    out.i64s(
        "timestampsUnixNano",
        item.timestamps_unix_nano.iter().map(|&v| v.into()),
    );
    out.end()
}

fn dictionary(item: &ProfilesDictionary) -> String {
    let mut out = Obj::new();
    out.list("mappingTable", &item.mapping_table, mapping);
    out.list("locationTable", &item.location_table, location);
    out.list("functionTable", &item.function_table, function);
    out.list("linkTable", &item.link_table, link);
    if !item.string_table.is_empty() {
        let mut strings = String::from("[");
        for (at, text) in item.string_table.iter().enumerate() {
            if at > 0 {
                strings.push(',');
            }
            string(&mut strings, text);
        }
        strings.push(']');
        out.raw("stringTable", &strings);
    }
    out.list("attributeTable", &item.attribute_table, attribute);
    out.list("stackTable", &item.stack_table, stack);
    out.end()
}

fn mapping(item: &Mapping) -> String {
    let mut out = Obj::new();
    out.i64("memoryStart", item.memory_start);
    out.i64("memoryLimit", item.memory_limit);
    out.i64("fileOffset", item.file_offset);
    out.i32("filenameStrindex", item.filename_strindex);
    out.i32s("attributeIndices", &item.attribute_indices);
    out.end()
}

fn location(item: &Location) -> String {
    let mut out = Obj::new();
    out.i32("mappingIndex", item.mapping_index);
    out.i64("address", item.address);
    out.list("lines", &item.lines, line);
    out.i32s("attributeIndices", &item.attribute_indices);
    out.end()
}

fn line(item: &Line) -> String {
    let mut out = Obj::new();
    out.i32("functionIndex", item.function_index);
    out.i64("line", item.line);
    out.i64("column", item.column);
    out.end()
}

fn function(item: &Function) -> String {
    let mut out = Obj::new();
    out.i32("nameStrindex", item.name_strindex);
    out.i32("systemNameStrindex", item.system_name_strindex);
    out.i32("filenameStrindex", item.filename_strindex);
    out.i64("startLine", item.start_line);
    out.end()
}

fn link(item: &Link) -> String {
    let mut out = Obj::new();
    out.hex("traceId", &item.trace_id);
    out.hex("spanId", &item.span_id);
    out.end()
}

fn attribute(item: &KeyValueAndUnit) -> String {
    let mut out = Obj::new();
    out.i32("keyStrindex", item.key_strindex);
    out.message("value", &item.value, any_value);
    out.i32("unitStrindex", item.unit_strindex);
    out.end()
}

fn stack(item: &Stack) -> String {
    let mut out = Obj::new();
    out.i32s("locationIndices", &item.location_indices);
    out.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_case_hex_ids_string_int64_and_zero_entries() {
        let data = ProfilesData {
            resource_profiles: vec![ResourceProfiles {
                scope_profiles: vec![ScopeProfiles {
                    profiles: vec![Profile {
                        time_unix_nano: 5,
                        profile_id: vec![0xab, 0x01],
                        samples: vec![Sample {
                            stack_index: 1,
                            timestamps_unix_nano: vec![7],
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            dictionary: Some(ProfilesDictionary {
                string_table: vec![String::new(), "a\"b".into()],
                stack_table: vec![
                    Stack::default(),
                    Stack {
                        location_indices: vec![0],
                    },
                ],
                ..Default::default()
            }),
        };
        assert_eq!(
            to_json(&data),
            r#"{"resourceProfiles":[{"scopeProfiles":[{"profiles":[{"samples":[{"stackIndex":1,"timestampsUnixNano":["7"]}],"timeUnixNano":"5","profileId":"ab01"}]}]}],"dictionary":{"stringTable":["","a\"b"],"stackTable":[{},{"locationIndices":[0]}]}}"#
        );
    }
}
