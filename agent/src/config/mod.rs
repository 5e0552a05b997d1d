//! The agent's effective configuration from four layers, highest first:
//! command-line flags, environment (`HOSTPROF_*`, then the OpenTelemetry
//! `OTEL_*` variables that mean the same), a TOML file (`--config` or
//! `HOSTPROF_CONFIG`), and defaults.
//!
//! Every setting has one name: the TOML key is the flag's long name
//! (`report-interval`) and the variable is `HOSTPROF_` plus that name in upper
//! snake case (`HOSTPROF_REPORT_INTERVAL`). Values from the environment and the
//! file go through the same parsers as the flags, so a bad value gets the same
//! one-line message naming where it came from and what is allowed.
//!
//! Each setting is declared once, in [`settings`]; `layers.rs` reads the
//! environment and the file, `parse.rs` holds the value parsers.
mod layers;
mod parse;
pub mod settings;
#[cfg(test)]
mod tests;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
};

pub use parse::*;
pub use settings::{AgentFlags, AgentSettings, SharedFlags, SharedSettings};

use layers::{Resolver, parse_file};

/// The variable naming the configuration file when `--config` is not given.
pub const CONFIG_ENV: &str = "HOSTPROF_CONFIG";

/// Where a setting's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    Env(String),
    Flag,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(path) => write!(f, "{}", path.display()),
            Source::Env(name) => f.write_str(name),
            Source::Flag => f.write_str("command line"),
        }
    }
}

/// A configuration error, always one line naming the key and what is allowed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "configuration file {} is not valid TOML: {}",
        path.display(),
        message.escape_debug()
    )]
    Syntax { path: PathBuf, message: String },
    #[error(
        "configuration file {}: unknown key `{}`; known keys: {}",
        path.display(),
        key.escape_debug(),
        known_keys()
    )]
    UnknownKey { path: PathBuf, key: String },
    // Values and problems are escaped: the message stays on one line whatever
    // the input holds (found by fuzzing).
    #[error(
        "{place}: invalid value `{}` for `{key}`: {} (allowed: {allowed})",
        value.escape_debug(),
        problem.escape_debug()
    )]
    Invalid {
        place: String,
        key: &'static str,
        value: String,
        problem: String,
        allowed: &'static str,
    },
}

fn known_keys() -> String {
    settings::all()
        .map(|setting| setting.key)
        .collect::<Vec<_>>()
        .join(", ")
}

fn allowed(key: &str) -> &'static str {
    settings::all()
        .find(|setting| setting.key == key)
        .map_or("see hostprof agent --help", |setting| setting.allowed)
}

/// `report-interval` → `HOSTPROF_REPORT_INTERVAL`.
pub fn env_name(key: &str) -> String {
    format!("HOSTPROF_{}", key.replace('-', "_").to_ascii_uppercase())
}

/// Which command a setting is resolved for: some defaults differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Agent,
    Record,
}

/// The agent's values given on the command line (`None` when a flag was not
/// given).
#[derive(Clone, Debug, Default)]
pub struct Flags {
    pub config: Option<PathBuf>,
    pub shared: SharedFlags,
    pub agent: AgentFlags,
}

/// The agent's effective configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    pub shared: SharedSettings,
    pub agent: AgentSettings,
    /// Where each key's value came from (keys without a value are absent).
    pub sources: BTreeMap<&'static str, Source>,
}

/// `record`'s settings: its flags over the defaults. `record` reads neither
/// the environment nor a configuration file: those configure the agent.
pub fn record_settings(flags: SharedFlags) -> Result<SharedSettings, ConfigError> {
    let no_env = |_: &str| None;
    flags.resolve(&mut Resolver::new(&no_env, None), Role::Record)
}

/// Checks a configuration file's text the way `hostprof agent` would, without
/// resolving it (for fuzzing and `--config` validation).
pub fn check_file(text: &str) -> Result<(), ConfigError> {
    let layer = parse_file(Path::new("<config>"), text)?;
    let env = |_: &str| None;
    resolve_layers(Flags::default(), Resolver::new(&env, Some(&layer))).map(drop)
}

fn resolve_layers(flags: Flags, mut layers: Resolver<'_>) -> Result<AgentConfig, ConfigError> {
    let shared = flags.shared.resolve(&mut layers, Role::Agent)?;
    let agent = flags.agent.resolve(&mut layers, Role::Agent)?;
    if let Some(ca) = &agent.otlp_ca
        && !agent.otlp_endpoint.starts_with("https://")
    {
        return Err(ConfigError::Invalid {
            place: format!("{}", layers.sources["otlp-ca"]),
            key: "otlp-ca",
            value: ca.display().to_string(),
            problem: format!("the endpoint {} is plain text", agent.otlp_endpoint),
            allowed: "a CA only with an https:// endpoint",
        });
    }
    Ok(AgentConfig {
        shared,
        agent,
        sources: layers.sources,
    })
}

impl AgentConfig {
    /// Resolves `flags` over this process's environment and the configuration
    /// file they (or `HOSTPROF_CONFIG`) name.
    pub fn load(flags: Flags) -> Result<Self, ConfigError> {
        warn_unknown_env(std::env::vars().map(|(name, _)| name));
        Self::resolve(flags, &|name| {
            std::env::var(name).ok().filter(|v| !v.trim().is_empty())
        })
    }

    /// Resolves `flags` over the environment `env` and the file it names.
    pub fn resolve(
        flags: Flags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let path = flags
            .config
            .clone()
            .or_else(|| env(CONFIG_ENV).map(PathBuf::from));
        let file = match path {
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Some(parse_file(&path, &text)?)
            }
            None => None,
        };
        resolve_layers(flags, Resolver::new(env, file.as_ref()))
    }

    /// The configuration as a TOML file that `--config` accepts, each line
    /// saying where its value came from. Header values are hidden: they
    /// usually carry credentials.
    pub fn to_toml(&self) -> String {
        let mut out = String::from(
            "# hostprof agent: effective configuration.\n\
             # Precedence: flags > HOSTPROF_* / OTEL_* environment > configuration file > defaults.\n",
        );
        let mut line = |key: &'static str, value: Option<String>| {
            let source = self.sources.get(key).cloned().unwrap_or(Source::Default);
            match value {
                Some(value) => {
                    let _ = writeln!(out, "{key} = {value}  # {source}");
                }
                None => {
                    let _ = writeln!(out, "# {key} is not set ({})", allowed(key));
                }
            }
        };
        self.shared.write_toml(&mut line);
        self.agent.write_toml(&mut line);
        out
    }
}

/// Names `HOSTPROF_*` variables that are not settings. A warning, not an
/// error: Kubernetes injects `HOSTPROF_SERVICE_HOST`-style variables for any
/// Service named hostprof.
fn warn_unknown_env(names: impl Iterator<Item = String>) {
    for name in names {
        let known =
            name == CONFIG_ENV || settings::all().any(|setting| env_name(setting.key) == name);
        if name.starts_with("HOSTPROF_") && !known {
            tracing::debug!("ignoring {name}: not a hostprof setting");
        }
    }
}
