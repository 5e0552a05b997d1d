//! Early samples held, shared, unwound and freed, on synthetic stacks.
use hostprof_common::RowChunk;
use hostprof_common::{SAMPLE_FLAG_TRACE, SAMPLE_HEADER_BYTES};
use hostprof_unwind::{ExecMapping, ROW_CHUNK, UnwindRow, cfa, reason, reg};

use super::*;

/// The process's code and where its ELF addresses are.
const MAP_START: u64 = 0x55_0000_0000;
const BIAS: u64 = MAP_START - 0x1000;
/// The top of the copied stack (sp at the sample).
const SP: u64 = 0x7ffd_0000_0f00;
/// Bytes of each frame, and frames below `_start`'s.
const FRAME: u64 = 48;
const DEPTH: u64 = 120;

/// Rows for two functions: `work` (at 0x1000; CFA sp + 48, the return
/// address just below it) and `_start` (at 0x3000: the end of the stack).
fn rows() -> Vec<UnwindRow> {
    let work = UnwindRow {
        pc: 0x1000,
        cfa_rule: cfa::SP,
        cfa_offset: FRAME as i32,
        ra_rule: reg::AT_CFA,
        ra_offset: -8,
        fp_rule: reg::SAME,
        ..Default::default()
    };
    let start = UnwindRow {
        pc: 0x3000,
        cfa_rule: cfa::END,
        ra_rule: reg::UNKNOWN,
        ..Default::default()
    };
    vec![work, start]
}

/// `DEPTH` frames of `work` calling itself, the outermost called from
/// `_start`: a stack deeper than any frame-pointer walk of this code
/// (none) would find.
fn deep_stack() -> Vec<u8> {
    let mut stack = vec![0u8; (DEPTH * FRAME) as usize];
    for frame in 0..DEPTH {
        let return_to = if frame + 1 == DEPTH { 0x3010 } else { 0x1020 };
        let at = ((frame + 1) * FRAME - 8) as usize;
        stack[at..at + 8].copy_from_slice(&(BIAS + return_to).to_le_bytes());
    }
    stack
}

/// A sample taken before the process's tables were in the kernel: two
/// kernel frames, its frame-pointer user stack (the pc alone).
fn early_sample(ktime_ns: u64) -> Sample {
    let mut sample = crate::sampler::decode_sample(&[0u8; SAMPLE_HEADER_BYTES]).unwrap();
    sample.tgid = 42;
    sample.tid = 43;
    sample.ktime_ns = ktime_ns;
    sample.flags = reason::UNKNOWN_PROCESS << SAMPLE_UNWIND_SHIFT;
    sample.kernel_stack[..2].copy_from_slice(&[0xffff_ffff_8100_0000, 0xffff_ffff_8200_0000]);
    sample.kernel_stack_len = 2;
    sample.user_stack[0] = BIAS + 0x1004;
    sample.user_stack_len = 1;
    sample
}

fn copy(sample: &Sample, stack: Vec<u8>) -> EarlyCopy {
    EarlyCopy {
        tid: sample.tid,
        ktime_ns: sample.ktime_ns,
        flags: sample.flags,
        regs: Some([BIAS + 0x1004, SP, 0, 0]),
        stack,
    }
}

/// What the loader writes, late: the rows and the process's mapping.
fn load_tables(mirror: &SharedMirror) {
    load_tables_up_to(mirror, MAP_START + 0x10_0000);
}

/// [`load_tables`] with the mapping ending at `end`.
fn load_tables_up_to(mirror: &SharedMirror, end: u64) {
    load_rows(mirror, end, rows());
}

/// What the loader writes: `rows` and the process's mapping, up to `end`.
fn load_rows(mirror: &SharedMirror, end: u64, rows: Vec<UnwindRow>) {
    let mut mirror = mirror.write().unwrap();
    let mut mappings = ProcessMappings::default();
    mappings.mappings[0] = ExecMapping {
        start: MAP_START,
        end,
        bias: BIAS,
        table_start: 0,
        table_len: rows.len() as u32,
    };
    mappings.len = 1;
    // The rows map: chunk 0 holds them.
    let words = hostprof_unwind::pack(&rows);
    let mut chunk = RowChunk([0; ROW_CHUNK]);
    chunk.0[..words.len()].copy_from_slice(&words);
    mirror.chunks = Some(Box::new(move |index| (index == 0).then_some(chunk)));
    mirror.set(42, &mappings);
}

