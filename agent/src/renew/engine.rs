//! Renewal engines: who makes the new certificates of a plan.
//!
//! - [`Engine::Native`] (the default): certrotor issues them itself ([`renew::issue_all`]).
//! - [`Engine::Kubeadm`]: the node's own tools do it, as EKS Anywhere does on Bottlerocket
//!   (`reference/bottlerocket-api.md` §3.4, §4): `kubeadm certs renew <name>` once per selected
//!   certificate (never `renew all`), and on etcd nodes `etcdadm join phase certificates
//!   <dummy-url> --init-system kubelet`, each run with `ctr run --rm` in the bottlerocket-bootstrap
//!   image through the host's containerd. The tools never see the live PKI: they work on a
//!   staging copy under `var/lib/certrotor/engine/<pid>` (0700), mounted where EKS Anywhere mounts
//!   the real folders (the kubeadm folder at both `/var/lib/kubeadm` and `/etc/kubernetes`; the
//!   etcd PKI, emptied of everything but `ca.*`, at `/etc/etcd/pki`). What they wrote becomes
//!   [`renew::Issued`] values, so the same validation and transaction follow as for the native
//!   engine.
//!
//! Containers are named `certrotor-kubeadm-<pid>-<n>`; each is removed after its run, whatever
//! the outcome, and a run starts by removing those a killed run left behind (their pid is gone).
//! Staging copies of an interrupted run are removed by the next run too. The image must already
//! be in containerd: certrotor never pulls.
//!
//! Where the image is (unless `--containerd-socket` or `--containerd-namespace` say): first
//! host-containerd (`/run/host-containerd/containerd.sock`, namespace `default`), where
//! Bottlerocket's host-ctr pulled the `kubeadm-bootstrap` host container's `source` when EKS
//! Anywhere made the node; the image stays there after that container disabled itself. Then the
//! kubelet's containerd (`/run/containerd/containerd.sock`) in namespace `k8s.io`, then in
//! `default` (where EKS Anywhere's documented `ctr image pull` puts it). Each socket is also
//! looked for under `/.bottlerocket/rootfs`, the host root of a Bottlerocket container. The
//! tools run through the containerd that holds the image.
//!
//! Decision: certrotor drives the host's `ctr` rather than containerd's gRPC API. The gRPC route
//! would need protobuf/tonic/tokio and an OCI runtime-spec builder in a small static binary;
//! `ctr run` already builds the spec exactly as EKS Anywhere's documented procedure does, and
//! Bottlerocket ships `/usr/bin/ctr`, reachable from a superpowered host container as
//! `/.bottlerocket/rootfs/usr/bin/ctr`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::node::carrier::CarrierError;
use crate::node::catalog::Flavor;
use crate::node::catalog::paths::{
    BOTTLEROCKET_ETCD_PKI, BOTTLEROCKET_KUBEADM_DIR, ETCDADM_PKI, KUBEADM_DIR,
};
use crate::pki::{Cert, MAX_PEM_FILE_BYTES, PrivateKey};
use crate::renew::{self, IdentityCheck, IssueError, Issued, Item, Plan, ValidityCheck};
use crate::sys::clock::Clock;
use crate::sys::fsutil;

/// containerd's socket on a Kubernetes node.
pub const DEFAULT_CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// The CRI namespace, where the kubelet's images are.
pub const DEFAULT_CONTAINERD_NAMESPACE: &str = "k8s.io";
/// Bottlerocket's host-containerd, which runs host and bootstrap containers.
pub const HOST_CONTAINERD_SOCKET: &str = "/run/host-containerd/containerd.sock";
/// host-containerd's namespace (host-ctr's default).
pub const HOST_CONTAINERD_NAMESPACE: &str = "default";
/// kubeadm in EKS Anywhere's bottlerocket-bootstrap image.
pub const DEFAULT_KUBEADM_PATH: &str = "/opt/bin/kubeadm";
/// etcdadm in the same image.
pub const DEFAULT_ETCDADM_PATH: &str = "/opt/bin/etcdadm";
/// Prefix of the containers certrotor runs.
pub const CONTAINER_PREFIX: &str = "certrotor-kubeadm-";
/// The endpoint EKS Anywhere gives `etcdadm join phase certificates`; it is not contacted.
const ETCDADM_DUMMY_URL: &str = "http://eks-a-etcd-dumb-url";
/// The Bottlerocket setting holding the bootstrap image.
const IMAGE_SETTING: &str = "settings.host-containers.kubeadm-bootstrap.source";
/// Bound on one tool run.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// Bound on one ctr housekeeping command.
const CTR_TIMEOUT: Duration = Duration::from_secs(60);

