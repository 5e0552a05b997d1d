//! Many short strings in one: symbol tables hold up to hundreds of
//! thousands of names, and a heap allocation per name cost about 40 bytes
//! of header and malloc overhead each, on top of the name.

/// Names appended one after another; each is found again by its [`NameAt`].
#[derive(Debug, Default)]
pub struct Names {
    text: String,
}

/// Where one name is in its [`Names`].
#[derive(Debug, Clone, Copy)]
pub struct NameAt {
    start: u32,
    len: u32,
}

impl Names {
    pub fn with_capacity(bytes: usize) -> Self {
        Names {
            text: String::with_capacity(bytes),
        }
    }

    /// Appends `parts` as one name; `None` once 4 GiB of names are held
    /// (callers stop there rather than wrap).
    pub fn push(&mut self, parts: &[&str]) -> Option<NameAt> {
        let start = u32::try_from(self.text.len()).ok()?;
        let len = u32::try_from(parts.iter().map(|part| part.len()).sum::<usize>()).ok()?;
        start.checked_add(len)?;
        for part in parts {
            self.text.push_str(part);
        }
        Some(NameAt { start, len })
    }

    pub fn get(&self, at: NameAt) -> &str {
        let start = at.start as usize;
        self.text
            .get(start..start + at.len as usize)
            .unwrap_or_default()
    }

    /// Bytes of text held.
    pub fn bytes(&self) -> usize {
        self.text.len()
    }

    pub fn shrink_to_fit(&mut self) {
        self.text.shrink_to_fit();
    }
}