/// Loads the whole tables; the one sample held comes out walked to
/// `_start`, its copy freed.
fn comes_out_whole(early: &mut EarlyStacks, mirror: &SharedMirror) {
    load_tables(mirror);
    let out = early.ready(false);
    assert_eq!(out.len(), 1);
    let why = (out[0].flags >> SAMPLE_UNWIND_SHIFT) & 0xff;
    assert_eq!(why, reason::COMPLETE, "stopped: {}", reason::name(why));
    assert_eq!(out[0].user_stack_len as u64, DEPTH + 1);
    assert_eq!(early.bytes(), 0, "everything freed");
}

#[test]
fn a_deep_early_stack_is_unwound_to_start_when_its_tables_come_late() {
    let mirror = SharedMirror::default();
    let mut early = EarlyStacks::new(mirror.clone());
    let sample = early_sample(1);
    early.add_copy(copy(&sample, deep_stack()));
    assert!(early.hold(&sample));
    // No tables yet: the sample waits.
    assert!(early.ready(false).is_empty());
    assert_eq!(early.len(), 1);
    load_tables(&mirror);
    let out = early.ready(false);
    assert_eq!(out.len(), 1);
    let unwound = out[0];
    let why = (unwound.flags >> SAMPLE_UNWIND_SHIFT) & 0xff;
    assert_eq!(why, reason::COMPLETE, "stopped: {}", reason::name(why));
    assert_eq!(unwound.user_stack_len as u64, DEPTH + 1);
    assert_eq!(unwound.user_stack[DEPTH as usize], BIAS + 0x3010);
    assert_eq!(unwound.kernel_stack_len, 2);
    assert_eq!(unwound.kernel_stack[..2], sample.kernel_stack[..2]);
    let stats = early.stats();
    assert_eq!((stats.unwound, stats.complete, stats.dropped), (1, 1, 0));
    assert_eq!(early.bytes(), 0, "everything freed");
}

#[test]
fn a_walk_that_reached_an_unmapped_address_goes_on_once_it_is_mapped() {
    // Loaded while `_start`'s code was not mapped yet (it is past the
    // mapping's end): the kernel's walk stopped there, and so does the
    // host's with the same mappings.
    let mirror = SharedMirror::default();
    load_tables_up_to(&mirror, MAP_START + 0x2000);
    let mut early = EarlyStacks::new(mirror.clone());
    let mut sample = early_sample(1);
    sample.flags = reason::NO_MAPPING << SAMPLE_UNWIND_SHIFT;
    early.add_copy(copy(&sample, deep_stack()));
    assert!(early.hold(&sample));
    assert!(early.ready(false).is_empty(), "no new mapping: it waits");
    assert!(early.ready(false).is_empty(), "and is not walked again");
    assert_eq!(early.len(), 1);
    // The next load maps it: the walk reaches `_start`.
    comes_out_whole(&mut early, &mirror);

    // One that never gets past it leaves at the end, walked as far as it goes.
    let mirror = SharedMirror::default();
    load_tables_up_to(&mirror, MAP_START + 0x2000);
    let mut early = EarlyStacks::new(mirror.clone());
    early.add_copy(copy(&sample, deep_stack()));
    assert!(early.hold(&sample));
    assert!(early.ready(false).is_empty());
    let out = early.ready(true);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].flags >> SAMPLE_UNWIND_SHIFT) & 0xff,
        reason::NO_MAPPING
    );
    // `_start`'s return address is found, but not walked from.
    assert_eq!(out[0].user_stack_len as u64, DEPTH + 1);
    assert_eq!(out[0].user_stack[DEPTH as usize], BIAS + 0x3010);
    assert_eq!(early.bytes(), 0, "everything freed");
}

#[test]
fn a_walk_that_reached_a_function_not_loaded_asks_for_it_and_goes_on_once_it_is() {
    // A table for the code that runs, with `work` but not `_start`.
    let mirror = SharedMirror::default();
    let mut sparse = rows();
    sparse[1] = UnwindRow {
        pc: 0x3000,
        cfa_rule: cfa::NOT_LOADED,
        ..Default::default()
    };
    load_rows(&mirror, MAP_START + 0x10_0000, sparse);
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let asking = asked.clone();
    let mut early =
        EarlyStacks::new(mirror.clone()).wanting_functions(Box::new(move |pid, pc, stack| {
            asking.lock().unwrap().push((pid, pc));
            // The sample's registers and stack go along.
            assert_eq!(stack.pc(), BIAS + 0x1004);
        }));
    let mut sample = early_sample(1);
    sample.flags = reason::NOT_LOADED << SAMPLE_UNWIND_SHIFT;
    early.add_copy(copy(&sample, deep_stack()));
    assert!(early.hold(&sample));
    assert!(early.ready(false).is_empty(), "stopped at _start: it waits");
    // Asked for `_start`, inside the call that returns there.
    assert_eq!(*asked.lock().unwrap(), [(42, BIAS + 0x3010 - 1)]);
    assert!(early.ready(false).is_empty(), "and is not walked again");
    assert_eq!(asked.lock().unwrap().len(), 1);
    // The table grew: the walk reaches the end.
    comes_out_whole(&mut early, &mirror);
    assert_eq!(early.stats().complete, 1);
}

