//! What `/` in `hostprof top` types: which samples count.
//!
//! `pid:N`, `tid:N`, `comm:TEXT` (process name), `thread:TEXT`,
//! `container:ID` (a prefix; `container:host` for processes in none),
//! `trace:ID` (a prefix of a trace id, as the traces view shows them),
//! `attr:KEY=VALUE` (an attribute's value, exactly: `service.name=cart`),
//! or bare text: a number is a pid or tid, anything else part of a process
//! or thread name or the start of a container id. Text matches ignore case.
use std::fmt;

use super::StackKey;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Filter {
    Pid(u32),
    Tid(u32),
    Process(String),
    Thread(String),
    /// A container id prefix, lowercase; `None`: on the host.
    Container(Option<String>),
    /// A trace id prefix, lowercase hex.
    Trace(String),
    /// An attribute ([`StackKey::attribute`]) and its exact value.
    Attribute(String, String),
    /// Bare text, lowercase (see the module's doc).
    Any(String),
}

/// Why typed text is no filter.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}`: {why}")]
pub struct FilterError {
    text: String,
    why: &'static str,
}

impl Filter {
    /// The filter `text` names; `None` for blank text (no filter).
    pub fn parse(text: &str) -> Result<Option<Filter>, FilterError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let error = |why| FilterError {
            text: text.to_owned(),
            why,
        };
        let id = |value: &str| {
            value
                .trim()
                .parse::<u32>()
                .map_err(|_| error("not a number"))
        };
        let name = |value: &str| match value.trim() {
            "" => Err(error("empty name")),
            value => Ok(value.to_lowercase()),
        };
        let filter = match text.split_once(':') {
            Some(("pid", value)) => Filter::Pid(id(value)?),
            Some(("tid", value)) => Filter::Tid(id(value)?),
            Some(("comm" | "process", value)) => Filter::Process(name(value)?),
            Some(("thread", value)) => Filter::Thread(name(value)?),
            Some(("container", value)) => match name(value)?.as_str() {
                "host" | "-" => Filter::Container(None),
                id => Filter::Container(Some(id.to_owned())),
            },
            Some(("trace", value)) => {
                let prefix = name(value)?;
                if !prefix.chars().all(|ch| ch.is_ascii_hexdigit()) {
                    return Err(error("a trace id is hex digits"));
                }
                Filter::Trace(prefix)
            }
            Some(("attr", value)) => match value.split_once('=') {
                Some((key, value)) if !key.trim().is_empty() => {
                    Filter::Attribute(key.trim().to_owned(), value.trim().to_owned())
                }
                _ => return Err(error("attr: wants KEY=VALUE")),
            },
            // Anything else with a colon is text (`std::thread`, `a:b`).
            _ => Filter::Any(text.to_lowercase()),
        };
        Ok(Some(filter))
    }

    /// Whether samples of `key` count.
    pub fn matches(&self, key: &StackKey) -> bool {
        let contains = |name: &str, part: &str| name.to_lowercase().contains(part);
        let in_container = |prefix: &str| {
            key.container
                .as_deref()
                .is_some_and(|id| id.to_lowercase().starts_with(prefix))
        };
        match self {
            Filter::Pid(pid) => key.pid == *pid,
            Filter::Tid(tid) => key.tid == *tid,
            Filter::Process(part) => contains(&key.process, part),
            Filter::Thread(part) => contains(&key.thread, part),
            Filter::Container(None) => key.container.is_none(),
            Filter::Container(Some(prefix)) => in_container(prefix),
            Filter::Trace(prefix) => key
                .trace_id
                .is_some_and(|id| crate::model::hex(&id).starts_with(prefix.as_str())),
            Filter::Attribute(name, value) => key.attribute(name).as_deref() == Some(value),
            Filter::Any(text) => {
                if let Ok(id) = text.parse::<u32>()
                    && (key.pid == id || key.tid == id)
                {
                    return true;
                }
                contains(&key.process, text) || contains(&key.thread, text) || in_container(text)
            }
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Filter::Pid(pid) => write!(f, "pid:{pid}"),
            Filter::Tid(tid) => write!(f, "tid:{tid}"),
            Filter::Process(name) => write!(f, "comm:{name}"),
            Filter::Thread(name) => write!(f, "thread:{name}"),
            Filter::Container(None) => write!(f, "container:host"),
            Filter::Container(Some(id)) => write!(f, "container:{id}"),
            Filter::Trace(prefix) => write!(f, "trace:{prefix}"),
            Filter::Attribute(key, value) => write!(f, "attr:{key}={value}"),
            Filter::Any(text) => write!(f, "{text}"),
        }
    }
}
