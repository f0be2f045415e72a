//! The inputs of a VM test: static binaries (certrotor and the Bottlerocket test doubles) and
//! the VM images built from them by `images/build-vm.sh`. Built once per test process.
//!
//! Environment:
//! * `CERTROTOR_BIN` — a static `certrotor` binary to use as is (no cargo build); the
//!   power-loss scenario needs one built with `--features failpoints`.
//! * `BR_SIM_DIR`    — a directory holding the static test doubles the VM runs (`apiserver-sim`,
//!   `kubelet-sim`); each one found there goes into the image (`k8s-sim`, also looked for there,
//!   only into a scenario's OCI image). Without it the
//!   harness builds the `testbed` crate's binaries (`bottlerocket/testbed`) and takes those that exist.
//! * `QEMU_TESTS_RUST_TARGET` — target triple for the static builds (default: musl, falling
//!   back to `x86_64-unknown-linux-gnu` with `+crt-static` when the musl target is missing).
//! * `QEMU_TESTS_CARGO_TARGET_DIR` — cargo target dir for those builds (default: the target
//!   dir, see [`crate::paths::target_dir`]).
//! * `CERTROTOR_K8S_BIN` — the folder of the real Kubernetes v1.20.2 binaries (default
//!   [`DEFAULT_K8S_BIN`], where `images/k8s/build.sh` puts them): kube-apiserver,
//!   kube-controller-manager and kube-scheduler go into the image as `/usr/lib/k8s/<name>`,
//!   where kubelet-sim runs them as every control-plane scenario's static pods; the kubelet too, for the real-kubelet scenario, whose
//!   pause image is built from the same folder's `pause`.
//! * `CERTROTOR_KUBECTL` — kubectl v1.20.2 for the image's `/usr/bin/kubectl` (default: the
//!   one `images/setup-host.sh` unpacks from Debian's kubernetes-client package).

use crate::error::{Context, Error, Result};
use crate::paths;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where `images/k8s/build.sh` puts the real Kubernetes v1.20.2 binaries.
pub const DEFAULT_K8S_BIN: &str = testkit::k8s::DEFAULT_BIN;

/// The real control-plane binaries and the kubelet (in the image at `/usr/lib/k8s/<name>`).
pub const K8S_NAMES: [&str; 4] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
];

/// The pod sandbox binary `images/k8s/build.sh` builds (the real kubelet's pause image).
pub const K8S_PAUSE: &str = "pause";

/// kubectl v1.20.2 unpacked by `images/setup-host.sh`.
pub const DEFAULT_KUBECTL: &str = testkit::k8s::DEFAULT_KUBECTL;

/// Names of the Bottlerocket test doubles built from the `testbed` crate that go into the VM
/// image.
pub const SIM_NAMES: [&str; 2] = ["apiserver-sim", "kubelet-sim"];

/// Test doubles of the `testbed` crate that scenarios pack into OCI images for the real kubelet
/// (k8s-sim's kube-vip stand-in), not into the VM image; found beside [`SIM_NAMES`].
pub const OCI_SIM_NAMES: [&str; 1] = ["k8s-sim"];

/// The VM's certrotor has the test-only failpoints (the power-loss scenario stops it at one);
/// the shipped build (`agent/build-static.sh`) does not.
const CERTROTOR_BUILD: &[&str] = &["-p", "certrotor", "--features", "failpoints"];

const MUSL: &str = "x86_64-unknown-linux-musl";
const GNU: &str = "x86_64-unknown-linux-gnu";

/// Static binaries for the VM.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The static `certrotor` binary.
    pub certrotor: PathBuf,
    /// The test doubles that were found, by name (`apiserver-sim`, ..., `k8s-sim`).
    pub sims: BTreeMap<String, PathBuf>,
    /// Why some test doubles are missing (empty when all were found).
    pub sims_note: String,
    /// The real Kubernetes binaries and kubectl that were found, by name.
    pub k8s: BTreeMap<String, PathBuf>,
    /// Which of them are missing and how to get them (empty when all were found).
    pub k8s_note: String,
    /// Time spent building (zero when everything came from the environment).
    pub build_time: Duration,
}

