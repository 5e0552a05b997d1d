//! The judge's thresholds, each figure failing its own check.
use super::*;

fn boot(lines: &[&str]) -> Boot {
    Boot {
        results: lines.iter().map(|line| line.to_string()).collect(),
        tail: vec!["last console line".into()],
        stderr: String::new(),
        timed_out: false,
    }
}

const BOOT: &str = "boot kernel=6.1.0-56-amd64 arch=x86_64 cpus=2 btf=1";
const PASSING: &[&str] = &[
    BOOT,
    "check=record-dwarf exit=0 samples=878 main=875 before_tables=0 detail=hostprof: 878 samples",
    "check=record-host exit=0 samples=741 kernel=408 detail=x",
    "check=off-cpu exit=0 offcpu_us=3739776 block_here_us=3318110 detail=x",
    "check=agent exit=0 requests=2 with_samples=2 detail=x",
    "check=error-line exit=1 lines=1 detail=hostprof: error: permission denied: run as root",
    "check=python exit=0 walk_off=0 samples=790 hot=781 detail=x",
    "check=node exit=0 copied=50 samples=700 main=688 hot=473 cold=157 truth_hot=1500 \
     truth_cold=500 detail=x",
    "check=java exit=0 compiled=1 inlined=1 worker=590 java=585 hot_leaf=480 rooted=588 hot=480 jni=95 \
     truth_worker=400 truth_hot=330 detail=x",
    "check=go_labels exit=0 labeled=250 unlabeled=60 failed=1 samples=311 detail=x",
    "check=go_labels_cgo exit=0 labeled=240 unlabeled=70 failed=0 samples=310 detail=x",
    "check=thread-context exit=0 samples=1040 in_threads=1000 linked=402 good=402 foreign=0 \
     unknown=0 outside=0 threads=3 failed_reads=1 exited=12 stack_faults=13 detail=x",
    "check=memory exit=0 cpus=2 rss_kib=25907 bpf_kib=43622 detail=x",
];

fn failed(verdicts: &[Verdict]) -> Vec<&str> {
    verdicts
        .iter()
        .filter(|verdict| !verdict.passed)
        .map(|verdict| verdict.short.as_str())
        .collect()
}

#[test]
fn a_complete_good_suite_passes() {
    let verdicts = judge(&boot(PASSING));
    assert_eq!(verdicts.len(), CHECKS.len());
    assert!(failed(&verdicts).is_empty(), "{:?}", failed(&verdicts));
    assert_eq!(verdicts[0].short, "record main 0.997 of 878");
}

#[test]
fn java_passes_near_the_design_where_jfr_leans_off_it() {
    // JFR's 0.875 is 0.042 off the design's 0.833: hostprof's 0.821 is
    // 0.054 off JFR's, and 0.012 off the design's.
    let mut lines = PASSING.to_vec();
    let java = "check=java exit=0 compiled=1 inlined=1 worker=590 java=585 hot_leaf=480 rooted=588 \
                hot=480 jni=95 truth_worker=400 truth_hot=350 detail=x";
    lines[8] = java;
    let verdicts = judge(&boot(&lines));
    assert!(failed(&verdicts).is_empty(), "{:?}", failed(&verdicts));
    let java = verdicts
        .iter()
        .find(|verdict| verdict.long.starts_with("java:"))
        .expect("a java verdict");
    assert!(
        java.long.contains("or of the design's 0.833"),
        "{}",
        java.long
    );
}

