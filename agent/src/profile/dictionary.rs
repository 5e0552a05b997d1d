//! The `ProfilesDictionary` of one request, built by interning: every table
//! starts with its zero value at index 0 (`string_table[0] == ""`), and an
//! entry is added only the first time something refers to it, so the tables
//! end up with neither duplicates nor unreferenced entries.
use std::{collections::HashMap, hash::Hash};

use hostprof_proto::{
    common::{AnyValue, any_value},
    profiles::{
        Function, KeyValueAndUnit, Line, Link, Location, Mapping, ProfilesDictionary, Stack,
    },
};

/// Index of an entry in one of the dictionary's tables.
pub type Index = i32;

/// A table of distinct values, the zero value first.
#[derive(Debug)]
struct Interner<K> {
    index: HashMap<K, Index>,
    values: Vec<K>,
}

impl<K: Hash + Eq + Clone + Default> Interner<K> {
    fn new() -> Self {
        let zero = K::default();
        Interner {
            index: HashMap::from([(zero.clone(), 0)]),
            values: vec![zero],
        }
    }

    fn intern(&mut self, value: K) -> Index {
        if let Some(&index) = self.index.get(&value) {
            return index;
        }
        // Tables beyond i32::MAX entries cannot be addressed by the format;
        // a window never gets near that (it would be gigabytes).
        let index = Index::try_from(self.values.len()).unwrap_or(Index::MAX);
        self.values.push(value.clone());
        self.index.insert(value, index);
        index
    }

    fn len(&self) -> usize {
        self.values.len()
    }
}

impl Interner<String> {
    /// Like `intern`, without allocating when the string is already known.
    fn intern_str(&mut self, value: &str) -> Index {
        match self.index.get(value) {
            Some(&index) => index,
            None => self.intern(value.to_owned()),
        }
    }
}

/// The value of an attribute, in the shapes hostprof emits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttributeValue {
    #[default]
    Empty,
    Str(String),
    Int(i64),
}

