//! The parsers of setting values: shared by clap (flags) and the environment
//! and file layers, so a bad value gets the same message wherever it came from.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

/// Logs go out as human-readable lines or as JSON objects (one per line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// How user stacks are walked (see `hostprof agent --help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindMethod {
    Dwarf,
    Fp,
}

/// Where built unwind tables are kept between runs, or nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheDir {
    Off,
    Dir(PathBuf),
}

/// A directory, or `off`.
pub fn parse_cache_dir(text: &str) -> Result<CacheDir, String> {
    match text.trim() {
        "" => Err("empty (give a directory, or off)".into()),
        "off" => Ok(CacheDir::Off),
        dir => Ok(CacheDir::Dir(PathBuf::from(dir))),
    }
}

pub fn parse_frequency(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(hz @ 1..=10_000) => Ok(hz),
        Ok(_) => Err("out of range (1 to 10000)".into()),
        Err(_) => Err("not a whole number".into()),
    }
}

pub fn parse_u64(text: &str) -> Result<u64, String> {
    text.trim()
        .parse()
        .map_err(|_| "not a whole number".to_owned())
}

pub fn parse_cache_mib(text: &str) -> Result<u64, String> {
    match parse_u64(text)? {
        mib @ 16.. => Ok(mib),
        _ => Err("too small to hold one large binary's symbols".into()),
    }
}

/// Seconds, fractions allowed, with an optional `s`; more than zero.
pub fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .trim_end_matches('s')
        .parse()
        .map_err(|_| "not a number of seconds".to_owned())?;
    if !(seconds > 0.0 && seconds.is_finite() && seconds < 1e9) {
        return Err("must be more than 0 seconds".into());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Seconds as [`parse_seconds`], or 0.
pub fn parse_seconds_or_zero(text: &str) -> Result<Duration, String> {
    match text.trim().trim_end_matches('s').parse::<f64>() {
        Ok(0.0) => Ok(Duration::ZERO),
        _ => parse_seconds(text),
    }
}

/// A duration with a unit: `ns`, `us`, `ms` or `s` (seconds when bare).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = [("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)]
        .iter()
        .find_map(|(unit, scale)| text.strip_suffix(unit).map(|number| (number, *scale)))
        .unwrap_or((text, 1.0));
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| "not a duration such as 1ms or 0.5s".to_owned())?;
    if !(value >= 0.0 && value.is_finite() && value * scale < 1e9) {
        return Err("must be 0 or more and finite".into());
    }
    Ok(Duration::from_secs_f64(value * scale))
}

pub fn parse_probability(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(p) if p > 0.0 && p <= 1.0 => Ok(p),
        _ => Err("not a probability above 0 and at most 1".into()),
    }
}

pub fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("not true or false".into()),
    }
}

pub fn parse_text(text: &str) -> Result<String, String> {
    Ok(text.to_owned())
}

pub fn parse_path(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        return Err("empty path".into());
    }
    Ok(PathBuf::from(text))
}

/// `http://` or `https://` with a host; a trailing `/` is dropped.
pub fn parse_endpoint(text: &str) -> Result<String, String> {
    let endpoint = text.trim().trim_end_matches('/');
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or_else(|| "needs a scheme: http:// (plain) or https:// (TLS)".to_owned())?;
    if rest.is_empty() || rest.contains(char::is_whitespace) {
        return Err("needs a host (and port)".into());
    }
    Ok(endpoint.to_owned())
}

/// `key1=value1,key2=value2` (values %-encoded) into gRPC metadata, keys lowercase.
pub fn parse_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let headers = crate::model::parse_key_values(text).map_err(|bad| match bad {
        crate::model::BadEntry::NotKeyValue(entry) => format!("`{entry}` is not key=value"),
        crate::model::BadEntry::BadEscape(entry) => format!("bad %-escape in `{entry}`"),
    })?;
    Ok(headers
        .into_iter()
        .map(|(key, value)| (key.to_ascii_lowercase(), value))
        .collect())
}

/// `PORT` or `:PORT` listen on loopback only; a host must be given to listen
/// anywhere else (`0.0.0.0:PORT` for every interface).
pub fn parse_metrics_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port = port.parse::<u16>().map_err(|_| "bad port".to_owned())?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse()
        .map_err(|_| "not an IP address and port".to_owned())
}

pub fn parse_unwind(text: &str) -> Result<UnwindMethod, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "dwarf" => Ok(UnwindMethod::Dwarf),
        "fp" => Ok(UnwindMethod::Fp),
        _ => Err("unknown unwinding method (dwarf or fp)".into()),
    }
}

pub fn parse_unwind_table_mib(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(mib @ 1..=4096) => Ok(mib),
        Ok(_) => Err("out of range (1 to 4096)".into()),
        Err(_) => Err("not a whole number".into()),
    }
}

pub fn parse_log_format(text: &str) -> Result<LogFormat, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err("unknown log format".into()),
    }
}

pub fn parse_log_level(text: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(text.trim())
        .map(|_| text.trim().to_owned())
        .map_err(|err| err.to_string())
}

/// Directories separated by `:` (as in `PATH`); a TOML list arrives joined
/// the same way (see `layers::parse_file`).
pub fn parse_dirs(text: &str) -> Result<Vec<PathBuf>, String> {
    let dirs: Vec<PathBuf> = std::env::split_paths(text)
        .filter(|dir| !dir.as_os_str().is_empty())
        .collect();
    Ok(dirs)
}
