//! In-kernel unwinding of code built without frame pointers: the real eBPF
//! sampler on C, C++ and Rust programs, checked for complete stacks and
//! against `perf record --call-graph dwarf` on the same programs.
mod common;

use std::{collections::HashMap, path::Path, process::Command};

use common::*;
use hostprof::sampler::{Sampler, SamplerOptions};
use hostprof_unwind::reason;

const FLAGS: &[&str] = &["-O2", "-fomit-frame-pointer", "-g"];

fn record(program: &Path, args: &[&str], extra: &[&str]) -> (Vec<(Vec<String>, u64)>, String) {
    let output = run_ok(
        hostprof()
            .args(["record", "-F", "999", "-o", "-"])
            .args(extra)
            .arg("--")
            .arg(program)
            .args(args),
    );
    (
        parse_folded(&String::from_utf8_lossy(&output.stdout)),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// (samples of `comm`, those with `main` on the stack).
fn reach_main(stacks: &[(Vec<String>, u64)], comm: &str) -> (u64, u64) {
    let of_comm = stacks.iter().filter(|(frames, _)| frames[0] == comm);
    let total = of_comm.clone().map(|(_, count)| count).sum();
    let complete = of_comm
        .filter(|(frames, _)| frames.iter().any(|frame| frame == "main"))
        .map(|(_, count)| count)
        .sum();
    (total, complete)
}

fn assert_complete(stacks: &[(Vec<String>, u64)], comm: &str, stderr: &str) {
    let (total, complete) = reach_main(stacks, comm);
    assert!(total >= 300, "only {total} samples of {comm}\n{stderr}");
    assert!(
        complete as f64 >= 0.99 * total as f64,
        "{complete} of {total} samples of {comm} reach main\n{stderr}"
    );
}

/// Leaf function shares of `perf record --call-graph dwarf` on the command.
fn perf_leaf_shares(name: &str, command: &[&str]) -> HashMap<String, f64> {
    let data = work_dir().join(format!("{name}.perf.data"));
    run_ok(
        Command::new("perf")
            .args(["record", "-q", "-F", "999", "--call-graph", "dwarf", "-o"])
            .arg(&data)
            .arg("--")
            .args(command),
    );
    let script = run_ok(
        Command::new("perf")
            .args(["script", "-F", "comm,ip,sym", "-i"])
            .arg(&data),
    );
    let text = String::from_utf8_lossy(&script.stdout);
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut total = 0;
    for block in text.split("\n\n") {
        let mut lines = block.lines().filter(|line| !line.trim().is_empty());
        let Some(comm) = lines.next() else { continue };
        if comm.trim() != name {
            continue;
        }
        let leaf = lines
            .next()
            .and_then(|line| line.split_whitespace().nth(1))
            .unwrap_or("[unknown]");
        *counts.entry(leaf.to_string()).or_default() += 1;
        total += 1;
    }
    assert!(total >= 300, "perf recorded only {total} samples of {name}");
    counts
        .into_iter()
        .map(|(function, count)| (function, count as f64 / total as f64))
        .collect()
}

/// hostprof's leaf shares match perf's within `tolerance` for `functions`
/// (a C++ name carries its parameters in hostprof, not in perf: `ours=theirs`).
fn assert_matches_perf(
    stacks: &[(Vec<String>, u64)],
    name: &str,
    command: &[&str],
    functions: &[&str],
    tolerance: f64,
) {
    if !require_tool("perf") {
        return;
    }
    let perf = perf_leaf_shares(name, command);
    for function in functions {
        let (function, perf_name) = function.split_once('=').unwrap_or((function, function));
        let ours = leaf_share(stacks, name, function);
        let theirs = perf.get(perf_name).copied().unwrap_or(0.0);
        assert!(
            theirs > 0.05,
            "perf barely sees {function} ({theirs:.3}): {perf:?}"
        );
        assert!(
            (ours - theirs).abs() <= tolerance,
            "{function}: hostprof {ours:.3}, perf {theirs:.3}"
        );
    }
}

#[test]
fn c_without_frame_pointers_reaches_main_and_matches_perf() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = build_c("unwind_c.c", "unwind_split", FLAGS);
    let (stacks, stderr) = record(&program, &["split", "3"], &[]);
    assert_complete(&stacks, "unwind_split", &stderr);
    // The designed 3:1 split, seen through complete stacks.
    let hot = leaf_share(&stacks, "unwind_split", "hot_work");
    assert!((hot - 0.75).abs() < 0.08, "hot_work {hot:.3}\n{stderr}");
    assert!(stderr.contains("0 did not fit"), "{stderr}");
    let command = [program.to_str().unwrap(), "split", "3"];
    assert_matches_perf(
        &stacks,
        "unwind_split",
        &command,
        &["hot_work", "cold_work"],
        0.08,
    );
}

#[test]
fn frame_pointer_mode_loses_the_callers_of_the_same_program() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    // The control: the same binary under --unwind fp rarely reaches main,
    // so the completeness above is the unwinder's doing.
    let program = build_c("unwind_c.c", "unwind_fp", FLAGS);
    let (stacks, stderr) = record(&program, &["split", "1"], &["--unwind", "fp"]);
    let (total, complete) = reach_main(&stacks, "unwind_fp");
    assert!(total >= 150, "only {total} samples\n{stderr}");
    assert!(
        (complete as f64) < 0.5 * total as f64,
        "{complete} of {total} frame-pointer stacks reach main"
    );
    assert!(!stderr.contains("unwound with tables"), "{stderr}");
}

