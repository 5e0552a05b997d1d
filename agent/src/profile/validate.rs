//! Checks a request against the rules of `profiles.proto` that a decoder
//! cannot see: zero values at index 0, indices in range, no duplicate or
//! unreferenced dictionary entries, sample identities unique, timestamps
//! inside the profile's window. Used by the unit tests and by the
//! integration tests on what the agent really sends.
use std::collections::HashSet;

use hostprof_proto::{
    Message,
    common::any_value,
    profiles::{Profile, ProfilesDictionary, ResourceProfiles},
};

/// Every broken rule, one line each; empty when the request is valid.
pub fn dictionary_violations(
    dictionary: &ProfilesDictionary,
    resource_profiles: &[ResourceProfiles],
) -> Vec<String> {
    let mut checker = Checker {
        dictionary,
        problems: Vec::new(),
        used: Used::new(dictionary),
    };
    checker.zero_values();
    checker.duplicates();
    for (at, resource) in resource_profiles.iter().enumerate() {
        for scope in &resource.scope_profiles {
            for profile in &scope.profiles {
                checker.profile(at, profile);
            }
        }
    }
    checker.unreferenced();
    checker.problems
}

/// Which entries of each table something refers to.
struct Used {
    strings: Vec<bool>,
    mappings: Vec<bool>,
    locations: Vec<bool>,
    functions: Vec<bool>,
    links: Vec<bool>,
    attributes: Vec<bool>,
    stacks: Vec<bool>,
}

impl Used {
    fn new(dictionary: &ProfilesDictionary) -> Self {
        Used {
            strings: vec![false; dictionary.string_table.len()],
            mappings: vec![false; dictionary.mapping_table.len()],
            locations: vec![false; dictionary.location_table.len()],
            functions: vec![false; dictionary.function_table.len()],
            links: vec![false; dictionary.link_table.len()],
            attributes: vec![false; dictionary.attribute_table.len()],
            stacks: vec![false; dictionary.stack_table.len()],
        }
    }
}

struct Checker<'a> {
    dictionary: &'a ProfilesDictionary,
    problems: Vec<String>,
    used: Used,
}

/// Marks `index` used in `table`, or reports it out of range.
fn mark(problems: &mut Vec<String>, table: &mut [bool], name: &str, index: i32, what: &str) {
    match usize::try_from(index).ok().filter(|&at| at < table.len()) {
        Some(at) => table[at] = true,
        None => problems.push(format!(
            "{what} refers to {name}[{index}], which has {} entries",
            table.len()
        )),
    }
}