#[test]
fn each_bad_figure_fails_its_check() {
    for (index, bad) in [
        (
            1,
            "check=record-dwarf exit=0 samples=878 main=800 before_tables=78 detail=x",
        ),
        (
            1,
            "check=record-dwarf exit=0 samples=90 main=90 before_tables=0 detail=x",
        ),
        (
            1,
            "check=record-dwarf exit=1 samples=0 main=0 detail=hostprof: error: x",
        ),
        (2, "check=record-host exit=0 samples=741 kernel=0 detail=x"),
        (
            3,
            "check=off-cpu exit=0 offcpu_us=0 block_here_us=0 detail=x",
        ),
        (4, "check=agent exit=0 requests=3 with_samples=0 detail=x"),
        (
            4,
            "check=agent exit=1 requests=2 with_samples=2 detail=hostprof: error: x",
        ),
        (
            5,
            "check=error-line exit=1 lines=2 detail=WARN x | hostprof: error: x",
        ),
        (
            5,
            "check=error-line exit=0 lines=1 detail=hostprof: error: x",
        ),
        (
            6,
            "check=python exit=0 walk_off=0 samples=790 hot=3 detail=x",
        ),
        (
            6,
            "check=python exit=0 walk_off=1 samples=790 hot=0 detail=x",
        ),
        (
            7,
            "check=node exit=0 samples=700 main=688 hot=225 cold=75 truth_hot=1500 truth_cold=500 detail=x",
        ),
        (
            7,
            "check=node exit=0 samples=700 main=50 hot=38 cold=12 truth_hot=1500 truth_cold=500 detail=x",
        ),
        (
            7,
            "check=node exit=1 samples=700 main=688 hot=510 cold=170 truth_hot=1500 truth_cold=500 detail=x",
        ),
        (
            7,
            "check=node exit=0 copied=60 samples=700 main=688 hot=375 cold=125 truth_hot=1500 truth_cold=500 detail=x",
        ),
        (
            7,
            "check=node exit=0 copied=200 samples=700 main=688 hot=360 cold=120 truth_hot=1500 truth_cold=500 detail=x",
        ),
        (
            7,
            // hotLoop's share of the work off --cpu-prof's: 0.889 for 0.75.
            "check=node exit=0 copied=50 samples=700 main=688 hot=560 cold=70 truth_hot=1500 \
             truth_cold=500 detail=x",
        ),
        (
            7,
            // No --cpu-prof profile to judge by.
            "check=node exit=0 copied=50 samples=700 main=688 hot=473 cold=157 truth_hot=0 \
             truth_cold=0 detail=x",
        ),
        (
            8,
            "check=java exit=0 compiled=1 inlined=1 worker=590 java=585 hot_leaf=200 rooted=588 hot=200 jni=95 \
             truth_worker=400 truth_hot=137 detail=x",
        ),
        (
            8,
            "check=java exit=0 compiled=1 inlined=1 worker=590 java=585 hot_leaf=480 rooted=100 hot=480 jni=95 \
             truth_worker=400 truth_hot=328 detail=x",
        ),
        (
            8,
            "check=java exit=0 compiled=1 inlined=1 worker=590 java=585 hot_leaf=480 rooted=588 hot=480 jni=10 \
             truth_worker=400 truth_hot=328 detail=x",
        ),
        (
            8,
            "check=java exit=0 compiled=1 inlined=1 worker=90 java=85 hot_leaf=75 rooted=90 hot=75 jni=15 \
             truth_worker=400 truth_hot=353 detail=x",
        ),
        (
            8,
            "check=java exit=0 compiled=0 inlined=1 worker=590 java=585 hot_leaf=480 rooted=588 hot=480 jni=95 \
             truth_worker=400 truth_hot=328 detail=x",
        ),
        (
            8,
            // hotLoop not inlined: its frames would not show the walk
            // expands inlined ones.
            "check=java exit=0 compiled=1 inlined=0 worker=590 java=585 hot_leaf=480 rooted=588 hot=480 jni=95 \
             truth_worker=400 truth_hot=328 detail=x",
        ),
        (
            8,
            "check=java exit=1 compiled=1 inlined=1 worker=590 java=585 hot_leaf=480 rooted=588 hot=480 jni=95 \
             truth_worker=400 truth_hot=328 detail=x",
        ),
        (
            8,
            // In Java, hotLoop's share off JFR's and the design's: 0.684
            // for 0.825 and 0.833.
            "check=java exit=0 compiled=1 inlined=1 worker=590 java=585 hot_leaf=400 rooted=588 hot=480 jni=95 \
             truth_worker=400 truth_hot=330 detail=x",
        ),
        (
            8,
            // hostprof's 0.901 is off both JFR's 0.840 and the design's
            // 0.833.
            "check=java exit=0 compiled=1 inlined=1 worker=590 java=585 hot_leaf=527 rooted=588 hot=527 jni=60 \
             truth_worker=400 truth_hot=336 detail=x",
        ),
        (
            8,
            // No JFR recording to judge by.
            "check=java exit=0 compiled=1 inlined=1 worker=590 java=585 hot_leaf=480 rooted=588 hot=480 jni=95 \
             truth_worker=0 truth_hot=0 detail=x",
        ),
        (
            9,
            "check=go_labels exit=0 labeled=100 unlabeled=210 failed=1 samples=311 detail=x",
        ),
        (
            9,
            "check=go_labels exit=0 labeled=250 unlabeled=30 failed=31 samples=311 detail=x",
        ),
        (
            10,
            "check=go_labels_cgo exit=0 labeled=90 unlabeled=0 failed=0 samples=90 detail=x",
        ),
        (
            10,
            "check=go_labels_cgo exit=1 labeled=240 unlabeled=70 failed=0 samples=310 detail=x",
        ),
        (
            11,
            "check=thread-context exit=0 samples=1040 in_threads=1000 linked=402 good=401 \
             foreign=1 unknown=0 outside=0 threads=3 failed_reads=1 stack_faults=1 detail=x",
        ),
        (
            11,
            "check=thread-context exit=0 samples=1040 in_threads=1000 linked=402 good=401 \
             foreign=0 unknown=1 outside=0 threads=3 failed_reads=1 stack_faults=1 detail=x",
        ),
        (
            11,
            "check=thread-context exit=0 samples=1040 in_threads=1000 linked=402 good=402 \
             foreign=0 unknown=0 outside=1 outside_us=40 outside_side=after threads=3 failed_reads=0 stack_faults=0 detail=x",
        ),
        (
            11,
            "check=thread-context exit=0 samples=1040 in_threads=1000 linked=100 good=100 \
             foreign=0 unknown=0 outside=0 threads=3 failed_reads=1 stack_faults=1 detail=x",
        ),
        (
            11,
            "check=thread-context exit=0 samples=1040 in_threads=90 linked=40 good=40 \
             foreign=0 unknown=0 outside=0 threads=3 failed_reads=1 stack_faults=1 detail=x",
        ),
        (
            11,
            "check=thread-context exit=0 samples=1040 in_threads=1000 linked=402 good=402 \
             foreign=0 unknown=0 outside=0 threads=2 failed_reads=0 stack_faults=0 detail=x",
        ),
        (
            11,
            "check=thread-context exit=0 samples=1040 in_threads=1000 linked=402 good=402 \
             foreign=0 unknown=0 outside=0 threads=3 failed_reads=11 stack_faults=11 detail=x",
        ),
        (
            11,
            "check=thread-context exit=0 no_log=1 failed_reads=0 stack_faults=0 detail=x",
        ),
        (
            12,
            "check=memory exit=0 cpus=2 rss_kib=0 bpf_kib=0 detail=no line",
        ),
    ] {
        let mut lines = PASSING.to_vec();
        lines[index] = bad;
        let verdicts = judge(&boot(&lines));
        assert_eq!(failed(&verdicts).len(), 1, "{bad}");
        assert!(!verdicts[index - 1].passed, "{bad}");
    }
}

