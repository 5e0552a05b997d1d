use std::{
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    time::{Duration, SystemTime},
};

use hostprof_unwind::{
    Arch, UnwindRow, cfa, reg,
    table::{TableKind, UnwindTable},
};

use super::{
    CacheFormatError, CacheOptions, CacheTotals, FORMAT_VERSION, HEADER_BYTES, TableCache, decode,
    encode,
};

const KEY: &str = "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const OTHER: &str = "sha256:ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

fn rows_table(rows: usize) -> UnwindTable {
    UnwindTable {
        arch: Arch::X86_64,
        kind: TableKind::Rows(
            (0..rows as u32)
                .map(|i| UnwindRow {
                    pc: 0x1000 + i * 16,
                    // Five distinct rules, shared as in real tables.
                    cfa_offset: 8 + (i % 5) as i32,
                    fp_offset: -16,
                    ra_offset: -8,
                    cfa_rule: cfa::SP,
                    fp_rule: reg::AT_CFA,
                    ra_rule: reg::AT_CFA,
                    arg: (i % 5) as u8,
                })
                .collect(),
        ),
        text_bytes: 12_345,
    }
}

/// The same table, built or read back packed.
fn same(a: &UnwindTable, b: &UnwindTable) -> bool {
    a.arch == b.arch
        && a.row_count() == b.row_count()
        && a.packed() == b.packed()
        && matches!(a.kind, TableKind::FramePointers) == matches!(b.kind, TableKind::FramePointers)
        && a.text_bytes == b.text_bytes
}

/// A fresh directory under the system's temporary one.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hostprof-table-cache-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_table_round_trips() {
    for table in [
        rows_table(0),
        rows_table(1),
        rows_table(1000),
        UnwindTable {
            arch: Arch::Aarch64,
            kind: TableKind::FramePointers,
            text_bytes: 7,
        },
    ] {
        let bytes = encode(KEY, &table, &[]);
        // 8 bytes a row, 16 a distinct rule: the rows map's layout.
        let rows = table.row_count();
        assert_eq!(
            bytes.len(),
            HEADER_BYTES + KEY.len() + 4 + hostprof_unwind::table_words(rows, rows.min(5)) * 8
        );
        assert!(same(&decode(KEY, &bytes).unwrap().table, &table));
    }
}

#[test]
fn a_truncated_or_extended_file_is_refused() {
    let bytes = encode(KEY, &rows_table(10), &[]);
    assert_eq!(
        decode_err(KEY, &bytes[..20]),
        Some(CacheFormatError::Truncated)
    );
    assert_eq!(decode_err(KEY, &[]), Some(CacheFormatError::Truncated));
    // A rule's 16 bytes fewer is a length that could be right: the
    // checksum refuses it.
    assert_eq!(
        decode_err(KEY, &bytes[..bytes.len() - 16]),
        Some(CacheFormatError::Checksum)
    );
    for cut in [HEADER_BYTES, bytes.len() - 1, bytes.len() - 8] {
        assert_eq!(
            decode_err(KEY, &bytes[..cut]),
            Some(CacheFormatError::Length)
        );
    }
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0; 8]);
    assert_eq!(decode_err(KEY, &longer), Some(CacheFormatError::Length));
}

#[test]
fn a_flipped_bit_anywhere_is_refused() {
    let bytes = encode(KEY, &rows_table(10), &[]);
    for at in (0..bytes.len()).step_by(7) {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        assert!(decode(KEY, &bad).is_err(), "bit flipped at {at}");
    }
    // A row changed but the header intact: only the checksum tells.
    let mut bad = bytes.clone();
    let last = bad.len() - 3;
    bad[last] ^= 1;
    assert_eq!(decode_err(KEY, &bad), Some(CacheFormatError::Checksum));
}

#[test]
fn another_version_or_row_layout_is_not_read() {
    let bytes = encode(KEY, &rows_table(3), &[]);
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert_eq!(
        decode_err(KEY, &newer),
        Some(CacheFormatError::Version(FORMAT_VERSION + 1))
    );
    let mut wider = bytes.clone();
    wider[12..16].copy_from_slice(&24u32.to_le_bytes());
    assert_eq!(decode_err(KEY, &wider), Some(CacheFormatError::RowSize(24)));
}

/// A file as format version 2 wrote it (16-byte rows, each with its
/// rule), for a table of `rows` rows.
fn version_2_file(key: &str, rows: usize) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"HPUWTAB\0");
    for field in [2u32, 16, 0, 0] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    out.extend_from_slice(&12_345u64.to_le_bytes());
    out.extend_from_slice(&(rows as u64).to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for i in 0..rows as u32 {
        out.extend_from_slice(&(0x1000 + i * 16).to_le_bytes());
        out.extend_from_slice(&8i32.to_le_bytes());
        out.extend_from_slice(&[0xf0, 0xff, 0xf8, 0xff, 0, 1, 1, 0]);
    }
    let crc = crc32fast::hash(&out);
    out[44..48].copy_from_slice(&crc.to_le_bytes());
    out
}

