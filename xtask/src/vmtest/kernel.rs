//! Debian distribution kernels for the matrix, fetched with `apt-get
//! download` through a private apt configuration (target/vmtest/apt/SUITE),
//! so the host's sources stay untouched and other releases' lists are only
//! used here. What is extracted is cached; a cached kernel needs no network.
//! The same apt state fetches the other Debian files the guests run: a
//! static busybox and, for arm64, Debian's JDK runtimes (11, 17, 21).
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::Arch;
use crate::run_cmd;

const MIRROR: &str = "http://deb.debian.org/debian";
const SECURITY_MIRROR: &str = "http://deb.debian.org/debian-security";
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// A booted kernel image and its identity.
pub struct Kernel {
    /// `6.1.0-56-amd64`, from the `vmlinuz-*` name.
    pub release: String,
    /// An image `qemu -kernel` boots (a bzImage, or an uncompressed arm64 Image).
    pub image: PathBuf,
    /// Its `/boot/config-*`.
    pub config: PathBuf,
}

/// One Debian release's private apt state.
struct Apt {
    dir: PathBuf,
}

impl Apt {
    /// Writes the sources (the release and its security suite, for amd64 and
    /// arm64) and the empty state apt needs.
    fn new(vmtest_dir: &Path, suite: &str) -> Result<Self> {
        let dir = vmtest_dir.join("apt").join(suite);
        for sub in ["lists/partial", "cache/archives/partial", "preferences.d"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        fs::write(dir.join("status"), "")?;
        let options = format!("[arch=amd64,arm64 signed-by={KEYRING}]");
        fs::write(
            dir.join("sources.list"),
            format!(
                "deb {options} {MIRROR} {suite} main\n\
                 deb {options} {SECURITY_MIRROR} {suite}-security main\n"
            ),
        )?;
        Ok(Apt { dir })
    }

    /// `apt-get`/`apt-cache` with every path pointing into the private state.
    fn command(&self, program: &str) -> Command {
        let dir = self.dir.display();
        let mut cmd = Command::new(program);
        for option in [
            format!("Dir::Etc::SourceList={dir}/sources.list"),
            "Dir::Etc::SourceParts=/dev/null".into(),
            "Dir::Etc::Preferences=/dev/null".into(),
            format!("Dir::Etc::PreferencesParts={dir}/preferences.d"),
            format!("Dir::State={dir}"),
            format!("Dir::State::Lists={dir}/lists"),
            format!("Dir::State::status={dir}/status"),
            format!("Dir::Cache={dir}/cache"),
            "APT::Architectures=amd64,arm64".into(),
            // As root apt would download as `_apt`, who cannot write here.
            "APT::Sandbox::User=root".into(),
            "Acquire::Languages=none".into(),
        ] {
            cmd.args(["-o", &option]);
        }
        cmd.arg("-q");
        cmd
    }

    fn update(&self) -> Result<()> {
        run_cmd(self.command("apt-get").arg("update"))
    }

    /// The package a meta package (`linux-image-amd64`) depends on, i.e. the
    /// current versioned kernel of the release.
    fn resolve(&self, meta: &str) -> Result<String> {
        let out = self
            .command("apt-cache")
            .args(["depends", meta])
            .output()
            .context("cannot run apt-cache")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .filter_map(|line| line.trim().strip_prefix("Depends: "))
            .find(|package| package.starts_with("linux-image-"))
            .map(str::to_owned)
            .with_context(|| format!("{meta} depends on no linux-image package:\n{text}"))
    }

    /// Downloads `package` and extracts the files under `members` (tar
    /// patterns like `./boot/*`) into `into`; the .deb is removed.
    fn extract(&self, package: &str, members: &[&str], into: &Path) -> Result<()> {
        let download = self.dir.join("download");
        let _ = fs::remove_dir_all(&download);
        fs::create_dir_all(&download)?;
        run_cmd(
            self.command("apt-get")
                .args(["download", package])
                .current_dir(&download),
        )?;
        let deb = fs::read_dir(&download)?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .find(|path| path.extension().is_some_and(|ext| ext == "deb"))
            .with_context(|| format!("apt-get download {package} left no .deb"))?;
        fs::create_dir_all(into)?;
        // Only what is needed: a kernel package's modules are ~400 MB.
        let mut unpack = Command::new("dpkg-deb")
            .arg("--fsys-tarfile")
            .arg(&deb)
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot run dpkg-deb")?;
        let tar = Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(into)
            .arg("--wildcards")
            .args(members)
            .stdin(unpack.stdout.take().expect("piped"))
            .status()
            .context("cannot run tar")?;
        if !unpack.wait()?.success() || !tar.success() {
            bail!("cannot extract {members:?} from {}", deb.display());
        }
        fs::remove_dir_all(&download)?;
        Ok(())
    }
}

/// The release's current kernel for `arch`, from the cache or downloaded.
pub fn fetch(vmtest_dir: &Path, suite: &str, arch: Arch) -> Result<Kernel> {
    let dir = vmtest_dir
        .join("kernels")
        .join(format!("{suite}-{}", arch.debian()));
    if let Some(kernel) = cached(&dir)? {
        return Ok(kernel);
    }
    let apt = Apt::new(vmtest_dir, suite)?;
    apt.update()?;
    let package = apt.resolve(&format!("linux-image-{0}:{0}", arch.debian()))?;
    let partial = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    apt.extract(&package, &["./boot/*"], &partial)?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir)?;
    let kernel = cached(&dir)?.with_context(|| format!("{package} has no /boot/vmlinuz-*"))?;
    // arm64 images may come gzip'ed; qemu boots the plain Image.
    if fs::read(&kernel.image)?.starts_with(&[0x1f, 0x8b]) {
        let out = Command::new("gzip")
            .arg("-dc")
            .arg(&kernel.image)
            .output()
            .context("cannot run gzip")?;
        if !out.status.success() {
            bail!("cannot gunzip {}", kernel.image.display());
        }
        fs::write(&kernel.image, out.stdout)?;
    }
    Ok(kernel)
}