impl Binaries {
    /// Ok when the image holds the real control plane and kubectl, else an error saying how to
    /// get them.
    pub fn require_k8s(&self) -> Result<()> {
        if self.k8s_note.is_empty() {
            Ok(())
        } else {
            Err(Error(format!(
                "the VM image lacks the real Kubernetes binaries: {}",
                self.k8s_note
            )))
        }
    }

    /// The test double `name`, or an error saying how to provide it.
    pub fn sim(&self, name: &str) -> Result<&Path> {
        self.sims.get(name).map(PathBuf::as_path).ok_or_else(|| {
            Error(format!(
                "test double {name} is not available ({}); set BR_SIM_DIR to a directory holding it",
                self.sims_note
            ))
        })
    }
}

/// The VM images (see `images/build-vm.sh`).
#[derive(Debug, Clone)]
pub struct Images {
    /// ELF kernel (PVH boot).
    pub vmlinux: PathBuf,
    /// Tiny initramfs.
    pub initramfs: PathBuf,
    /// Read-only root image (virtio serial `vmroot`).
    pub rootfs: PathBuf,
    /// Blank ext4 used as backing file of each scenario's `/local` overlay.
    pub local_base: PathBuf,
    /// Kernel version.
    pub kver: String,
    /// How long `build-vm.sh` took in this process.
    pub build_time: Duration,
}

/// Everything a scenario needs: binaries + images.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// The static binaries.
    pub bins: Binaries,
    /// The VM images containing them.
    pub images: Images,
}

static ARTIFACTS: OnceLock<std::result::Result<Artifacts, Error>> = OnceLock::new();

/// Builds (once per process) the binaries and the images, and returns them.
pub fn artifacts() -> Result<&'static Artifacts> {
    ARTIFACTS
        .get_or_init(|| {
            let bins = binaries()?;
            let images = build_images(&bins)?;
            Ok(Artifacts { bins, images })
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    eprintln!("qemu-tests: {what}: {cmd:?}");
    let st = cmd.status().ctx(format!("{what}: cannot start {cmd:?}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(Error(format!("{what} failed ({st}): {cmd:?}")))
    }
}

fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.current_dir(paths::workspace_root());
    c
}

fn cargo_target_dir() -> PathBuf {
    paths::path_from_env("QEMU_TESTS_CARGO_TARGET_DIR").unwrap_or_else(paths::target_dir)
}

/// `cargo build --release --target TRIPLE ARGS`, static; returns the release dir.
fn cargo_build_static(triple: &str, args: &[&str], what: &str) -> Result<PathBuf> {
    let tdir = cargo_target_dir();
    let mut c = cargo();
    c.args(["build", "--release", "--target", triple])
        .args(args)
        .env("CARGO_TARGET_DIR", &tdir);
    if triple == MUSL {
        // C dependencies (aws-lc-sys) need a musl C compiler: Debian's musl-tools has musl-gcc.
        if std::env::var_os("CC_x86_64_unknown_linux_musl").is_none()
            && which("x86_64-linux-musl-gcc").is_none()
            && which("musl-gcc").is_some()
        {
            c.env("CC_x86_64_unknown_linux_musl", "musl-gcc");
        }
    } else {
        c.env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            "-C target-feature=+crt-static",
        );
    }
    run(&mut c, what)?;
    Ok(tdir.join(triple).join("release"))
}

fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// Picks the target triple: `QEMU_TESTS_RUST_TARGET`, else musl if `rustup target add` works
/// (or rustup is absent and the target is assumed present), else gnu + crt-static.
fn static_triple() -> String {
    if let Ok(t) = std::env::var("QEMU_TESTS_RUST_TARGET")
        && !t.is_empty()
    {
        return t;
    }
    if which("rustup").is_none() {
        return MUSL.to_string();
    }
    let ok = Command::new("rustup")
        .args(["target", "add", MUSL])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        MUSL.to_string()
    } else {
        eprintln!("qemu-tests: rustup cannot add {MUSL}; using {GNU} with +crt-static");
        GNU.to_string()
    }
}

