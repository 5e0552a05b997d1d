//! OTLP/JSON (`.otlp.json`) back into `ProfilesData`, then samples as for
//! protobuf. The fields hostprof reads, spelled lowerCamelCase as OTLP/JSON
//! writes them (proto field names are accepted too); 64-bit integers as
//! strings or numbers. Unknown fields are ignored, as proto3 JSON asks.
use hostprof_proto::{
    common::{AnyValue, KeyValue, any_value},
    profiles::{
        Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesData,
        ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
    },
    resource::Resource,
};
use serde_json::{Map, Value};

use super::InputError;

type Object = Map<String, Value>;

pub(super) fn read(data: &[u8]) -> Result<super::InputProfile, InputError> {
    let value: Value = serde_json::from_slice(data)
        .map_err(|err| InputError::OtlpJson(format!("invalid JSON: {err}")))?;
    let data = profiles_data(&value).map_err(InputError::OtlpJson)?;
    super::otlp::decode(&data).map_err(InputError::OtlpJson)
}

fn object<'a>(value: &'a Value, what: &str) -> Result<&'a Object, String> {
    value
        .as_object()
        .ok_or_else(|| format!("{what} is not an object"))
}

/// The field `camel` (or its proto name `snake`), if present and not null.
fn field<'a>(object: &'a Object, camel: &str, snake: &str) -> Option<&'a Value> {
    object
        .get(camel)
        .or_else(|| object.get(snake))
        .filter(|value| !value.is_null())
}

fn list<'a, T>(
    object: &'a Object,
    camel: &str,
    snake: &str,
    decode: impl Fn(&'a Value) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    match field(object, camel, snake) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(decode).collect(),
        Some(_) => Err(format!("`{camel}` is not an array")),
    }
}

fn message<'a, T>(
    object: &'a Object,
    camel: &str,
    snake: &str,
    decode: impl Fn(&'a Value) -> Result<T, String>,
) -> Result<Option<T>, String> {
    field(object, camel, snake).map(decode).transpose()
}

/// An integer written as a JSON number or a decimal string.
fn integer(value: &Value, what: &str) -> Result<i128, String> {
    let number = match value {
        Value::Number(number) => number
            .as_i64()
            .map(i128::from)
            .or_else(|| number.as_u64().map(i128::from)),
        Value::String(text) => text.parse().ok(),
        _ => None,
    };
    number.ok_or_else(|| format!("`{what}` is not an integer: {value}"))
}

fn int<T: TryFrom<i128>>(object: &Object, camel: &str, snake: &str) -> Result<T, String> {
    let value = match field(object, camel, snake) {
        None => 0,
        Some(value) => integer(value, camel)?,
    };
    T::try_from(value).map_err(|_| format!("`{camel}` out of range: {value}"))
}

fn ints<T: TryFrom<i128>>(object: &Object, camel: &str, snake: &str) -> Result<Vec<T>, String> {
    list(object, camel, snake, |value| {
        let number = integer(value, camel)?;
        T::try_from(number).map_err(|_| format!("`{camel}` out of range: {number}"))
    })
}

fn string(object: &Object, camel: &str, snake: &str) -> Result<String, String> {
    match field(object, camel, snake) {
        None => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(_) => Err(format!("`{camel}` is not a string")),
    }
}

fn profiles_data(value: &Value) -> Result<ProfilesData, String> {
    let top = object(value, "the document")?;
    Ok(ProfilesData {
        resource_profiles: list(
            top,
            "resourceProfiles",
            "resource_profiles",
            resource_profiles,
        )?,
        dictionary: message(top, "dictionary", "dictionary", dictionary)?,
    })
}

fn resource_profiles(value: &Value) -> Result<ResourceProfiles, String> {
    let item = object(value, "a resource profile")?;
    Ok(ResourceProfiles {
        resource: message(item, "resource", "resource", |value| {
            let resource = object(value, "a resource")?;
            Ok(Resource {
                attributes: list(resource, "attributes", "attributes", key_value)?,
                ..Default::default()
            })
        })?,
        scope_profiles: list(item, "scopeProfiles", "scope_profiles", |value| {
            let scope = object(value, "a scope profile")?;
            Ok(ScopeProfiles {
                profiles: list(scope, "profiles", "profiles", profile)?,
                ..Default::default()
            })
        })?,
        schema_url: String::new(),
    })
}

fn key_value(value: &Value) -> Result<KeyValue, String> {
    let item = object(value, "an attribute")?;
    Ok(KeyValue {
        key: string(item, "key", "key")?,
        value: message(item, "value", "value", any_value)?,
        ..Default::default()
    })
}

fn any_value(value: &Value) -> Result<AnyValue, String> {
    use any_value::Value as V;
    let item = object(value, "an attribute value")?;
    let value = if let Some(text) = field(item, "stringValue", "string_value") {
        Some(V::StringValue(
            text.as_str()
                .ok_or("`stringValue` is not a string")?
                .to_owned(),
        ))
    } else if field(item, "intValue", "int_value").is_some() {
        Some(V::IntValue(int(item, "intValue", "int_value")?))
    } else if field(item, "stringValueStrindex", "string_value_strindex").is_some() {
        Some(V::StringValueStrindex(int(
            item,
            "stringValueStrindex",
            "string_value_strindex",
        )?))
    } else if let Some(number) = field(item, "doubleValue", "double_value") {
        Some(V::DoubleValue(
            number.as_f64().ok_or("`doubleValue` is not a number")?,
        ))
    } else {
        field(item, "boolValue", "bool_value")
            .map(|flag| V::BoolValue(flag.as_bool().unwrap_or(false)))
    };
    Ok(AnyValue { value })
}