/// The kernel extracted in `dir`, if any.
fn cached(dir: &Path) -> Result<Option<Kernel>> {
    let Ok(entries) = fs::read_dir(dir.join("boot")) else {
        return Ok(None);
    };
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(release) = name.strip_prefix("vmlinuz-") {
            return Ok(Some(Kernel {
                release: release.to_owned(),
                image: dir.join("boot").join(&name),
                config: dir.join("boot").join(format!("config-{release}")),
            }));
        }
    }
    Ok(None)
}

/// Whether the kernel was built with BTF (hostprof needs
/// /sys/kernel/btf/vmlinux).
pub fn has_btf(kernel: &Kernel) -> Result<bool> {
    let config = fs::read_to_string(&kernel.config)
        .with_context(|| format!("cannot read {}", kernel.config.display()))?;
    Ok(config.lines().any(|line| line == "CONFIG_DEBUG_INFO_BTF=y"))
}

/// A static busybox for `arch`: the host's (busybox-static, installed by
/// setup) when it matches, else the release's busybox-static package.
pub fn busybox(vmtest_dir: &Path, suite: &str, arch: Arch) -> Result<PathBuf> {
    if arch == Arch::host() {
        return Ok(PathBuf::from("/bin/busybox"));
    }
    let dir = vmtest_dir.join(format!("busybox-{}", arch.debian()));
    let binary = dir.join("bin/busybox");
    if !binary.exists() {
        let apt = Apt::new(vmtest_dir, suite)?;
        apt.update()?;
        apt.extract(
            &format!("busybox-static:{}", arch.debian()),
            &["./bin/busybox"],
            &dir,
        )?;
    }
    Ok(binary)
}

