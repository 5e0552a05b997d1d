//! `hostprof record`: sample for a while, then write a profile (folded, SVG,
//! pprof, OTLP protobuf or JSON) and a summary.
use std::{
    fs::File,
    io::{self, BufWriter, Write},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use super::{
    OutputFormat, RecordArgs,
    output::{Output, write_output},
    progress::{Live, Progress},
    session::{Mode, Session},
};
use crate::{
    output::Summary,
    pipeline::SampleSink,
    procs,
    profile::ResourceConfig,
    sampler::{Counters, ReaderStats, Sampler, SamplerOptions},
};

/// Wall-clock time in Unix nanoseconds.
pub(super) fn unix_nanos_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|time| time.as_nanos() as u64)
        .unwrap_or(0)
}

pub async fn run(args: RecordArgs) -> anyhow::Result<()> {
    let format = OutputFormat::chosen(args.format, args.output.as_deref())?;
    for pid in &args.pids {
        if !procs::is_alive(*pid) {
            bail!("no process with pid {pid}: check it with `ps -p {pid}`");
        }
    }
    let pids = (!args.pids.is_empty() || !args.command.is_empty()).then(|| args.pids.clone());
    let (unwind, unwind_chunks) = args.unwind.options();
    let options = SamplerOptions {
        unwind,
        unwind_chunks,
        frequency_hz: args.frequency,
        pids,
        bpf_stats: args.bpf_stats,
        // A command's children are part of it (as with perf); -p means just those.
        follow_children: !args.command.is_empty(),
        off_cpu: args.off_cpu.options(),
        stack_copy_bytes: args.stack_copy.unwrap_or(0),
        ..Default::default()
    };
    let (copies, stack_copies) = match args.stack_copy {
        Some(_) => {
            let (tx, rx) = std::sync::mpsc::channel();
            let dir = args.stack_copy_dir.clone();
            if let Some(dir) = &dir {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            let thread = std::thread::Builder::new()
                .name("hostprof-stack-copy".into())
                .spawn(move || keep_stack_copies(rx, dir.as_deref()))
                .context("cannot start the stack copy thread")?;
            (Some(tx), Some(thread))
        }
        None => (None, None),
    };
    let start = unix_nanos_now();
    let cpu_period_ns = 1_000_000_000 / args.frequency;
    let resource = match format {
        Some(OutputFormat::Otlp | OutputFormat::OtlpJson) => ResourceConfig::from_env(None)?,
        _ => ResourceConfig::default(),
    };
    let mut output = Output::new(
        format,
        args.frequency,
        start,
        args.off_cpu.enabled.then_some(cpu_period_ns),
        resource,
    );
    let live = Arc::new(Live::default());
    let worker_live = live.clone();
    let mut session = Session::start(
        &options,
        args.symbols.options(super::RECORD_SYMBOL_CACHE_MIB),
        Mode::Record,
        copies,
        move |batches| {
            let mut summary = Summary::new();
            for batch in batches {
                for sample in &batch {
                    output.push(sample);
                    summary.push(sample);
                }
                worker_live.update(batch.len(), summary.samples(), summary.processes());
            }
            (output, summary)
        },
    )?;
    let progress = Progress::on_terminal(live, session.reader_progress.clone(), args.duration);

    let started = Instant::now();
    let mut child = match args.command.as_slice() {
        [] => None,
        command => Some(spawn_profiled(command, &mut session.sampler)?),
    };
    let why = wait_for_end(
        &args,
        child.as_mut(),
        &mut session.sampler,
        progress.as_ref(),
    )
    .await?;
    if let Some(progress) = &progress {
        progress.clear();
    }
    let elapsed = started.elapsed();

    let finished = session.stop(None).await?;
    let (output, summary) = finished.output;
    if let (Some(path), Some(format)) = (&args.output, format) {
        let end = unix_nanos_now();
        write_output(path, |out| output.write(format, end, "hostprof", out))?;
    }
    eprint!(
        "{}",
        report(
            &args,
            elapsed,
            why,
            &finished.counters,
            &finished.reader,
            &summary
        )
    );
    eprint!("{}", unwind_report(&finished.counters, finished.unwind));
    if let Some(thread) = stack_copies {
        // The reader, which held the sender, has stopped: the thread ends.
        let kept = thread
            .join()
            .map_err(|_| anyhow::anyhow!("the stack copy thread panicked"))??;
        eprintln!(
            "hostprof: stack copies: {} samples carried {} bytes of user stack each (or less at \
             the top of a stack){}",
            finished.reader.stack_copies,
            args.stack_copy.unwrap_or(0),
            match &args.stack_copy_dir {
                Some(dir) => format!("; {kept} snapshots written to {}", dir.display()),
                None => String::new(),
            }
        );
    }
    if args.bpf_stats {
        let (run_time, runs) = finished.program_stats;
        eprintln!(
            "hostprof: eBPF program ran {runs} times, {:.0} ns per run",
            run_time.as_nanos() as f64 / runs.max(1) as f64
        );
    }
    if let Some(mut child) = child
        && let Ok(Some(status)) = child.try_wait()
        && !status.success()
    {
        eprintln!("hostprof: the profiled command exited with {status}");
    }
    Ok(())
}

/// Turns `--stack-copy` records into snapshots (with the process's
/// mappings, read when its first copy arrives and again when a frame falls
/// outside them) and writes them to `dir`; returns how many were written.
fn keep_stack_copies(
    copies: std::sync::mpsc::Receiver<crate::sampler::StackCopy>,
    dir: Option<&Path>,
) -> anyhow::Result<u64> {
    use crate::unwind::replay::{RecordedSample, SnapshotMapping, process_mappings, save_vdso};
    // The vDSO is no file: the snapshots name a copy of it.
    let vdso = dir.map(|dir| dir.join("vdso.so"));
    let vdso = vdso.filter(|path| match save_vdso(path) {
        Ok(()) => true,
        Err(err) => {
            tracing::warn!("cannot save the vDSO for the snapshots: {err}");
            false
        }
    });
    let mut mappings: std::collections::HashMap<u32, Vec<SnapshotMapping>> = Default::default();
    let mut written = 0;
    for copy in copies {
        let Some(dir) = dir else { continue };
        let tgid = copy.sample.tgid;
        let frames = &copy.sample.user_stack
            [..(copy.sample.user_stack_len as usize).min(copy.sample.user_stack.len())];
        let known = mappings.get(&tgid).is_some_and(|maps| {
            frames
                .iter()
                .all(|pc| maps.iter().any(|m| (m.start..m.end).contains(pc)))
        });
        if !known && let Ok(fresh) = process_mappings(tgid, vdso.as_deref()) {
            mappings.insert(tgid, fresh);
        }
        let Some(maps) = mappings.get(&tgid) else {
            // Gone before its first copy was read: nothing to replay with.
            continue;
        };
        let Some(recorded) = RecordedSample::new(&copy, maps.clone()) else {
            continue;
        };
        let path = dir.join(format!(
            "{}-{}-{}.stack",
            recorded.tgid, recorded.tid, recorded.ktime_ns
        ));
        let mut out = BufWriter::new(
            File::create(&path).with_context(|| format!("cannot create {}", path.display()))?,
        );
        recorded
            .write(&mut out)
            .and_then(|()| out.flush())
            .with_context(|| format!("cannot write {}", path.display()))?;
        written += 1;
    }
    Ok(written)
}

/// Why the recording ended.
#[derive(Clone, Copy, Debug)]
enum End {
    Duration,
    Interrupted,
    CommandExited,
    ProcessesExited,
}

/// The line `record` prints on stderr once it samples and Ctrl-C ends the
/// recording (rather than killing hostprof): scripts and tests wait for it.
pub const RECORDING_LINE: &str = "hostprof: recording";

async fn wait_for_end(
    args: &RecordArgs,
    child: Option<&mut tokio::process::Child>,
    sampler: &mut Sampler,
    progress: Option<&Progress>,
) -> anyhow::Result<End> {
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot handle SIGINT")?;
    eprintln!("{RECORDING_LINE} at {} Hz (Ctrl-C to stop)", args.frequency);
    // A followed command tree adds pids to the filter; drop the exited ones.
    let following = child.is_some();
    let duration = async {
        match args.duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    let command = async {
        match child {
            Some(child) => {
                let _ = child.wait().await;
            }
            None => std::future::pending().await,
        }
    };
    let targets = async {
        if args.pids.is_empty() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if !args.pids.iter().any(|pid| procs::is_alive(*pid)) {
                return;
            }
        }
    };
    // Once a second: prune the filter, and redraw the progress line.
    let sweep = async {
        if !following && progress.is_none() {
            return std::future::pending().await;
        }
        if let Some(progress) = progress {
            progress.show(sampler.counters().ok().as_ref());
        }
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if following && let Err(err) = sampler.forget_exited_pids() {
                tracing::warn!("cannot prune the process filter: {err}");
            }
            if let Some(progress) = progress {
                progress.show(sampler.counters().ok().as_ref());
            }
        }
    };
    Ok(tokio::select! {
        _ = duration => End::Duration,
        _ = sweep => End::Duration,
        _ = interrupt.recv() => End::Interrupted,
        _ = command => End::CommandExited,
        _ = targets => End::ProcessesExited,
    })
}

