//! The real Kubernetes v1.20.2 binaries built by `images/k8s/build.sh`, and kubeadm run on a node
//! root: `kubeadm --rootfs <root> ...` (kubeadm chroots there, so its default paths
//! `/etc/kubernetes` and `/etc/kubernetes/pki` are the node's) with a config file written into the
//! root. Missing binaries, or not being root (chroot), fail the test with what to do.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::util::openssl_date;

/// The folder with kubeadm, kube-apiserver, ...: `CERTROTOR_K8S_BIN`, else what
/// `images/k8s/build.sh --print-bin-dir` prints. Panics, naming the build script, when absent.
pub fn k8s_bin() -> &'static Path {
    static BIN_DIR: OnceLock<PathBuf> = OnceLock::new();
    BIN_DIR.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/k8s/build.sh");
        let dir = match std::env::var("CERTROTOR_K8S_BIN") {
            Ok(d) if !d.is_empty() => PathBuf::from(d),
            _ => {
                let out = Command::new(&script).arg("--print-bin-dir").output();
                match out {
                    Ok(o) if o.status.success() => {
                        PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
                    }
                    Ok(o) => panic!(
                        "the real Kubernetes v1.20.2 binaries are not built: run {} (as root, \
                         ~11 min on 2 cores) or set CERTROTOR_K8S_BIN\n{}",
                        script.display(),
                        String::from_utf8_lossy(&o.stderr)
                    ),
                    Err(e) => panic!("cannot run {}: {e}", script.display()),
                }
            }
        };
        let kubeadm = dir.join("kubeadm");
        assert!(
            kubeadm.is_file(),
            "{} is missing: run images/k8s/build.sh (or fix CERTROTOR_K8S_BIN='{}')",
            kubeadm.display(),
            dir.display()
        );
        dir
    })
}

/// Fails the test unless running as root (kubeadm --rootfs chroots; containerd needs root).
pub fn require_root(test: &str) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "{test}: needs root (kubeadm --rootfs chroots into the node root): run the tests as root"
    );
}

/// Where the config lives inside a node root (kubeadm sees it at `/kubeadm.yaml`).
pub const CONFIG: &str = "kubeadm.yaml";

/// A kubeadm v1beta2 configuration for node `cp-1` at 10.0.0.10. `extra`: extra apiserver and
/// etcd SANs and a controlPlaneEndpoint, as a real cluster often has.
pub fn config(extra: bool) -> String {
    let mut c = String::from(
        "apiVersion: kubeadm.k8s.io/v1beta2\nkind: InitConfiguration\nlocalAPIEndpoint:\n  \
         advertiseAddress: 10.0.0.10\n  bindPort: 6443\nnodeRegistration:\n  name: cp-1\n---\n\
         apiVersion: kubeadm.k8s.io/v1beta2\nkind: ClusterConfiguration\nkubernetesVersion: \
         v1.20.2\nnetworking:\n  serviceSubnet: 10.96.0.0/12\n  dnsDomain: cluster.local\n",
    );
    if extra {
        c.push_str(
            "controlPlaneEndpoint: \"cp.parity.test:6443\"\napiServer:\n  certSANs: \
             [\"api.parity.test\", \"10.0.0.100\", \"127.0.0.1\"]\netcd:\n  local:\n    \
             serverCertSANs: [\"etcd.parity.test\", \"10.0.0.101\"]\n    peerCertSANs: \
             [\"peer.parity.test\"]\n",
        );
    }
    c
}

