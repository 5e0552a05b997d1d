//! The file layer on files this test makes: no root needed.
use std::{
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::*;

/// A fresh directory for one test, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("hostprof-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root/tmp")).unwrap();
        Scratch(dir)
    }

    fn root(&self) -> Root {
        Root::open_dir(&self.0.join("root")).unwrap()
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.0.join(relative)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn reads_a_regular_file_whole() {
    let scratch = Scratch::new("regular");
    let content: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(scratch.path("root/tmp/x"), &content).unwrap();
    let file = scratch.root().open("/tmp/x", Kind::Binary).unwrap();
    assert_eq!(file.stat().size, 100_000);
    let data = file.read().unwrap();
    assert_eq!(&*data, &content[..]);
    // Relative paths resolve from the root too.
    assert_eq!(
        &*scratch
            .root()
            .open("tmp/x", Kind::Binary)
            .unwrap()
            .read()
            .unwrap(),
        &content[..]
    );
}

#[test]
fn a_fifo_is_refused_at_once() {
    let scratch = Scratch::new("fifo");
    mkfifo(&scratch.path("root/tmp/perf-1.map"));
    let before = refusals().not_regular;
    let started = Instant::now();
    // Nobody ever writes to it: a plain open for reading would block forever.
    let err = scratch
        .root()
        .open("/tmp/perf-1.map", Kind::PerfMap)
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(err, FileError::NotRegular { what: "FIFO", .. }),
        "{err}"
    );
    assert!(err.is_refusal());
    assert!(refusals().not_regular > before);
}

