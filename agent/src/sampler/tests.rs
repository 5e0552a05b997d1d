//! Record decoding (the kernel's compact layout) and the object's relocations.
use super::*;
use hostprof_common::Sample;

/// A record as the kernel writes it: header, kernel frames, then user
/// frames right after them, only as long as the frames need.
fn compact_record(kernel: &[u64], user: &[u64]) -> Vec<u8> {
    // SAFETY: all-zero is a valid `Sample` (integers only).
    let mut sample: Sample = unsafe { std::mem::zeroed() };
    sample.tgid = 42;
    sample.kernel_stack_len = kernel.len() as u32;
    sample.user_stack_len = user.len() as u32;
    let header = hostprof_common::SAMPLE_HEADER_BYTES;
    // SAFETY: plain old data, read as bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts((&sample as *const Sample).cast::<u8>(), header) };
    let mut record = bytes.to_vec();
    for frame in kernel.iter().chain(user) {
        record.extend_from_slice(&frame.to_ne_bytes());
    }
    record
}

#[test]
fn compact_records_decode_to_whole_samples() {
    let record = compact_record(&[0xffff_0001, 0xffff_0002], &[0x401000, 0x402000, 0x403000]);
    assert_eq!(record.len(), hostprof_common::SAMPLE_HEADER_BYTES + 5 * 8);
    let sample = decode_sample(&record).expect("decodes");
    assert_eq!(sample.tgid, 42);
    assert_eq!(&sample.kernel_stack[..3], &[0xffff_0001, 0xffff_0002, 0]);
    assert_eq!(&sample.user_stack[..4], &[0x401000, 0x402000, 0x403000, 0]);

    // Full stacks: every frame slot, up to the runtime frames.
    let kernel: Vec<u64> = (0..hostprof_common::MAX_STACK_DEPTH as u64).collect();
    let user: Vec<u64> = (1000..1000 + hostprof_common::MAX_USER_STACK_DEPTH as u64).collect();
    let record = compact_record(&kernel, &user);
    assert_eq!(record.len(), std::mem::offset_of!(Sample, runtime));
    let sample = decode_sample(&record).expect("decodes");
    assert_eq!(sample.kernel_stack.to_vec(), kernel);
    assert_eq!(sample.user_stack.to_vec(), user);
    assert_eq!(sample.runtime.len, 0);

    // A sample with runtime frames: the native slots whole, then its
    // runtime frames, and only those.
    let mut record = compact_record(&[0xffff_0001], &[0x401000, 0x402000]);
    let runtime = std::mem::offset_of!(Sample, runtime);
    let frames = runtime + std::mem::offset_of!(hostprof_common::runtime::Stack, frames);
    record.resize(frames + 3 * 16, 0);
    record[runtime..runtime + 4].copy_from_slice(&3u32.to_ne_bytes());
    record[frames + 32..frames + 40].copy_from_slice(&0x7777u64.to_ne_bytes());
    let sample = decode_sample(&record).expect("decodes");
    assert_eq!(&sample.user_stack[..3], &[0x401000, 0x402000, 0]);
    assert_eq!(sample.runtime.len, 3);
    assert_eq!(sample.runtime.frames[2].code, 0x7777);
    // A count past the frames the record holds is malformed.
    assert!(decode_sample(&record[..record.len() - 16]).is_none());
}