/// A Debian JDK whose runtime the arm64 guest runs: its feature release
/// and the Debian release that carries it (each of 11, 17 and 21 is in
/// one release only).
pub struct Jdk {
    pub major: u32,
    pub suite: &'static str,
    /// Whether it needs its release's C library: one newer than the cross
    /// sysroot's (bookworm's glibc 2.36), which the image's other
    /// programs were linked against and run on as well.
    pub own_libc: bool,
}

/// The JDKs the arm64 guest checks, the LTS releases hostprof supports.
pub const JDKS: &[Jdk] = &[
    Jdk {
        major: 11,
        suite: "bullseye",
        own_libc: false,
    },
    Jdk {
        major: 17,
        suite: "bookworm",
        own_libc: false,
    },
    Jdk {
        major: 21,
        suite: "trixie",
        // Its libjvm, libjava and libjli want GLIBC_2.38.
        own_libc: true,
    },
];

/// Debian's runtime of `jdk` for a guest that is not the host's arch (the
/// host's tests run the host's own JDKs): the release's
/// `openjdk-N-jre-headless` and the one library it needs that the cross
/// sysroot (`libc6-dev-arm64-cross`, and the libstdc++ and libgcc_s that
/// `gcc-aarch64-linux-gnu` brings) lacks, zlib, from the same release,
/// and, for a JDK that needs it, the release's glibc (under [`LIBC`]).
/// The release's own versions, not its security archive's: that index
/// names builds its mirror may lack (bullseye's arm64 JDK 11, now LTS's,
/// answers 404). Extracted under `vmtest_dir/jre-N-ARCH` (cached: a
/// second run needs no network); returns where, with the JDK's home at
/// [`jre_home`] in it and its libraries under [`jre_libraries`].
pub fn jre(vmtest_dir: &Path, jdk: &Jdk, arch: Arch) -> Result<PathBuf> {
    let dir = vmtest_dir.join(format!("jre-{}-{}", jdk.major, arch.debian()));
    if jre_home(&dir, jdk.major, arch)
        .join("lib/server/libjvm.so")
        .exists()
    {
        return Ok(dir);
    }
    let apt = Apt::new(vmtest_dir, jdk.suite)?;
    apt.update()?;
    let partial = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    let home = format!("./{}/*", jre_home(Path::new(""), jdk.major, arch).display());
    let package = |name: &str| format!("{name}:{}/{}", arch.debian(), jdk.suite);
    apt.extract(
        &package(&format!("openjdk-{}-jre-headless", jdk.major)),
        &[&home],
        &partial,
    )?;
    // Under /lib up to bookworm, /usr/lib from trixie (merged /usr): the
    // pattern's `*` takes both.
    let libraries = format!("./*lib/{}/*", arch.triplet());
    apt.extract(&package("zlib1g"), &[&libraries], &partial)?;
    if jdk.own_libc {
        // Apart: the image takes it whole, its loader with it.
        apt.extract(&package("libc6"), &[&libraries], &partial.join(LIBC))?;
    }
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir)?;
    Ok(dir)
}

/// Where in [`jre`]'s directory a JDK's own C library is extracted (as
/// `usr/lib/TRIPLET/` from trixie on).
pub const LIBC: &str = "libc";

/// Where [`jre`]'s directory `dir` has the libraries it brings besides
/// the JDK's own (its C library apart).
pub fn jre_libraries(dir: &Path, arch: Arch) -> Vec<PathBuf> {
    ["lib", "usr/lib"]
        .iter()
        .map(|lib| dir.join(lib).join(arch.triplet()))
        .collect()
}

/// The JDK's home in [`jre`]'s directory `dir` (and in the guest, under
/// `/`): Debian's path, which its CDS archive was made at.
pub fn jre_home(dir: &Path, major: u32, arch: Arch) -> PathBuf {
    dir.join(format!(
        "usr/lib/jvm/java-{major}-openjdk-{}",
        arch.debian()
    ))
}
