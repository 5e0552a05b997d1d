//! The records the kernel writes to the ring, decoded: a [`Sample`] in its
//! compact layout (frames as many as it has, runtime frames at its end),
//! and a sample with a copy of its user stack ([`StackCopy`]).
use hostprof_common::Sample;

/// A CPU sample with its raw user stack (`SamplerOptions::stack_copy_bytes`).
#[derive(Clone, Debug)]
pub struct StackCopy {
    pub sample: Sample,
    /// User pc, sp, frame pointer and link register; `None` when the kernel
    /// could not read them.
    pub regs: Option<[u64; 4]>,
    /// The stack from sp up (shorter than asked near the top of a stack;
    /// empty when unreadable).
    pub stack: Vec<u8>,
}

/// What the early unwinder (`crate::unwind::early`) takes of a stack-copy
/// record: whose and when (to meet its sample later), the registers and
/// the stack bytes, without the 4 KiB sample it arrives with.
#[derive(Clone, Debug)]
pub struct EarlyCopy {
    pub tid: u32,
    pub ktime_ns: u64,
    /// The sample's `flags` (why the kernel's walk stopped).
    pub flags: u32,
    /// User pc, sp, frame pointer and link register, when read.
    pub regs: Option<[u64; 4]>,
    /// The stack from sp up.
    pub stack: Vec<u8>,
}