#[test]
fn qsort_callback_through_libc_reaches_main() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = build_c("unwind_c.c", "unwind_qsort", FLAGS);
    let (stacks, stderr) = record(&program, &["qsort", "3"], &[]);
    assert_complete(&stacks, "unwind_qsort", &stderr);
    // The comparator is called from libc (no frame pointers there either),
    // and run_qsort sits below libc's frames.
    let through_libc: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames[0] == "unwind_qsort")
        .filter(|(frames, _)| {
            let at = |name: &str| frames.iter().position(|frame| frame == name);
            matches!(
                (at("run_qsort"), at("compare_slowly")),
                (Some(caller), Some(callback)) if caller + 1 < callback
            )
        })
        .map(|(_, count)| count)
        .sum();
    let (total, _) = reach_main(&stacks, "unwind_qsort");
    assert!(
        through_libc as f64 >= 0.5 * total as f64,
        "{through_libc} of {total} samples in the comparator under libc\n{stderr}"
    );
    let command = [program.to_str().unwrap(), "qsort", "3"];
    assert_matches_perf(&stacks, "unwind_qsort", &command, &["compare_slowly"], 0.1);
}

#[test]
fn deep_recursion_is_unwound_to_main() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = build_c("unwind_c.c", "unwind_deep", FLAGS);
    let (stacks, stderr) = record(&program, &["recurse", "3"], &[]);
    assert_complete(&stacks, "unwind_deep", &stderr);
    let deepest = stacks
        .iter()
        .filter(|(frames, _)| frames[0] == "unwind_deep")
        .map(|(frames, _)| frames.iter().filter(|frame| *frame == "recurse").count())
        .max()
        .unwrap_or(0);
    assert_eq!(deepest, 81, "recurse(80) has 81 frames\n{stderr}");
}