/// Who issues the new certificates.
#[derive(Debug, Clone, Default)]
pub enum Engine {
    /// certrotor itself.
    #[default]
    Native,
    /// kubeadm/etcdadm in the bootstrap image, through containerd.
    Kubeadm(KubeadmOptions),
}

impl Engine {
    /// `native` or `kubeadm`.
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Native => "native",
            Engine::Kubeadm(_) => "kubeadm",
        }
    }
}

/// Where the kubeadm engine finds its image, tools and containerd.
#[derive(Debug, Clone)]
pub struct KubeadmOptions {
    /// The image; `None`: `settings.host-containers.kubeadm-bootstrap.source` from the API.
    pub image: Option<String>,
    pub kubeadm_path: String,
    pub etcdadm_path: String,
    /// The `ctr` binary; `None`: the host's (`/.bottlerocket/rootfs/usr/bin/ctr` in a host
    /// container), else `ctr` from `PATH`.
    pub ctr_path: Option<PathBuf>,
    /// containerd's socket; with `namespace`, `None` for both: look where Bottlerocket and EKS
    /// Anywhere keep the image (see the module documentation).
    pub socket: Option<PathBuf>,
    /// The image's containerd namespace (`k8s.io` when only `socket` is given).
    pub namespace: Option<String>,
    /// The Bottlerocket API socket, to look the image up.
    pub api_socket: PathBuf,
}

impl Default for KubeadmOptions {
    fn default() -> Self {
        KubeadmOptions {
            image: None,
            kubeadm_path: DEFAULT_KUBEADM_PATH.into(),
            etcdadm_path: DEFAULT_ETCDADM_PATH.into(),
            ctr_path: None,
            socket: None,
            namespace: None,
            api_socket: crate::node::catalog::paths::API_SOCKET.into(),
        }
    }
}

/// What an engine issued, and how to validate it.
#[derive(Debug)]
pub struct Output {
    pub issued: Vec<Issued>,
    pub validity: ValidityCheck,
}

/// Issues every planned certificate with `engine`. Nothing live is touched. `clock` dates
/// the window in which kubeadm chose its validity.
pub fn issue(
    root: &Path,
    plan: &Plan,
    engine: &Engine,
    clock: &dyn Clock,
) -> Result<Output, IssueError> {
    match engine {
        Engine::Native => Ok(Output {
            issued: renew::issue_all(root, plan)?,
            validity: ValidityCheck::Planned,
        }),
        Engine::Kubeadm(opts) => {
            let started = clock.now();
            let clock_started = Instant::now();
            let issued = kubeadm_issue(root, plan, opts)?;
            log::info!(
                "kubeadm engine: {} certificate(s) in {} ms",
                issued.len(),
                clock_started.elapsed().as_millis()
            );
            Ok(Output {
                issued,
                validity: ValidityCheck::ToolChosen {
                    started,
                    finished: clock.now(),
                },
            })
        }
    }
}

fn err(message: impl fmt::Display) -> IssueError {
    IssueError(format!("kubeadm engine: {message}"))
}

