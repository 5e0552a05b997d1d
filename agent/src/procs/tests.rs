use hostprof_common::{PROCESS_EVENT_EXEC, PROCESS_EVENT_EXIT, PROCESS_EVENT_FORK, ProcessEvent};

use super::*;

fn event(kind: u32, tgid: u32, parent_tgid: u32, ktime_ns: u64) -> ProcessEvent {
    ProcessEvent {
        kind,
        tgid,
        parent_tgid,
        _pad: 0,
        ktime_ns,
    }
}

/// Pids above pid_max are never valid: /proc has nothing for them.
const GONE: u32 = u32::MAX - 1;

#[test]
fn reads_our_own_process() {
    let mut table = ProcessTable::new();
    let pid = std::process::id();
    let info = table.info(pid, "ignored", 0);
    assert_eq!(info.pid, pid);
    assert_eq!(
        &*info.exe_path,
        std::env::current_exe().unwrap().to_str().unwrap()
    );
    // The address of this very function lies in our executable's mapping.
    let here = reads_our_own_process as *const () as u64;
    let (mapping, offset) = table
        .mapping_of(pid, "ignored", 0, here)
        .expect("text is mapped");
    assert_eq!(&*mapping.path, &*info.exe_path);
    assert!(offset >= mapping.file_offset);
}

#[test]
fn a_samples_frames_are_mapped_with_one_lookup_of_their_process() {
    let mut table = ProcessTable::new();
    let pid = std::process::id();
    let here = a_samples_frames_are_mapped_with_one_lookup_of_their_process as *const () as u64;
    let libc = libc::getpid as *const () as u64;
    let frame = |address| Frame {
        kind: crate::model::FrameKind::Native,
        address,
        mapping: None,
        file_offset: 0,
        lines: crate::model::no_lines(),
    };
    let mut frames = [frame(here), frame(here | 1 << 63), frame(0x10), frame(libc)];
    table.map_frames(pid, "ignored", 0, &mut frames, |frame| {
        frame.address >> 63 == 0
    });
    let exe = std::env::current_exe().unwrap();
    let (mapped, offset) = table.mapping_of(pid, "ignored", 0, here).unwrap();
    assert_eq!(
        std::path::Path::new(&*frames[0].mapping.as_ref().unwrap().path),
        exe
    );
    assert_eq!(frames[0].mapping, Some(mapped));
    assert_eq!(frames[0].file_offset, offset);
    assert!(frames[1].mapping.is_none(), "not wanted: left alone");
    assert!(frames[2].mapping.is_none(), "no mapping holds it");
    assert!(frames[3].mapping.as_ref().unwrap().path.contains("libc"));
}

#[test]
fn an_exited_process_keeps_its_comm() {
    let mut table = ProcessTable::new();
    let info = table.info(GONE, "gone", 0);
    assert_eq!(&*info.comm, "gone");
    assert_eq!(info.exe_name(), "gone");
    assert!(table.mapping_of(GONE, "gone", 0, 0x1000).is_none());
}

#[test]
fn a_process_is_read_once_however_many_samples() {
    let mut table = ProcessTable::with_events();
    let pid = std::process::id();
    let here = a_process_is_read_once_however_many_samples as *const () as u64;
    for ktime in 0..10_000 {
        table.info(pid, "ignored", ktime);
        assert!(table.mapping_of(pid, "ignored", ktime, here).is_some());
    }
    assert_eq!(table.stats().proc_reads, 1);
}

#[test]
fn a_process_that_exited_keeps_what_was_read_while_it_ran() {
    let mut table = ProcessTable::with_events();
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = child.id();
    let info = table.info(pid, "sleep", 0);
    assert!(info.exe_path.ends_with("sleep"), "{}", info.exe_path);
    child.kill().unwrap();
    child.wait().unwrap();
    // An address its maps miss, once the re-read's rate limit has passed
    // (a wait for a clock, not for another process): /proc has nothing of
    // it any more, and the image read while it ran stands for its samples
    // still being attributed.
    std::thread::sleep(MIN_REFRESH_INTERVAL);
    assert!(table.mapping_of(pid, "sleep", 0, 0x10).is_none());
    assert_eq!(table.info(pid, "sleep", 0).exe_path, info.exe_path);
    assert!(!table.executable_maps(pid, "sleep", 0).is_empty());
}

#[test]
fn a_forked_child_is_its_parent_until_it_execs() {
    let mut table = ProcessTable::with_events();
    let parent = std::process::id();
    let here = a_forked_child_is_its_parent_until_it_execs as *const () as u64;
    let parent_info = table.info(parent, "parent", 100);
    table.apply(&event(PROCESS_EVENT_FORK, GONE, parent, 200));
    // The child's samples have the parent's names and mappings, no read.
    let child = table.info(GONE, "child", 300);
    assert_eq!(child.pid, GONE);
    assert_eq!(child.exe_path, parent_info.exe_path);
    assert!(table.mapping_of(GONE, "child", 300, here).is_some());
    assert_eq!(table.stats().proc_reads, 1);
    // After its exec, /proc tells (here: nothing, the pid is not real).
    table.apply(&event(PROCESS_EVENT_EXEC, GONE, 0, 400));
    let execd = table.info(GONE, "newimage", 500);
    assert_eq!(&*execd.comm, "newimage");
    assert!(table.mapping_of(GONE, "newimage", 500, here).is_none());
    // A sample taken before the exec, attributed late, keeps the old image.
    assert_eq!(
        table.info(GONE, "child", 350).exe_path,
        parent_info.exe_path
    );
}

