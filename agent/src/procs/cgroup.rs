//! Container id and Kubernetes pod uid from the text of `/proc/PID/cgroup`.
//!
//! Runtimes name a container's cgroup after its 64-hex-digit id, each in its
//! own way: docker (`docker-<id>.scope` with systemd, `/docker/<id>` without),
//! containerd/CRI (`cri-containerd-<id>.scope`, `/kubepods/.../<id>`), CRI-O
//! (`crio-<id>.scope`), podman (`libpod-<id>.scope`). The kubelet puts pods
//! under `kubepods…pod<uid>.slice` (systemd driver, `_` for `-`) or
//! `/kubepods/<qos>/pod<uid>/` (cgroupfs driver). Both cgroup v1 (one line per
//! hierarchy) and v2 (`0::/path`) files are understood: the first line that
//! names a container wins.

/// What the cgroup file says about where a process runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupIdentity {
    /// 64 lowercase hex digits.
    pub container_id: Option<String>,
    /// The pod's uid with dashes (`0f3c…-…`).
    pub pod_uid: Option<String>,
}

/// Parses the content of `/proc/PID/cgroup`.
pub fn parse_cgroup(text: &str) -> CgroupIdentity {
    let mut identity = CgroupIdentity::default();
    for line in text.lines() {
        // hierarchy-id:controllers:path; the path may itself contain ':'.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        if identity.container_id.is_none() {
            identity.container_id = container_id(path);
        }
        if identity.pod_uid.is_none() {
            identity.pod_uid = pod_uid(path);
        }
        if identity.container_id.is_some() && identity.pod_uid.is_some() {
            break;
        }
    }
    identity
}

/// The innermost path component that is a container id.
fn container_id(path: &str) -> Option<String> {
    path.rsplit('/').find_map(|component| {
        let name = component.strip_suffix(".scope").unwrap_or(component);
        // `cri-containerd-`, `docker-`, `crio-`, `libpod-`: the id is the part
        // after the last dash. A bare id (cgroupfs driver) has no dash at all.
        let id = name.rsplit('-').next().unwrap_or(name);
        is_container_id(id).then(|| id.to_ascii_lowercase())
    })
}

fn is_container_id(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|byte| byte.is_ascii_hexdigit())
}

/// The pod uid from a `kubepods` path.
fn pod_uid(path: &str) -> Option<String> {
    if !path.contains("kubepods") {
        return None;
    }
    path.split('/').find_map(|component| {
        let name = component.strip_suffix(".slice").unwrap_or(component);
        // systemd: kubepods-burstable-pod<uid>.slice; cgroupfs: pod<uid>.
        let uid = &name[name.rfind("pod")? + 3..];
        let uid = uid.replace('_', "-");
        is_uid(&uid).then(|| uid.to_ascii_lowercase())
    })
}

fn is_uid(text: &str) -> bool {
    let groups: Vec<_> = text.split('-').collect();
    groups.iter().map(|group| group.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|group| group.bytes().all(|byte| byte.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4b1f0e5d0c3a8e2f9d7c6b5a4938271605f4e3d2c1b0a9f8e7d6c5b4a3928170";

    fn id(text: &str) -> Option<String> {
        parse_cgroup(text).container_id
    }

    #[test]
    fn docker_v2_systemd_and_v1_cgroupfs() {
        assert_eq!(
            id(&format!("0::/system.slice/docker-{ID}.scope\n")).as_deref(),
            Some(ID)
        );
        let v1 = format!(
            "12:pids:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n"
        );
        assert_eq!(id(&v1).as_deref(), Some(ID));
    }

    #[test]
    fn containerd_crio_podman() {
        for prefix in ["cri-containerd-", "crio-", "libpod-"] {
            let text = format!("0::/system.slice/{prefix}{ID}.scope\n");
            assert_eq!(id(&text).as_deref(), Some(ID), "{prefix}");
        }
        // Podman rootless puts a container subgroup below the scope.
        let text = format!("0::/user.slice/user-1000.slice/libpod-{ID}.scope/container\n");
        assert_eq!(id(&text).as_deref(), Some(ID));
    }

    /// `text` names container `ID` in pod 0f3c2a1e-….
    fn assert_container_in_pod(text: &str) {
        let identity = parse_cgroup(text);
        assert_eq!(identity.container_id.as_deref(), Some(ID));
        assert_eq!(
            identity.pod_uid.as_deref(),
            Some("0f3c2a1e-5b6d-4c7e-8f90-a1b2c3d4e5f6")
        );
    }

    #[test]
    fn kubernetes_systemd_driver_pod_and_container() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod0f3c2a1e_5b6d_4c7e_8f90_a1b2c3d4e5f6.slice/\
             cri-containerd-{ID}.scope\n"
        );
        assert_container_in_pod(&text);
    }

    #[test]
    fn kubernetes_cgroupfs_driver_v1() {
        let text =
            format!("5:memory:/kubepods/besteffort/pod0f3c2a1e-5b6d-4c7e-8f90-a1b2c3d4e5f6/{ID}\n");
        assert_container_in_pod(&text);
    }

    #[test]
    fn host_processes_have_no_container() {
        for text in [
            "0::/init.scope\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "12:pids:/system.slice/sshd.service\n0::/system.slice/sshd.service\n",
            "",
            "garbage",
            // Too short to be an id, and a pod path without a uid.
            "0::/system.slice/docker-abc.scope\n0::/kubepods.slice/podnope.slice\n",
        ] {
            assert_eq!(parse_cgroup(text), CgroupIdentity::default(), "{text:?}");
        }
    }
}
