//! Resolution order, messages and printing of the agent's settings.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use super::*;

fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| {
        pairs
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.to_string())
    }
}

fn write_config(text: &str) -> (tempdir::Dir, PathBuf) {
    let dir = tempdir::Dir::new();
    let path = dir.path().join("hostprof.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// A directory removed on drop (std only, to avoid a dev-dependency).
mod tempdir {
    pub struct Dir(std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path =
                std::env::temp_dir().join(format!("hostprof-config-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&path).unwrap();
            Dir(path)
        }
        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn defaults_without_flags_env_or_file() {
    let config = AgentConfig::resolve(Flags::default(), &|_| None).unwrap();
    assert_eq!(config.shared.frequency, 19);
    assert_eq!(config.agent.otlp_endpoint, "http://localhost:4317");
    assert_eq!(config.agent.metrics_addr, None);
    assert_eq!(config.agent.status_interval, Duration::from_secs(60));
    assert!(config.sources.is_empty());
}

#[test]
fn flags_beat_env_beats_file_beats_default() {
    let (_dir, path) = write_config(
        "frequency = 7\nreport-interval = \"2s\"\nexport-queue-mib = 3\n\
         debug-dir = [\"/a\", \"/b\"]\noff-cpu = true\n",
    );
    let flags = Flags {
        config: Some(path.clone()),
        shared: SharedFlags {
            frequency: Some(99),
            ..Default::default()
        },
        ..Default::default()
    };
    let env = env_of(&[
        ("HOSTPROF_FREQUENCY", "50"),
        ("HOSTPROF_REPORT_INTERVAL", "3"),
    ]);
    let config = AgentConfig::resolve(flags, &env).unwrap();
    assert_eq!(config.shared.frequency, 99);
    assert_eq!(config.sources["frequency"], Source::Flag);
    assert_eq!(config.agent.report_interval, Duration::from_secs(3));
    assert_eq!(
        config.sources["report-interval"],
        Source::Env("HOSTPROF_REPORT_INTERVAL".into())
    );
    assert_eq!(config.agent.export_queue_mib, 3);
    assert_eq!(config.sources["export-queue-mib"], Source::File(path));
    assert_eq!(
        config.shared.debug_dirs,
        [PathBuf::from("/a"), PathBuf::from("/b")]
    );
    assert!(config.shared.off_cpu);
    assert_eq!(config.agent.export_timeout, Duration::from_secs(10));
    assert!(!config.sources.contains_key("export-timeout"));
}

#[test]
fn hostprof_env_beats_otel_env_beats_file() {
    let (_dir, path) = write_config("otlp-endpoint = \"http://file:1\"\n");
    let flags = || Flags {
        config: Some(path.clone()),
        ..Default::default()
    };
    let config = AgentConfig::resolve(flags(), &|_| None).unwrap();
    assert_eq!(config.agent.otlp_endpoint, "http://file:1");
    let env = env_of(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:2"),
        (
            "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
            "https://profiles:3/",
        ),
    ]);
    let config = AgentConfig::resolve(flags(), &env).unwrap();
    assert_eq!(config.agent.otlp_endpoint, "https://profiles:3");
    let env = env_of(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:2"),
        ("HOSTPROF_OTLP_ENDPOINT", "http://ours:4"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20x"),
    ]);
    let config = AgentConfig::resolve(flags(), &env).unwrap();
    assert_eq!(config.agent.otlp_endpoint, "http://ours:4");
    assert_eq!(
        config.agent.otlp_headers,
        Some(vec![("authorization".to_owned(), "Bearer x".to_owned())])
    );
    // Credentials never appear in --print-config.
    assert!(config.to_toml().contains("authorization=<redacted>"));
    assert!(!config.to_toml().contains("Bearer"));
}

#[test]
fn config_file_from_hostprof_config_variable() {
    let (_dir, path) = write_config("frequency = 33\n");
    let path_text: &'static str = Box::leak(path.to_string_lossy().into_owned().into_boxed_str());
    let pairs: &'static [(&str, &str)] = Box::leak(Box::new([(CONFIG_ENV, path_text)]));
    let config = AgentConfig::resolve(Flags::default(), &env_of(pairs)).unwrap();
    assert_eq!(config.shared.frequency, 33);
}

#[test]
fn unknown_keys_and_bad_values_name_the_key_on_one_line() {
    let (_dir, path) = write_config("frequncy = 19\n");
    let flags = Flags {
        config: Some(path),
        ..Default::default()
    };
    let err = AgentConfig::resolve(flags, &|_| None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown key `frequncy`"), "{err}");
    assert!(err.contains("frequency, off-cpu"), "{err}");
    assert!(!err.contains('\n'), "{err}");

    for (text, key, fragment) in [
        ("frequency = 0\n", "frequency", "1 to 10000"),
        ("frequency = \"fast\"\n", "frequency", "not a whole number"),
        (
            "otlp-endpoint = \"collector:4317\"\n",
            "otlp-endpoint",
            "needs a scheme",
        ),
        ("off-cpu = \"maybe\"\n", "off-cpu", "true or false"),
        ("metrics-addr = \"nowhere\"\n", "metrics-addr", "PORT"),
        ("log-format = \"xml\"\n", "log-format", "text or json"),
        (
            "report-interval = [1]\n",
            "report-interval",
            "expected one value",
        ),
        ("symbol-cache-mib = 1\n", "symbol-cache-mib", "16 or more"),
    ] {
        let err = check_file(text).unwrap_err().to_string();
        assert!(err.contains(&format!("`{key}`")), "{text}: {err}");
        assert!(err.contains(fragment), "{text}: {err}");
        assert!(!err.contains('\n'), "{text}: {err}");
    }
    let err = check_file("frequency = \n").unwrap_err().to_string();
    assert!(
        err.contains("not valid TOML") && !err.contains('\n'),
        "{err}"
    );

    let env = env_of(&[("HOSTPROF_OFF_CPU_PROBABILITY", "2")]);
    let err = AgentConfig::resolve(Flags::default(), &env)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("environment variable HOSTPROF_OFF_CPU_PROBABILITY: invalid value `2`"),
        "{err}"
    );
}

#[test]
fn printed_config_reads_back_the_same() {
    let env = env_of(&[
        ("HOSTPROF_METRICS_ADDR", "9400"),
        ("HOSTPROF_DEBUG_DIR", "/x:/y"),
        ("HOSTPROF_OFF_CPU_THRESHOLD", "250us"),
        ("HOSTPROF_STATUS_INTERVAL", "0"),
        ("OTEL_SERVICE_NAME", "checkout \"eu\""),
    ]);
    let config = AgentConfig::resolve(Flags::default(), &env).unwrap();
    assert_eq!(
        config.agent.metrics_addr,
        Some("127.0.0.1:9400".parse().unwrap())
    );
    assert_eq!(config.agent.status_interval, Duration::ZERO);
    let printed = config.to_toml();
    assert!(printed.contains("# HOSTPROF_METRICS_ADDR"), "{printed}");
    assert!(printed.contains("frequency = 19  # default"), "{printed}");
    let (_dir, path) = write_config(&printed);
    let flags = Flags {
        config: Some(path),
        ..Default::default()
    };
    let reread = AgentConfig::resolve(flags, &|_| None).unwrap();
    assert_eq!(
        AgentConfig {
            sources: BTreeMap::new(),
            ..reread
        },
        AgentConfig {
            sources: BTreeMap::new(),
            ..config
        }
    );
}

#[test]
fn metrics_addr_defaults_to_loopback() {
    assert_eq!(
        parse_metrics_addr(":9400").unwrap().to_string(),
        "127.0.0.1:9400"
    );
    assert_eq!(
        parse_metrics_addr("localhost:1").unwrap().to_string(),
        "127.0.0.1:1"
    );
    assert_eq!(
        parse_metrics_addr("0.0.0.0:9400").unwrap().to_string(),
        "0.0.0.0:9400"
    );
    assert_eq!(
        parse_metrics_addr("[::1]:9").unwrap().to_string(),
        "[::1]:9"
    );
    assert!(parse_metrics_addr("70000").is_err());
}

#[test]
fn every_key_has_an_env_name() {
    assert_eq!(env_name("report-interval"), "HOSTPROF_REPORT_INTERVAL");
    let printed = AgentConfig::resolve(Flags::default(), &|_| None)
        .unwrap()
        .to_toml();
    for key in settings::all().map(|setting| setting.key) {
        assert!(
            printed.contains(&format!("{key} ")),
            "{key} missing:\n{printed}"
        );
    }
}

/// The documented example file (packaging/config/hostprof.toml) is checked
/// against the table: it parses, names every setting (set or commented
/// out), and each value it sets is the agent's default.
#[test]
fn example_file_documents_every_setting_with_its_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/config/hostprof.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    check_file(&text).unwrap();
    for setting in settings::all() {
        let key = setting.key;
        assert!(
            text.lines().any(|line| {
                let line = line.trim_start_matches("# ");
                line.starts_with(&format!("{key} ="))
            }),
            "{} does not mention `{key}`",
            path.display()
        );
    }
    let defaults = AgentConfig::resolve(Flags::default(), &|_| None).unwrap();
    let from_file = AgentConfig::resolve(
        Flags {
            config: Some(path.clone()),
            ..Default::default()
        },
        &|_| None,
    )
    .unwrap();
    assert!(!from_file.sources.is_empty());
    assert_eq!(
        AgentConfig {
            sources: BTreeMap::new(),
            ..from_file
        },
        AgentConfig {
            sources: BTreeMap::new(),
            ..defaults
        },
        "a value in {} differs from the default",
        path.display()
    );
}

/// `--help` states each default that has one fixed value; the text must
/// match the table's default.
#[test]
fn help_text_defaults_match_the_table() {
    use clap::CommandFactory;
    let defaults = AgentConfig::resolve(Flags::default(), &|_| None).unwrap();
    let mut printed = String::new();
    defaults.shared.write_toml(&mut |key, value| {
        printed.push_str(&format!("{key}={}\n", value.unwrap_or_default()))
    });
    defaults.agent.write_toml(&mut |key, value| {
        printed.push_str(&format!("{key}={}\n", value.unwrap_or_default()))
    });
    let command = crate::cli::Cli::command();
    let agent = command.find_subcommand("agent").unwrap();
    let mut checked = 0;
    for arg in agent.get_arguments() {
        let (Some(key), Some(help)) = (arg.get_long(), arg.get_help()) else {
            continue;
        };
        let help = help.to_string();
        let Some(default) = help
            .split("[default: ")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
        else {
            continue;
        };
        if default.contains(" for ") {
            continue; // per-command defaults: checked by the cli tests
        }
        let value = printed
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("--{key} is not a setting"));
        let value = value.trim_matches('"');
        let default = default.trim_end_matches('s');
        let same = value == default
            || value.parse::<f64>().ok() == default.parse::<f64>().ok()
                && value.parse::<f64>().is_ok()
            || value
                .trim_end_matches("us")
                .parse::<f64>()
                .ok()
                .zip(default.trim_end_matches("m").parse::<f64>().ok())
                .is_some_and(|(us, ms)| us == ms * 1000.0);
        assert!(same, "--{key}: help says {default}, the table {value}");
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} defaults in --help");
}
