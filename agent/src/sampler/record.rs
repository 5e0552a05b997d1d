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

/// Decodes the stack copy of a ring-buffer record; `None` for plain
/// samples (the only kind without `--stack-copy`).
pub fn decode_stack_copy(record: &[u8]) -> Option<StackCopy> {
    if record.len() < std::mem::size_of::<hostprof_common::StackSample>() {
        return None;
    }
    // SAFETY: as in `decode_sample`: plain old data, enough bytes.
    let raw =
        unsafe { std::ptr::read_unaligned(record.as_ptr().cast::<hostprof_common::StackSample>()) };
    let len = (raw.stack_len as usize).min(hostprof_common::MAX_STACK_COPY);
    Some(StackCopy {
        sample: decode_sample(record)?,
        regs: (raw.regs_valid != 0).then_some(raw.regs),
        stack: raw.stack[..len].to_vec(),
    })
}

/// Decodes one ring-buffer record: a [`Sample`] in its compact layout
/// (see `hostprof_common::Sample`), as long as its frames need.
pub fn decode_sample(record: &[u8]) -> Option<Sample> {
    let sample_len = std::mem::size_of::<Sample>();
    let header = hostprof_common::SAMPLE_HEADER_BYTES;
    if record.len() < header {
        return None;
    }
    // A stack-copy record starts with a whole `Sample`, its link in place.
    let copy = record.len() > sample_len;
    let record = &record[..record.len().min(sample_len)];
    let mut bytes = [0u8; std::mem::size_of::<Sample>()];
    bytes[..record.len()].copy_from_slice(record);
    // SAFETY: `Sample` is plain old data (see hostprof_common) and `bytes` holds
    // exactly one; read_unaligned because a byte array has no alignment.
    let mut sample = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Sample>()) };
    // A compact record with a trace context ends with it.
    let link = hostprof_common::trace::LINK_BYTES;
    let record = if sample.flags & hostprof_common::SAMPLE_FLAG_TRACE == 0 {
        sample.trace = Default::default();
        sample.attrs.fill(0);
        record
    } else if copy {
        // Link and attributes in place.
        let attrs = usize::from(sample.trace.attrs_len);
        if attrs > hostprof_common::trace::MAX_ATTRS {
            return None;
        }
        sample.attrs[attrs..].fill(0);
        record
    } else {
        let body = record
            .len()
            .checked_sub(link)
            .filter(|&body| body >= header)?;
        let tail = &record[body..];
        // SAFETY: a `Link` is plain old data of `link` bytes.
        sample.trace = unsafe {
            std::ptr::read_unaligned(tail.as_ptr().cast::<hostprof_common::trace::Link>())
        };
        // Its attributes, if any, just before it, padded to words.
        let attrs = usize::from(sample.trace.attrs_len);
        if attrs > hostprof_common::trace::MAX_ATTRS {
            return None;
        }
        let body = body
            .checked_sub(attrs.next_multiple_of(8))
            .filter(|&body| body >= header)?;
        sample.attrs.fill(0);
        sample.attrs[..attrs].copy_from_slice(&record[body..body + attrs]);
        bytes[body..].fill(0);
        &record[..body]
    };
    let kernel = sample.kernel_stack_len as usize;
    let user = sample.user_stack_len as usize;
    if kernel > hostprof_common::MAX_STACK_DEPTH
        || user > hostprof_common::MAX_USER_STACK_DEPTH
        || header + 8 * (kernel + user) > record.len()
    {
        return None;
    }
    // The user frames follow the kernel ones: move them to `user_stack`.
    let frames = &bytes[header + 8 * kernel..header + 8 * (kernel + user)];
    for (slot, frame) in sample.user_stack.iter_mut().zip(frames.chunks_exact(8)) {
        *slot = u64::from_ne_bytes(frame.try_into().expect("8 bytes"));
    }
    sample.user_stack[user..].fill(0);
    sample.kernel_stack[kernel..].fill(0);
    // Runtime frames end the record: only as many as it holds count.
    let runtime = std::mem::offset_of!(Sample, runtime);
    let runtime_frames = runtime + std::mem::offset_of!(hostprof_common::runtime::Stack, frames);
    if record.len() <= runtime {
        sample.runtime.len = 0;
        sample.runtime.reason = 0;
    } else {
        let len = sample.runtime.len as usize;
        let frame = std::mem::size_of::<hostprof_common::runtime::Frame>();
        if len > hostprof_common::runtime::MAX_FRAMES || runtime_frames + frame * len > record.len()
        {
            return None;
        }
        sample.runtime.frames[len..].fill(Default::default());
    }
    Some(sample)
}
