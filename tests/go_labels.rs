//! Go's pprof labels as sample attributes, end to end with the real eBPF
//! sampler: a Go program (`tests/programs/go_labels`), built here by each
//! Go toolchain `cargo xtask setup` installs (1.15, 1.19, 1.23 to 1.27) with cgo
//! and without, works in turns under
//! `pprof.Do` with `route=/cart` (3 units), `route=/checkout` (1 unit,
//! in C when built with cgo: a thread in a cgo call runs `g0`), without
//! labels (1 unit), and under 15 labels (1 unit: more than hostprof
//! keeps, with a key over its cap and a value it cuts). `hostprof record -p PID` writes OTLP, decoded
//! here by the generated protobuf types; its pprof conversion is read by
//! `go tool pprof -tags`, and `hostprof report --attribute` filters by a
//! label.
mod common;

use std::{path::PathBuf, process::Command, time::Duration};

use common::{
    collector::{location_names, sample_count, sample_locations, sample_pid, text_attribute},
    running::{self, KillOnDrop},
};
use hostprof_proto::{
    Message,
    common::any_value::Value,
    profiles::{ProfilesData, ProfilesDictionary, Sample},
};

/// The `go` of a release `cargo xtask setup` unpacked under target/.
macro_rules! debian_go {
    ($release:literal) => {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/go-",
            $release,
            "/usr/lib/go-",
            $release,
            "/bin/go"
        )
    };
}

/// The toolchains: Debian bookworm's Go 1.19, the 1.23 `cargo xtask
/// setup` installs from bookworm-backports, and the ones it unpacks under
/// target/ (`DEBIAN_GOS` in xtask/src/setup.rs): bullseye's 1.15 (the
/// version in the older `.go.buildinfo` header, `g.labels` elsewhere),
/// trixie's 1.24 (labels in a slice, not a map), trixie-backports' 1.25
/// (`m.curg` and `g.labels` moved), 1.26 and 1.27 (`g.labels` moved
/// again, the label slice's type renamed).
const TOOLCHAINS: [&str; 7] = [
    debian_go!("1.15"),
    "/usr/bin/go",
    "/usr/lib/go-1.23/bin/go",
    debian_go!("1.24"),
    debian_go!("1.25"),
    debian_go!("1.26"),
    debian_go!("1.27"),
];
/// Labeled samples to see at least.
const LABELED_AT_LEAST: u64 = 100;
/// CPU seconds the program runs while recorded: ~750 samples at 499 Hz,
/// ~500 of them in the /cart and /checkout turns.
const CPU_SECONDS: f64 = 1.5;
/// `/cart`'s share of the labeled work.
const CART_SHARE: f64 = 0.75;
/// Allowed distance from it: with 500 such samples the share's standard
/// deviation is under 0.02, so this is 3.6 of them; with the fewest
/// allowed (100), 1.6.
const SHARE_TOLERANCE: f64 = 0.07;

#[test]
fn go_samples_carry_their_goroutines_labels_without_cgo() {
    for go in TOOLCHAINS {
        check(go, false);
    }
}

#[test]
fn go_samples_carry_their_goroutines_labels_with_cgo() {
    for go in TOOLCHAINS {
        check(go, true);
    }
}

/// The legacy eBPF variant's read (Linux 5.10 to 5.16: a loop bounded in
/// the program, no `bpf_loop`), loaded on this kernel: a map of labels
/// (1.23) and a slice (1.27), with cgo and without. `cargo xtask vmtest`
/// runs it on a real 5.10.
#[test]
fn the_legacy_variant_reads_the_labels_too() {
    for go in [TOOLCHAINS[2], TOOLCHAINS[6]] {
        for cgo in [false, true] {
            check_on(go, cgo, Some("legacy"));
        }
    }
}