/// The programs for Linux 5.10 to 5.16 (tail calls, registers from the
/// task's kernel stack), forced on this kernel: the same complete stacks,
/// the same split, and recursion as deep as the modern variant sees it
/// (`cargo xtask vmtest` runs them on a real 5.10).
#[test]
fn legacy_variant_reaches_main_and_walks_deep_recursion() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = build_c("unwind_c.c", "unwind_legacy", FLAGS);
    let record_legacy = |args: &[&str]| {
        let output = run_ok(
            hostprof()
                .env(hostprof::sampler::VARIANT_ENV, "legacy")
                .args(["record", "-F", "999", "--log-level", "info", "-o", "-"])
                .arg("--")
                .arg(&program)
                .args(args),
        );
        (
            parse_folded(&String::from_utf8_lossy(&output.stdout)),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (stacks, stderr) = record_legacy(&["split", "3"]);
    assert!(stderr.contains("bounded loops"), "{stderr}");
    assert_complete(&stacks, "unwind_legacy", &stderr);
    let hot = leaf_share(&stacks, "unwind_legacy", "hot_work");
    assert!((hot - 0.75).abs() < 0.08, "hot_work {hot:.3}\n{stderr}");
    let (stacks, stderr) = record_legacy(&["recurse", "3"]);
    assert_complete(&stacks, "unwind_legacy", &stderr);
    let deepest = stacks
        .iter()
        .filter(|(frames, _)| frames[0] == "unwind_legacy")
        .map(|(frames, _)| frames.iter().filter(|frame| *frame == "recurse").count())
        .max()
        .unwrap_or(0);
    assert_eq!(deepest, 81, "recurse(80) has 81 frames\n{stderr}");
}

#[test]
fn cpp_and_rust_release_builds_reach_main() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let cpp = work_dir().join("unwind_cpp");
    run_ok(
        Command::new("c++")
            .args(FLAGS)
            .arg("-o")
            .arg(&cpp)
            .arg(program_source("unwind_cpp.cpp")),
    );
    let (stacks, stderr) = record(&cpp, &["3"], &[]);
    assert_complete(&stacks, "unwind_cpp", &stderr);
    let work = leaf_share(&stacks, "unwind_cpp", "shapes::Square::work()");
    assert!(work > 0.8, "Square::work {work:.3}\n{stderr}");
    let command = [cpp.to_str().unwrap(), "3"];
    assert_matches_perf(
        &stacks,
        "unwind_cpp",
        &command,
        &["shapes::Square::work()=shapes::Square::work"],
        0.08,
    );

    let rust = work_dir().join("unwind_rust");
    run_ok(
        Command::new("rustc")
            .args(["-O", "-g", "--crate-name", "unwind_rust", "-o"])
            .arg(&rust)
            .arg(program_source("unwind_rust.rs")),
    );
    let (stacks, stderr) = record(&rust, &["3"], &[]);
    assert_complete(&stacks, "unwind_rust", &stderr);
    let with_stage: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames[0] == "unwind_rust")
        .filter(|(frames, _)| {
            frames.iter().any(|frame| frame == "unwind_rust::stage")
                && frames.iter().any(|frame| frame == "unwind_rust::main")
        })
        .map(|(_, count)| count)
        .sum();
    let (total, _) = reach_main(&stacks, "unwind_rust");
    assert!(
        with_stage as f64 >= 0.9 * total as f64,
        "{with_stage} of {total} Rust samples go main -> stage\n{stderr}"
    );
}

/// Records `program` with `--stack-copy 8192` and replays every snapshot
/// on the host through the same unwinder core: the host's frames must be
/// the kernel's, but for stacks deeper than the copy (the host then stops
/// at a read fault, on a prefix of the kernel's frames). At least 99 % of
/// the copies hold stack bytes, 8 KiB or up to the top of the stack.
fn assert_replay_matches_kernel(program: &Path, args: &[&str]) {
    use hostprof::unwind::replay::{self, RecordedSample};
    let name = program.file_name().unwrap().to_string_lossy().into_owned();
    let dir = work_dir().join(format!("{name}.stacks"));
    let _ = std::fs::remove_dir_all(&dir);
    let output = run_ok(
        hostprof()
            .args([
                "record",
                "-F",
                "199",
                "--stack-copy",
                "8192",
                "--stack-copy-dir",
            ])
            .arg(&dir)
            .arg("--")
            .arg(program)
            .args(args),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let (mut tables, mut same, mut short, mut behind, mut empty, mut copies) = (0, 0, 0, 0, 0, 0);
    let mut differ = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the stack copy dir") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "stack") {
            continue;
        }
        let data = std::fs::read(path).unwrap();
        let recorded = RecordedSample::read(&data).expect("a stack copy file");
        let stack = &recorded.snapshot.memory[0].1;
        // Empty only where the kernel cannot read the stack at all (e.g. a
        // sample in the middle of exec, old sp, new memory).
        empty += usize::from(stack.is_empty());
        copies += 1;
        assert!(stack.len() <= 8192);
        if !recorded.unwound_with_tables() {
            continue;
        }
        tables += 1;
        let (frames, why) =
            replay::unwind(&recorded.snapshot, hostprof_common::MAX_USER_STACK_DEPTH);
        let kernel_why = (recorded.flags >> hostprof_common::SAMPLE_UNWIND_SHIFT) & 0xff;
        if frames == recorded.kernel_frames {
            same += 1;
        } else if why == reason::READ_FAULT && recorded.kernel_frames.starts_with(&frames) {
            // The kernel read further up than the copy goes.
            short += 1;
        } else if matches!(kernel_why, reason::NO_TABLE | reason::NO_MAPPING)
            && frames.starts_with(&recorded.kernel_frames)
        {
            // The kernel stopped in a library whose table it did not have
            // yet (tables load after a process's first samples); the host,
            // with every table, goes on along the same path.
            behind += 1;
        } else {
            differ.push(format!(
                "kernel {:x?} (stopped: {kernel_why})\nhost   {frames:x?} (stopped: {why})",
                recorded.kernel_frames
            ));
        }
    }
    assert!(
        tables >= 200,
        "only {tables} table-unwound samples\n{stderr}"
    );
    assert!(
        empty * 100 <= copies,
        "{empty} of {copies} samples carry no stack bytes\n{stderr}"
    );
    assert!(
        differ.is_empty(),
        "{} of {tables} replays differ from the kernel's unwind:\n{}",
        differ.len(),
        differ[..differ.len().min(5)].join("\n")
    );
    assert!(
        same as f64 >= 0.95 * tables as f64,
        "{same} of {tables} replays equal the kernel's ({short} cut by the 8 KiB copy, \
         {behind} where the kernel lacked a table yet)"
    );
    assert!(stderr.contains("snapshots written"), "{stderr}");
}