#[test]
fn a_trace_link_ends_the_record_that_has_one() {
    // Ids of 0xab, no attributes.
    let mut link = [0xabu8; hostprof_common::trace::LINK_BYTES];
    link[25..].fill(0);
    let flagged = |mut record: Vec<u8>| {
        let flags = std::mem::offset_of!(Sample, flags);
        record[flags..flags + 4].copy_from_slice(&hostprof_common::SAMPLE_FLAG_TRACE.to_ne_bytes());
        record.extend_from_slice(&link);
        record
    };
    let record = flagged(compact_record(&[0xffff_0001], &[0x401000, 0x402000]));
    let sample = decode_sample(&record).expect("decodes");
    assert_eq!(sample.trace.trace_id, [0xab; 16]);
    assert_eq!(sample.trace.span_id, [0xab; 8]);
    assert_eq!(&sample.user_stack[..3], &[0x401000, 0x402000, 0]);
    assert_eq!(&sample.kernel_stack[..2], &[0xffff_0001, 0]);

    // Full native slots: the link lands on the runtime count, which a
    // record that short does not have.
    let kernel: Vec<u64> = (0..hostprof_common::MAX_STACK_DEPTH as u64).collect();
    let user: Vec<u64> = (1000..1000 + hostprof_common::MAX_USER_STACK_DEPTH as u64).collect();
    let sample = decode_sample(&flagged(compact_record(&kernel, &user))).expect("decodes");
    assert_eq!(sample.runtime.len, 0);
    assert_eq!(sample.user_stack.to_vec(), user);
    assert_eq!(sample.trace.span_id, [0xab; 8]);

    // Without the flag, no link; a flagged record too short for one is
    // malformed.
    let plain = decode_sample(&compact_record(&[1], &[2])).expect("decodes");
    assert_eq!(plain.trace, Default::default());
    let mut short = compact_record(&[], &[]);
    let flags = std::mem::offset_of!(Sample, flags);
    short[flags..flags + 4].copy_from_slice(&hostprof_common::SAMPLE_FLAG_TRACE.to_ne_bytes());
    assert!(decode_sample(&short).is_none());
}

#[test]
fn attributes_come_padded_to_words_before_the_link() {
    let flags = std::mem::offset_of!(Sample, flags);
    let with_attrs = |attrs: &[u8], announced: u16| {
        let mut record = compact_record(&[0xffff_0001], &[0x401000]);
        record[flags..flags + 4].copy_from_slice(&hostprof_common::SAMPLE_FLAG_TRACE.to_ne_bytes());
        record.extend_from_slice(attrs);
        record.resize(record.len().next_multiple_of(8), 0);
        let link = hostprof_common::trace::Link {
            trace_id: [1; 16],
            span_id: [2; 8],
            attrs_len: announced,
            ..Default::default()
        };
        // SAFETY: a `Link` is plain old data.
        let bytes: [u8; hostprof_common::trace::LINK_BYTES] = unsafe { std::mem::transmute(link) };
        record.extend_from_slice(&bytes);
        record
    };
    let attrs = b"\x00\x02/a\x01\x03GET";
    let sample = decode_sample(&with_attrs(attrs, attrs.len() as u16)).expect("decodes");
    assert_eq!(&sample.attrs[..attrs.len()], attrs);
    assert!(sample.attrs[attrs.len()..].iter().all(|&byte| byte == 0));
    assert_eq!(&sample.user_stack[..2], &[0x401000, 0]);
    assert_eq!(sample.trace.span_id, [2; 8]);
    // A length past the cap, or past what the record holds, is malformed.
    let cap = hostprof_common::trace::MAX_ATTRS as u16;
    assert!(decode_sample(&with_attrs(attrs, cap + 1)).is_none());
    assert!(decode_sample(&with_attrs(attrs, cap)).is_none());
}