/// Starts `command` held at a gate until its pid is in the sampler's filter,
/// so its very first instructions are profiled.
///
/// `spawn` returns only once the child has exec'd, so the gate cannot sit
/// between fork and exec; a shell waits on it instead and then `exec`s the
/// command, which keeps the pid we put in the filter.
fn spawn_profiled(
    command: &[String],
    sampler: &mut Sampler,
) -> anyhow::Result<tokio::process::Child> {
    if !is_runnable(&command[0]) {
        bail!(
            "cannot start `{}`: no such command (check the name or PATH)",
            command[0]
        );
    }
    let (gate_read, gate_write) = pipe().context("cannot create a pipe")?;
    let read_fd = gate_read.as_raw_fd();
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(r#"read -r _ <&3; exec 3<&-; exec "$0" "$@""#)
        .args(command);
    // SAFETY: dup2 is async-signal-safe; it runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(read_fd, GATE_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .context("cannot start /bin/sh to run the command")?;
    drop(gate_read);
    if let Some(pid) = child.id() {
        sampler.add_pid(pid)?;
    }
    let mut gate = File::from(gate_write);
    gate.write_all(b"go\n")
        .context("cannot release the profiled command")?;
    Ok(child)
}

/// The descriptor the gate shell reads.
const GATE_FD: i32 = 3;

/// A path, or a name found in PATH, naming an executable file.
fn is_runnable(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        path.metadata()
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        return executable(Path::new(name));
    }
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| executable(&dir.join(name))))
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn report(
    args: &RecordArgs,
    elapsed: Duration,
    why: End,
    counters: &Counters,
    reader: &ReaderStats,
    summary: &Summary,
) -> String {
    use agent_ebpf::Counter;
    let why = match why {
        End::Duration => "duration reached",
        End::Interrupted => "interrupted",
        End::CommandExited => "command exited",
        End::ProcessesExited => "profiled processes exited",
    };
    let mut text = format!(
        "hostprof: {} samples from {} processes in {:.2} s at {} Hz ({why})\n\
         hostprof: lost {} samples (ring buffer full {}, pipeline backlog {}); \
         stack errors: kernel {}, user {}; truncated stacks {}\n",
        summary.samples(),
        summary.processes(),
        elapsed.as_secs_f64(),
        args.frequency,
        counters.lost() + reader.dropped_backlog,
        counters.get(Counter::RingFull),
        reader.dropped_backlog,
        counters.get(Counter::KernelStackError),
        counters.get(Counter::UserStackError),
        counters.get(Counter::Truncated),
    );
    let refused = crate::files::refusals();
    if refused.total() > 0 {
        text.push_str(&format!(
            "hostprof: files refused: {} not regular (FIFO, device), {} over their size cap, \
             {} through magic links (--log-level hostprof::files=debug names them)\n",
            refused.not_regular, refused.too_large, refused.escape
        ));
    }
    if let Some(path) = &args.output
        && path.as_os_str() != "-"
    {
        text.push_str(&format!("hostprof: wrote {}\n", path.display()));
    }
    let (off_cpu_events, off_cpu_ns) = summary.off_cpu();
    if args.off_cpu.enabled {
        text.push_str(&format!(
            "hostprof: off-CPU: {off_cpu_events} periods over {}, {:.3} s in all\n",
            humanize(
                args.off_cpu
                    .threshold
                    .unwrap_or(crate::config::DEFAULT_OFF_CPU_THRESHOLD)
            ),
            off_cpu_ns as f64 / 1e9
        ));
    }
    if summary.samples() > 0 || off_cpu_events > 0 {
        text.push_str(&summary.top(args.top));
    }
    text
}

