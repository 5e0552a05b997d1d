//! Names of JavaScript frames, read from V8's heap in the process: a
//! function's name from its `SharedFunctionInfo` (a string, or the
//! function's `ScopeInfo`, which holds the name and the function's source
//! positions), its script's name, and the line its definition starts on
//! (from the script's line ends, or its source when V8 has not computed
//! them). Everything read is the tenant's: lengths are capped, strings
//! nested at most a few levels, and an object of the wrong type is no name.
use super::layout::Layout;
use crate::{
    procs::memory::Memory,
    runtime::refusals::{self, Reason, Runtime},
};

/// Longest function or script name kept.
const MAX_NAME: usize = 1024;
/// Longest script source read to find its lines (when V8 keeps no line
/// ends): larger scripts get no line numbers.
const MAX_SOURCE: usize = 8 << 20;
/// The instance type bit of an external string without V8's copy of its
/// data pointer (`kUncachedExternalStringMask`, V8 10 to 12).
const UNCACHED_EXTERNAL: u32 = 0x10;
/// Most line ends read from a script.
const MAX_LINES: usize = 1 << 20;
/// Strings nested deeper than this (cons, sliced, thin) are not read.
const MAX_STRING_DEPTH: u32 = 8;
/// `ScopeInfo` slots looked at for the name and positions.
const SCOPE_SLOTS: usize = 16;

/// What a frame is named by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub function: String,
    /// The script's name (a path or a URL such as `node:internal/…`);
    /// `None` for builtins.
    pub file: Option<String>,
    /// The source position the function's definition starts at.
    pub start: Option<u32>,
    /// The script (0 for none), whose lines turn `start` into a line.
    pub script: u64,
}

/// A V8 heap in a process.
pub struct Heap<'a, M> {
    pub memory: &'a M,
    pub layout: &'a Layout,
}

/// The address of a tagged heap pointer (V8 tags them with 1).
pub fn heap_object(tagged: u64) -> Option<u64> {
    (tagged & 3 == 1).then_some(tagged & !3)
}

/// The value of a small integer (upper half of the word on 64-bit builds
/// without pointer compression, node's).
pub fn small_integer(tagged: u64) -> Option<i64> {
    (tagged & 1 == 0).then_some(i64::from((tagged >> 32) as i32))
}