/// A Go executable whose version cannot be read (its `.go.buildinfo`
/// version string damaged) runs unlabeled, and `record` says so once
/// rather than only in a log line a user does not see by default.
#[test]
fn a_go_executable_whose_version_is_unreadable_is_counted() {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let Some((binary, version)) = build_as(TOOLCHAINS[1], false, "-unreadable") else {
        return;
    };
    let mut bytes = std::fs::read(&binary).unwrap();
    // The header (Go 1.18+: the version inline, a length byte at 32).
    let magic = b"\xff Go buildinf:";
    let at = bytes
        .windows(magic.len())
        .position(|window| window == magic)
        .expect("a .go.buildinfo header");
    let text = at + 33;
    assert_eq!(
        &bytes[text..text + 4],
        b"go1.",
        "{version}: the header's version"
    );
    bytes[text + 1] = b'x';
    let damaged = binary.with_file_name(format!("go_labels-{version}-damaged"));
    let _ = std::fs::remove_file(&damaged);
    std::fs::write(&damaged, &bytes).unwrap();
    std::fs::set_permissions(
        &damaged,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let (mut program, stop) = start(&damaged, "go_labels-unreadable");
    let pid = program.0.id();
    let out = common::work_dir().join("go_labels-unreadable.otlp.pb");
    let (mut recording, mut log) = running::record_pid_on(pid, "99", &out, None);
    // Its first sample has the process looked at; a fifth of a second at
    // 99 Hz is about 20 of them.
    let ran = running::wait_for_cpu(pid, 0.2, Duration::from_secs(60));
    assert_eq!(ran, Some(true), "the damaged program did not run");
    let status = running::interrupt(&mut recording);
    let log = log.finish();
    std::fs::write(&stop, b"").unwrap();
    let _ = program.0.wait();
    assert!(status.success(), "hostprof record failed:\n{log}");
    assert!(
        log.contains("go labels: not read for 1 Go executable(s)"),
        "record did not say the labels were not read:\n{log}"
    );
}

/// Which turn of the program a sample caught, by its leaf function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Turn {
    Cart,
    Checkout,
    Plain,
    Bulk,
    /// Go's runtime (the scheduler, the garbage collector's workers).
    Other,
}

fn turn_of(dictionary: &ProfilesDictionary, sample: &Sample) -> Turn {
    let leaf = sample_locations(dictionary, sample)
        .first()
        .map(|location| location_names(dictionary, location))
        .unwrap_or_default();
    match leaf.first().map(String::as_str) {
        Some("main.cartSpin") => Turn::Cart,
        Some("main.checkoutSpin" | "checkout_spin_c") => Turn::Checkout,
        Some("main.plainSpin") => Turn::Plain,
        Some("main.bulkSpin") => Turn::Bulk,
        _ => Turn::Other,
    }
}

/// A sample of the bulk turn keeps at most 10 of its 15 labels, Go's
/// names and values, the long key left out and the long value cut back
/// to whole characters; true when it has some (a map of 15 labels has 4
/// buckets, of which the kernel reads 2: they may hold none of them).
fn check_bulk(dictionary: &ProfilesDictionary, sample: &Sample, what: &str) -> bool {
    let mut labels = Vec::new();
    for &index in &sample.attribute_indices {
        let attribute = &dictionary.attribute_table[index as usize];
        let key = &dictionary.string_table[attribute.key_strindex as usize];
        let value = match attribute
            .value
            .as_ref()
            .and_then(|value| value.value.as_ref())
        {
            Some(Value::StringValue(value)) => value.clone(),
            _ => continue,
        };
        let expected = match key.as_str() {
            "route" => "/bulk".to_owned(),
            "long" => format!("x{}", "é".repeat(31)),
            _ => match key.strip_prefix('k').and_then(|n| n.parse::<u8>().ok()) {
                Some(n) if n < 12 && key.len() == 3 => format!("v{n:02}"),
                // hostprof's own attributes (thread.name, process.pid, …).
                _ => continue,
            },
        };
        assert_eq!(value, expected, "{what}: bulk label {key}");
        labels.push(key.clone());
    }
    assert!(labels.len() <= 10, "{what}: bulk labels {labels:?}");
    !labels.is_empty()
}