#[test]
fn a_copy_waits_for_a_sample_that_comes_batches_later() {
    let mut early = EarlyStacks::new(SharedMirror::default());
    let sample = early_sample(1);
    early.add_copy(copy(&sample, deep_stack()));
    // A batch without the sample (it waits in the reader, behind).
    assert!(early.ready(false).is_empty());
    assert!(early.hold(&sample), "the copy was kept for it");
    // A copy whose sample never comes goes at the end, counted.
    early.add_copy(copy(&early_sample(2), deep_stack()));
    let out = early.ready(true);
    assert_eq!(out.len(), 1);
    assert_eq!(early.stats().orphaned, 1);
    assert_eq!(early.bytes(), 0, "everything freed");
}

#[test]
fn a_held_sample_keeps_its_thread_context() {
    let mut sample = early_sample(1);
    sample.flags |= SAMPLE_FLAG_TRACE;
    sample.trace.span_id = [7; 8];
    let attrs = b"\x00\x05/cart";
    sample.trace.attrs_len = attrs.len() as u16;
    sample.attrs[..attrs.len()].copy_from_slice(attrs);
    let back = crate::sampler::decode_sample(&pack_sample(&sample)).expect("decodes");
    assert_eq!(back.trace.span_id, [7; 8]);
    assert_eq!(usize::from(back.trace.attrs_len), attrs.len());
    assert_eq!(&back.attrs[..attrs.len()], attrs);
    assert_eq!(back.user_stack[..2], sample.user_stack[..2]);
}

#[test]
fn a_thread_s_copies_share_their_unchanged_blocks() {
    let mut early = EarlyStacks::new(SharedMirror::default());
    let first = early_sample(1);
    early.add_copy(copy(&first, deep_stack()));
    assert!(early.hold(&first));
    let one = early.bytes();
    // The same callers, the leaf's frame rewritten.
    let mut stack = deep_stack();
    stack[..16].copy_from_slice(&[7; 16]);
    let second = early_sample(2);
    early.add_copy(copy(&second, stack));
    assert!(early.hold(&second));
    let two = early.bytes();
    assert!(
        two - one < one / 4,
        "first copy {one} bytes, the second added {}",
        two - one
    );
    // Tables never came: both go on as they were, their frame-pointer
    // stacks kept, and nothing stays held.
    let out = early.ready(true);
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].user_stack[..1], [BIAS + 0x1004]);
    assert_eq!(out[1].user_stack_len, 1);
    assert_eq!(early.stats().timed_out, 2);
    assert_eq!(early.bytes(), 0);
}

#[test]
fn copies_past_the_byte_budget_are_dropped_and_counted() {
    let mut early = EarlyStacks::new(SharedMirror::default());
    let mut taken = 0u64;
    // Distinct threads: nothing shared.
    for n in 0..(MAX_HELD_BYTES / 8192 + 64) as u64 {
        let mut sample = early_sample(n);
        sample.tid = 1000 + n as u32;
        early.add_copy(copy(&sample, vec![n as u8; 8192]));
        taken += u64::from(early.hold(&sample));
    }
    let stats = early.stats();
    assert!(stats.dropped > 0 && taken > 0, "{stats:?}, {taken} held");
    assert!(
        early.bytes() <= MAX_HELD_BYTES + (16 << 10),
        "{}",
        early.bytes()
    );
    assert_eq!(taken + stats.dropped, (MAX_HELD_BYTES / 8192 + 64) as u64);
}