impl AttributeValue {
    pub fn to_any_value(&self) -> Option<AnyValue> {
        let value = match self {
            AttributeValue::Empty => return None,
            AttributeValue::Str(text) => any_value::Value::StringValue(text.clone()),
            AttributeValue::Int(number) => any_value::Value::IntValue(*number),
        };
        Some(AnyValue { value: Some(value) })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct AttributeKey {
    key: Index,
    value: AttributeValue,
    unit: Index,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct FunctionKey {
    name: Index,
    system_name: Index,
    filename: Index,
    start_line: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct MappingKey {
    start: u64,
    limit: u64,
    file_offset: u64,
    filename: Index,
    attributes: Vec<Index>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct LocationKey {
    mapping: Index,
    address: u64,
    /// (function, line, column), innermost first.
    lines: Vec<(Index, i64, i64)>,
    attributes: Vec<Index>,
}

/// One source line of a location.
#[derive(Clone, Copy, Debug)]
pub struct LineRef {
    pub function: Index,
    pub line: i64,
    pub column: i64,
}

/// The growing dictionary of one request.
#[derive(Debug)]
pub struct Dictionary {
    strings: Interner<String>,
    attributes: Interner<AttributeKey>,
    functions: Interner<FunctionKey>,
    mappings: Interner<MappingKey>,
    locations: Interner<LocationKey>,
    stacks: Interner<Vec<Index>>,
    /// (trace id, span id) of each link; the zero value first.
    links: Interner<([u8; 16], [u8; 8])>,
}

impl Default for Dictionary {
    fn default() -> Self {
        Self::new()
    }
}

impl Dictionary {
    pub fn new() -> Self {
        Dictionary {
            strings: Interner::new(),
            attributes: Interner::new(),
            functions: Interner::new(),
            mappings: Interner::new(),
            locations: Interner::new(),
            stacks: Interner::new(),
            links: Interner::new(),
        }
    }

    /// The index of a link to `span_id` of `trace_id`.
    pub fn link(&mut self, trace_id: [u8; 16], span_id: [u8; 8]) -> Index {
        self.links.intern((trace_id, span_id))
    }

    pub fn string(&mut self, text: &str) -> Index {
        self.strings.intern_str(text)
    }

    /// An attribute without unit.
    pub fn attribute(&mut self, key: &str, value: AttributeValue) -> Index {
        let key = self.string(key);
        self.attributes.intern(AttributeKey {
            key,
            value,
            unit: 0,
        })
    }

    pub fn function(
        &mut self,
        name: &str,
        system_name: &str,
        filename: &str,
        start_line: i64,
    ) -> Index {
        let key = FunctionKey {
            name: self.string(name),
            system_name: self.string(system_name),
            filename: self.string(filename),
            start_line,
        };
        self.functions.intern(key)
    }

    /// `attributes` must already be interned (sorted for stable identity).
    pub fn mapping(
        &mut self,
        start: u64,
        limit: u64,
        file_offset: u64,
        filename: &str,
        attributes: Vec<Index>,
    ) -> Index {
        let key = MappingKey {
            start,
            limit,
            file_offset,
            filename: self.string(filename),
            attributes,
        };
        self.mappings.intern(key)
    }

    pub fn location(
        &mut self,
        mapping: Index,
        address: u64,
        lines: &[LineRef],
        attributes: Vec<Index>,
    ) -> Index {
        let key = LocationKey {
            mapping,
            address,
            lines: lines
                .iter()
                .map(|line| (line.function, line.line, line.column))
                .collect(),
            attributes,
        };
        self.locations.intern(key)
    }

    /// A stack of locations, leaf first.
    pub fn stack(&mut self, locations: Vec<Index>) -> Index {
        self.stacks.intern(locations)
    }

    /// Entries so far, all tables together (for sizing decisions).
    pub fn entries(&self) -> usize {
        self.strings.len()
            + self.attributes.len()
            + self.functions.len()
            + self.mappings.len()
            + self.locations.len()
            + self.stacks.len()
    }

    /// The protobuf form.
    pub fn into_proto(self) -> ProfilesDictionary {
        ProfilesDictionary {
            mapping_table: self
                .mappings
                .values
                .into_iter()
                .map(|key| Mapping {
                    memory_start: key.start,
                    memory_limit: key.limit,
                    file_offset: key.file_offset,
                    filename_strindex: key.filename,
                    attribute_indices: key.attributes,
                })
                .collect(),
            location_table: self
                .locations
                .values
                .into_iter()
                .map(|key| Location {
                    mapping_index: key.mapping,
                    address: key.address,
                    lines: key
                        .lines
                        .into_iter()
                        .map(|(function_index, line, column)| Line {
                            function_index,
                            line,
                            column,
                        })
                        .collect(),
                    attribute_indices: key.attributes,
                })
                .collect(),
            function_table: self
                .functions
                .values
                .into_iter()
                .map(|key| Function {
                    name_strindex: key.name,
                    system_name_strindex: key.system_name,
                    filename_strindex: key.filename,
                    start_line: key.start_line,
                })
                .collect(),
            link_table: self
                .links
                .values
                .into_iter()
                .map(|(trace_id, span_id)| {
                    // The zero value (index 0) has empty ids, as the format's.
                    if (trace_id, span_id) == Default::default() {
                        return Link::default();
                    }
                    Link {
                        trace_id: trace_id.to_vec(),
                        span_id: span_id.to_vec(),
                    }
                })
                .collect(),
            string_table: self.strings.values,
            attribute_table: self
                .attributes
                .values
                .into_iter()
                .map(|key| KeyValueAndUnit {
                    key_strindex: key.key,
                    value: key.value.to_any_value(),
                    unit_strindex: key.unit,
                })
                .collect(),
            stack_table: self
                .stacks
                .values
                .into_iter()
                .map(|location_indices| Stack { location_indices })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_values_first_and_no_duplicates() {
        let mut dictionary = Dictionary::new();
        assert_eq!(dictionary.string(""), 0);
        let a = dictionary.string("a");
        assert_eq!(dictionary.string("a"), a);
        let f = dictionary.function("f", "_Z1fv", "f.c", 3);
        assert_eq!(dictionary.function("f", "_Z1fv", "f.c", 3), f);
        assert_ne!(dictionary.function("f", "_Z1fv", "f.c", 4), f);
        let pid = dictionary.attribute("process.pid", AttributeValue::Int(1));
        assert_eq!(
            dictionary.attribute("process.pid", AttributeValue::Int(1)),
            pid
        );
        let proto = dictionary.into_proto();
        assert_eq!(proto.string_table[0], "");
        assert_eq!(proto.function_table[0], Function::default());
        assert_eq!(proto.attribute_table[0], KeyValueAndUnit::default());
        assert_eq!(proto.mapping_table, [Mapping::default()]);
        assert_eq!(proto.link_table, [Link::default()]);
        assert_eq!(proto.stack_table, [Stack::default()]);
        assert_eq!(proto.function_table.len(), 3);
    }

    #[test]
    fn links_are_interned_after_the_zero_value() {
        let mut dictionary = Dictionary::new();
        let one = dictionary.link([1; 16], [2; 8]);
        assert_eq!(one, 1);
        assert_eq!(dictionary.link([1; 16], [2; 8]), one);
        assert_eq!(dictionary.link([1; 16], [3; 8]), 2);
        let proto = dictionary.into_proto();
        assert_eq!(proto.link_table[0], Link::default());
        assert_eq!(proto.link_table[1].trace_id, vec![1; 16]);
        assert_eq!(proto.link_table[2].span_id, vec![3; 8]);
    }
}