fn binaries() -> Result<Binaries> {
    let t0 = Instant::now();
    let mut triple: Option<String> = None;
    let certrotor = match paths::path_from_env("CERTROTOR_BIN") {
        Some(p) if p.is_file() => p,
        Some(p) => {
            return Err(Error(format!(
                "CERTROTOR_BIN={} is not a file",
                p.display()
            )));
        }
        None => {
            let mut t = static_triple();
            let dir = match cargo_build_static(&t, CERTROTOR_BUILD, "build certrotor") {
                Ok(d) => d,
                Err(e) if t == MUSL => {
                    eprintln!("qemu-tests: {e}; retrying with {GNU} +crt-static");
                    t = GNU.to_string();
                    cargo_build_static(&t, CERTROTOR_BUILD, "build certrotor")?
                }
                Err(e) => return Err(e),
            };
            triple = Some(t);
            dir.join("certrotor")
        }
    };
    let mut sims = BTreeMap::new();
    let mut notes = Vec::new();
    if let Some(dir) = paths::path_from_env("BR_SIM_DIR") {
        for n in SIM_NAMES.into_iter().chain(OCI_SIM_NAMES) {
            let p = dir.join(n);
            if p.is_file() {
                sims.insert(n.to_string(), p);
            } else {
                notes.push(format!("{} missing", p.display()));
            }
        }
    } else {
        let t = match triple {
            Some(t) => t,
            None => static_triple(),
        };
        match cargo_build_static(&t, &["-p", "testbed", "--bins"], "build test doubles") {
            Ok(dir) => {
                for n in SIM_NAMES.into_iter().chain(OCI_SIM_NAMES) {
                    let p = dir.join(n);
                    if p.is_file() {
                        sims.insert(n.to_string(), p);
                    } else {
                        notes.push(format!("crate testbed has no binary {n} yet"));
                    }
                }
            }
            // Best effort: the smoke scenario does not need them; scenarios that do fail
            // with this note through `Binaries::sim`.
            Err(e) => notes.push(format!("building them failed: {e}")),
        }
    }
    let sims_note = notes.join("; ");
    if !sims_note.is_empty() {
        eprintln!("qemu-tests: note: test doubles: {sims_note}");
    }
    let (k8s, k8s_note) = k8s_binaries();
    if !k8s_note.is_empty() {
        eprintln!("qemu-tests: note: {k8s_note}");
    }
    Ok(Binaries {
        certrotor,
        sims,
        sims_note,
        k8s,
        k8s_note,
        build_time: t0.elapsed(),
    })
}

/// The real Kubernetes binaries and kubectl that exist, and a note on the missing ones.
fn k8s_binaries() -> (BTreeMap<String, PathBuf>, String) {
    let dir =
        paths::path_from_env("CERTROTOR_K8S_BIN").unwrap_or_else(|| PathBuf::from(DEFAULT_K8S_BIN));
    let kubectl =
        paths::path_from_env("CERTROTOR_KUBECTL").unwrap_or_else(|| PathBuf::from(DEFAULT_KUBECTL));
    let mut found = BTreeMap::new();
    let mut missing = Vec::new();
    for (name, path) in K8S_NAMES
        .iter()
        .map(|n| (n.to_string(), dir.join(n)))
        .chain([("kubectl".to_string(), kubectl)])
    {
        if path.is_file() {
            found.insert(name, path);
        } else {
            missing.push(path.display().to_string());
        }
    }
    let note = if missing.is_empty() {
        String::new()
    } else {
        format!(
            "missing {}: build Kubernetes v1.20.2 with images/k8s/build.sh (or set \
             CERTROTOR_K8S_BIN), and run images/setup-host.sh for kubectl (or set \
             CERTROTOR_KUBECTL)",
            missing.join(", ")
        )
    };
    (found, note)
}