/// `kubeadm --rootfs <root> args`; panics with its output unless it succeeds. Returns stdout.
pub fn kubeadm(root: &Path, args: &[&str]) -> String {
    let out = kubeadm_raw(root, args);
    assert!(
        out.status.success(),
        "kubeadm --rootfs {} {} failed ({}):\n{}\n{}",
        root.display(),
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn kubeadm_raw(root: &Path, args: &[&str]) -> std::process::Output {
    Command::new(k8s_bin().join("kubeadm"))
        .arg("--rootfs")
        .arg(root)
        .args(args)
        .current_dir("/")
        .output()
        .unwrap()
}

/// A node root made by the real kubeadm: `init phase certs all` and `init phase kubeconfig all`
/// with [`config`]`(extra)`.
pub fn kubeadm_node(root: &Path, extra: bool) {
    std::fs::create_dir_all(root).unwrap();
    std::fs::write(root.join(CONFIG), config(extra)).unwrap();
    let cfg = format!("/{CONFIG}");
    kubeadm(root, &["init", "phase", "certs", "all", "--config", &cfg]);
    kubeadm(
        root,
        &["init", "phase", "kubeconfig", "all", "--config", &cfg],
    );
}

/// One row of `kubeadm certs check-expiration`.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub name: String,
    /// Unix seconds of the EXPIRES column (minute precision).
    pub expires: i64,
    pub residual: String,
    /// `None` in the CA table (no such column).
    pub ca: Option<String>,
    pub external: bool,
}

/// `kubeadm certs check-expiration --config /kubeadm.yaml` on a node root: (leaf rows, CA rows).
pub fn check_expiration(root: &Path) -> (Vec<Row>, Vec<Row>) {
    let out = kubeadm(
        root,
        &[
            "certs",
            "check-expiration",
            "--config",
            &format!("/{CONFIG}"),
        ],
    );
    parse_check_expiration(&out)
}

/// Parses kubeadm's two tables by the column offsets of their headers (a column can be blank).
pub fn parse_check_expiration(out: &str) -> (Vec<Row>, Vec<Row>) {
    let mut tables: Vec<Vec<Row>> = Vec::new();
    let mut header: Option<String> = None;
    for line in out.lines() {
        if line.starts_with("CERTIFICATE") {
            header = Some(line.to_string());
            tables.push(Vec::new());
            continue;
        }
        let Some(h) = &header else { continue };
        if line.trim().is_empty() {
            header = None;
            continue;
        }
        let col = |name: &str| h.find(name).unwrap_or_else(|| panic!("no {name} in {h}"));
        let cell = |from: usize, to: Option<usize>| -> String {
            let end = to.unwrap_or(line.len()).min(line.len());
            line.get(from.min(end)..end)
                .unwrap_or("")
                .trim()
                .to_string()
        };
        let (exp, res, ext) = (
            col("EXPIRES"),
            col("RESIDUAL TIME"),
            col("EXTERNALLY MANAGED"),
        );
        let ca_col = h.find("CERTIFICATE AUTHORITY").filter(|&c| c > 0);
        let expires_text = cell(exp, Some(res));
        let row = Row {
            name: cell(0, Some(exp)),
            expires: kubeadm_date(&expires_text),
            residual: cell(res, Some(ca_col.unwrap_or(ext))),
            ca: ca_col.map(|c| cell(c, Some(ext))),
            external: match cell(ext, None).as_str() {
                "no" => false,
                "yes" => true,
                other => panic!("EXTERNALLY MANAGED '{other}' in: {line}"),
            },
        };
        tables.last_mut().unwrap().push(row);
    }
    assert_eq!(tables.len(), 2, "two tables expected in:\n{out}");
    let cas = tables.pop().unwrap();
    (tables.pop().unwrap(), cas)
}

/// `Nov 23, 2027 00:38 UTC` (Go layout `Jan 02, 2006 15:04 MST`) as Unix seconds.
pub fn kubeadm_date(text: &str) -> i64 {
    let w: Vec<&str> = text.split_whitespace().collect();
    assert!(
        w.len() == 5 && w[4] == "UTC",
        "unexpected kubeadm date '{text}'"
    );
    let day = w[1].trim_end_matches(',');
    openssl_date(&format!("{} {day} {}:00 {} GMT", w[0], w[3], w[2]))
}

/// kubeadm's RESIDUAL TIME: apimachinery's `duration.ShortHumanDuration`.
pub fn short_human_duration(seconds: i64) -> String {
    if seconds < -1 {
        "<invalid>".into()
    } else if seconds < 0 {
        "0s".into()
    } else if seconds < 60 {
        format!("{seconds}s")
    } else if seconds < 3600 {
        format!("{}m", seconds / 60)
    } else if seconds < 86_400 {
        format!("{}h", seconds / 3600)
    } else if seconds < 365 * 86_400 {
        format!("{}d", seconds / 86_400)
    } else {
        format!("{}y", seconds / (365 * 86_400))
    }
}