#[test]
fn a_version_2_file_is_stale_and_replaced_not_misread() {
    let old = version_2_file(KEY, 6);
    assert_eq!(decode_err(KEY, &old), Some(CacheFormatError::Version(2)));
    // Even claiming this version, its 16-byte rows are not read as words.
    let mut relabelled = old.clone();
    relabelled[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    assert_eq!(
        decode_err(KEY, &relabelled),
        Some(CacheFormatError::RowSize(16))
    );
    let dir = temp_dir("v2");
    let cache = TableCache::open(CacheOptions {
        dir: dir.clone(),
        max_bytes: 1 << 20,
    })
    .unwrap();
    let path = dir.join(format!("{}.table", &KEY[7..]));
    std::fs::write(&path, &old).unwrap();
    assert!(cache.get(KEY).is_none());
    assert_eq!(cache.totals().stale, 1);
    assert_eq!(cache.totals().corrupt, 0);
    // The table built again takes its place.
    let table = rows_table(6);
    cache.put(KEY, &table, &[]);
    assert!(same(&cache.get(KEY).unwrap().table, &table));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_for_another_key_or_with_unsorted_rows_is_refused() {
    let bytes = encode(KEY, &rows_table(3), &[]);
    assert_eq!(decode_err(OTHER, &bytes), Some(CacheFormatError::Key));
    let mut table = rows_table(3);
    if let TableKind::Rows(rows) = &mut table.kind {
        rows.swap(0, 2);
    }
    assert_eq!(
        decode_err(KEY, &encode(KEY, &table, &[])),
        Some(CacheFormatError::Unsorted)
    );
    // A huge row count cannot make the length check overflow.
    let mut hostile = bytes.clone();
    hostile[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(decode_err(KEY, &hostile), Some(CacheFormatError::Length));
}

#[test]
fn the_directory_serves_what_was_stored_and_counts_the_rest() {
    let dir = temp_dir("serve");
    let cache = TableCache::open(CacheOptions {
        dir: dir.clone(),
        max_bytes: 1 << 20,
    })
    .unwrap();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    assert!(cache.get(KEY).is_none());
    let table = rows_table(100);
    cache.put(KEY, &table, &[]);
    assert!(same(&cache.get(KEY).unwrap().table, &table));
    // Damaged on disk: ignored, counted, and replaced by the next store.
    let path = dir.join(format!("{}.table", &KEY[7..]));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[HEADER_BYTES + KEY.len() + 5] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    assert!(cache.get(KEY).is_none());
    std::fs::write(&path, b"short").unwrap();
    assert!(cache.get(KEY).is_none());
    cache.put(KEY, &table, &[]);
    assert!(cache.get(KEY).is_some());
    // Not a content id: never a path.
    assert!(cache.get("../../etc/passwd").is_none());
    assert_eq!(
        cache.totals(),
        CacheTotals {
            hits: 2,
            misses: 1,
            stale: 0,
            corrupt: 2,
            write_errors: 0,
        }
    );
    // No partial file left behind.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [format!("{}.table", &KEY[7..])]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_least_recently_used_files_go_past_the_bound() {
    let dir = temp_dir("evict");
    let one = encode(KEY, &rows_table(100), &[]).len() as u64;
    let cache = TableCache::open(CacheOptions {
        dir: dir.clone(),
        max_bytes: one * 2 + one / 2,
    })
    .unwrap();
    let keys: Vec<String> = (0..3).map(|i| format!("sha256:{i:064x}")).collect();
    let table = rows_table(100);
    cache.put(&keys[0], &table, &[]);
    cache.put(&keys[1], &table, &[]);
    // The first is used again: the second is now the oldest.
    let old = SystemTime::now() - Duration::from_secs(60);
    for (key, age) in keys.iter().zip([2, 1]) {
        let path = dir.join(format!("{}.table", &key[7..]));
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(old - Duration::from_secs(age)).unwrap();
    }
    assert!(cache.get(&keys[0]).is_some());
    cache.put(&keys[2], &table, &[]);
    let kept: Vec<bool> = keys
        .iter()
        .map(|key| dir.join(format!("{}.table", &key[7..])).exists())
        .collect();
    assert_eq!(kept, [true, false, true]);
    // A table larger than the whole cache is not stored.
    cache.put(KEY, &rows_table(1000), &[]);
    assert!(cache.get(KEY).is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_directory_open_to_others_is_made_private() {
    let dir = temp_dir("private");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    TableCache::open(CacheOptions {
        dir: dir.clone(),
        max_bytes: 1,
    })
    .unwrap();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Why `bytes` were refused (`None`: accepted).
fn decode_err(key: &str, bytes: &[u8]) -> Option<CacheFormatError> {
    decode(key, bytes).err()
}

#[test]
fn a_table_keeps_its_files_segments() {
    use hostprof_unwind::table::{load_segments, vaddr_in};
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let segments = load_segments(&exe).unwrap();
    assert!(segments.iter().any(|segment| segment.executable));
    let bytes = encode(KEY, &rows_table(5), &segments);
    let cached = decode(KEY, &bytes).unwrap();
    assert_eq!(cached.segments, segments);
    // Placed alike from the cache as from the file.
    for segment in &segments {
        assert_eq!(
            vaddr_in(&cached.segments, segment.offset & !4095),
            hostprof_unwind::table::vaddr_of_offset(&exe, segment.offset & !4095)
        );
    }
    // More segments than a file may have: refused.
    let many = vec![segments[0]; 65];
    let mut bytes = encode(KEY, &rows_table(1), &many);
    let at = HEADER_BYTES + KEY.len();
    bytes[at..at + 4].copy_from_slice(&65u32.to_le_bytes());
    assert!(decode(KEY, &bytes).is_err());
}