/// Builds the program with `go`, cgo or not; `None` when that toolchain
/// is not installed.
fn build(go: &str, cgo: bool) -> Option<(PathBuf, String)> {
    build_as(go, cgo, "")
}

/// [`build`] to a file of its own, its name ending in `suffix`: tests
/// running side by side do not write one file at once.
fn build_as(go: &str, cgo: bool, suffix: &str) -> Option<(PathBuf, String)> {
    if !common::require_tool(go) {
        return None;
    }
    // `go version` says `go version go1.15.15 linux/amd64` (`go env
    // GOVERSION` is 1.16's).
    let version = common::run_ok(Command::new(go).arg("version"));
    let version = String::from_utf8_lossy(&version.stdout)
        .split_whitespace()
        .nth(2)
        .expect("go version's release")
        .to_owned();
    let binary =
        common::work_dir().join(format!("go_labels-{version}-cgo{}{suffix}", u8::from(cgo)));
    common::run_ok(
        Command::new(go)
            .args(["build", "-o"])
            .arg(&binary)
            .arg(".")
            .current_dir(common::program_source("go_labels"))
            .env("CGO_ENABLED", if cgo { "1" } else { "0" })
            .env("GOCACHE", common::work_dir().join("go-cache"))
            .env("GOPATH", common::work_dir().join("go-path"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local"),
    );
    Some((binary, version))
}

/// Starts the Go program `binary`, which works until the file it returns
/// (named after `name`) exists, or 120 s.
fn start(binary: &std::path::Path, name: &str) -> (KillOnDrop, PathBuf) {
    let stop = common::work_dir().join(format!("{name}.stop"));
    let _ = std::fs::remove_file(&stop);
    let program = KillOnDrop(
        Command::new(binary)
            .arg(&stop)
            .arg("120")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start the Go program"),
    );
    (program, stop)
}

fn check(go: &str, cgo: bool) {
    check_on(go, cgo, None);
}

/// [`check`] with the eBPF variant `variant` forced.
fn check_on(go: &str, cgo: bool, variant: Option<&str>) {
    let Some(_serial) = common::require_ebpf() else {
        return;
    };
    let Some((binary, version)) = build(go, cgo) else {
        return;
    };
    let variant_name = variant.unwrap_or("chosen");
    let what = format!("{version}, cgo {cgo}, variant {variant_name}");
    // Files of their own: the tests of both variants run side by side.
    let name = format!("go_labels-{version}-{cgo}-{variant_name}");
    let (mut program, stop) = start(&binary, &name);
    let pid = program.0.id();
    let out = common::work_dir().join(format!("{name}.otlp.pb"));
    let (mut recording, mut log) = running::record_pid_on(pid, "499", &out, variant);
    let ran = running::wait_for_cpu(pid, CPU_SECONDS, Duration::from_secs(60));
    assert_eq!(ran, Some(true), "{what}: the program did not run");
    let status = running::interrupt(&mut recording);
    let log = log.finish();
    assert!(status.success(), "{what}: hostprof record failed:\n{log}");
    std::fs::write(&stop, b"").unwrap();
    assert!(
        program.0.wait().unwrap().success(),
        "{what}: the program failed"
    );

    let data = ProfilesData::decode(&*std::fs::read(&out).unwrap()).expect("a ProfilesData");
    let dictionary = data.dictionary.as_ref().expect("a dictionary");
    // (turn, route) -> samples.
    let mut seen = std::collections::HashMap::<(Turn, Option<String>), u64>::new();
    let (mut bulk, mut bulk_labeled) = (0, 0);
    for group in &data.resource_profiles {
        for scope in &group.scope_profiles {
            for profile in &scope.profiles {
                for sample in &profile.samples {
                    if sample_pid(dictionary, sample) != Some(i64::from(pid)) {
                        continue;
                    }
                    // Labels without a trace context: no link.
                    assert_eq!(sample.link_index, 0, "{what}: a Go sample has a link");
                    let key = (
                        turn_of(dictionary, sample),
                        text_attribute(dictionary, sample, "route"),
                    );
                    if key.0 == Turn::Bulk {
                        let count = sample_count(sample);
                        bulk += count;
                        if check_bulk(dictionary, sample, &what) {
                            bulk_labeled += count;
                        }
                    }
                    *seen.entry(key).or_default() += sample_count(sample);
                }
            }
        }
    }
    let count = |turn: Turn, route: Option<&str>| {
        seen.get(&(turn, route.map(str::to_owned)))
            .copied()
            .unwrap_or(0)
    };
    let cart = count(Turn::Cart, Some("/cart"));
    let checkout = count(Turn::Checkout, Some("/checkout"));
    let plain = count(Turn::Plain, None);
    println!("{what}: {seen:?}");
    // Every sample of a turn has that turn's label, and only those.
    let wrong: u64 = seen
        .iter()
        .filter(|((turn, route), _)| match turn {
            Turn::Cart => route.as_deref() != Some("/cart"),
            Turn::Checkout => route.as_deref() != Some("/checkout"),
            Turn::Plain => route.is_some(),
            // The map's order: route may be among the labels left out.
            Turn::Bulk => route.as_deref().is_some_and(|route| route != "/bulk"),
            Turn::Other => false,
        })
        .map(|(_, samples)| samples)
        .sum();
    assert_eq!(
        wrong, 0,
        "{what}: samples with another turn's label: {seen:?}"
    );
    assert!(
        cart + checkout >= LABELED_AT_LEAST && plain > 0,
        "{what}: {cart} /cart, {checkout} /checkout, {plain} unlabeled samples; log:\n{log}"
    );
    assert!(
        bulk_labeled * 2 > bulk,
        "{what}: {bulk_labeled} of {bulk} samples of the bulk turn have labels"
    );
    // record's summary counts the kernel's reads, the bulk turn's cut.
    let summary = log
        .lines()
        .find_map(|line| line.strip_prefix("hostprof: Go labels: "))
        .unwrap_or_else(|| panic!("{what}: no Go labels line in:\n{log}"));
    let cut: u64 = summary
        .rsplit_once(" reads failed, ")
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{what}: {summary}"));
    assert!(cut > 0, "{what}: {summary}");
    let share = cart as f64 / (cart + checkout) as f64;
    println!(
        "{what}: {cart} /cart, {checkout} /checkout, {plain} unlabeled: /cart's share {share:.3}"
    );
    assert!(
        (share - CART_SHARE).abs() <= SHARE_TOLERANCE,
        "{what}: /cart's share {share:.3}, not {CART_SHARE} ± {SHARE_TOLERANCE}"
    );

    // `report --attribute` keeps the /cart samples, wherever they ran.
    let all_cart: u64 = seen
        .iter()
        .filter(|((_, route), _)| route.as_deref() == Some("/cart"))
        .map(|(_, samples)| samples)
        .sum();
    let report = common::run_ok(
        common::hostprof()
            .arg("report")
            .arg(&out)
            .args(["--attribute", "route=/cart"]),
    );
    let text = String::from_utf8_lossy(&report.stderr);
    assert!(
        text.contains(&format!(" {all_cart} of ")),
        "{what}: report --attribute route=/cart: {text}"
    );
    // The labels are pprof labels too, read by Go's own pprof.
    let pprof = common::work_dir().join(format!("{name}.pb.gz"));
    common::run_ok(
        common::hostprof()
            .arg("report")
            .arg(&out)
            .arg("-o")
            .arg(&pprof),
    );
    let tags = common::run_ok(
        Command::new(go)
            .args(["tool", "pprof", "-tags"])
            .arg(&pprof),
    );
    let tags = String::from_utf8_lossy(&tags.stdout);
    assert!(
        tags.contains(" route: ") && tags.contains(": /cart") && tags.contains(": /checkout"),
        "{what}: go tool pprof -tags: {tags}"
    );
}