#[test]
fn stack_copies_replay_on_the_host_to_the_kernels_frames() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let program = build_c("unwind_c.c", "unwind_copy_qsort", FLAGS);
    assert_replay_matches_kernel(&program, &["qsort", "2"]);
    let program = build_c("unwind_c.c", "unwind_copy_deep", FLAGS);
    assert_replay_matches_kernel(&program, &["recurse", "2"]);
}

/// Reads every record the ring holds after `options` sampled a busy
/// program 60 times: their sizes.
fn ring_record_sizes(options: SamplerOptions) -> Vec<usize> {
    let program = build_c("unwind_c.c", "unwind_ring", FLAGS);
    // Killed once sampled enough.
    let mut child = Command::new(&program)
        .args(["split", "60"])
        .spawn()
        .expect("start the program");
    let mut sampler = Sampler::start(&SamplerOptions {
        pids: Some(vec![child.id()]),
        frequency_hz: 199,
        ..options
    })
    .expect("start the sampler");
    let mut ring = sampler.take_ring().expect("the ring");
    running::wait_for(std::time::Duration::from_secs(60), || {
        let counters = sampler.counters().ok()?;
        (counters.get(hostprof_common::Counter::Submitted) >= 60).then_some(())
    })
    .expect("the program was not sampled 60 times");
    sampler.stop();
    let _ = child.kill();
    let _ = child.wait();
    let mut sizes = Vec::new();
    while let Some(record) = ring.next() {
        if let Some(copy) = hostprof::sampler::decode_stack_copy(&record) {
            assert!(copy.regs.is_some() && !copy.stack.is_empty());
        } else {
            // A bare sample is as long as its frames need.
            let sample = hostprof::sampler::decode_sample(&record).expect("a sample");
            let frames = (sample.kernel_stack_len + sample.user_stack_len) as usize;
            assert_eq!(
                record.len(),
                hostprof_common::SAMPLE_HEADER_BYTES + 8 * frames
            );
            assert!(sample.user_stack_len > 0 && sample.user_stack[0] != 0);
        }
        sizes.push(record.len());
    }
    assert!(sizes.len() >= 50, "only {} records", sizes.len());
    sizes
}

#[test]
fn stack_memory_leaves_the_kernel_only_when_asked_or_early() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    // Early copies off (`--no-early-stack-copy`): every record is a bare
    // Sample (frames, no memory), only as long as its frames.
    let sizes = ring_record_sizes(SamplerOptions {
        early_copy_bytes: 0,
        ..Default::default()
    });
    let sample = std::mem::size_of::<hostprof_common::Sample>();
    assert!(
        sizes.iter().all(|size| *size < sample),
        "records as long as a whole Sample ({sample}): {sizes:?}"
    );
    // By default only samples of a process whose tables are not loaded
    // carry a copy (here none are: nothing loads them), for the agent to
    // unwind and free (tests/procs.rs checks no output ever holds it).
    let sizes = ring_record_sizes(SamplerOptions::default());
    let with_stack = std::mem::size_of::<hostprof_common::StackSample>();
    assert!(sizes.iter().all(|size| *size == with_stack), "{sizes:?}");
    // The control: asked for, each record carries the stack.
    let sizes = ring_record_sizes(SamplerOptions {
        stack_copy_bytes: 4096,
        early_copy_bytes: 0,
        ..Default::default()
    });
    assert!(sizes.iter().all(|size| *size == with_stack), "{sizes:?}");
}