#[test]
fn python_frames_are_wanted_from_linux_5_10() {
    let old_boot = BOOT.replace("kernel=6.1.0-56", "kernel=5.10.0-46");
    let mut lines = PASSING.to_vec();
    lines[0] = &old_boot;
    assert!(
        failed(&judge(&boot(&lines))).is_empty(),
        "5.10: the legacy walk"
    );
    lines[6] = "check=python exit=0 walk_off=1 samples=790 hot=0 detail=x";
    assert_eq!(
        failed(&judge(&boot(&lines))),
        ["python 0.000 of 790 FAIL"],
        "5.10: the walk must be on"
    );
    lines[6] = "check=python exit=0 absent=1";
    assert!(failed(&judge(&boot(&lines))).is_empty(), "other arch");
    lines[7] = "check=node exit=0 absent=1";
    assert_eq!(
        failed(&judge(&boot(&lines))),
        ["node n/a FAIL"],
        "every image carries node"
    );
}

#[test]
fn go_labels_are_wanted_on_the_legacy_kernels_and_from_linux_6_1() {
    let no_labels = "check=go_labels exit=0 labeled=0 unlabeled=0 failed=0 samples=311 detail=x";
    let no_labels_cgo =
        "check=go_labels_cgo exit=0 labeled=0 unlabeled=0 failed=0 samples=310 detail=x";
    for (kernel, why) in [("5.10.0-46", "5.10: the legacy read"), ("6.1.0-56", "6.1")] {
        let booted = BOOT.replace("kernel=6.1.0-56", &format!("kernel={kernel}"));
        let mut lines = PASSING.to_vec();
        lines[0] = &booted;
        assert!(failed(&judge(&boot(&lines))).is_empty(), "{why}");
        lines[9] = no_labels;
        assert_eq!(
            failed(&judge(&boot(&lines))),
            ["go labels 0.000 of 311 FAIL"],
            "{why}: the read must be on"
        );
    }
    // The modern variant before 6.1 has no read (no such kernel is in
    // the matrix): labels there would mean the agent's bound moved.
    let between = BOOT.replace("kernel=6.1.0-56", "kernel=5.18.0-4");
    let mut lines = PASSING.to_vec();
    lines[0] = &between;
    lines[7] = "check=node exit=0 modern=1";
    assert_eq!(
        failed(&judge(&boot(&lines))),
        ["go labels off FAIL", "go labels cgo off FAIL"],
        "5.18: the read must be off"
    );
    lines[9] = no_labels;
    lines[10] = no_labels_cgo;
    assert!(failed(&judge(&boot(&lines))).is_empty(), "5.18: off");
}