mod ctr;
use ctr::{Ctr, default_ctr, host_path, locate, resolve_image};
#[cfg(test)]
use ctr::{certrotor_alive, redact_keys};
/// The tool folder of an item: (which tool, folder relative to the root).
fn tool_dir(item: &Item) -> Result<(Flavor, &'static str), IssueError> {
    let candidates: [(Flavor, &'static str); 4] = [
        (Flavor::Kubeadm, KUBEADM_DIR),
        (Flavor::Kubeadm, BOTTLEROCKET_KUBEADM_DIR),
        (Flavor::Etcdadm, ETCDADM_PKI),
        (Flavor::Etcdadm, BOTTLEROCKET_ETCD_PKI),
    ];
    candidates
        .into_iter()
        .find(|(flavor, dir)| *flavor == item.flavor && item.path.starts_with(&format!("{dir}/")))
        .ok_or_else(|| {
            err(format!(
                "{}: '{}' is in no known folder",
                item.name, item.path
            ))
        })
}

/// The staging folder of this run; removes those of interrupted runs.
struct Staging {
    dir: PathBuf,
}

impl Staging {
    fn new(root: &Path) -> Result<Staging, IssueError> {
        let parent = crate::txn::state_dir(root).join("engine");
        if let Ok(list) = std::fs::read_dir(&parent) {
            for e in list.flatten() {
                log::warn!(
                    "kubeadm engine: removing the staging copy '{}' of an interrupted run",
                    e.path().display()
                );
                std::fs::remove_dir_all(e.path())
                    .map_err(|x| err(format!("cannot remove '{}': {x}", e.path().display())))?;
            }
        }
        let dir = parent.join(std::process::id().to_string());
        fsutil::create_dir_all_mode(&dir, 0o700)
            .map_err(|e| err(format!("cannot create '{}': {e}", dir.display())))?;
        Ok(Staging { dir })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies the regular files and folders of `from` into `to` (symlinks and others skipped),
/// keeping modes.
fn copy_tree(from: &Path, to: &Path, filter: &dyn Fn(&Path) -> bool) -> Result<(), IssueError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |p: &Path, e: std::io::Error| err(format!("staging '{}': {e}", p.display()));
    fsutil::create_dir_all_mode(to, 0o700).map_err(|e| io(to, e))?;
    for e in std::fs::read_dir(from).map_err(|e| io(from, e))?.flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            copy_tree(&src, &dst, filter)?;
        } else if kind.is_file() && filter(&src) {
            let mode = e.metadata().map_err(|x| io(&src, x))?.permissions().mode() & 0o777;
            let data = fsutil::read_limited(&src, &src.display().to_string(), MAX_PEM_FILE_BYTES)
                .map_err(|x| err(x.to_string()))?;
            fsutil::write_new(&dst, &data, mode, None).map_err(|x| io(&dst, x))?;
        }
    }
    Ok(())
}

fn read_rel(root: &Path, rel: &str) -> Result<Vec<u8>, IssueError> {
    match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(err(format!("'{rel}' does not exist"))),
        Err(e) => Err(err(e)),
    }
}

fn kubeadm_issue(
    root: &Path,
    plan: &Plan,
    opts: &KubeadmOptions,
) -> Result<Vec<Issued>, IssueError> {
    if plan.reuse_keys {
        return Err(err(
            "--reuse-keys: kubeadm and etcdadm always make new keys; use --engine native",
        ));
    }
    let image = resolve_image(opts)?;
    let ctr_path = opts.ctr_path.clone().unwrap_or_else(default_ctr);
    let mut ctr = locate(opts, &image, &ctr_path)?;
    ctr.remove_leftovers()?;
    let staging = Staging::new(root)?;

    let mut groups: BTreeMap<(u8, &'static str), Vec<&Item>> = BTreeMap::new();
    for item in &plan.items {
        let (flavor, dir) = tool_dir(item)?;
        groups
            .entry((u8::from(flavor == Flavor::Etcdadm), dir))
            .or_default()
            .push(item);
    }
    let mut issued = Vec::new();
    for (n, ((etcdadm, dir), items)) in groups.into_iter().enumerate() {
        let group = Group {
            root,
            stage: staging.dir.join(format!("{n}")),
            dir,
            items,
        };
        if etcdadm == 0 {
            issued.extend(kubeadm_group(&mut ctr, opts, &group)?);
        } else {
            issued.extend(etcdadm_group(&mut ctr, opts, &group)?);
        }
    }
    drop(staging);
    Ok(issued)
}

/// The items one tool renews in one staged copy of their folder.
struct Group<'a> {
    root: &'a Path,
    /// The staged copy.
    stage: PathBuf,
    /// The folder under the root (its `pki` for kubeadm).
    dir: &'static str,
    items: Vec<&'a Item>,
}

