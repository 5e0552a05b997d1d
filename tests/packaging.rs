//! Deployment artifacts: the systemd unit, the Kubernetes manifests, the
//! container image recipe, and the aarch64 build.
mod common;

use std::{fs, path::PathBuf, process::Command};

use common::*;

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

#[test]
fn systemd_unit_passes_systemd_analyze_verify() {
    if !require_tool("systemd-analyze") {
        return;
    }
    let unit = fs::read_to_string(repo_file("packaging/systemd/hostprof.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/hostprof agent"));
    // verify insists that ExecStart exists: point it at the binary under test.
    let local = work_dir().join("hostprof.service");
    fs::write(
        &local,
        unit.replace("/usr/bin/hostprof", env!("CARGO_BIN_EXE_hostprof")),
    )
    .unwrap();
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&local)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}

fn kubernetes_validate(files: &[PathBuf]) -> std::process::Output {
    Command::new("kubernetes-validate")
        .arg("--strict")
        .args(files)
        .output()
        .expect("run kubernetes-validate")
}

#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    if !require_tool("kubernetes-validate") {
        return;
    }
    let dir = repo_file("packaging/kubernetes");
    let mut manifests: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    manifests.sort();
    assert!(manifests.len() >= 4, "manifests: {manifests:?}");
    let output = kubernetes_validate(&manifests);
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // The validator does reject a misspelt field: the check above can fail.
    let daemonset = fs::read_to_string(dir.join("daemonset.yaml")).unwrap();
    let broken = work_dir().join("broken-daemonset.yaml");
    fs::write(&broken, daemonset.replace("hostPID: true", "hostPid: true")).unwrap();
    assert!(
        !kubernetes_validate(&[broken]).status.success(),
        "a misspelt field passed validation"
    );
}

#[test]
fn daemonset_has_what_a_node_agent_needs() {
    let daemonset = fs::read_to_string(repo_file("packaging/kubernetes/daemonset.yaml")).unwrap();
    for needed in [
        "hostPID: true",
        "fieldPath: spec.nodeName",
        "k8s.node.name=$(K8S_NODE_NAME)",
        "- operator: Exists",
        "- BPF",
        "- PERFMON",
        "limits:",
        "readOnly: true",
    ] {
        assert!(
            daemonset.contains(needed),
            "daemonset.yaml lacks `{needed}`"
        );
    }
    assert!(
        !daemonset.contains("privileged: true"),
        "the agent must not need a privileged container"
    );
    let collector = fs::read_to_string(repo_file("packaging/kubernetes/collector.yaml")).unwrap();
    assert!(collector.contains("k8sattributes") && collector.contains("name: container.id"));
    assert!(collector.contains("service.profilesSupport"));
}

/// The `hostprof.toml` block of the ConfigMap (a YAML literal block).
fn configmap_toml(configmap: &str) -> String {
    let mut lines = configmap
        .lines()
        .skip_while(|line| !line.trim_start().starts_with("hostprof.toml: |"));
    lines.next();
    lines
        .take_while(|line| line.starts_with("    ") || line.is_empty())
        .map(|line| format!("{}\n", line.trim_start()))
        .collect()
}

#[test]
fn shipped_configurations_are_accepted_by_the_agent() {
    let configmap = fs::read_to_string(repo_file("packaging/kubernetes/configmap.yaml")).unwrap();
    let from_configmap = work_dir().join("configmap-hostprof.toml");
    let toml = configmap_toml(&configmap);
    assert!(toml.contains("log-format = \"json\""), "{toml}");
    fs::write(&from_configmap, toml).unwrap();
    let daemonset = fs::read_to_string(repo_file("packaging/kubernetes/daemonset.yaml")).unwrap();
    assert!(daemonset.contains("--config\", \"/etc/hostprof/hostprof.toml"));
    assert!(daemonset.contains("name: hostprof-config"));
    for config in [repo_file("packaging/config/hostprof.toml"), from_configmap] {
        let output = hostprof()
            .args(["agent", "--print-config", "--config"])
            .arg(&config)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{}: {}",
            config.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            printed.contains(&format!("frequency = 19  # {}", config.display())),
            "{printed}"
        );
    }
    // The negative control: the same check rejects a file with a typo.
    let typo = work_dir().join("typo-hostprof.toml");
    fs::write(&typo, "frequency = 19\nreport_interval = 5\n").unwrap();
    let output = hostprof()
        .args(["agent", "--print-config", "--config"])
        .arg(&typo)
        .output()
        .unwrap();
    assert!(!output.status.success());
}

#[test]
fn aarch64_build_runs_under_qemu() {
    let binary = match std::env::var("HOSTPROF_AARCH64_BIN") {
        Ok(path) => PathBuf::from(path),
        Err(_) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!(
                "CI=true: HOSTPROF_AARCH64_BIN must name the aarch64 build (cargo xtask test sets it)"
            )
        }
        Err(_) => {
            eprintln!("skipping: set HOSTPROF_AARCH64_BIN (cargo xtask test builds and sets it)");
            return;
        }
    };
    if !require_tool("qemu-aarch64-static") {
        return;
    }
    let header = fs::read(&binary).unwrap();
    // ELF e_machine 183 = EM_AARCH64.
    assert_eq!(
        u16::from_le_bytes([header[18], header[19]]),
        183,
        "not an aarch64 ELF"
    );
    let output = run_ok(
        Command::new("qemu-aarch64-static")
            .args(["-L", "/usr/aarch64-linux-gnu"])
            .arg(&binary)
            .arg("--version"),
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("hostprof {}", env!("CARGO_PKG_VERSION"))
    );
    // The configuration layers work the same on aarch64.
    let output = run_ok(
        Command::new("qemu-aarch64-static")
            .args(["-L", "/usr/aarch64-linux-gnu"])
            .arg(&binary)
            .args(["agent", "--print-config", "--frequency", "49"])
            .env("HOSTPROF_OFF_CPU", "true")
            .env(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "https://collector.example:4317",
            ),
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("frequency = 49  # command line"),
        "{printed}"
    );
    assert!(
        printed.contains("off-cpu = true  # HOSTPROF_OFF_CPU"),
        "{printed}"
    );
    assert!(
        printed.contains(
            "otlp-endpoint = \"https://collector.example:4317\"  # OTEL_EXPORTER_OTLP_ENDPOINT"
        ),
        "{printed}"
    );
}
