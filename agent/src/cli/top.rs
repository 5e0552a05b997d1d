//! `hostprof top`: the running session's samples, ranked live on a full
//! screen and refreshed every second. The figures are [`crate::top`]'s; this
//! file starts the session, runs the screen on a thread of its own (the
//! async thread keeps reading the ring) and puts the terminal back.
use std::{
    io::{BufWriter, IsTerminal, Stdout},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use ratatui::{
    Terminal,
    backend::CrosstermBackend,
    crossterm::{
        event::{self, Event, KeyEventKind},
        execute, terminal,
    },
};

use super::session::{Mode, Session};
use crate::{
    config, output, procs,
    sampler::SamplerOptions,
    top::{
        TopSink, Unit, Window,
        screen::{Action, Header, Screen},
    },
};

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Only this process and its threads (repeatable); default: the whole host.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Seconds of samples the shares are of (whole seconds, at least 1).
    #[arg(long = "window", value_name = "SECONDS", default_value = "10",
          value_parser = config::parse_seconds)]
    pub window: Duration,
    /// `record`'s options (frequency, off-CPU, unwinding, symbols), with its
    /// defaults. Log messages (only with --log-level) go to stderr: send it
    /// to a file (`2>top.log`), or they cross the screen.
    #[command(flatten)]
    pub settings: config::SharedFlags,
}

/// How often the window moves and the screen is drawn.
const REFRESH: Duration = Duration::from_secs(1);
/// How often the screen looks whether a signal asked it to stop.
const QUIT_CHECK: Duration = Duration::from_millis(200);
/// How long quitting may wait for samples still being symbolized.
const STOP_DEADLINE: Duration = Duration::from_millis(500);
/// How long the screen gets to end once told to quit. Past it, it is
/// stuck reading a terminal that is gone (see [`terminal_gone`]).
const SCREEN_GRACE: Duration = Duration::from_secs(2);

pub async fn run(args: TopArgs) -> anyhow::Result<()> {
    for pid in &args.pids {
        if !procs::is_alive(*pid) {
            bail!("no process with pid {pid}: check it with `ps -p {pid}`");
        }
    }
    // Before the kernel side is loaded: a full-screen view needs a terminal.
    if !std::io::stdout().is_terminal() {
        bail!(
            "hostprof top needs a terminal on stdout; to save a profile instead, use \
             `hostprof record -o FILE`"
        );
    }
    let log_level = args.settings.log_level.is_some();
    let settings = config::record_settings(args.settings.clone())?;
    if log_level {
        super::init_logging(config::LogFormat::Text, &settings.log_level);
    }
    let (unwind, unwind_chunks) = settings.unwind_options();
    let options = SamplerOptions {
        unwind,
        unwind_chunks,
        frequency_hz: settings.frequency,
        pids: (!args.pids.is_empty()).then(|| args.pids.clone()),
        off_cpu: settings.off_cpu_options(),
        process_environment: settings.process_environment,
        // The whole sampling program once a process needs it.
        lean_start: true,
        ..Default::default()
    };
    let unit = match settings.off_cpu {
        true => Unit::Nanos {
            cpu_period_ns: 1_000_000_000 / settings.frequency,
        },
        false => Unit::Samples,
    };
    let sink = TopSink::new(unit);
    let mut worker_sink = sink.clone();
    let mut session = Session::start(
        &options,
        settings.symbolizer_options(),
        settings.table_cache_options(),
        Mode::Live,
        None,
        move |batches| output::drain(batches, &mut [&mut worker_sink]),
    )?;
    let header = Header {
        targets: match args.pids.as_slice() {
            [] => "host-wide".to_owned(),
            pids => format!(
                "pid {}",
                pids.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        frequency_hz: settings.frequency,
        window_seconds: args.window.as_secs_f64().ceil().max(1.0) as usize,
        unit,
        lost: 0,
        targets_exited: false,
    };
    let shared = Arc::new(Mutex::new(header));
    let quit = Arc::new(AtomicBool::new(false));
    let mut screen = {
        let (shared, quit) = (shared.clone(), quit.clone());
        tokio::task::spawn_blocking(move || show(sink, shared, &quit))
    };
    // Meanwhile, on this thread: the kernel's loss counters and whether the
    // named processes still run, for the header.
    // SIGTERM and SIGHUP (the terminal closing) end the screen like `q`,
    // so the terminal is put back and the kernel side detached.
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut hangup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    let terminals = {
        use std::os::fd::AsFd;
        [
            rustix::termios::isatty(std::io::stdin().as_fd()),
            rustix::termios::isatty(std::io::stdout().as_fd()),
        ]
    };
    let mut quitting_since = None;
    let shown = loop {
        tokio::select! {
            shown = &mut screen => break Some(shown),
            _ = terminate.recv() => quit.store(true, Ordering::Relaxed),
            _ = hangup.recv() => quit.store(true, Ordering::Relaxed),
            _ = tokio::time::sleep(REFRESH) => {
                if terminal_gone(terminals) {
                    quit.store(true, Ordering::Relaxed);
                }
                super::session::upgrade_when_wanted(&mut session.sampler);
                let lost = session.sampler.counters().map(|c| c.lost()).unwrap_or(0)
                    + session.reader_progress.borrow().dropped_backlog;
                let exited = !args.pids.is_empty()
                    && !args.pids.iter().any(|pid| procs::is_alive(*pid));
                let mut header = shared.lock().unwrap_or_else(|e| e.into_inner());
                header.lost = lost;
                header.targets_exited = exited;
            }
        }
        if quit.load(Ordering::Relaxed)
            && quitting_since.get_or_insert_with(Instant::now).elapsed() >= SCREEN_GRACE
        {
            break None;
        }
    };
    let Some(shown) = shown else {
        // The screen thread is stuck in crossterm's read loop, which spins
        // on a terminal that is gone instead of failing (crossterm issue
        // 793): it cannot be joined, and the runtime would wait for it at
        // exit. Detach the kernel side and leave without it.
        session.stop(Some(STOP_DEADLINE)).await?;
        eprintln!("hostprof: error: the terminal went away; top stopped");
        std::process::exit(1);
    };
    let shown = shown.context("the screen thread panicked");
    // Stop even when the screen failed, so the kernel side is detached.
    session.stop(Some(STOP_DEADLINE)).await?;
    shown?
}

/// True when the terminal top draws on is gone (its ssh session or tmux
/// pane closed): a poll of it reports a hangup or an error. A process in
/// the terminal's session gets SIGHUP then, but one started outside it
/// (`setsid`, `nohup`) is told nothing, and crossterm spins on the dead
/// terminal at 100 % of a core instead of returning.
///
/// `terminals`: which of stdin and stdout were terminals at the start (a
/// terminal that is gone no longer says it is one).
fn terminal_gone(terminals: [bool; 2]) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    use std::os::fd::AsFd;
    let (stdin, stdout) = (std::io::stdin(), std::io::stdout());
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let mut watched = [stdin.as_fd(), stdout.as_fd()]
        .into_iter()
        .zip(terminals)
        .filter_map(|(fd, terminal)| terminal.then_some(fd));
    watched.any(|fd| {
        let mut polled = [PollFd::new(&fd, PollFlags::empty())];
        poll(&mut polled, Some(&now)).is_ok()
            && polled[0]
                .revents()
                .intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL)
    })
}