/// The [`EarlyCopy`] of a stack-copy record (`None` for a plain sample),
/// read field by field: the whole record is some 21 KiB.
pub fn decode_early_copy(record: &[u8]) -> Option<EarlyCopy> {
    use hostprof_common::StackSample;
    if record.len() < std::mem::size_of::<StackSample>() {
        return None;
    }
    let u32_at = |at: usize| u32::from_ne_bytes(record[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_ne_bytes(record[at..at + 8].try_into().expect("8 bytes"));
    let regs_at = std::mem::offset_of!(StackSample, regs);
    let regs = [0, 1, 2, 3].map(|i| u64_at(regs_at + 8 * i));
    let len = (u32_at(std::mem::offset_of!(StackSample, stack_len)) as usize)
        .min(hostprof_common::MAX_STACK_COPY);
    let stack_at = std::mem::offset_of!(StackSample, stack);
    Some(EarlyCopy {
        tid: u32_at(std::mem::offset_of!(Sample, tid)),
        ktime_ns: u64_at(std::mem::offset_of!(Sample, ktime_ns)),
        flags: u32_at(std::mem::offset_of!(Sample, flags)),
        regs: (u32_at(std::mem::offset_of!(StackSample, regs_valid)) != 0).then_some(regs),
        stack: record[stack_at..stack_at + len].to_vec(),
    })
}

/// Decodes the stack copy of a ring-buffer record; `None` for plain
/// samples (the only kind without `--stack-copy`).
pub fn decode_stack_copy(record: &[u8]) -> Option<StackCopy> {
    let copy = decode_early_copy(record)?;
    Some(StackCopy {
        sample: decode_sample(record)?,
        regs: copy.regs,
        stack: copy.stack,
    })
}

/// Decodes one ring-buffer record: a [`Sample`] in its compact layout
/// (see `hostprof_common::Sample`), as long as its frames need.
pub fn decode_sample(record: &[u8]) -> Option<Sample> {
    // SAFETY: all-zero is a valid `Sample` (integers only).
    let mut sample: Sample = unsafe { std::mem::zeroed() };
    decode_sample_into(record, &mut sample).then_some(sample)
}

/// [`decode_sample`] into `sample`, which the caller reuses from record to
/// record: a `Sample` is 4 KiB, and returning one by value per record, then
/// moving it into a batch, was most of the reader's CPU. False when the
/// record is malformed (`sample` then holds garbage).
pub fn decode_sample_into(record: &[u8], sample: &mut Sample) -> bool {
    let sample_len = std::mem::size_of::<Sample>();
    let header = hostprof_common::SAMPLE_HEADER_BYTES;
    if record.len() < header {
        return false;
    }
    // A stack-copy record starts with a whole `Sample`, its link in place.
    let copy = record.len() > sample_len;
    let record = &record[..record.len().min(sample_len)];
    // SAFETY: `Sample` is plain old data (see hostprof_common): any bytes
    // are one, and `bytes` is the only reference to it while it lives.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut((sample as *mut Sample).cast::<u8>(), sample_len) };
    bytes[..record.len()].copy_from_slice(record);
    bytes[record.len()..].fill(0);
    // A compact record with a trace context ends with it.
    let link = hostprof_common::trace::LINK_BYTES;
    let flags = u32::from_ne_bytes(
        record[std::mem::offset_of!(Sample, flags)..][..4]
            .try_into()
            .expect("4 bytes"),
    );
    let used = if flags & hostprof_common::SAMPLE_FLAG_TRACE == 0 {
        bytes[hostprof_common::SAMPLE_TRACE_AT..].fill(0);
        record.len()
    } else if copy {
        // Link and attributes in place.
        let attrs = usize::from(sample.trace.attrs_len);
        if attrs > hostprof_common::trace::MAX_ATTRS {
            return false;
        }
        sample.attrs[attrs..].fill(0);
        record.len()
    } else {
        let Some(body) = record
            .len()
            .checked_sub(link)
            .filter(|&body| body >= header)
        else {
            return false;
        };
        // SAFETY: a `Link` is plain old data of `link` bytes.
        let trace = unsafe {
            std::ptr::read_unaligned(
                record[body..]
                    .as_ptr()
                    .cast::<hostprof_common::trace::Link>(),
            )
        };
        // Its attributes, if any, just before it, padded to words.
        let attrs = usize::from(trace.attrs_len);
        if attrs > hostprof_common::trace::MAX_ATTRS {
            return false;
        }
        let Some(body) = body
            .checked_sub(attrs.next_multiple_of(8))
            .filter(|&body| body >= header)
        else {
            return false;
        };
        // Clear where attributes and link sat (and the fields they go to)
        // before writing them through `sample`: `bytes` is not used after.
        bytes[body..].fill(0);
        sample.trace = trace;
        sample.attrs[..attrs].copy_from_slice(&record[body..body + attrs]);
        body
    };
    let kernel = sample.kernel_stack_len as usize;
    let user = sample.user_stack_len as usize;
    if kernel > hostprof_common::MAX_STACK_DEPTH
        || user > hostprof_common::MAX_USER_STACK_DEPTH
        || header + 8 * (kernel + user) > used
    {
        return false;
    }
    // The user frames follow the kernel ones: move them to `user_stack`
    // (forward or in place: the kernel slots are never fewer than used).
    let user_at = std::mem::offset_of!(Sample, user_stack);
    let bytes =
        // SAFETY: as above; the earlier slice is no longer used.
        unsafe { std::slice::from_raw_parts_mut((sample as *mut Sample).cast::<u8>(), sample_len) };
    bytes.copy_within(header + 8 * kernel..header + 8 * (kernel + user), user_at);
    sample.user_stack[user..].fill(0);
    sample.kernel_stack[kernel..].fill(0);
    // Runtime frames end the record: only as many as it holds count.
    let runtime = std::mem::offset_of!(Sample, runtime);
    let runtime_frames = runtime + std::mem::offset_of!(hostprof_common::runtime::Stack, frames);
    if used <= runtime {
        sample.runtime.len = 0;
        sample.runtime.reason = 0;
    } else {
        let len = sample.runtime.len as usize;
        let frame = std::mem::size_of::<hostprof_common::runtime::Frame>();
        if len > hostprof_common::runtime::MAX_FRAMES || runtime_frames + frame * len > used {
            return false;
        }
        sample.runtime.frames[len..].fill(Default::default());
    }
    true
}

/// Encodes `sample` as the kernel writes it to the ring: the header, the
/// kernel frames and right after them the user frames, the runtime frames
/// (at their place) when it has some, then, with a trace context, its
/// attributes padded to words and its link. The kernel's writer
/// (`agent-ebpf`'s `output`) is the other half; [`decode_sample_into`]
/// reads both, and the tests hold the three to one layout. For records the
/// agent keeps (`crate::unwind::early` holds samples at this size).
pub fn encode_sample(sample: &Sample) -> Vec<u8> {
    use hostprof_common::{
        SAMPLE_FLAG_TRACE, SAMPLE_HEADER_BYTES, SAMPLE_TRACE_AT, runtime, trace,
    };
    // SAFETY: `Sample` is plain old data without padding (it is `aya::Pod`),
    // so all its bytes are initialized; the slice lives as long as `sample`.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (sample as *const Sample).cast::<u8>(),
            std::mem::size_of::<Sample>(),
        )
    };
    let kernel = (sample.kernel_stack_len as usize).min(hostprof_common::MAX_STACK_DEPTH);
    let user = (sample.user_stack_len as usize).min(sample.user_stack.len());
    let frames_end = SAMPLE_HEADER_BYTES + 8 * (kernel + user);
    let used = match (sample.runtime.len as usize).min(runtime::MAX_FRAMES) {
        0 => frames_end,
        frames => {
            let at = std::mem::offset_of!(Sample, runtime)
                + std::mem::offset_of!(runtime::Stack, frames);
            (at + frames * std::mem::size_of::<runtime::Frame>()).max(frames_end)
        }
    };
    let mut record = bytes[..used].to_vec();
    // Counts past their arrays are cut to what the record holds.
    let mut put = |at: usize, count: usize| {
        record[at..at + 4].copy_from_slice(&(count as u32).to_ne_bytes());
    };
    put(std::mem::offset_of!(Sample, kernel_stack_len), kernel);
    put(std::mem::offset_of!(Sample, user_stack_len), user);
    if sample.runtime.len != 0 {
        let frames = (sample.runtime.len as usize).min(runtime::MAX_FRAMES);
        put(std::mem::offset_of!(Sample, runtime), frames);
    }
    let at = SAMPLE_HEADER_BYTES + 8 * kernel;
    for (slot, frame) in record[at..frames_end]
        .chunks_exact_mut(8)
        .zip(&sample.user_stack[..user])
    {
        slot.copy_from_slice(&frame.to_ne_bytes());
    }
    if sample.flags & SAMPLE_FLAG_TRACE != 0 {
        let attrs = usize::from(sample.trace.attrs_len).min(trace::MAX_ATTRS);
        record.extend_from_slice(&sample.attrs[..attrs]);
        record.resize(record.len() + (attrs.next_multiple_of(8) - attrs), 0);
        let link = record.len();
        record.extend_from_slice(&bytes[SAMPLE_TRACE_AT..SAMPLE_TRACE_AT + trace::LINK_BYTES]);
        // The length the record carries is the one it holds.
        let len_at = link + std::mem::offset_of!(trace::Link, attrs_len);
        record[len_at..len_at + 2].copy_from_slice(&(attrs as u16).to_ne_bytes());
    }
    record
}

