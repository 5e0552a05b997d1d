//! `/proc/PID/cgroup` text (cgroup paths are chosen by whoever creates the
//! cgroup, e.g. a container runtime or a user with a delegated subtree).
#![no_main]

use hostprof::procs::parse_cgroup;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The agent reads the file with read_to_string.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let identity = parse_cgroup(text);
    if let Some(id) = identity.container_id {
        assert!(id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    if let Some(uid) = identity.pod_uid {
        assert_eq!(uid.len(), 36);
    }
});
