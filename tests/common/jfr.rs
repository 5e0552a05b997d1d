//! JDK Flight Recorder as ground truth for Java stacks: the execution
//! samples of a recording, as `jfr print --json` shows them.
//!
//! JFR samples only threads running Java code (state `_thread_in_Java`),
//! every 10 ms with `settings=profile`, and walks their stacks in the JVM,
//! with inlined methods as frames of their own (type `Inlined`), so its top
//! frame is the innermost Java method as the source says it, whatever C2
//! inlined: the frame hostprof's innermost Java frame is compared with.
use std::{path::Path, process::Command};

use serde_json::Value;

use super::run_ok;

/// One `jdk.ExecutionSample` event.
#[derive(Debug, Clone)]
pub struct ExecutionSample {
    /// When it was taken, in nanoseconds since the Unix epoch.
    pub unix_nanos: i128,
    /// The thread's Java name when JFR first saw the thread (JFR keeps it:
    /// a later `Thread.setName` does not show).
    pub thread: String,
    /// Innermost first.
    pub frames: Vec<JavaFrame>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JavaFrame {
    /// `package.Class.method`, the class dotted as Java spells it
    /// (`Hot$Worker.run`, `java.lang.reflect.Method.invoke`).
    pub method: String,
    /// -1 where the class has no line table.
    pub line: i64,
    /// `Interpreted`, `JIT compiled`, `Inlined` or `Native`.
    pub kind: String,
}

/// Frames `jfr print` shows of each stack: its default, 5, cuts worker
/// stacks (`Hot$Worker.run → … → Hot.callback → Hot.coldLoop` is 9 deep).
const STACK_DEPTH: &str = "64";

/// The execution samples of `recording`, read by the `jfr` tool at `jfr`
/// (one JDK's tool reads the recordings of the others: the file format is
/// self-describing, and 11's, 17's and 21's are version 2).
pub fn execution_samples(jfr: &Path, recording: &Path) -> Vec<ExecutionSample> {
    let output = run_ok(
        Command::new(jfr)
            .args(["print", "--json", "--stack-depth", STACK_DEPTH])
            .args(["--events", "jdk.ExecutionSample"])
            .arg(recording),
    );
    parse(&String::from_utf8_lossy(&output.stdout))
        .unwrap_or_else(|why| panic!("{}: {why}", recording.display()))
}

/// Parses `jfr print --json --events jdk.ExecutionSample`'s output.
pub fn parse(json: &str) -> Result<Vec<ExecutionSample>, String> {
    let document: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let events = document["recording"]["events"]
        .as_array()
        .ok_or("no recording.events")?;
    events
        .iter()
        .filter(|event| event["type"] == "jdk.ExecutionSample")
        .map(|event| sample(&event["values"]))
        .collect()
}

fn sample(values: &Value) -> Result<ExecutionSample, String> {
    let time = values["startTime"].as_str().ok_or("no startTime")?;
    let frames = values["stackTrace"]["frames"]
        .as_array()
        .ok_or("no stackTrace.frames")?
        .iter()
        .map(frame)
        .collect::<Result<_, _>>()?;
    Ok(ExecutionSample {
        unix_nanos: unix_nanos(time).ok_or_else(|| format!("bad startTime {time}"))?,
        thread: values["sampledThread"]["javaName"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        frames,
    })
}

fn frame(frame: &Value) -> Result<JavaFrame, String> {
    let method = &frame["method"];
    // Binary names (`jdk/internal/reflect/Method`), dotted as in source.
    let class = method["type"]["name"].as_str().ok_or("no class name")?;
    let name = method["name"].as_str().ok_or("no method name")?;
    Ok(JavaFrame {
        method: format!("{}.{name}", class.replace('/', ".")),
        line: frame["lineNumber"].as_i64().unwrap_or(-1),
        kind: frame["type"].as_str().unwrap_or_default().to_string(),
    })
}

/// Now as nanoseconds since the Unix epoch, the clock of JFR's times.
pub fn now_unix_nanos() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

/// `2026-11-25T13:54:26.193771177Z` (what `jfr print --json` writes: UTC,
/// up to nanoseconds) as nanoseconds since the Unix epoch.
pub fn unix_nanos(time: &str) -> Option<i128> {
    let time = time.strip_suffix('Z')?;
    let (date, clock) = time.split_once('T')?;
    let mut date = date.splitn(3, '-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (clock, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut clock = clock.splitn(3, ':').map(|part| part.parse::<i64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    let nanos: i128 = if fraction.is_empty() {
        0
    } else {
        if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        format!("{fraction:0<9}").parse().ok()?
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Some(seconds as i128 * 1_000_000_000 + nanos)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}