impl Checker<'_> {
    fn zero_values(&mut self) {
        let d = self.dictionary;
        if d.string_table.first().map(String::as_str) != Some("") {
            self.problems
                .push("string_table[0] is not the empty string".into());
        }
        let zero = |first: Option<Vec<u8>>| first.is_some_and(|bytes| bytes.is_empty());
        for (name, first) in [
            (
                "mapping_table",
                d.mapping_table.first().map(|m| m.encode_to_vec()),
            ),
            (
                "location_table",
                d.location_table.first().map(|m| m.encode_to_vec()),
            ),
            (
                "function_table",
                d.function_table.first().map(|m| m.encode_to_vec()),
            ),
            (
                "link_table",
                d.link_table.first().map(|m| m.encode_to_vec()),
            ),
            (
                "attribute_table",
                d.attribute_table.first().map(|m| m.encode_to_vec()),
            ),
            (
                "stack_table",
                d.stack_table.first().map(|m| m.encode_to_vec()),
            ),
        ] {
            if !zero(first) {
                self.problems
                    .push(format!("{name}[0] is missing or not the zero value"));
            }
        }
    }

    fn duplicates(&mut self) {
        let d = self.dictionary;
        for (name, items) in [
            (
                "string_table",
                d.string_table
                    .iter()
                    .map(|s| s.as_bytes().to_vec())
                    .collect::<Vec<_>>(),
            ),
            (
                "mapping_table",
                d.mapping_table.iter().map(|m| m.encode_to_vec()).collect(),
            ),
            (
                "location_table",
                d.location_table.iter().map(|m| m.encode_to_vec()).collect(),
            ),
            (
                "function_table",
                d.function_table.iter().map(|m| m.encode_to_vec()).collect(),
            ),
            (
                "link_table",
                d.link_table.iter().map(|m| m.encode_to_vec()).collect(),
            ),
            (
                "attribute_table",
                d.attribute_table
                    .iter()
                    .map(|m| m.encode_to_vec())
                    .collect(),
            ),
            (
                "stack_table",
                d.stack_table.iter().map(|m| m.encode_to_vec()).collect(),
            ),
        ] {
            let mut seen = HashSet::new();
            for (at, item) in items.iter().enumerate() {
                if !seen.insert(item) {
                    self.problems
                        .push(format!("{name}[{at}] duplicates an earlier entry"));
                }
            }
        }
    }

    fn attribute_list(&mut self, indices: &[i32], what: &str) {
        for &index in indices {
            mark(
                &mut self.problems,
                &mut self.used.attributes,
                "attribute_table",
                index,
                what,
            );
        }
    }

    fn profile(&mut self, resource: usize, profile: &Profile) {
        let what = format!("resource_profiles[{resource}] profile");
        for value_type in [&profile.sample_type, &profile.period_type]
            .into_iter()
            .flatten()
        {
            for index in [value_type.type_strindex, value_type.unit_strindex] {
                mark(
                    &mut self.problems,
                    &mut self.used.strings,
                    "string_table",
                    index,
                    &what,
                );
            }
        }
        self.attribute_list(&profile.attribute_indices, &what);
        if profile.profile_id.len() != 16 || profile.profile_id.iter().all(|&b| b == 0) {
            self.problems
                .push(format!("{what}: profile_id is not 16 non-zero bytes"));
        }
        let (start, end) = (
            profile.time_unix_nano,
            profile.time_unix_nano.saturating_add(profile.duration_nano),
        );
        let mut identities = HashSet::new();
        for (at, sample) in profile.samples.iter().enumerate() {
            let what = format!("{what} sample {at}");
            mark(
                &mut self.problems,
                &mut self.used.stacks,
                "stack_table",
                sample.stack_index,
                &what,
            );
            mark(
                &mut self.problems,
                &mut self.used.links,
                "link_table",
                sample.link_index,
                &what,
            );
            self.attribute_list(&sample.attribute_indices, &what);
            let mut attributes = sample.attribute_indices.clone();
            attributes.sort_unstable();
            if !identities.insert((sample.stack_index, attributes, sample.link_index)) {
                self.problems
                    .push(format!("{what}: same identity as an earlier sample"));
            }
            if sample.values.is_empty() && sample.timestamps_unix_nano.is_empty() {
                self.problems
                    .push(format!("{what}: neither values nor timestamps"));
            }
            if !sample.values.is_empty()
                && !sample.timestamps_unix_nano.is_empty()
                && sample.values.len() != sample.timestamps_unix_nano.len()
            {
                self.problems
                    .push(format!("{what}: values and timestamps differ in length"));
            }
            if let Some(time) = sample
                .timestamps_unix_nano
                .iter()
                .find(|&&time| time < start || time >= end)
            {
                self.problems
                    .push(format!("{what}: timestamp {time} outside [{start}, {end})"));
            }
        }
    }

    /// Follows references out of the used stacks, then reports any entry
    /// (beyond the zero value) that nothing refers to.
    fn unreferenced(&mut self) {
        let d = self.dictionary;
        let problems = &mut self.problems;
        let used = &mut self.used;
        for (at, stack) in d.stack_table.iter().enumerate() {
            if used.stacks[at] {
                for &index in &stack.location_indices {
                    mark(
                        problems,
                        &mut used.locations,
                        "location_table",
                        index,
                        "stack",
                    );
                }
            }
        }
        for (at, location) in d.location_table.iter().enumerate() {
            if used.locations[at] {
                mark(
                    problems,
                    &mut used.mappings,
                    "mapping_table",
                    location.mapping_index,
                    "location",
                );
                for line in &location.lines {
                    mark(
                        problems,
                        &mut used.functions,
                        "function_table",
                        line.function_index,
                        "line",
                    );
                }
                for &index in &location.attribute_indices {
                    mark(
                        problems,
                        &mut used.attributes,
                        "attribute_table",
                        index,
                        "location",
                    );
                }
            }
        }
        for (at, mapping) in d.mapping_table.iter().enumerate() {
            if used.mappings[at] {
                mark(
                    problems,
                    &mut used.strings,
                    "string_table",
                    mapping.filename_strindex,
                    "mapping",
                );
                for &index in &mapping.attribute_indices {
                    mark(
                        problems,
                        &mut used.attributes,
                        "attribute_table",
                        index,
                        "mapping",
                    );
                }
            }
        }
        for (at, function) in d.function_table.iter().enumerate() {
            if used.functions[at] {
                for index in [
                    function.name_strindex,
                    function.system_name_strindex,
                    function.filename_strindex,
                ] {
                    mark(
                        problems,
                        &mut used.strings,
                        "string_table",
                        index,
                        "function",
                    );
                }
            }
        }
        for (at, attribute) in d.attribute_table.iter().enumerate() {
            if used.attributes[at] {
                for index in [attribute.key_strindex, attribute.unit_strindex] {
                    mark(
                        problems,
                        &mut used.strings,
                        "string_table",
                        index,
                        "attribute",
                    );
                }
                if let Some(any_value::Value::StringValueStrindex(index)) = attribute
                    .value
                    .as_ref()
                    .and_then(|value| value.value.as_ref())
                {
                    mark(
                        problems,
                        &mut used.strings,
                        "string_table",
                        *index,
                        "attribute value",
                    );
                }
            }
        }
        for (name, table) in [
            ("string_table", &used.strings),
            ("mapping_table", &used.mappings),
            ("location_table", &used.locations),
            ("function_table", &used.functions),
            ("link_table", &used.links),
            ("attribute_table", &used.attributes),
            ("stack_table", &used.stacks),
        ] {
            for (at, _) in table.iter().enumerate().skip(1).filter(|(_, used)| !**used) {
                problems.push(format!("{name}[{at}] is not referenced"));
            }
        }
    }
}
