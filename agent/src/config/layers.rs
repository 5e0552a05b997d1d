//! The layers a setting's value can come from below the flags: the
//! environment and the configuration file, and the [`Resolver`] that picks
//! the highest one present and remembers where each value came from.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{ConfigError, Source, allowed, env_name, settings};

/// The file's keys, as the text a flag would have had.
pub(crate) struct FileLayer {
    path: PathBuf,
    values: BTreeMap<String, String>,
}

/// Reads and checks a configuration file: TOML, only known keys, scalar
/// values (or a list for `debug-dir`, joined with `:` as in
/// `HOSTPROF_DEBUG_DIR`).
pub(crate) fn parse_file(path: &Path, text: &str) -> Result<FileLayer, ConfigError> {
    let table: toml::Table = text
        .parse()
        .map_err(|err: toml::de::Error| ConfigError::Syntax {
            path: path.to_owned(),
            // toml's messages span several lines with a source excerpt; keep the first.
            message: err.message().lines().next().unwrap_or("").to_owned(),
        })?;
    let mut values = BTreeMap::new();
    for (key, value) in table {
        let Some(setting) = settings::all().find(|setting| setting.key == key) else {
            return Err(ConfigError::UnknownKey {
                path: path.to_owned(),
                key,
            });
        };
        let invalid = |value: &toml::Value, problem: &str| ConfigError::Invalid {
            place: format!("configuration file {}", path.display()),
            key: setting.key,
            value: value.to_string(),
            problem: problem.to_owned(),
            allowed: setting.allowed,
        };
        let text = match &value {
            toml::Value::Array(items) if setting.key == "debug-dir" => {
                let dirs = items
                    .iter()
                    .map(|item| scalar(item).ok_or_else(|| invalid(item, "expected a string")))
                    .collect::<Result<Vec<_>, _>>()?;
                std::env::join_paths(&dirs)
                    .ok()
                    .and_then(|joined| joined.into_string().ok())
                    .ok_or_else(|| invalid(&value, "a directory name cannot contain ':'"))?
            }
            other => scalar(other).ok_or_else(|| invalid(other, "expected one value"))?,
        };
        values.insert(key, text);
    }
    Ok(FileLayer {
        path: path.to_owned(),
        values,
    })
}

/// A TOML scalar as the text a flag would have had.
fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(text) => Some(text.clone()),
        toml::Value::Integer(number) => Some(number.to_string()),
        toml::Value::Float(number) => Some(number.to_string()),
        toml::Value::Boolean(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// Picks each setting's value from the highest layer that has it.
pub(crate) struct Resolver<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    file: Option<&'a FileLayer>,
    pub(crate) sources: BTreeMap<&'static str, Source>,
}

impl<'a> Resolver<'a> {
    pub(crate) fn new(
        env: &'a dyn Fn(&str) -> Option<String>,
        file: Option<&'a FileLayer>,
    ) -> Self {
        Resolver {
            env,
            file,
            sources: BTreeMap::new(),
        }
    }

    /// The flag, else the environment (`HOSTPROF_*`, then `otel_env`), else the
    /// file, parsed with `parse`; records where it came from.
    pub(crate) fn pick<T>(
        &mut self,
        key: &'static str,
        flag: Option<T>,
        otel_env: &[&str],
        parse: fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        if flag.is_some() {
            self.sources.insert(key, Source::Flag);
            return Ok(flag);
        }
        let hostprof_env = env_name(key);
        let from_env = std::iter::once(hostprof_env.as_str())
            .chain(otel_env.iter().copied())
            .find_map(|name| (self.env)(name).map(|value| (name.to_owned(), value)));
        let (source, value) = match from_env {
            Some((name, value)) => (Source::Env(name), value),
            None => match self.file.and_then(|file| file.values.get(key)) {
                Some(value) => (Source::File(self.file_path()), value.clone()),
                None => return Ok(None),
            },
        };
        let parsed = parse(&value).map_err(|problem| ConfigError::Invalid {
            place: match &source {
                Source::Env(name) => format!("environment variable {name}"),
                other => format!("configuration file {other}"),
            },
            key,
            value: value.clone(),
            problem,
            allowed: allowed(key),
        })?;
        self.sources.insert(key, source);
        Ok(Some(parsed))
    }

    fn file_path(&self) -> PathBuf {
        self.file.map(|file| file.path.clone()).unwrap_or_default()
    }
}