/// `rows` in a rows map's chunk 0 and one mapping of `work`'s code, for
/// [`walk_copy`] (the unwind service's walk of a copy that asked).
fn walk_with(
    rows: &[UnwindRow],
    copy: &StackCopy,
    frames: &mut [u64],
    fill: &mut dyn FnMut(u64) -> Option<unwind::Lookup>,
) -> (usize, u32) {
    let mut mappings = ProcessMappings::default();
    mappings.mappings[0] = ExecMapping {
        start: MAP_START,
        end: MAP_START + 0x10_0000,
        bias: BIAS,
        table_start: 0,
        table_len: rows.len() as u32,
    };
    mappings.len = 1;
    let words = hostprof_unwind::pack(rows);
    let mut chunk = RowChunk([0; ROW_CHUNK]);
    chunk.0[..words.len()].copy_from_slice(&words);
    let read = move |index: u32| (index == 0).then_some(chunk);
    walk_copy(&mappings, Some(&read), copy, frames, fill)
}

/// A tenant's stack copy, walked on the host: garbage bytes, a rule that
/// never moves the stack pointer on, return addresses back into the same
/// function, functions that are never loaded. Every walk ends within the
/// frames it was given, asking for a missing function at most once a
/// frame, without a panic.
#[test]
fn hostile_stack_copies_are_walked_to_a_bounded_end() {
    let mut rng = crate::test_rng::XorShift::new(31);
    let mut frames = [0u64; 64];
    let mut asked = 0usize;
    let mut fill = |_pc: u64| {
        asked += 1;
        Some(unwind::Lookup::Row(rows()[0]))
    };
    // Garbage stacks and registers, with the real rules.
    for _ in 0..2000 {
        let len = rng.below(8192) as usize;
        let pc = match rng.below(3) {
            0 => BIAS + 0x1000 + rng.below(0x2100),
            1 => MAP_START + rng.below(0x20_0000),
            _ => rng.next_u64(),
        };
        let copy = StackCopy::new([pc, SP, rng.next_u64(), rng.next_u64()], &rng.bytes(len));
        let (walked, _) = walk_with(&rows(), &copy, &mut frames, &mut fill);
        assert!((1..=frames.len()).contains(&walked), "{walked} frames");
    }
    // `work`'s return address at the stack pointer, the stack pointer not
    // moved on: the same frame forever, cut at the frames given.
    let still = UnwindRow {
        cfa_offset: 0,
        ra_offset: 0,
        ..rows()[0]
    };
    let stack: Vec<u8> = std::iter::repeat_n((BIAS + 0x1004).to_le_bytes(), 1024)
        .flatten()
        .collect();
    let copy = StackCopy::new([BIAS + 0x1004, SP, 0, 0], &stack);
    let (walked, why) = walk_with(&[still, rows()[1]], &copy, &mut frames, &mut fill);
    assert!(walked <= frames.len());
    assert!(
        [reason::DEPTH_LIMIT, reason::BAD_FRAME].contains(&why),
        "stopped: {}",
        reason::name(why)
    );
    // Every function not loaded: each frame's is asked for, once a frame.
    asked = 0;
    let missing = UnwindRow {
        pc: 0x1000,
        cfa_rule: cfa::NOT_LOADED,
        ..Default::default()
    };
    let mut count = |_pc: u64| {
        asked += 1;
        Some(unwind::Lookup::Row(rows()[0]))
    };
    let (walked, why) = walk_with(
        &[missing, rows()[1]],
        &StackCopy::new([BIAS + 0x1004, SP, 0, 0], &deep_stack()),
        &mut frames,
        &mut count,
    );
    assert_eq!((walked, why), (frames.len(), reason::DEPTH_LIMIT));
    assert!(asked <= frames.len(), "{asked} asks for {walked} frames");
}

#[test]
fn frames_of_a_marked_mapping_are_marked_as_the_kernel_marks_them() {
    let mirror = SharedMirror::default();
    let mut early = EarlyStacks::new(mirror.clone());
    let sample = early_sample(1);
    early.add_copy(copy(&sample, deep_stack()));
    assert!(early.hold(&sample));
    load_tables(&mirror);
    {
        // The mapping marks its frames (an interpreter's loop, say).
        let mut mirror = mirror.write().unwrap();
        let mut mappings = mirror.processes[&42];
        mappings.mappings[0].set_mark(3);
        mirror.set(42, &mappings);
    }
    let out = early.ready(false);
    assert_eq!(out.len(), 1);
    let frames = &out[0].user_stack[..out[0].user_stack_len as usize];
    assert_eq!(frames.len() as u64, DEPTH + 1);
    // Each frame walked from carries the mark; the last, never left, none.
    let (last, walked) = frames.split_last().unwrap();
    assert!(
        walked
            .iter()
            .all(|&entry| hostprof_unwind::stack_mark(entry) == 3)
    );
    assert_eq!(hostprof_unwind::without_mark(walked[0]), BIAS + 0x1004);
    assert_eq!(*last, BIAS + 0x3010);
}
