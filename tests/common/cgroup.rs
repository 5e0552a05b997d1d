//! A stand-in container for tests: a cgroup v2 directory named like a
//! containerd container's scope, which hostprof reads as that container.
//! Only for tests where the runtime is not the point (a recorded file's
//! split by container in tests/report.rs): the per-container grouping itself
//! is tested with real Docker containers in tests/containers.rs.
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

/// A cgroup directory named `cri-containerd-ID.scope`; removed on drop (its
/// processes must have exited by then).
pub struct ContainerCgroup {
    pub dir: PathBuf,
    /// The 64-hex container id hostprof should report.
    pub id: String,
}

impl ContainerCgroup {
    pub fn create() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let id = format!("{:032x}{:032x}", nanos, u128::from(std::process::id()));
        let dir = PathBuf::from(format!("/sys/fs/cgroup/unified/cri-containerd-{id}.scope"));
        std::fs::create_dir(&dir).expect("create a cgroup under /sys/fs/cgroup/unified");
        ContainerCgroup { dir, id }
    }

    /// Moves process `pid` into the cgroup.
    pub fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("move into cgroup");
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        // The kernel releases the cgroup a moment after its last process exits.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            std::thread::yield_now();
        }
    }
}