/// Renews each item of a kubeadm folder with `kubeadm certs renew`, in a staged copy of the
/// folder's PKI and kubeconfigs.
fn kubeadm_group(
    ctr: &mut Ctr,
    opts: &KubeadmOptions,
    group: &Group<'_>,
) -> Result<Vec<Issued>, IssueError> {
    let (root, stage, dir) = (group.root, group.stage.as_path(), group.dir);
    let host = host_path(root, stage);
    copy_tree(&root.join(dir).join("pki"), &stage.join("pki"), &|_| true)?;
    copy_tree(&root.join(dir), stage, &|p| {
        p.extension().is_some_and(|x| x == "conf") && p.parent() == Some(root.join(dir).as_path())
    })?;
    let mut issued = Vec::new();
    for item in &group.items {
        let name = item.name.split('@').next().unwrap_or(&item.name);
        let before = staged_cert(stage, dir, item).ok();
        let out = ctr.tool(
            &[
                (host.clone(), "/var/lib/kubeadm"),
                (host.clone(), "/etc/kubernetes"),
            ],
            false,
            &[
                opts.kubeadm_path.clone(),
                "certs".into(),
                "renew".into(),
                name.to_string(),
            ],
        )?;
        let after = staged_cert(stage, dir, item).ok();
        if after.is_none() || after == before {
            return Err(err(format!(
                "kubeadm certs renew {name} did not renew '{}' (its output: {})",
                item.path,
                out.trim()
            )));
        }
        issued.push(collect(root, stage, dir, item, IdentityCheck::SameAsOld)?);
    }
    Ok(issued)
}

/// Renews the items of an etcdadm folder with one `etcdadm join phase certificates`.
fn etcdadm_group(
    ctr: &mut Ctr,
    opts: &KubeadmOptions,
    group: &Group<'_>,
) -> Result<Vec<Issued>, IssueError> {
    let stage = group.stage.as_path();
    // etcdadm keeps whatever leaf it finds: give it the CA only, as EKS Anywhere does.
    copy_tree(&group.root.join(group.dir), stage, &|p| {
        p.file_name()
            .and_then(|f| f.to_str())
            .is_some_and(|f| f == "ca.crt" || f == "ca.key")
    })?;
    ctr.tool(
        &[(host_path(group.root, stage), "/etc/etcd/pki")],
        true,
        &[
            opts.etcdadm_path.clone(),
            "join".into(),
            "phase".into(),
            "certificates".into(),
            ETCDADM_DUMMY_URL.into(),
            "--init-system".into(),
            "kubelet".into(),
        ],
    )?;
    let as_configured = IdentityCheck::EtcdadmAsNodeConfigured;
    (group.items.iter())
        .map(|item| collect(group.root, stage, group.dir, item, as_configured))
        .collect()
}

/// The staged copy of a path relative to the root.
fn staged(stage: &Path, dir: &str, rel: &str) -> Result<PathBuf, IssueError> {
    rel.strip_prefix(&format!("{dir}/"))
        .map(|r| stage.join(r))
        .ok_or_else(|| err(format!("'{rel}' is not under '{dir}'")))
}

fn read_staged(path: &Path) -> Result<Vec<u8>, IssueError> {
    fsutil::read_limited(path, &path.display().to_string(), MAX_PEM_FILE_BYTES)
        .map_err(|e| err(format!("the tool's output: {e}")))
}