/// The screen's loop, until `q` or Ctrl-C: a new bucket every second, a
/// redraw after each and after every key that changes the view.
fn show(sink: TopSink, header: Arc<Mutex<Header>>, quit: &AtomicBool) -> anyhow::Result<()> {
    let mut terminal = take_terminal().context("cannot take over the terminal")?;
    let result = (|| -> anyhow::Result<()> {
        let mut screen = Screen::default();
        let window_seconds = header
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .window_seconds;
        let mut window = Window::new(window_seconds);
        let mut next_tick = Instant::now() + REFRESH;
        loop {
            let table = window.table(&screen.query);
            let shown_header = header.lock().unwrap_or_else(|e| e.into_inner()).clone();
            terminal
                .draw(|frame| screen.draw(frame, &shown_header, &table))
                .context("cannot draw on the terminal")?;
            // Wait for a key or the next tick, whichever comes first.
            loop {
                let now = Instant::now();
                if now >= next_tick {
                    window.advance(sink.take());
                    next_tick = now + REFRESH;
                    break;
                }
                if quit.load(Ordering::Relaxed) {
                    return Ok(());
                }
                if !event::poll((next_tick - now).min(QUIT_CHECK))
                    .context("cannot read the terminal")?
                {
                    continue;
                }
                match event::read().context("cannot read the terminal")? {
                    Event::Key(key) if key.kind != KeyEventKind::Release => {
                        match screen.on_key(key) {
                            Action::Quit => return Ok(()),
                            Action::Redraw => break,
                            Action::None => {}
                        }
                    }
                    Event::Resize(..) => break,
                    _ => {}
                }
            }
        }
    })();
    ratatui::restore();
    result
}

/// Raw mode, the alternate screen, and a terminal whose frames reach it in
/// one write: stdout's own buffer flushes every KiB, and a reader of the
/// screen (tmux, a slow ssh link) would see frames half drawn. A panic puts
/// the terminal back before its message is printed.
fn take_terminal() -> std::io::Result<Terminal<CrosstermBackend<BufWriter<Stdout>>>> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        ratatui::restore();
        previous(info);
    }));
    terminal::enable_raw_mode()?;
    execute!(std::io::stdout(), terminal::EnterAlternateScreen)?;
    Terminal::new(CrosstermBackend::new(BufWriter::with_capacity(
        FRAME_BUFFER_BYTES,
        std::io::stdout(),
    )))
}

/// Larger than a full frame of a big terminal with colours.
const FRAME_BUFFER_BYTES: usize = 1 << 20;
