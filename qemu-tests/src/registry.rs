//! The image as users pull it: certrotor's OCI image index (linux/amd64 + linux/arm64, built by
//! `bottlerocket/packaging/build-image.sh` from the shipped static binaries), a real registry on
//! loopback to push it to (Debian's `docker-registry`, one per test, on a free 127.0.0.1 port
//! with its own storage, stopped when dropped) and Debian's `skopeo` to push and pull.
//!
//! Used by `tests/image_registry.rs` (push, pull back by digest, run both architectures) and by
//! the smoke scenario, whose VM pulls the index by digest from the host's registry through
//! QEMU's user network (the guest reaches the host's 127.0.0.1 as 10.0.2.2).

use crate::error::{Context, Error, Result};
use crate::paths;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where QEMU's user network (`-netdev user`) shows the host to the guest: the guest's
/// connections to this address reach the host's 127.0.0.1.
pub const HOST_FROM_GUEST: &str = "10.0.2.2";

/// The repository the tests push the index to.
pub const REPOSITORY: &str = "certrotor";

/// `tool` on PATH, or an error naming the Debian package that provides it.
pub fn require_tool(tool: &str, package: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error(format!(
                "{tool} is not on PATH: install the Debian package '{package}' \
                 (images/setup-host.sh installs every package the suite needs)"
            ))
        })
}

/// One platform's part of the index, as the builder's summary lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// Digest of the platform's image manifest.
    pub manifest: String,
    /// Digest of its config.
    pub config: String,
    /// Digest of its (gzip) layer.
    pub layer: String,
    /// Digest of the uncompressed layer (the config's `rootfs.diff_ids`).
    pub diff_id: String,
    /// sha256 (hex) of the static binary packed into it.
    pub binary_sha256: String,
    /// Its size in bytes.
    pub binary_size: u64,
}

/// certrotor's image index in an OCI archive.
#[derive(Debug, Clone)]
pub struct ImageIndex {
    /// The OCI layout archive (`oci-archive:` for skopeo).
    pub archive: PathBuf,
    /// The name stored in the archive (`localhost/certrotor:VERSION`).
    pub name: String,
    /// Its tag (the version): the archive's `org.opencontainers.image.ref.name`.
    pub tag: String,
    /// The index's digest (`sha256:...`): what a node pulls by.
    pub digest: String,
    /// By platform (`linux/amd64`, `linux/arm64`).
    pub platforms: BTreeMap<String, Platform>,
    /// How long `build-image.sh` took.
    pub build_time: Duration,
}

impl ImageIndex {
    /// The part for `platform` (`linux/amd64`, ...), or an error.
    pub fn platform(&self, platform: &str) -> Result<&Platform> {
        self.platforms.get(platform).ok_or_else(|| {
            Error(format!(
                "{}: no {platform} manifest in the index",
                self.archive.display()
            ))
        })
    }
}

fn field(v: &Value, key: &str, what: &str) -> Result<String> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| Error(format!("{what}: no string {key:?}")))
}

/// Runs `bottlerocket/packaging/build-image.sh OUT` (both static binaries, cargo-cached, then the
/// deterministic packing) with `envs` added, and reads the summary it writes next to `out`.
pub fn build_image_index(out: &Path, envs: &[(&str, &str)]) -> Result<ImageIndex> {
    let script = paths::workspace_root().join("bottlerocket/packaging/build-image.sh");
    let mut c = Command::new("bash");
    c.arg(&script).arg(out).current_dir(paths::workspace_root());
    c.env("CARGO_TARGET_DIR", paths::target_dir());
    for (k, v) in envs {
        c.env(k, v);
    }
    eprintln!("qemu-tests: build the image index: {c:?}");
    let t0 = Instant::now();
    let st = c.status().ctx(format!("cannot run {}", script.display()))?;
    let build_time = t0.elapsed();
    if !st.success() {
        return Err(Error(format!(
            "{} failed ({st}): see its output above (run images/setup-host.sh as root when a \
             package is missing)",
            script.display()
        )));
    }
    let summary_path = out.with_extension("json");
    let text = fs::read_to_string(&summary_path).ctx(format!("read {}", summary_path.display()))?;
    let v: Value = serde_json::from_str(&text).ctx(format!("parse {}", summary_path.display()))?;
    let what = summary_path.display().to_string();
    let name = field(&v, "name", &what)?;
    let tag = name
        .rsplit('/')
        .next()
        .and_then(|last| last.rsplit_once(':'))
        .map(|(_, t)| t.to_string())
        .ok_or_else(|| Error(format!("{what}: name {name:?} has no tag")))?;
    let mut platforms = BTreeMap::new();
    for (plat, p) in v
        .get("platforms")
        .and_then(Value::as_object)
        .ok_or_else(|| Error(format!("{what}: no platforms")))?
    {
        let w = format!("{what}: {plat}");
        platforms.insert(
            plat.clone(),
            Platform {
                manifest: field(p, "manifest", &w)?,
                config: field(p, "config", &w)?,
                layer: field(p, "layer", &w)?,
                diff_id: field(p, "diff_id", &w)?,
                binary_sha256: field(p, "binary_sha256", &w)?,
                binary_size: p
                    .get("binary_size")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| Error(format!("{w}: no binary_size")))?,
            },
        );
    }
    Ok(ImageIndex {
        archive: out.to_path_buf(),
        digest: field(&v, "index", &what)?,
        name,
        tag,
        platforms,
        build_time,
    })
}