#[test]
fn a_reused_pid_is_a_new_process_from_its_fork_on() {
    let mut table = ProcessTable::with_events();
    let us = std::process::id();
    // GONE ran "old" (never readable: only the sample's comm is known).
    assert_eq!(&*table.info(GONE, "old", 10).comm, "old");
    table.apply(&event(PROCESS_EVENT_EXIT, GONE, 0, 20));
    // Our process forks a child that gets the same pid.
    table.info(us, "us", 25);
    table.apply(&event(PROCESS_EVENT_FORK, GONE, us, 30));
    let new = table.info(GONE, "new", 40);
    assert_eq!(new.exe_path, table.info(us, "us", 40).exe_path);
    // Late samples of the old process still name it.
    assert_eq!(&*table.info(GONE, "old", 15).comm, "old");
}

#[test]
fn without_fork_events_a_sample_after_the_exit_is_a_new_process() {
    let mut table = ProcessTable::new();
    assert_eq!(&*table.info(GONE, "old", 10).comm, "old");
    table.apply(&event(PROCESS_EVENT_EXIT, GONE, 0, 20));
    assert_eq!(&*table.info(GONE, "new", 30).comm, "new");
    assert_eq!(&*table.info(GONE, "old", 10).comm, "old");
}

#[test]
fn exited_processes_are_forgotten_and_images_bounded() {
    let mut table = ProcessTable::with_events();
    for exec in 0..(MAX_IMAGES as u64 * 3) {
        table.apply(&event(PROCESS_EVENT_EXEC, GONE, 0, exec * 10));
        table.info(GONE, "x", exec * 10 + 1);
    }
    assert_eq!(table.entries[&GONE].images.len(), MAX_IMAGES);
    // Not alive in /proc, unused since the last sweep: gone at the second.
    table.forget_exited();
    table.forget_exited();
    assert!(table.is_empty());
}

/// Publishes a process context in this test process, once, as OTEP 4719's
/// writers do (a memfd named `OTEL_CTX`, header, then the timestamp last),
/// and returns its `service.name`.
fn publish_own_context() -> &'static str {
    use super::otel_ctx::tests::{header, payload, text};
    const NAME: &str = "unit-test-service";
    static PUBLISHED: std::sync::Once = std::sync::Once::new();
    PUBLISHED.call_once(|| {
        let bytes: &'static [u8] = payload(vec![text("service.name", NAME)]).leak();
        let mut header = header(2, bytes.len() as u32, 0, bytes.as_ptr() as u64);
        // SAFETY: plain system calls on a fresh fd and mapping of our own;
        // the mapping is written only here and never unmapped.
        unsafe {
            let fd = libc::memfd_create(c"OTEL_CTX".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create");
            assert_eq!(libc::ftruncate(fd, 4096), 0);
            let map = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                fd,
                0,
            );
            libc::close(fd);
            assert_ne!(map, libc::MAP_FAILED);
            std::ptr::copy_nonoverlapping(header.as_ptr(), map.cast::<u8>(), header.len());
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            header[16..24].copy_from_slice(&1u64.to_le_bytes());
            std::ptr::copy_nonoverlapping(header[16..24].as_ptr(), map.cast::<u8>().add(16), 8);
        }
    });
    NAME
}

#[test]
fn a_process_context_is_read_and_not_inherited_by_a_fork() {
    let name = publish_own_context();
    let mut table = ProcessTable::with_events();
    let pid = std::process::id();
    let parent = table.info(pid, "parent", 100);
    let service = parent.service.as_ref().expect("the context is read");
    assert_eq!(service.get("service.name"), Some(name));
    // The child has what its environment says (inherited), not the
    // parent's context, which the writer maps MADV_DONTFORK.
    table.apply(&event(PROCESS_EVENT_FORK, GONE, pid, 200));
    let child = table.info(GONE, "child", 300);
    assert_eq!(child.service, environment::read(pid).map(Arc::new));
    assert_ne!(
        child
            .service
            .as_ref()
            .and_then(|service| service.get("service.name")),
        Some(name)
    );
}

#[test]
fn a_context_outlives_its_process_but_not_its_mapping() {
    let name = publish_own_context();
    let maps = std::fs::read("/proc/self/maps").unwrap();
    let read = |pid| {
        let mut identity = Identity::read(std::process::id(), &maps, None, false);
        let mut reads = 0;
        identity.recheck(pid, &mut reads);
        identity
            .service()
            .and_then(|service| service.get("service.name").map(String::from))
    };
    // A process that exited (a zombie: no memory, empty maps) keeps the
    // context it had for its samples still in flight.
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    let pid = exited.id();
    // SAFETY: waits, without reaping, for a child of ours.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let waited =
        unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
    assert_eq!(waited, 0);
    assert_eq!(read(pid).as_deref(), Some(name));
    // So does a re-read of its maps after it exited (they read empty).
    let known = Identity::read(std::process::id(), &maps, None, false);
    let reread = Identity::read(pid, b"", Some(&known), false);
    assert_eq!(
        reread
            .service()
            .and_then(|service| service.get("service.name").map(String::from))
            .as_deref(),
        Some(name)
    );
    exited.wait().unwrap();
    // A live process where the context's address is not mapped (as after
    // an unmap) drops it.
    let mut live = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let dropped = read(live.id());
    live.kill().unwrap();
    live.wait().unwrap();
    assert_eq!(dropped, None);
}