#[test]
fn javascript_frames_are_checked_on_x86_64_only_before_linux_5_17_and_always_on_arm64() {
    let mut lines = PASSING.to_vec();
    lines[7] = "check=node exit=0 modern=1";
    assert!(failed(&judge(&boot(&lines))).is_empty(), "6.1: on the host");
    let mut runtimes = arm64_runtimes();
    runtimes.retain(|line| !line.starts_with("check=node"));
    runtimes.push("check=node exit=0 modern=1".into());
    assert_eq!(
        failed(&judged(&arm64_lines(&runtimes))),
        ["node n/a FAIL"],
        "arm64: checked in the guest on every kernel"
    );
    let old_boot = BOOT.replace("kernel=6.1.0-56", "kernel=5.10.0-46");
    lines[0] = &old_boot;
    assert_eq!(
        failed(&judge(&boot(&lines))),
        ["node n/a FAIL"],
        "5.10: the legacy walk must be checked"
    );
}

#[test]
fn java_frames_are_wanted_on_arm64() {
    let mut lines = PASSING.to_vec();
    lines[8] = "check=java exit=0 absent=1";
    assert!(
        failed(&judge(&boot(&lines))).is_empty(),
        "x86_64: on the host"
    );
    let mut runtimes = arm64_runtimes();
    runtimes.retain(|line| !line.starts_with("check=java"));
    runtimes.push("check=java exit=0 absent=1".into());
    assert_eq!(
        failed(&judged(&arm64_lines(&runtimes))),
        ["java n/a FAIL"],
        "arm64: the image carries JVMs"
    );
}