fn value_type(value: &Value) -> Result<ValueType, String> {
    let item = object(value, "a value type")?;
    Ok(ValueType {
        type_strindex: int(item, "typeStrindex", "type_strindex")?,
        unit_strindex: int(item, "unitStrindex", "unit_strindex")?,
    })
}

fn profile(value: &Value) -> Result<Profile, String> {
    let item = object(value, "a profile")?;
    Ok(Profile {
        sample_type: message(item, "sampleType", "sample_type", value_type)?,
        samples: list(item, "samples", "samples", sample)?,
        time_unix_nano: int(item, "timeUnixNano", "time_unix_nano")?,
        duration_nano: int(item, "durationNano", "duration_nano")?,
        period_type: message(item, "periodType", "period_type", value_type)?,
        period: int(item, "period", "period")?,
        attribute_indices: ints(item, "attributeIndices", "attribute_indices")?,
        ..Default::default()
    })
}

fn sample(value: &Value) -> Result<Sample, String> {
    let item = object(value, "a sample")?;
    Ok(Sample {
        stack_index: int(item, "stackIndex", "stack_index")?,
        attribute_indices: ints(item, "attributeIndices", "attribute_indices")?,
        link_index: int(item, "linkIndex", "link_index")?,
        values: ints(item, "values", "values")?,
        timestamps_unix_nano: ints(item, "timestampsUnixNano", "timestamps_unix_nano")?,
    })
}

fn dictionary(value: &Value) -> Result<ProfilesDictionary, String> {
    let item = object(value, "the dictionary")?;
    Ok(ProfilesDictionary {
        mapping_table: list(item, "mappingTable", "mapping_table", mapping)?,
        location_table: list(item, "locationTable", "location_table", location)?,
        function_table: list(item, "functionTable", "function_table", function)?,
        link_table: list(item, "linkTable", "link_table", link)?,
        string_table: list(item, "stringTable", "string_table", |value| {
            value
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| "`stringTable` holds a non-string".to_owned())
        })?,
        attribute_table: list(item, "attributeTable", "attribute_table", |value| {
            let entry = object(value, "an attribute")?;
            Ok(KeyValueAndUnit {
                key_strindex: int(entry, "keyStrindex", "key_strindex")?,
                value: message(entry, "value", "value", any_value)?,
                unit_strindex: int(entry, "unitStrindex", "unit_strindex")?,
            })
        })?,
        stack_table: list(item, "stackTable", "stack_table", |value| {
            let entry = object(value, "a stack")?;
            Ok(Stack {
                location_indices: ints(entry, "locationIndices", "location_indices")?,
            })
        })?,
    })
}

/// A link; its ids in hex, as OTLP/JSON writes trace and span ids.
fn link(value: &Value) -> Result<Link, String> {
    let item = object(value, "a link")?;
    let bytes = |camel: &str, snake: &str| -> Result<Vec<u8>, String> {
        let text = string(item, camel, snake)?;
        if text.len() % 2 != 0 || !text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return Err(format!("`{camel}` is not hex: {text:?}"));
        }
        Ok(text
            .as_bytes()
            .chunks(2)
            .map(|pair| {
                // Two ASCII hex digits, checked above.
                u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("00"), 16).unwrap_or(0)
            })
            .collect())
    };
    Ok(Link {
        trace_id: bytes("traceId", "trace_id")?,
        span_id: bytes("spanId", "span_id")?,
    })
}

fn mapping(value: &Value) -> Result<Mapping, String> {
    let item = object(value, "a mapping")?;
    Ok(Mapping {
        memory_start: int(item, "memoryStart", "memory_start")?,
        memory_limit: int(item, "memoryLimit", "memory_limit")?,
        file_offset: int(item, "fileOffset", "file_offset")?,
        filename_strindex: int(item, "filenameStrindex", "filename_strindex")?,
        attribute_indices: ints(item, "attributeIndices", "attribute_indices")?,
    })
}

fn location(value: &Value) -> Result<Location, String> {
    let item = object(value, "a location")?;
    Ok(Location {
        mapping_index: int(item, "mappingIndex", "mapping_index")?,
        address: int(item, "address", "address")?,
        lines: list(item, "lines", "lines", |value| {
            let line = object(value, "a line")?;
            Ok(Line {
                function_index: int(line, "functionIndex", "function_index")?,
                line: int(line, "line", "line")?,
                column: int(line, "column", "column")?,
            })
        })?,
        attribute_indices: ints(item, "attributeIndices", "attribute_indices")?,
    })
}

fn function(value: &Value) -> Result<Function, String> {
    let item = object(value, "a function")?;
    Ok(Function {
        name_strindex: int(item, "nameStrindex", "name_strindex")?,
        system_name_strindex: int(item, "systemNameStrindex", "system_name_strindex")?,
        filename_strindex: int(item, "filenameStrindex", "filename_strindex")?,
        start_line: int(item, "startLine", "start_line")?,
    })
}
