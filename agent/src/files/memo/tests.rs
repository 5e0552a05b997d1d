use std::{
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use super::*;

/// A file no real one is (device `u64::MAX`), changed `ctime_s` seconds
/// after the epoch.
fn stat(inode: u64, ctime_s: i128) -> Stat {
    Stat {
        dev: u64::MAX,
        inode,
        size: 4096 + inode,
        mtime_ns: ctime_s * 1_000_000_000 - 5,
        ctime_ns: ctime_s * 1_000_000_000 + 123,
    }
}

fn id(byte: u8) -> Arc<str> {
    format!("sha256:{}", crate::symbolize::hex(&[byte; 32])).into()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hostprof-memo-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn entries_round_trip() {
    let entries = [(stat(1, 1000), id(1)), (stat(2, 2000), id(0xab))];
    let bytes = encode(entries.iter().map(|(stat, id)| (stat, id)));
    assert_eq!(bytes.len(), HEADER_BYTES + 2 * ENTRY_BYTES);
    assert_eq!(decode(&bytes).unwrap(), entries);
    // Not a content id: not kept.
    let odd: Arc<str> = "inode:7".into();
    assert_eq!(
        decode(&encode([(&stat(3, 1), &odd)].into_iter())).unwrap(),
        []
    );
}

#[test]
fn damaged_files_are_refused() {
    let entries = [(stat(1, 1000), id(1)), (stat(2, 2000), id(2))];
    let bytes = encode(entries.iter().map(|(stat, id)| (stat, id)));
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        assert!(decode(&bad).is_err(), "bit flipped at {at}");
    }
    for cut in 0..bytes.len() {
        assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    let mut newer = bytes.clone();
    newer[8] = 9;
    assert_eq!(decode(&newer), Err(MemoFormatError::Version));
    // A count past the bound is refused before anything is allocated.
    let mut hostile = bytes.clone();
    hostile[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode(&hostile), Err(MemoFormatError::Length));
}

#[test]
fn a_change_within_a_clock_tick_is_not_kept_on_disk() {
    let at = |ns: i128| UNIX_EPOCH + Duration::from_nanos(ns as u64);
    let fine = stat(1, 1000);
    assert!(is_racy(&fine, at(fine.ctime_ns + 1_000_000)));
    assert!(!is_racy(&fine, at(fine.ctime_ns + 30_000_000)));
    // A filesystem of whole seconds: a second of doubt.
    let coarse = Stat {
        ctime_ns: 1000 * 1_000_000_000,
        ..fine
    };
    assert!(is_racy(&coarse, at(coarse.ctime_ns + 500_000_000)));
    assert!(!is_racy(&coarse, at(coarse.ctime_ns + 1_500_000_000)));
}

/// The memo as a restart sees it: ids read back from the file, a changed
/// file (new times) not recognised, new ids written back (only the ones
/// not just written), a damaged file ignored and counted. One test: the
/// memo and its file are the process's.
#[test]
fn a_restart_reads_the_ids_back_and_ignores_a_damaged_file() {
    let dir = temp("restart");
    let path = dir.join("ids");
    let old = stat(1, 1000);
    std::fs::write(&path, encode([(&old, &id(1))].into_iter())).unwrap();
    let before = totals();
    persist(path.clone());
    assert_eq!(known(&old), Some(id(1)));
    assert!(totals().loaded > before.loaded);
    // Same path, new content: new mtime and ctime, so another key.
    let rewritten = Stat {
        mtime_ns: old.mtime_ns + 1,
        ctime_ns: old.ctime_ns + 7_000_000_000,
        ..old
    };
    assert_eq!(known(&rewritten), None);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let just_written = Stat {
        ctime_ns: now.as_nanos() as i128,
        ..stat(3, 0)
    };
    remember(rewritten, id(2));
    remember(just_written, id(3));
    assert_eq!(known(&just_written), Some(id(3)), "used within this run");
    save();
    let on_disk = decode(&std::fs::read(&path).unwrap()).unwrap();
    assert!(on_disk.contains(&(old, id(1))));
    assert!(on_disk.contains(&(rewritten, id(2))));
    assert!(
        !on_disk.iter().any(|(stat, _)| *stat == just_written),
        "a file changed a moment ago was kept on disk"
    );

    // Damaged: ignored, counted, and replaced at the next write.
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    let damaged = dir.join("damaged");
    std::fs::write(&damaged, &bytes).unwrap();
    let before = totals().corrupt;
    persist(damaged.clone());
    assert_eq!(totals().corrupt, before + 1);
    remember(stat(4, 4000), id(4));
    save();
    assert!(decode(&std::fs::read(&damaged).unwrap()).is_ok());
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&damaged).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    std::fs::remove_dir_all(&dir).unwrap();
}