fn build_images(bins: &Binaries) -> Result<Images> {
    let out = paths::images_out_dir();
    let script = paths::images_src_dir().join("build-vm.sh");
    let mut c = Command::new("bash");
    c.arg(&script).arg(&out);
    c.arg("--add")
        .arg(format!("{}:/usr/bin/certrotor", bins.certrotor.display()));
    for (name, p) in bins
        .sims
        .iter()
        .filter(|(n, _)| SIM_NAMES.contains(&n.as_str()))
    {
        c.arg("--add")
            .arg(format!("{}:/usr/bin/{name}", p.display()));
    }
    for (name, p) in &bins.k8s {
        let dest = if name == "kubectl" {
            "/usr/bin/kubectl".to_string()
        } else {
            format!("/usr/lib/k8s/{name}")
        };
        c.arg("--add").arg(format!("{}:{dest}", p.display()));
    }
    let t0 = Instant::now();
    run(&mut c, "build VM images").map_err(|e| {
        e.context("(run images/setup-host.sh as root first if packages are missing)")
    })?;
    let build_time = t0.elapsed();
    let env_file = out.join("vm.env");
    let text = std::fs::read_to_string(&env_file).ctx(format!("read {}", env_file.display()))?;
    let kv: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let get = |k: &str| -> Result<PathBuf> {
        let v = kv
            .get(k)
            .ok_or_else(|| Error(format!("{}: no {k}", env_file.display())))?;
        let p = PathBuf::from(v);
        if p.exists() {
            Ok(p)
        } else {
            Err(Error(format!(
                "{}: {k}={v} does not exist",
                env_file.display()
            )))
        }
    };
    Ok(Images {
        vmlinux: get("VMLINUX")?,
        initramfs: get("INITRAMFS")?,
        rootfs: get("ROOTFS")?,
        local_base: get("LOCAL_BASE")?,
        kver: kv.get("KVER").map(|s| (*s).to_string()).unwrap_or_default(),
        build_time,
    })
}

/// The real pause binary (`<CERTROTOR_K8S_BIN>/pause`), or an error saying how to build it.
pub fn k8s_pause() -> Result<PathBuf> {
    k8s_bin(K8S_PAUSE)
}

/// The Kubernetes v1.20.2 binary `name` built by `images/k8s/build.sh` (or from
/// `CERTROTOR_K8S_BIN`), or an error saying how to build it.
pub fn k8s_bin(name: &str) -> Result<PathBuf> {
    let dir =
        paths::path_from_env("CERTROTOR_K8S_BIN").unwrap_or_else(|| PathBuf::from(DEFAULT_K8S_BIN));
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(Error(format!(
            "missing {}: build Kubernetes v1.20.2 with images/k8s/build.sh (or set CERTROTOR_K8S_BIN)",
            p.display()
        )))
    }
}

/// Where OCI archives are kept by input hash (`OCI_IMAGE_CACHE` of `images/oci-image.py`):
/// packed once, hard-linked into each scenario's share. Under the work root, so a `cargo clean`
/// or a fresh clone starts empty.
pub fn oci_cache_dir() -> PathBuf {
    paths::work_root().join(".oci-cache")
}

/// Builds an OCI image archive (`ctr images import`-able) holding `binary` at `dest` (an
/// absolute path in the image, also the entrypoint), named `reference`, at `out`.
pub fn oci_image(binary: &Path, dest: &str, reference: &str, out: &Path) -> Result<()> {
    oci_image_with(binary, dest, &[], reference, out)
}

/// [`oci_image`] with extra host files in the image (`(source, absolute destination)`), e.g.
/// the C library a dynamically linked binary needs.
pub fn oci_image_with(
    binary: &Path,
    dest: &str,
    extra: &[(&Path, &str)],
    reference: &str,
    out: &Path,
) -> Result<()> {
    let script = paths::images_src_dir().join("oci-image.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(script)
        .env("OCI_IMAGE_CACHE", oci_cache_dir())
        .arg(binary)
        .arg(out)
        .args(["--name", reference, "--dest", dest]);
    for (src, dest) in extra {
        cmd.arg("--add").arg(format!("{}:{dest}", src.display()));
    }
    run(&mut cmd, "build OCI image")
}