#[test]
fn a_symlink_to_a_device_is_refused() {
    let scratch = Scratch::new("device");
    symlink("/dev/zero", scratch.path("host-zero")).unwrap();
    // The host's /dev/zero itself, through the host root.
    let err = open_host("/dev/zero", Kind::DebugFile).unwrap_err();
    assert!(
        matches!(
            err,
            FileError::NotRegular {
                what: "character device",
                ..
            }
        ),
        "{err}"
    );
    // A symlink to it, on the host.
    let link = scratch.path("host-zero");
    let err = open_host(link.to_str().unwrap(), Kind::PerfMap).unwrap_err();
    assert!(matches!(err, FileError::NotRegular { .. }), "{err}");
    // Directories are not files either.
    let err = scratch.root().open("/tmp", Kind::Binary).unwrap_err();
    assert!(
        matches!(
            err,
            FileError::NotRegular {
                what: "directory",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn symlinks_cannot_leave_the_root() {
    let scratch = Scratch::new("escape");
    std::fs::create_dir_all(scratch.path("outside")).unwrap();
    std::fs::create_dir_all(scratch.path("root/etc")).unwrap();
    std::fs::write(scratch.path("root/etc/inside"), "in").unwrap();
    let secret = scratch.path("outside/secret");
    std::fs::write(&secret, "out").unwrap();
    // An absolute link and a `..` climb, both aimed outside the root.
    symlink(&secret, scratch.path("root/abs")).unwrap();
    symlink("../../outside/secret", scratch.path("root/etc/up")).unwrap();
    let root = scratch.root();
    let read = |path: &str| root.open(path, Kind::Binary).and_then(OpenFile::read);
    assert_eq!(&*read("/etc/inside").unwrap(), b"in");
    // Both resolve inside the root, where there is no such file.
    assert!(
        matches!(read("/abs"), Err(FileError::Open { .. })),
        "absolute symlink escaped the root"
    );
    assert!(
        matches!(read("/etc/up"), Err(FileError::Open { .. })),
        "`..` escaped the root"
    );
    // The same file planted inside the root is what the links find.
    std::fs::create_dir_all(
        scratch
            .path("root")
            .join(secret.parent().unwrap().strip_prefix("/").unwrap()),
    )
    .unwrap();
    std::fs::write(
        scratch.path("root").join(secret.strip_prefix("/").unwrap()),
        "planted",
    )
    .unwrap();
    assert_eq!(&*read("/abs").unwrap(), b"planted");
}

#[test]
fn magic_links_are_refused() {
    let before = refusals().escape;
    // /proc/self/root is a magic link: followed, it could lead anywhere.
    let err = open_host("/proc/self/root/etc/hostname", Kind::Binary).unwrap_err();
    assert!(matches!(err, FileError::Escape { .. }), "{err}");
    assert!(refusals().escape > before);
}

#[test]
fn files_over_their_cap_are_refused_unread() {
    let scratch = Scratch::new("large");
    let path = scratch.path("root/tmp/huge.map");
    // Sparse: costs no disk, and must not be read.
    std::fs::File::create(&path)
        .unwrap()
        .set_len(MAX_PERF_MAP_BYTES + 1)
        .unwrap();
    let before = refusals().too_large;
    let err = scratch
        .root()
        .open("/tmp/huge.map", Kind::PerfMap)
        .unwrap_err();
    assert!(matches!(err, FileError::TooLarge { .. }), "{err}");
    assert!(refusals().too_large > before);
    // The same size is fine for a binary.
    assert!(scratch.root().open("/tmp/huge.map", Kind::Binary).is_ok());
}

#[test]
fn a_file_truncated_after_opening_reads_short() {
    let scratch = Scratch::new("truncate");
    let path = scratch.path("root/tmp/lib.so");
    std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
    let file = scratch.root().open("/tmp/lib.so", Kind::Binary).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let data = file.read().unwrap();
    assert_eq!(data.len(), 4096);
    assert_eq!(data.stat().size, 1 << 20, "stat is from the open");
}

#[test]
fn our_own_mapping_opens_through_map_files_or_root() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let exe = std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap();
    let line = maps
        .lines()
        .find(|line| line.ends_with(exe.to_str().unwrap()))
        .expect("our executable is mapped");
    let fields: Vec<&str> = line.split_ascii_whitespace().collect();
    let (start, end) = fields[0].split_once('-').unwrap();
    let inode: u64 = fields[4].parse().unwrap();
    let mapping = MappedRange {
        start: u64::from_str_radix(start, 16).unwrap(),
        end: u64::from_str_radix(end, 16).unwrap(),
        path: exe.to_str().unwrap(),
        dev: 0,
        inode,
    };
    let data = open_mapping(std::process::id(), &mapping, Kind::Binary)
        .unwrap()
        .read()
        .unwrap();
    assert_eq!(&*data, &std::fs::read(&exe).unwrap()[..]);
    // Another inode at that path is not the mapped file.
    let other = MappedRange {
        start: 1,
        end: 2,
        inode: inode + 1,
        ..mapping
    };
    assert!(matches!(
        open_mapping(std::process::id(), &other, Kind::Binary),
        Err(FileError::Replaced { .. })
    ));
}

#[test]
fn content_ids_follow_the_bytes() {
    let a = content_id(b"one");
    assert_eq!(a, content_id(b"one"));
    assert_ne!(a, content_id(b"two"));
    // sha256("one")
    assert_eq!(
        &*a,
        "sha256:7692c3ad3540bb803c020b3aee66cd8887123234ea0c6e7143c0add73ff431ed"
    );
}

/// This test binary (far over `SPARSE_FROM`, with symbols and DWARF) read
/// for names and for unwinding: each keeps its sections byte for byte,
/// leaves code out, and has the content id of every byte.
#[test]
fn parts_keep_their_sections_and_the_whole_files_identity() {
    use object::{Object, ObjectSection};
    let exe = std::env::current_exe().unwrap();
    let whole = std::fs::read(&exe).unwrap();
    assert!(whole.len() as u64 > SPARSE_FROM, "the test binary is small");
    let object = object::File::parse(&whole[..]).unwrap();
    let bytes_of = |data: &[u8], name: &str| {
        let (offset, size) = object.section_by_name(name).unwrap().file_range().unwrap();
        data[offset as usize..(offset + size) as usize].to_vec()
    };
    let open = || open_host(exe.to_str().unwrap(), Kind::Binary).unwrap();
    let names = open()
        .read_parts(Parts::Names {
            dwarf: DwarfLimit::NONE,
        })
        .unwrap();
    // DWARF that could not fit is not read at all.
    let no_dwarf = open()
        .read_parts(Parts::Names {
            dwarf: DwarfLimit {
                is_needed: |name| name.starts_with(".debug_"),
                limit: 1 << 20,
            },
        })
        .unwrap();
    let unwind = open().read_parts(Parts::Unwind).unwrap();
    for (data, kept, left_out) in [
        (
            &names,
            &[
                ".symtab",
                ".strtab",
                ".debug_info",
                ".debug_line",
                ".eh_frame",
            ][..],
            &[".text"][..],
        ),
        (
            &unwind,
            &[".eh_frame", ".eh_frame_hdr", ".symtab"][..],
            &[".text", ".debug_info"][..],
        ),
        (
            &no_dwarf,
            &[".symtab", ".strtab", ".eh_frame"][..],
            &[".text", ".debug_info", ".debug_line"][..],
        ),
    ] {
        assert!(data.is_partial());
        assert_eq!(data.len(), whole.len());
        assert_eq!(data.content_id(), content_id(&whole));
        for name in kept {
            assert!(
                bytes_of(data, name) == bytes_of(&whole, name),
                "{name} differs"
            );
        }
        for name in left_out {
            assert!(
                bytes_of(data, name).iter().all(|byte| *byte == 0),
                "{name} was read"
            );
        }
        // What parses the whole file parses the image alike.
        let image = object::File::parse(&data[..]).unwrap();
        assert_eq!(image.symbols().count(), object.symbols().count());
    }
}

/// The dynamic linker's view of this test binary keeps its dynamic
/// symbols, their names and relocations and its interpreter byte for byte,
/// and reads nothing else; a file that is not ELF is refused.
#[test]
fn the_dynamic_view_reads_only_what_the_loader_reads() {
    use object::{Object, ObjectSection, ObjectSymbol};
    let exe = std::env::current_exe().unwrap();
    let whole = std::fs::read(&exe).unwrap();
    let object = object::File::parse(&whole[..]).unwrap();
    let bytes_of = |data: &[u8], name: &str| {
        let (offset, size) = object.section_by_name(name).unwrap().file_range().unwrap();
        data[offset as usize..(offset + size) as usize].to_vec()
    };
    let view = open_host(exe.to_str().unwrap(), Kind::Binary)
        .unwrap()
        .read_dynamic()
        .unwrap();
    assert_eq!(view.len(), whole.len());
    for name in [".dynsym", ".dynstr", ".rela.dyn", ".interp"] {
        assert!(
            bytes_of(&view, name) == bytes_of(&whole, name),
            "{name} differs"
        );
    }
    for name in [".symtab", ".strtab", ".text", ".eh_frame", ".debug_info"] {
        assert!(
            bytes_of(&view, name).iter().all(|byte| *byte == 0),
            "{name} was read"
        );
    }
    let parsed = object::File::parse(&*view).unwrap();
    let names = |file: &object::File| -> Vec<String> {
        file.dynamic_symbols()
            .map(|symbol| symbol.name().unwrap().to_owned())
            .collect()
    };
    assert!(!names(&object).is_empty());
    assert_eq!(names(&parsed), names(&object));
    assert!(parsed.section_by_name(".text").is_some(), "section names");

    let scratch = Scratch::new("dynamic-view");
    let text = scratch.path("root/tmp/text");
    std::fs::write(&text, vec![b'x'; 4096]).unwrap();
    let file = open_host(text.to_str().unwrap(), Kind::Binary).unwrap();
    assert!(matches!(file.read_dynamic(), Err(FileError::Read { .. })));
}

/// A hostile ELF file read for its dynamic view: a `.dynsym` whose header
/// claims far more bytes than the file has is refused before any of it is
/// read; so is a file truncated after opening, never a fault.
#[test]
fn the_dynamic_view_of_a_hostile_file_is_bounded() {
    use object::{Object, ObjectSection};
    let scratch = Scratch::new("dynamic-hostile");
    let mut bytes = std::fs::read("/usr/bin/true").unwrap();
    let (header, offset, size) = {
        let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&bytes[..]).unwrap();
        let dynsym = elf.section_by_name(".dynsym").unwrap();
        let shoff = elf.elf_header().e_shoff.get(elf.endian()) as usize;
        let (offset, size) = dynsym.file_range().unwrap();
        (shoff + dynsym.index().0 * 64, offset, size)
    };
    // sh_size (little-endian, at 32 in an ELF64 section header).
    bytes[header + 32..header + 40].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let path = scratch.path("root/tmp/hostile");
    std::fs::write(&path, &bytes).unwrap();
    let hostile = open_host(path.to_str().unwrap(), Kind::Binary).unwrap();
    assert!(matches!(
        hostile.read_dynamic(),
        Err(FileError::Read { .. })
    ));
    // The same file with its true size reads, `.dynsym` and all.
    bytes[header + 32..header + 40].copy_from_slice(&size.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let view = open_host(path.to_str().unwrap(), Kind::Binary)
        .unwrap()
        .read_dynamic()
        .unwrap();
    assert_eq!(view.len(), bytes.len());
    let at = offset as usize..(offset + size) as usize;
    assert!(view[at.clone()] == bytes[at]);

    let file = open_host(path.to_str().unwrap(), Kind::Binary).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    assert!(matches!(file.read_dynamic(), Err(FileError::Read { .. })));
}

/// A file read again unchanged is not hashed again, and keeps its id; once
/// written (its ctime moves) it is hashed again and its id follows the
/// bytes.
#[test]
fn an_unchanged_file_is_hashed_once() {
    use std::os::unix::fs::FileExt;
    let scratch = Scratch::new("hashed-once");
    let copy = scratch.path("binary");
    std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
    let size = std::fs::metadata(&copy).unwrap().len();
    let read = || {
        let before = sparse::hashed_bytes();
        let data = open_host(copy.to_str().unwrap(), Kind::Binary)
            .unwrap()
            .read_parts(Parts::Unwind)
            .unwrap();
        (data, sparse::hashed_bytes() - before)
    };
    let (first, hashed) = read();
    assert_eq!(hashed, size, "the first read hashes every byte");
    assert_eq!(
        first.content_id(),
        content_id(&std::fs::read(&copy).unwrap())
    );
    let (again, hashed) = read();
    assert_eq!(hashed, 0, "read again, unchanged, and hashed again");
    assert_eq!(again.content_id(), first.content_id());
    assert!(again[..] == first[..], "the kept bytes differ");
    // One byte in the middle (code, not kept) changes: a new id.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&copy)
        .unwrap();
    let middle = size / 2;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, middle).unwrap();
    file.write_all_at(&[byte[0] ^ 0xff], middle).unwrap();
    drop(file);
    let (changed, hashed) = read();
    assert_eq!(hashed, size, "a written file was not hashed again");
    assert_ne!(changed.content_id(), first.content_id());
    assert_eq!(
        changed.content_id(),
        content_id(&std::fs::read(&copy).unwrap())
    );
}
