//! Many short strings in one: symbol tables hold up to hundreds of
//! thousands of names, and a heap allocation per name cost about 40 bytes
//! of header and malloc overhead each, on top of the name.

/// Names appended one after another; each is found again by its [`NameAt`].
#[derive(Debug, Default)]
pub struct Names {
    text: String,
}

/// Where one name is in its [`Names`]: its first byte (each name ends
/// with a NUL, which names from symbol tables never hold). Four bytes, not
/// a start and a length: a table's entries are most of a module's memory
/// (a binary with 20,000 functions is 20,000 entries).
#[derive(Debug, Clone, Copy)]
pub struct NameAt(u32);

impl Names {
    /// Room for names of `bytes` in all, `count` of them.
    pub fn with_capacity(bytes: usize, count: usize) -> Self {
        Names {
            text: String::with_capacity(bytes + count),
        }
    }

    /// Appends `parts` as one name; `None` once 4 GiB of names are held
    /// (callers stop there rather than wrap).
    pub fn push(&mut self, parts: &[&str]) -> Option<NameAt> {
        let start = u32::try_from(self.text.len()).ok()?;
        let len = u32::try_from(parts.iter().map(|part| part.len()).sum::<usize>()).ok()?;
        start.checked_add(len)?.checked_add(1)?;
        for part in parts {
            self.text.push_str(part);
        }
        self.text.push('\0');
        Some(NameAt(start))
    }

    /// The name at `at`, up to its NUL (a part that held one is cut there).
    pub fn get(&self, at: NameAt) -> &str {
        let rest = self.text.get(at.0 as usize..).unwrap_or_default();
        rest.find('\0').map_or(rest, |end| &rest[..end])
    }

    /// Bytes of text held.
    pub fn bytes(&self) -> usize {
        self.text.len()
    }

    /// Bytes allocated for text (tests: a table is built without growth).
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.text.capacity()
    }

    pub fn shrink_to_fit(&mut self) {
        self.text.shrink_to_fit();
    }
}