#[test]
fn missing_results_fail() {
    let verdicts = judge(&boot(&PASSING[..3]));
    assert_eq!(failed(&verdicts).len(), 10);
    assert!(verdicts[2].long.contains("no result"));
    let verdicts = judge(&boot(&[]));
    assert_eq!(failed(&verdicts), ["boot FAIL"]);
    let no_btf = BOOT.replace("btf=1", "btf=0");
    let mut lines = PASSING.to_vec();
    lines[0] = &no_btf;
    assert_eq!(failed(&judge(&boot(&lines))), ["btf FAIL"]);
}

const ARM64: &str = "boot kernel=6.1.0-56-arm64 arch=aarch64 cpus=2 btf=1";

/// A node line whose `work` samples (hotLoop's and coldLoop's) split as
/// --cpu-prof's do, 3 to 1.
fn node_line(version: &str, work: u32) -> String {
    format!(
        "check=node version={version} contained=1 exit=0 copied=50 samples=700 main=688 hot={} \
         cold={} truth_hot=1500 truth_cold=500 detail=x",
        work - work / 4,
        work / 4
    )
}

fn java_line(version: u32, hot: u32) -> String {
    format!(
        "check=java version={version} exit=0 compiled=1 inlined=1 worker=590 java=585 hot_leaf={hot} rooted=588 hot={hot} \
         jni=95 truth_worker=400 truth_hot={} detail=x",
        // JFR's share as hostprof's in Java.
        400 * hot / 585
    )
}

/// A passing arm64 suite: one line per Node.js (those the image carries)
/// and JDK version.
fn arm64_runtimes() -> Vec<String> {
    let nodes = crate::vmtest::image::node_versions(crate::vmtest::Arch::Aarch64);
    let mut lines: Vec<String> = nodes
        .iter()
        .map(|version| node_line(version, 630))
        .collect();
    lines.extend([11, 17, 21].map(|version| java_line(version, 480)));
    lines
}

/// [`PASSING`] on arm64, with `runtimes` for its node and java lines.
fn arm64_lines(runtimes: &[String]) -> Vec<String> {
    let mut lines: Vec<String> = PASSING.iter().map(|line| line.to_string()).collect();
    lines[0] = ARM64.to_string();
    lines.retain(|line| !line.starts_with("check=node") && !line.starts_with("check=java"));
    lines.extend(runtimes.iter().cloned());
    lines
}

fn judged(lines: &[String]) -> Vec<Verdict> {
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    judge(&boot(&lines))
}

#[test]
fn arm64_judges_each_runtime_version_on_its_own_line() {
    let runtimes = arm64_runtimes();
    let verdicts = judged(&arm64_lines(&runtimes));
    assert!(failed(&verdicts).is_empty(), "{:?}", failed(&verdicts));
    // One line each past the one a check has anyway.
    assert_eq!(verdicts.len(), CHECKS.len() + runtimes.len() - 2);
    let shown: Vec<&str> = verdicts
        .iter()
        .filter(|verdict| verdict.show)
        .map(|verdict| verdict.long.as_str())
        .collect();
    assert_eq!(
        shown.len(),
        1 + runtimes.len(),
        "error line, nodes, JVMs: {shown:?}"
    );
    assert!(shown[1].starts_with("node 18.20.4: exit 0"), "{}", shown[1]);
    let last = shown.last().unwrap();
    assert!(last.starts_with("java 21: exit 0"), "{last}");

    let mut bad = runtimes.clone();
    bad[1] = node_line("20.18.0", 300);
    *bad.last_mut().unwrap() = java_line(21, 100);
    assert_eq!(
        failed(&judged(&arm64_lines(&bad))),
        [
            "node 20.18.0 (pid ns) 0.470 of 638, hot 0.750 (--cpu-prof 0.750) FAIL",
            "java 21 0.169 of 590, in Java 0.171 (JFR 0.170) FAIL"
        ]
    );
    let missing: Vec<String> = runtimes
        .iter()
        .filter(|line| !line.contains("22.10.0") && !line.contains("version=11 "))
        .cloned()
        .collect();
    assert_eq!(
        failed(&judged(&arm64_lines(&missing))),
        ["node 22.10.0 FAIL", "java 11 FAIL"]
    );
}