impl<M: Memory> Heap<'_, M> {
    pub(super) fn word(&self, address: u64) -> Option<u64> {
        self.memory.read_u64(address)
    }

    /// The heap object tagged at `address + offset` (a field).
    pub(super) fn field(&self, object: u64, offset: u64) -> Option<u64> {
        heap_object(self.word(object.checked_add(offset)?)?)
    }

    /// The instance type of the object at `object`.
    pub fn instance_type(&self, object: u64) -> Option<u32> {
        let map = self.field(object, self.layout.map)?;
        let offset = map.checked_add(self.layout.instance_type)?;
        self.memory.read_u16(offset).map(u32::from)
    }

    /// A function's name, script and first line, from its
    /// `SharedFunctionInfo` at `shared`.
    pub fn name(&self, shared: u64) -> Option<Named> {
        let layout = self.layout;
        if self.instance_type(shared)? != layout.type_shared_info {
            return None;
        }
        let mut function = None;
        let mut start = None;
        if let Some(name) = self.field(shared, layout.shared_name) {
            let kind = self.instance_type(name)?;
            if kind < layout.first_nonstring_type {
                function = self.string(name, MAX_NAME, 0);
            } else if kind == layout.type_scope_info {
                (function, start) = self.scope_info(name);
            }
        }
        let function = match function {
            Some(name) if !name.is_empty() => name,
            _ => "(anonymous)".to_string(),
        };
        let script = self
            .field(shared, layout.shared_script)
            .filter(|&script| self.instance_type(script) == Some(layout.type_script));
        let Some(script) = script else {
            return Some(Named {
                function,
                file: None,
                start,
                script: 0,
            });
        };
        let file = self
            .field(script, layout.script_name)
            .filter(|&name| {
                self.instance_type(name)
                    .is_some_and(|kind| kind < layout.first_nonstring_type)
            })
            .and_then(|name| self.string(name, MAX_NAME, 0));
        Some(Named {
            function,
            file,
            start,
            script,
        })
    }

    /// The function name and start position a `ScopeInfo` holds. Its
    /// layout changes between versions and is not described by the
    /// constants: past the context locals, the first string is the
    /// function's name (an anonymous function's is empty, and the name V8
    /// inferred for it follows), and (before V8 12.8.44) the first two small
    /// integers after it in increasing order are its start and end.
    fn scope_info(&self, scope: u64) -> (Option<String>, Option<u32>) {
        let layout = self.layout;
        let Some(data) = self
            .memory
            .read_vec(scope + layout.map + 8, SCOPE_SLOTS * 8)
        else {
            return (None, None);
        };
        let slot = |index: usize| -> Option<u64> {
            let bytes = data.get(index * 8..index * 8 + 8)?;
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        };
        let fixed = layout.fixed_scope_positions();
        let mut start = if fixed {
            slot(3)
                .and_then(small_integer)
                .and_then(|value| u32::try_from(value).ok())
        } else {
            None
        };
        let locals = slot(layout.scope_context_locals as usize)
            .and_then(small_integer)
            .and_then(|count| usize::try_from(count).ok())
            .unwrap_or(0);
        let mut name = None;
        let mut previous: Option<i64> = None;
        let first = (layout.scope_first_vars as usize).saturating_add(locals.saturating_mul(2));
        for index in first..SCOPE_SLOTS {
            let Some(value) = slot(index) else { break };
            if name.is_none()
                && let Some(object) = heap_object(value)
                && self
                    .instance_type(object)
                    .is_some_and(|kind| kind < layout.first_nonstring_type)
            {
                // An anonymous function's name is empty; the name V8
                // inferred for it (`Module._compile`) comes next.
                name = self
                    .string(object, MAX_NAME, 0)
                    .filter(|name| !name.is_empty());
                if fixed && name.is_some() {
                    break;
                }
            }
            let number = small_integer(value);
            if !fixed
                && let (Some(low), Some(high)) = (previous, number)
                && low < high
            {
                start = u32::try_from(low).ok();
                break;
            }
            previous = number;
        }
        (name, start)
    }

    /// The string at `string` (at most `max` bytes of it).
    pub fn string(&self, string: u64, max: usize, depth: u32) -> Option<String> {
        if depth > MAX_STRING_DEPTH {
            refusals::refuse(Runtime::V8, Reason::TooDeep);
            return None;
        }
        let layout = self.layout;
        let kind = self.instance_type(string)?;
        if kind >= layout.first_nonstring_type {
            return None;
        }
        let length = self
            .memory
            .read_u32(string.checked_add(layout.string_length)?)? as usize;
        let representation = kind & layout.representation_mask;
        let one_byte = kind & layout.encoding_mask == layout.one_byte_tag;
        if representation == layout.cons_tag {
            let mut first = self.string(self.field(string, layout.cons_first)?, max, depth + 1)?;
            if first.len() < max {
                let second =
                    self.string(self.field(string, layout.cons_second)?, max, depth + 1)?;
                first.push_str(&second);
            }
            first.truncate(floor_char_boundary(&first, max));
            return Some(first);
        }
        if representation == layout.thin_tag {
            return self.string(self.field(string, layout.thin_actual)?, max, depth + 1);
        }
        if representation == layout.sliced_tag {
            let parent = self.string(
                self.field(string, layout.sliced_parent)?,
                MAX_SOURCE,
                depth + 1,
            )?;
            let offset = small_integer(self.word(string + layout.sliced_offset)?)?;
            let offset = usize::try_from(offset).ok()?;
            let text: String = parent.chars().skip(offset).take(length.min(max)).collect();
            return Some(text);
        }
        if length > MAX_SOURCE {
            refusals::refuse(Runtime::V8, Reason::TooLong);
            return None;
        }
        let length = length.min(max);
        let chars = if representation == layout.external_tag {
            // Characters outside V8's heap (node's own modules' sources,
            // in the binary): at the data pointer V8 copies from the
            // embedder's resource, except in "uncached" external strings,
            // where only the resource, an object of the embedder's, has it.
            if kind & UNCACHED_EXTERNAL != 0 {
                return None;
            }
            self.word(
                string
                    .checked_add(layout.external_resource?)?
                    .checked_add(8)?,
            )?
        } else if one_byte {
            string + layout.seq_one_byte_chars
        } else {
            string + layout.seq_two_byte_chars
        };
        if one_byte {
            let bytes = self.memory.read_vec(chars, length)?;
            // Latin-1: every byte is its own code point.
            Some(bytes.iter().map(|&byte| char::from(byte)).collect())
        } else {
            let bytes = self.memory.read_vec(chars, length * 2)?;
            let units: Vec<u16> = bytes
                .chunks_exact(2)
                .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
                .collect();
            Some(String::from_utf16_lossy(&units))
        }
    }

    /// The offsets at which each line of `script` ends: V8's own table
    /// when it has made one, else found in the source.
    pub fn line_ends(&self, script: u64) -> Option<Vec<u32>> {
        let layout = self.layout;
        if let Some(ends) = self.field(script, layout.script_line_ends)
            && self.instance_type(ends) == Some(layout.type_fixed_array)
        {
            let count = small_integer(self.word(ends + layout.array_length)?)?;
            let mut count = usize::try_from(count).ok()?;
            if count > MAX_LINES {
                // The lines past the cap read as the last one.
                refusals::refuse(Runtime::V8, Reason::TooLong);
                count = MAX_LINES;
            }
            let data = self
                .memory
                .read_vec(ends + layout.fixed_array_data, count * 8)?;
            return Some(
                data.chunks_exact(8)
                    .filter_map(|word| {
                        small_integer(u64::from_le_bytes(word.try_into().ok()?))
                            .and_then(|end| u32::try_from(end).ok())
                    })
                    .collect(),
            );
        }
        let source = self.field(script, layout.script_source)?;
        let text = self.string(source, MAX_SOURCE, 0)?;
        // Positions count UTF-16 units; the scripts' text here is mostly
        // ASCII, where they are characters.
        Some(
            text.chars()
                .enumerate()
                .filter(|(_, c)| *c == '\n')
                .map(|(index, _)| index as u32)
                .collect(),
        )
    }
}

/// The 1-based line holding `position`, given each line's end.
pub fn line_at(ends: &[u32], position: u32) -> u32 {
    ends.partition_point(|&end| end < position) as u32 + 1
}

fn floor_char_boundary(text: &str, max: usize) -> usize {
    if max >= text.len() {
        return text.len();
    }
    (0..=max)
        .rev()
        .find(|&at| text.is_char_boundary(at))
        .unwrap_or(0)
}