/// The agent's encoder writes what the kernel writes (the hand-built
/// records above) and what the decoder reads back, for samples of every
/// shape: frames from none to full, runtime frames, links with and
/// without attributes.
#[test]
fn encoded_samples_decode_to_themselves() {
    use hostprof_common::{
        MAX_STACK_DEPTH, MAX_USER_STACK_DEPTH, SAMPLE_FLAG_TRACE, runtime, trace,
    };
    let plain = {
        // SAFETY: all-zero is a valid `Sample` (integers only).
        let mut sample: Sample = unsafe { std::mem::zeroed() };
        sample.tgid = 42;
        sample.kernel_stack_len = 1;
        sample.kernel_stack[0] = 0xffff_0001;
        sample.user_stack_len = 2;
        sample.user_stack[..2].copy_from_slice(&[0x401000, 0x402000]);
        sample
    };
    assert_eq!(
        encode_sample(&plain),
        compact_record(&[0xffff_0001], &[0x401000, 0x402000])
    );

    let mut rng = crate::test_rng::XorShift::new(0x51_7cc1_b727_220a);
    for round in 0..500 {
        // SAFETY: as above.
        let mut sample: Sample = unsafe { std::mem::zeroed() };
        sample.tgid = rng.next_u64() as u32;
        sample.tid = rng.next_u64() as u32;
        sample.ktime_ns = rng.next_u64();
        let kernel = rng.below(MAX_STACK_DEPTH as u64 + 1) as usize;
        let user = rng.below(MAX_USER_STACK_DEPTH as u64 + 1) as usize;
        sample.kernel_stack_len = kernel as u32;
        sample.user_stack_len = user as u32;
        for frame in &mut sample.kernel_stack[..kernel] {
            *frame = rng.next_u64();
        }
        for frame in &mut sample.user_stack[..user] {
            *frame = rng.next_u64();
        }
        if round % 3 == 0 {
            let frames = rng.below(runtime::MAX_FRAMES as u64 + 1) as usize;
            sample.runtime.len = frames as u32;
            for frame in &mut sample.runtime.frames[..frames] {
                frame.code = rng.next_u64();
            }
        }
        if round % 2 == 0 {
            sample.flags |= SAMPLE_FLAG_TRACE;
            sample.trace.span_id = rng.next_u64().to_ne_bytes();
            let attrs = if round % 4 == 0 {
                rng.below(trace::MAX_ATTRS as u64 + 1) as usize
            } else {
                0
            };
            sample.trace.attrs_len = attrs as u16;
            sample.attrs[..attrs].copy_from_slice(&rng.bytes(attrs));
        }
        let record = encode_sample(&sample);
        let back = decode_sample(&record).unwrap_or_else(|| panic!("round {round} decodes"));
        assert_eq!(back.tgid, sample.tgid);
        assert_eq!(back.tid, sample.tid);
        assert_eq!(back.ktime_ns, sample.ktime_ns);
        assert_eq!(back.kernel_stack, sample.kernel_stack, "round {round}");
        assert_eq!(back.user_stack, sample.user_stack, "round {round}");
        assert_eq!(back.runtime.len, sample.runtime.len);
        assert_eq!(back.runtime.frames, sample.runtime.frames, "round {round}");
        assert_eq!(back.trace, sample.trace, "round {round}");
        assert_eq!(back.attrs, sample.attrs, "round {round}");
        // Only the used part travels.
        let runtime_end = std::mem::offset_of!(Sample, runtime)
            + std::mem::offset_of!(runtime::Stack, frames)
            + sample.runtime.len as usize * std::mem::size_of::<runtime::Frame>();
        assert!(
            record.len()
                <= runtime_end.max(hostprof_common::SAMPLE_HEADER_BYTES + 8 * (kernel + user))
                    + trace::ATTRS_ROOM
                    + trace::LINK_BYTES
        );
    }
}

#[test]
fn records_shorter_than_their_frames_are_malformed() {
    let mut record = compact_record(&[1, 2], &[3]);
    record.truncate(record.len() - 8);
    assert!(decode_sample(&record).is_none());
    assert!(decode_sample(&record[..10]).is_none());
}

/// `Sampler::load` gives aya no target BTF, which is only right while the
/// programs have no CO-RE relocation to resolve against it: their
/// `.BTF.ext` header's `core_relo_len` (after magic, version, flags,
/// hdr_len and the func/line info offsets and lengths) must be zero.
#[test]
fn the_ebpf_object_has_no_core_relocations() {
    use object::{Object, ObjectSection};
    let file = object::File::parse(EBPF_OBJECT).expect("the embedded eBPF object is an ELF file");
    let Some(section) = file.section_by_name(".BTF.ext") else {
        return;
    };
    let ext = section.data().expect(".BTF.ext is readable");
    let u32_at = |at: usize| u32::from_le_bytes(ext[at..at + 4].try_into().unwrap());
    assert_eq!(u16::from_le_bytes([ext[0], ext[1]]), 0xeb9f, "BTF magic");
    let header_len = u32_at(4) as usize;
    // Headers shorter than 32 bytes predate CO-RE relocations.
    if header_len >= 32 {
        let core_relo_len = u32_at(28);
        assert_eq!(
            core_relo_len, 0,
            "the eBPF programs now have CO-RE relocations: give EbpfLoader the kernel's BTF again"
        );
    }
    // The section did hold function and line info: the header was read right.
    assert!(u32_at(12) > 0, "func_info_len");
    assert!(u32_at(20) > 0, "line_info_len");
}