/// What the table unwinder costs every start: the verifier's walk of the
/// sampling program. LLVM once turned the branch-free mapping search's
/// arithmetic into conditional jumps without a sound change in the
/// source, and the walk grew tenfold (82,000 instructions, 80 ms of
/// every `record`); the bound catches that kind of silent growth.
#[test]
fn the_table_unwinder_loads_without_a_long_verifier_walk() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let sampler = Sampler::load(&SamplerOptions::default()).expect("load the sampler");
    let stats = sampler.program_stats().expect("the program's info");
    let Some(walked) = stats.verified_instructions else {
        // Linux before 5.16 does not report it.
        return;
    };
    // Python's, HotSpot's and V8's walks, the kernel-stack search and the
    // thread-context read included: about 24,700 on Linux 6.18, 24,791
    // with its DTV reads for dynamic TLS (7,400 before the JIT runtimes'
    // steps and the thread context, whose reads' branches each double the
    // states of the rest of the record's fill); 45,103 with the Go labels'
    // read (its branch doubles them again; the CI run that first met it
    // had a bound of 40,000). Linux 6.18.44's verifier walks a `bpf_loop`
    // callback until its state converges: the row search's probes, their
    // search on the stack, made it 184,000 (0.39 s of every start), 92,000
    // once the search lived in map memory, about 115,000 with the frames'
    // marks. The bound still catches the growth above.
    println!("the verifier walked {walked} instructions to load sample_cpu");
    assert!(
        (1_000..160_000).contains(&walked),
        "the verifier walked {walked} instructions to load sample_cpu"
    );
}

/// `record` and `top` start with the lean sampling program (no JIT
/// runtimes' walks, no Go labels), whose verifier walk is at most three
/// fifths of the whole program's, and replace it with the whole one, which then
/// samples, once a process needs it.
#[test]
fn the_lean_program_verifies_in_a_fraction_and_gives_way_to_the_whole_one() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    let options = SamplerOptions {
        lean_start: true,
        bpf_stats: true,
        frequency_hz: 999,
        ..Default::default()
    };
    let mut sampler = Sampler::load(&options).expect("load the sampler");
    assert!(
        sampler.can_upgrade(),
        "Linux 6.18 runs the modern variant, which has a lean program"
    );
    // A lean start loads its program when told (after its caller looked
    // at the processes it names).
    let unloaded = sampler.program_stats().expect("no program's info");
    assert_eq!(unloaded.verified_instructions, None);
    sampler
        .load_sampling_program()
        .expect("load the lean program");
    let lean = sampler.program_stats().expect("the program's info");
    sampler.start_sampling(999).expect("start sampling");
    // The lean program samples (every CPU's events run it).
    let runs = |sampler: &Sampler| sampler.program_stats().expect("the program's info").runs;
    let minute = std::time::Duration::from_secs(60);
    let first = running::spin_for(minute, || (runs(&sampler) >= 100).then_some(()));
    assert!(
        first.is_some(),
        "no 100 runs of the lean program in {minute:?}"
    );
    assert!(sampler.upgrade().expect("load the whole program"));
    assert!(!sampler.can_upgrade());
    assert!(!sampler.upgrade().expect("nothing to do"));
    let both = sampler.program_stats().expect("the programs' info");
    if let (Some(lean), Some(both)) = (lean.verified_instructions, both.verified_instructions) {
        let whole = both - lean;
        println!(
            "the verifier walked {lean} instructions for the lean program, {whole} for the whole one"
        );
        // Both carry the native unwinder, whose share of the lean one's
        // walk is most of it: 9,653 of the lean program's instructions
        // against 18,187 for the whole one on Linux 6.18, once the
        // unwinder read the stack through its window (8,706 before); on
        // 6.18.44, whose verifier walks its callback until it converges,
        // about 70,000 against 115,000.
        assert!(
            lean >= 1_000 && lean * 4 < whole * 3,
            "lean {lean}, whole {whole}"
        );
    }
    // The whole program samples on after the lean one left the events.
    let after = runs(&sampler);
    let later = running::spin_for(minute, || (runs(&sampler) >= after + 100).then_some(()));
    assert!(
        later.is_some(),
        "no 100 runs after the upgrade in {minute:?}"
    );
    sampler.stop();
}

/// The number just before `word` in `line` ("… 12 hits, …").
fn number_before(line: &str, word: &str) -> u64 {
    let at = line.find(word).unwrap_or_else(|| panic!("{word}: {line}"));
    let digits = line[..at].trim_end();
    let start = digits
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    digits[start..].parse().unwrap()
}