/// Whether a sample with these `flags` stopped for want of its process's
/// unwind tables (the process, or the mapping of its pc, unknown to the
/// kernel): the tables are to be loaded.
pub fn needs_tables(flags: u32) -> bool {
    use hostprof_unwind::reason;
    let why = (flags >> hostprof_common::SAMPLE_UNWIND_SHIFT) & 0xff;
    why == reason::UNKNOWN_PROCESS || why == reason::NO_MAPPING
}

/// Whether a sample with these `flags` stopped at a function whose rows
/// are not loaded yet: its stack copy waits for them.
pub fn stopped_not_loaded(flags: u32) -> bool {
    (flags >> hostprof_common::SAMPLE_UNWIND_SHIFT) & 0xff == hostprof_unwind::reason::NOT_LOADED
}

/// Where a sample's walk stopped for want of its function's rows (a table
/// built for the code that runs, `reason::NOT_LOADED`): the address to
/// add, inside the call for a return address, as the walk looked it up.
pub fn function_wanted(sample: &Sample) -> Option<u64> {
    if !stopped_not_loaded(sample.flags) {
        return None;
    }
    let len = (sample.user_stack_len as usize).min(sample.user_stack.len());
    let pc = *sample.user_stack[..len].last()?;
    Some(if len == 1 { pc } else { pc.wrapping_sub(1) })
}

/// Ring records as they came, back to back: the samples of a drain, on
/// their way to the pipeline, at their compact size (a header and 8 bytes
/// per frame: some 200 bytes where a decoded [`Sample`] is 4 KiB). The
/// reader used to decode each into a `Vec<Sample>`: the copies, the
/// vector's growth and the page faults of its fresh memory were a third of
/// the agent's CPU per sample. Now only the stage that uses a sample
/// decodes it, into one reused buffer ([`Records::for_each`]).
#[derive(Clone, Debug, Default)]
pub struct Records {
    bytes: Vec<u8>,
    /// Where each record ends in `bytes`.
    ends: Vec<usize>,
}

impl Records {
    /// Adds a record; false (and nothing added) when it is malformed.
    pub fn push(&mut self, record: &[u8], scratch: &mut Sample) -> bool {
        if !decode_sample_into(record, scratch) {
            return false;
        }
        if record.len() > std::mem::size_of::<Sample>() {
            // A stack-copy record (about 21 KiB) waits here only for its
            // sample: the reader has already handed its registers and
            // stack to the copy sinks. Kept whole, a few seconds of early
            // copies on a busy host were tens of MiB of the agent's RSS.
            self.bytes.extend_from_slice(&encode_sample(scratch));
        } else {
            self.bytes.extend_from_slice(record);
        }
        self.ends.push(self.bytes.len());
        true
    }

    /// Bytes the records take (a test's measure of what waits).
    #[cfg(test)]
    pub(crate) fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Each record's bytes, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(start, end)| &self.bytes[start..end])
    }

    /// Calls `each` with every sample, oldest first, decoded in turn into
    /// one buffer (records were checked when pushed).
    pub fn for_each(&self, mut each: impl FnMut(&Sample)) {
        // SAFETY: all-zero is a valid `Sample` (integers only).
        let mut sample: Box<Sample> = Box::new(unsafe { std::mem::zeroed() });
        for record in self.iter() {
            if decode_sample_into(record, &mut sample) {
                each(&sample);
            }
        }
    }

    /// Moves `other`'s records after these, leaving it empty.
    pub fn append(&mut self, other: &mut Records) {
        let base = self.bytes.len();
        self.bytes.append(&mut other.bytes);
        self.ends.extend(other.ends.drain(..).map(|end| end + base));
    }

    /// Drops the `count` oldest records.
    pub fn drop_oldest(&mut self, count: usize) {
        let count = count.min(self.len());
        if count == 0 {
            return;
        }
        let cut = self.ends[count - 1];
        self.bytes.drain(..cut);
        self.ends.drain(..count);
        for end in &mut self.ends {
            *end -= cut;
        }
    }
}
