//! What each CPU costs: the suite's memory check (a host-wide `record` of
//! an idle guest: its peak RSS and its BPF maps' kernel memory) on the
//! usual 2-vCPU guest and on a [`MANY_CPUS`] one of the same kernel.
//! Per-CPU maps, the sample ring and per-CPU buffers grow with the CPUs;
//! everything else must not.
//!
//! Judged on the BPF maps, which are sized at load and the same from run
//! to run. The RSS difference is printed, not judged: a `record`'s peak
//! RSS varies by about 1.5 MiB between runs of one guest (seen: the least
//! of three runs 30.1 MiB on 2 vCPUs, 28.7 MiB on 32), which is 50 KiB per
//! added CPU, as much as the cap.
use super::qemu::Boot;

/// The vCPUs of the many-CPU guest.
pub const MANY_CPUS: u32 = 32;
/// The most BPF map memory each CPU past the first two may add.
pub const MAX_PER_CPU_KIB: f64 = 64.0;

/// A `check=memory` line's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    pub cpus: u32,
    pub rss_kib: u64,
    pub bpf_kib: u64,
}

/// The memory check's figures in a boot's results, when it ran and said
/// them (exit 0, both figures read).
pub fn figures(boot: &Boot) -> Option<Figures> {
    let line = boot
        .results
        .iter()
        .find_map(|line| line.strip_prefix("check=memory "))?;
    let figures = line.split(" detail=").next().unwrap_or(line);
    let field = |key: &str| -> Option<u64> {
        figures
            .split_whitespace()
            .find_map(|field| field.strip_prefix(key)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    let found = Figures {
        cpus: u32::try_from(field("cpus")?).ok()?,
        rss_kib: field("rss_kib")?,
        bpf_kib: field("bpf_kib")?,
    };
    (field("exit") == Some(0) && found.rss_kib > 0 && found.bpf_kib > 0).then_some(found)
}

/// Whether `many` (the many-CPU guest) has at most [`MAX_PER_CPU_KIB`]
/// more BPF map memory per added CPU than `few`, and the words saying so.
pub fn per_cpu(few: Figures, many: Figures) -> (bool, String) {
    let added = f64::from(many.cpus.saturating_sub(few.cpus).max(1));
    let per_cpu = |few: u64, many: u64| (many as f64 - few as f64) / added;
    let bpf = per_cpu(few.bpf_kib, many.bpf_kib);
    let rss = per_cpu(few.rss_kib, many.rss_kib);
    let passed = many.cpus > few.cpus && bpf <= MAX_PER_CPU_KIB;
    (
        passed,
        format!(
            "BPF maps per CPU {bpf:.1} KiB (want <= {MAX_PER_CPU_KIB}), peak RSS per CPU {rss:.1} KiB \
             (not judged): {} vCPUs RSS {} + BPF maps {} KiB, {} vCPUs RSS {} + BPF maps {} KiB",
            few.cpus, few.rss_kib, few.bpf_kib, many.cpus, many.rss_kib, many.bpf_kib
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot(line: &str) -> Boot {
        Boot {
            results: vec![line.to_string()],
            tail: Vec::new(),
            stderr: String::new(),
            timed_out: false,
        }
    }

    #[test]
    fn figures_are_read_from_a_good_check_only() {
        let good = "check=memory exit=0 cpus=2 rss_kib=25907 bpf_kib=43622 detail=hostprof: x";
        assert_eq!(
            figures(&boot(good)),
            Some(Figures {
                cpus: 2,
                rss_kib: 25907,
                bpf_kib: 43622
            })
        );
        for bad in [
            "check=memory exit=1 cpus=2 rss_kib=25907 bpf_kib=43622 detail=x",
            "check=memory exit=0 cpus=2 rss_kib=0 bpf_kib=0 detail=no line",
            "check=python exit=0 cpus=2 rss_kib=1 bpf_kib=1",
        ] {
            assert_eq!(figures(&boot(bad)), None, "{bad}");
        }
    }

    #[test]
    fn growth_past_the_cap_per_added_cpu_fails() {
        let few = Figures {
            cpus: 2,
            rss_kib: 25_000,
            bpf_kib: 43_000,
        };
        let within = Figures {
            cpus: 32,
            rss_kib: 28_000,
            bpf_kib: 44_900,
        };
        assert!(
            per_cpu(few, within).0,
            "63 KiB of maps per CPU; RSS not judged"
        );
        let over = Figures {
            bpf_kib: 45_000,
            ..within
        };
        assert!(!per_cpu(few, over).0, "67 KiB per CPU");
        assert!(!per_cpu(few, few).0, "not more CPUs");
    }
}