/// How user stacks were walked, and why table-driven walks stopped.
pub(super) fn unwind_report(
    counters: &Counters,
    tables: Option<crate::unwind::LoaderStats>,
) -> String {
    use agent_ebpf::Counter;
    let Some(tables) = tables else {
        return String::new();
    };
    let reasons: Vec<String> = Counter::UNWIND_STOPS
        .iter()
        .map(|counter| {
            let name = counter
                .name()
                .trim_start_matches("unwind_")
                .replace('_', " ");
            format!("{name} {}", counters.get(*counter))
        })
        .collect();
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    format!(
        "hostprof: user stacks: {} unwound with tables ({} complete; stopped: {}), \
         {} with frame pointers before their tables were loaded\n\
         hostprof: unwind tables: {} files, {} rows, {:.1} of {:.0} MiB (for {:.1} MiB of code); \
         {} did not fit, {} without CFI\n",
        counters.get(Counter::UnwindTables),
        counters.get(Counter::UnwindComplete),
        reasons.join(", "),
        counters.get(Counter::UnwindUnknownProcess),
        tables.tables,
        tables.rows,
        mib(tables.bytes_used),
        mib(tables.bytes_capacity),
        mib(tables.text_bytes),
        tables.table_full,
        tables.build_failures,
    )
}

fn humanize(duration: Duration) -> String {
    match duration.as_nanos() {
        ns if ns % 1_000_000 == 0 => format!("{} ms", ns / 1_000_000),
        ns if ns % 1_000 == 0 => format!("{} us", ns / 1_000),
        ns => format!("{ns} ns"),
    }
}