/// The `hostprof: unwind table cache: …` line's (hits, misses, corrupt).
fn cache_line(stderr: &str) -> (u64, u64, u64) {
    let line = stderr
        .lines()
        .find_map(|line| line.strip_prefix("hostprof: unwind table cache: "))
        .unwrap_or_else(|| panic!("no cache line\n{stderr}"));
    let number_before = |word: &str| number_before(line, word);
    (
        number_before(" hits"),
        number_before(" misses"),
        number_before(" corrupt"),
    )
}

/// The `hostprof: unwind files: …` line's (tables from the cache unread,
/// files read only to find a cached table, memo entries loaded, memo
/// files ignored as corrupt).
fn files_line(stderr: &str) -> (u64, u64, u64, u64) {
    let line = stderr
        .lines()
        .find_map(|line| line.strip_prefix("hostprof: unwind files: "))
        .unwrap_or_else(|| panic!("no unwind files line\n{stderr}"));
    let number_before = |word: &str| number_before(line, word);
    (
        number_before(" tables from the cache unread"),
        number_before(" only to find a cached table"),
        number_before(" loaded"),
        number_before(" corrupt"),
    )
}

#[test]
fn a_second_record_takes_the_table_from_the_cache() {
    let Some(_serial) = require_ebpf() else {
        return;
    };
    use sha2::Digest;
    let program = build_c("unwind_c.c", "unwind_cached", FLAGS);
    let dir = work_dir().join("table-cache");
    let _ = std::fs::remove_dir_all(&dir);
    let cache = ["--unwind-cache-dir", dir.to_str().unwrap()];
    let hex: String = sha2::Sha256::digest(std::fs::read(&program).unwrap())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let file = dir.join(format!("{hex}.table"));

    // Cold: every table built, and stored.
    let (stacks, stderr) = record(&program, &["split", "2"], &cache);
    assert_complete(&stacks, "unwind_cached", &stderr);
    let (hits, misses, corrupt) = cache_line(&stderr);
    assert!(misses >= 1 && corrupt == 0, "{stderr}");
    assert!(file.exists(), "no {}\n{stderr}", file.display());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&dir).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700);

    // Warm: the program's table (and libc's…) from the cache, the
    // program's file among them (a hit refreshes its time). Not as many
    // as the cold run built: that one may also have loaded the child
    // before its exec (hostprof's own image), or another process.
    let stored = std::fs::metadata(&file).unwrap().modified().unwrap();
    let (stacks, stderr) = record(&program, &["split", "2"], &cache);
    assert_complete(&stacks, "unwind_cached", &stderr);
    let (warm_hits, _, _) = cache_line(&stderr);
    assert!(warm_hits >= 1, "cold {hits}/{misses}\n{stderr}");
    let used = std::fs::metadata(&file).unwrap().modified().unwrap();
    assert!(
        used > stored,
        "the program's table was not taken from the cache\n{stderr}"
    );
    // And without reading the program's file (nor any other whose table
    // was cached): its content id came from the memo the cold run left.
    let (unread, read_for_cached, loaded, _) = files_line(&stderr);
    assert!(loaded >= 1 && unread >= 1, "{stderr}");
    assert_eq!(
        read_for_cached, 0,
        "a cached table's file was read\n{stderr}"
    );
    let memo = dir.join("file-ids.memo");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&memo).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    // Damaged: ignored and counted, the table built again, stacks complete.
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();
    let (stacks, stderr) = record(&program, &["split", "2"], &cache);
    assert_complete(&stacks, "unwind_cached", &stderr);
    let (_, _, corrupt) = cache_line(&stderr);
    assert!(corrupt == 1, "{stderr}");

    // Changed: same path, new bytes and times: hashed again (a table under
    // its new content id), never mistaken for the old file.
    let mut bytes = std::fs::read(&program).unwrap();
    bytes.extend_from_slice(b"changed");
    std::fs::write(&program, &bytes).unwrap();
    let changed: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let (stacks, stderr) = record(&program, &["split", "2"], &cache);
    assert_complete(&stacks, "unwind_cached", &stderr);
    assert!(
        dir.join(format!("{changed}.table")).exists(),
        "the changed program was not hashed again\n{stderr}"
    );

    // A damaged memo: ignored and counted, stacks complete.
    let mut bytes = std::fs::read(&memo).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&memo, &bytes).unwrap();
    let (stacks, stderr) = record(&program, &["split", "2"], &cache);
    assert_complete(&stacks, "unwind_cached", &stderr);
    let (_, _, loaded, corrupt) = files_line(&stderr);
    assert_eq!((loaded, corrupt), (0, 1), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
