//! What the sampler's BPF maps cost the kernel: each map's `memlock` from
//! its fd's `/proc/self/fdinfo`, the figure the kernel charges to the
//! agent's memory cgroup (Linux 5.11+ accounts BPF maps to the cgroup of
//! their creator) and `bpftool map show` prints.
//!
//! Read once, right after the load: every map of ours is fixed in size
//! (arrays, rings, and hash maps preallocated for perf_event programs), so
//! what the kernel reports at the load stays true until the maps go.
use std::os::fd::{AsFd, AsRawFd};

use aya::maps::{Map, MapData};

/// One map's kernel memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapMemory {
    pub name: String,
    /// The kernel's `map_type` number (`BPF_MAP_TYPE_*`).
    pub map_type: u32,
    pub max_entries: u32,
    pub value_size: u32,
    /// `memlock` of its fdinfo: bytes of kernel memory.
    pub bytes: u64,
}

/// The memory of every map loaded with `maps` (those `fdinfo` describes;
/// a map the kernel says nothing of counts as 0, and is logged).
pub fn measure<'a>(maps: impl Iterator<Item = (&'a str, &'a Map)>) -> Vec<MapMemory> {
    let mut measured: Vec<MapMemory> = maps
        .filter_map(|(name, map)| {
            let data = map_data(map)?;
            let fd = data.fd().as_fd().as_raw_fd();
            let read = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
                .ok()
                .and_then(|text| parse_fdinfo(name, &text));
            if read.is_none() {
                tracing::debug!("map {name}: its fdinfo has no memlock");
            }
            read
        })
        .collect();
    measured.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    for map in &measured {
        tracing::debug!(
            "map {}: type {}, {} entries of {} bytes, {} bytes of kernel memory",
            map.name,
            map.map_type,
            map.max_entries,
            map.value_size,
            map.bytes
        );
    }
    measured
}

/// `name`'s figures from the text of its fd's fdinfo (`memlock:\t4096`
/// lines); `None` when that is not a map's.
pub fn parse_fdinfo(name: &str, text: &str) -> Option<MapMemory> {
    let field = |key: &str| {
        text.lines().find_map(|line| {
            let (k, value) = line.split_once(':')?;
            (k.trim() == key).then(|| value.trim().parse::<u64>().ok())?
        })
    };
    let number = |key: &str| field(key).and_then(|value| u32::try_from(value).ok());
    Some(MapMemory {
        name: name.to_string(),
        map_type: number("map_type")?,
        max_entries: number("max_entries").unwrap_or(0),
        value_size: number("value_size").unwrap_or(0),
        bytes: field("memlock")?,
    })
}

/// The map types our object declares (`agent-ebpf/src/programs/`); the
/// integration tests compare the sum with `/proc/PID/fdinfo`, which a map
/// of another type, missed here, would fail.
fn map_data(map: &Map) -> Option<&MapData> {
    match map {
        Map::Array(data)
        | Map::HashMap(data)
        | Map::LruHashMap(data)
        | Map::PerCpuArray(data)
        | Map::PerCpuHashMap(data)
        | Map::ProgramArray(data)
        | Map::RingBuf(data) => Some(data),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_maps_fdinfo() {
        // /proc/self/fdinfo of a ring buffer on Linux 6.18.
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2090\n\
                    map_type:\t27\nkey_size:\t0\nvalue_size:\t0\n\
                    max_entries:\t1048576\nmap_flags:\t0x0\nmap_extra:\t0x0\n\
                    memlock:\t1065304\nmap_id:\t812\nfrozen:\t0\n";
        assert_eq!(
            parse_fdinfo("SAMPLES", text),
            Some(MapMemory {
                name: "SAMPLES".into(),
                map_type: 27,
                max_entries: 1 << 20,
                value_size: 0,
                bytes: 1_065_304,
            })
        );
    }

    #[test]
    fn a_file_or_program_fd_is_no_map() {
        assert_eq!(parse_fdinfo("x", "pos:\t0\nflags:\t02\nmnt_id:\t1\n"), None);
        let program = "prog_type:\t7\nprog_jited:\t1\nmemlock:\t8192\nprog_id:\t9\n";
        assert_eq!(parse_fdinfo("x", program), None);
    }
}