/// Data flows from the sampler to `unwind` (tables, stack copies), never
/// back: the sampler names nothing of it but in comments.
#[test]
fn the_sampler_imports_nothing_from_unwind() {
    let files = [
        ("mod.rs", include_str!("mod.rs")),
        ("btf.rs", include_str!("btf.rs")),
        ("error.rs", include_str!("error.rs")),
        ("kernel.rs", include_str!("kernel.rs")),
        ("memory.rs", include_str!("memory.rs")),
        ("reader.rs", include_str!("reader.rs")),
        ("record.rs", include_str!("record.rs")),
        ("sizes.rs", include_str!("sizes.rs")),
    ];
    for (name, text) in files {
        let code = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"));
        for line in code {
            assert!(
                !line.contains("crate::unwind") && !line.contains("super::super::unwind"),
                "sampler/{name}: {line}"
            );
        }
    }
}

#[test]
fn a_stack_copy_waits_in_a_batch_at_its_samples_size() {
    use hostprof_common::StackSample;
    // SAFETY: all-zero is a valid `StackSample` (integers only).
    let mut raw: Box<StackSample> = Box::new(unsafe { std::mem::zeroed() });
    raw.sample.tid = 7;
    raw.sample.kernel_stack_len = 1;
    raw.sample.kernel_stack[0] = 0xffff_ffff_8100_0000;
    // As the kernel writes them: the user frames right after the kernel's.
    raw.sample.user_stack_len = 3;
    raw.sample.kernel_stack[1..4].copy_from_slice(&[0x401000, 0x402000, 0x403000]);
    raw.stack_len = 4096;
    // SAFETY: plain old data, read as bytes.
    let record = unsafe {
        std::slice::from_raw_parts(
            (&*raw as *const StackSample).cast::<u8>(),
            std::mem::size_of::<StackSample>(),
        )
    };
    // SAFETY: as above.
    let mut scratch: Box<Sample> = Box::new(unsafe { std::mem::zeroed() });
    let mut batch = Records::default();
    assert!(batch.push(record, &mut scratch));
    assert!(batch.push(&compact_record(&[1], &[2]), &mut scratch));
    // The copy's stack and its sample's unused frame slots are not kept.
    assert!(batch.byte_len() < 1024, "{} bytes", batch.byte_len());
    let mut seen = Vec::new();
    batch.for_each(|sample| {
        let user = &sample.user_stack[..sample.user_stack_len as usize];
        let kernel = &sample.kernel_stack[..sample.kernel_stack_len as usize];
        seen.push((sample.tid, kernel.to_vec(), user.to_vec()));
    });
    assert_eq!(
        seen[0],
        (
            7,
            vec![0xffff_ffff_8100_0000],
            vec![0x401000, 0x402000, 0x403000]
        )
    );
    assert_eq!(seen[1].1, [1]);
    assert_eq!(seen.len(), 2);
}

#[test]
fn an_early_copy_is_what_the_whole_stack_copy_says() {
    use hostprof_common::StackSample;
    // SAFETY: all-zero is a valid `StackSample` (integers only).
    let mut raw: Box<StackSample> = Box::new(unsafe { std::mem::zeroed() });
    raw.sample.tid = 7;
    raw.sample.ktime_ns = 123_456_789;
    raw.sample.flags = 5 << hostprof_common::SAMPLE_UNWIND_SHIFT;
    raw.regs = [1, 2, 3, 4];
    raw.regs_valid = 1;
    raw.stack_len = 24;
    raw.stack[..24].copy_from_slice(&[9; 24]);
    // SAFETY: plain old data, read as bytes.
    let record = unsafe {
        std::slice::from_raw_parts(
            (&*raw as *const StackSample).cast::<u8>(),
            std::mem::size_of::<StackSample>(),
        )
    };
    let whole = decode_stack_copy(record).expect("a copy");
    let early = decode_early_copy(record).expect("a copy");
    assert_eq!(
        (early.tid, early.ktime_ns, early.flags),
        (whole.sample.tid, whole.sample.ktime_ns, whole.sample.flags)
    );
    assert_eq!((early.regs, &early.stack), (whole.regs, &whole.stack));
    assert_eq!(early.stack, [9; 24]);
    raw.regs_valid = 0;
    // SAFETY: as above.
    let record = unsafe {
        std::slice::from_raw_parts(
            (&*raw as *const StackSample).cast::<u8>(),
            std::mem::size_of::<StackSample>(),
        )
    };
    assert_eq!(decode_early_copy(record).expect("a copy").regs, None);
    // A plain sample carries no copy.
    assert!(decode_early_copy(&compact_record(&[1], &[2])).is_none());
}