/// The DER of the staged certificate of an item (a kubeconfig's embedded one).
fn staged_cert(stage: &Path, dir: &str, item: &Item) -> Result<Vec<u8>, IssueError> {
    let (cert, _) = staged_pair(stage, dir, item)?;
    Ok(Cert::from_pem(&cert).map_err(err)?.der)
}

/// The staged certificate and key PEM of an item; the key is scrubbed wherever it is dropped.
fn staged_pair(
    stage: &Path,
    dir: &str,
    item: &Item,
) -> Result<(Vec<u8>, zeroize::Zeroizing<Vec<u8>>), IssueError> {
    let held = item
        .carrier()
        .read_held(|rel| read_staged(&staged(stage, dir, rel)?), Ok)
        .map_err(|e| match e {
            CarrierError::Given(e) => e,
            CarrierError::NotEmbedded => err(format!(
                "{}: the tool's kubeconfig has no embedded client certificate",
                item.name
            )),
            e => err(format!("{}: the tool's kubeconfig: {e}", item.name)),
        })?;
    Ok((held.cert, held.key_pem))
}

/// Turns what the tool wrote for `item` into an [`Issued`] on the live files.
fn collect(
    root: &Path,
    stage: &Path,
    dir: &str,
    item: &Item,
    identity: IdentityCheck,
) -> Result<Issued, IssueError> {
    let ctx = |e: &dyn fmt::Display| err(format!("{}: {e}", item.name));
    // The key is scrubbed on every path out of here (`Issued` scrubs its files).
    let (cert_pem, key_pem) = staged_pair(stage, dir, item)?;
    let new = Cert::from_pem(&cert_pem).map_err(|e| ctx(&e))?;
    let key = PrivateKey::from_pem(&key_pem).map_err(|e| ctx(&e))?;
    let ca_bytes = read_rel(root, &item.signer_cert_path)?;
    let ca = Cert::from_pem(&ca_bytes).map_err(|e| ctx(&e))?;
    let trust = super::ca_file_certs(&ca_bytes, &ca);
    let live = zeroize::Zeroizing::new(read_rel(root, &item.path)?);
    let carrier = item.carrier();
    let (old, document) = carrier.cert_in(&live).map_err(|e| ctx(&e))?;
    let files =
        (carrier.new_files(document, cert_pem, &key_pem, &trust, true)).map_err(|e| ctx(&e))?;
    if old.der == new.der {
        return Err(ctx(&"the tool left the certificate unchanged"));
    }
    Ok(Issued {
        item: item.clone(),
        old,
        new,
        key,
        ca,
        files,
        identity,
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn tool_output_never_carries_key_material() {
        let out = "renewed apiserver\n-----BEGIN RSA PRIVATE KEY-----\nMIIEsecret\n-----END RSA PRIVATE KEY-----\ndone";
        let r = redact_keys(out);
        assert_eq!(r, "renewed apiserver\n[private key redacted]\ndone");
        assert!(!r.contains("MIIEsecret"));
    }

    use super::*;
    use crate::node::catalog::paths::BOTTLEROCKET_HOST_ROOT;

    #[test]
    fn host_paths_map_only_inside_a_bottlerocket_host_container() {
        let p = Path::new("/tmp/x/var/lib/certrotor/engine/1/0");
        assert_eq!(host_path(Path::new("/tmp/x"), p), p);
        let br = Path::new("/.bottlerocket/rootfs/var/lib/certrotor/engine/1/0");
        if !Path::new(BOTTLEROCKET_HOST_ROOT).exists() {
            // canonicalize fails on a missing root and falls back to the path itself.
            assert_eq!(
                host_path(Path::new(BOTTLEROCKET_HOST_ROOT), br),
                Path::new("/var/lib/certrotor/engine/1/0")
            );
        }
    }

    #[test]
    fn leftovers_of_live_certrotor_processes_are_kept() {
        assert!(!certrotor_alive(u32::MAX));
    }
}