static INDEX: OnceLock<std::result::Result<ImageIndex, Error>> = OnceLock::new();

/// The image index at `<target>/oci/certrotor-oci.tar`, built once per test process.
pub fn image_index() -> Result<&'static ImageIndex> {
    INDEX
        .get_or_init(|| {
            let dir = paths::target_dir().join("oci");
            fs::create_dir_all(&dir).ctx(format!("create {}", dir.display()))?;
            build_image_index(&dir.join("certrotor-oci.tar"), &[])
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A running `docker-registry` on 127.0.0.1, with its storage in a fresh folder; stopped (and
/// its storage removed) when dropped.
#[derive(Debug)]
pub struct Registry {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Registry {
    /// Starts Debian's `docker-registry` on a free loopback port with its storage under
    /// `<target>/qemu-tests/registry-<name>/` and waits (at most 30 s) until it answers `/v2/`.
    pub fn start(name: &str) -> Result<Registry> {
        let bin = require_tool("docker-registry", "docker-registry")?;
        require_tool("skopeo", "skopeo")?;
        let dir = paths::work_root().join(format!("registry-{name}"));
        if dir.exists() {
            fs::remove_dir_all(&dir).ctx(format!("remove {}", dir.display()))?;
        }
        fs::create_dir_all(dir.join("storage")).ctx(format!("create {}", dir.display()))?;
        fs::write(
            dir.join("policy.json"),
            "{\"default\":[{\"type\":\"insecureAcceptAnything\"}]}\n",
        )
        .ctx("write the skopeo policy")?;
        // The port is picked by the kernel, released, then taken by the registry: another process
        // may take it in between; the registry then fails to listen and the next port is tried.
        let mut last = String::new();
        for _ in 0..5 {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .ctx("find a free loopback port")?
                .port();
            let config = dir.join("config.yml");
            fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    \
                     rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                    dir.join("storage").display()
                ),
            )
            .ctx(format!("write {}", config.display()))?;
            let log_path = dir.join("registry.log");
            let log = fs::File::create(&log_path).ctx(format!("create {}", log_path.display()))?;
            let err = log.try_clone().ctx("registry log")?;
            let child = Command::new(&bin)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(err)
                .spawn()
                .ctx(format!("start {}", bin.display()))?;
            let mut reg = Registry {
                child,
                port,
                dir: dir.clone(),
            };
            match reg.wait_ready(Duration::from_secs(30)) {
                Ok(()) => {
                    eprintln!(
                        "qemu-tests: docker-registry on 127.0.0.1:{port} (storage {})",
                        dir.display()
                    );
                    return Ok(reg);
                }
                Err(e) => last = e.0,
            }
            // `reg` is dropped here: the process is killed and reaped.
        }
        Err(Error(format!("docker-registry did not start: {last}")))
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        loop {
            if let Some(st) = self.child.try_wait().ctx("docker-registry")? {
                return Err(Error(format!(
                    "docker-registry exited ({st}); its log {}:\n{}",
                    self.log().display(),
                    fs::read_to_string(self.log()).unwrap_or_default()
                )));
            }
            if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let req = format!("GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n", self.port);
                let mut buf = [0u8; 12];
                if s.write_all(req.as_bytes()).is_ok()
                    && s.read_exact(&mut buf).is_ok()
                    && buf.ends_with(b" 200")
                {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(Error(format!(
                    "docker-registry on 127.0.0.1:{} did not answer GET /v2/ with 200 within \
                     {limit:?}; its log: {}",
                    self.port,
                    self.log().display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The registry's log file.
    pub fn log(&self) -> PathBuf {
        self.dir.join("registry.log")
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `skopeo` with the test's policy (accept anything: a loopback registry, no signatures)
    /// and `args`; Ok(output) when it exits 0, else an error with its stderr.
    pub fn skopeo(&self, args: &[&str]) -> Result<Output> {
        let policy = self.dir.join("policy.json");
        let mut c = Command::new("skopeo");
        c.arg("--policy").arg(&policy).args(args);
        let out = c
            .output()
            .ctx("cannot run skopeo (Debian package 'skopeo')")?;
        if out.status.success() {
            Ok(out)
        } else {
            Err(Error(format!(
                "skopeo {} failed ({}):\n{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// Pushes the whole index (every platform, digests preserved) as `REPOSITORY:TAG`; returns
    /// the reference by digest, `127.0.0.1:PORT/certrotor@sha256:...`.
    pub fn push(&self, index: &ImageIndex) -> Result<String> {
        self.push_as(index, &index.tag)
    }

    /// [`Registry::push`] under another tag: `REPOSITORY:tag`.
    pub fn push_as(&self, index: &ImageIndex, tag: &str) -> Result<String> {
        let src = format!("oci-archive:{}:{}", index.archive.display(), index.tag);
        let dest = format!("docker://{}/{REPOSITORY}:{tag}", self.addr());
        self.skopeo(&[
            "copy",
            "--all",
            "--preserve-digests",
            "--dest-tls-verify=false",
            &src,
            &dest,
        ])?;
        Ok(format!("{}/{REPOSITORY}@{}", self.addr(), index.digest))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // SIGKILL and reap: nothing of it outlives the test.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(self.dir.join("storage"));
    }
}
