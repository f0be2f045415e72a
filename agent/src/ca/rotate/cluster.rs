//! The cluster CA's files beyond its certificate and key: the CA data every kubeconfig of the
//! node embeds, and kube-controller-manager's signer.
//!
//! kubeadm points kube-controller-manager's `--cluster-signing-cert-file` at `ca.crt`, the
//! file the other consumers trust; its CSR signer refuses a file of more than one certificate
//! (`pkg/controller/certificates/signer/ca_provider.go`: "expected 1 certificate"), and a
//! controller that cannot start stops kube-controller-manager. So from trust-in until
//! trust-out (or an abort) the signer reads a file of its own beside the CA file,
//! `ca.signer.crt`, holding the certificate of the key that signs; the manifest's flag names
//! it, written last in the stage's transaction (after the file it names); trust-out and an
//! abort name `ca.crt` again and remove the file. Every kubeconfig's
//! `certificate-authority-data` holds what the CA file holds (a renewal in the middle of the
//! rotation embeds the CA file's certificates too, [`crate::node::carrier`]).

use std::path::Path;

use super::files::{self, CaFiles, Target};
use crate::ca::plan::on_node;
use crate::node::Node;
use crate::node::catalog::{self, Kind};
use crate::node::files::{KCM_MANIFEST, signer_cert};
use crate::node::kubeconfig::{Kubeconfig, Source};
use crate::node::manifests::{Component, PodInfo};
use crate::pki::Cert;
use crate::txn::Change;

const FLAG: &str = "cluster-signing-cert-file";

/// kube-controller-manager's signer flag where it names the CA file (or its signer file).
pub(super) struct SignerFlag {
    /// The manifest the kubelet runs, relative to the root.
    pub(super) manifest: String,
    /// The flag's value now, and the values naming the CA file and the signer file.
    pub(super) now: String,
    pub(super) ca_value: String,
    pub(super) signer_value: String,
    /// The signer file on the node.
    pub(super) signer_rel: String,
    /// Bottlerocket: the static pod whose manifest setting the API renders to `manifest`
    /// ([`super::bottlerocket`]); `None`: kubeadm's manifest, a file of the transaction.
    pub(super) setting: Option<String>,
}

pub(super) fn signer_flag(
    node: &Node,
    pods: &[(String, PodInfo)],
    files: &CaFiles,
) -> Result<Option<SignerFlag>, String> {
    let signer_rel = signer_cert(&files.cert);
    for (name, pod) in pods {
        if pod.component() != Some(Component::KubeControllerManager) {
            continue;
        }
        let Some(value) = pod.flag(FLAG) else {
            continue;
        };
        let host = on_node(pod, value);
        let (ca_value, signer_value) = if host == files.cert {
            (value.to_string(), signer_cert(value))
        } else if host == signer_rel {
            let ca = value
                .strip_suffix(".signer.crt")
                .map(|s| format!("{s}.crt"))
                .unwrap_or_else(|| value.to_string());
            (ca, value.to_string())
        } else {
            continue;
        };
        if super::bottlerocket::is_bottlerocket(node) {
            return Ok(Some(SignerFlag {
                manifest: format!("{}/{name}", catalog::paths::BOTTLEROCKET_STATIC_PODS),
                now: value.to_string(),
                ca_value,
                signer_value,
                signer_rel,
                setting: Some(name.clone()),
            }));
        }
        let manifest = format!("{}/{name}", catalog::paths::KUBEADM_MANIFESTS);
        if manifest != KCM_MANIFEST || !node.root().join(&manifest).is_file() {
            return Err(format!(
                "kube-controller-manager signs with '{}', and its manifest is not \
                 '{KCM_MANIFEST}': certrotor moves the signer of the cluster CA in kubeadm's \
                 manifest only",
                files.cert
            ));
        }
        return Ok(Some(SignerFlag {
            manifest,
            now: value.to_string(),
            ca_value,
            signer_value,
            signer_rel,
            setting: None,
        }));
    }
    Ok(None)
}

/// How many times the manifest names `--flag=value` (the value whole, not a prefix).
fn count(text: &str, value: &str) -> usize {
    let flag = format!("--{FLAG}={value}");
    text.match_indices(&flag)
        .filter(|(i, _)| {
            let end = i + flag.len();
            text[end..]
                .chars()
                .next()
                .is_none_or(|c| c.is_whitespace() || c == '"' || c == '\'')
        })
        .count()
}

/// Whether the manifest names `value` as the signer's file, once.
pub(super) fn names(text: &str, value: &str) -> bool {
    count(text, value) == 1
}

/// The manifest with the signer flag's value `from` made `to`: exactly one `--flag=from`.
pub(super) fn edit_manifest(
    text: &str,
    manifest: &str,
    from: &str,
    to: &str,
) -> Result<String, String> {
    let old = format!("--{FLAG}={from}");
    let found = count(text, from);
    if found != 1 {
        return Err(format!(
            "'{manifest}' names '--{FLAG}={from}' {found} times, not once as kubeadm writes it: \
             certrotor cannot move kube-controller-manager's signer"
        ));
    }
    Ok(text.replacen(&old, &format!("--{FLAG}={to}"), 1))
}

/// Refuses before a rotation begins what this module cannot change.
pub(super) fn refuse(
    node: &Node,
    pods: &[(String, PodInfo)],
    files: &CaFiles,
) -> Result<(), String> {
    if let Some(f) = signer_flag(node, pods, files)? {
        let text = read_text(node.root(), &f.manifest)?;
        edit_manifest(&text, &f.manifest, &f.now, &f.signer_value)?;
    }
    for (rel, kc) in kubeconfigs(node)? {
        if !matches!(
            kc.credentials()
                .map_err(|e| format!("'{rel}': {e}"))?
                .certificate_authority,
            Some(Source::Embedded(_))
        ) {
            return Err(format!(
                "'{rel}' does not embed its certificate-authority-data: certrotor changes the CA \
                 data of kubeconfigs that embed it, as kubeadm writes them"
            ));
        }
    }
    Ok(())
}

fn read_text(root: &Path, rel: &str) -> Result<String, String> {
    let bytes = files::read(root, rel)?.ok_or_else(|| format!("'{rel}' is missing"))?;
    String::from_utf8(bytes.to_vec()).map_err(|_| format!("'{rel}' is not UTF-8 text"))
}

/// The node's kubeconfigs that exist, parsed.
fn kubeconfigs(node: &Node) -> Result<Vec<(String, Kubeconfig)>, String> {
    let mut out = Vec::new();
    for e in node.entries().iter().filter(|e| e.kind == Kind::Kubeconfig) {
        if out.iter().any(|(rel, _)| *rel == e.path) {
            continue;
        }
        let Some(bytes) = files::read(node.root(), &e.path)? else {
            continue;
        };
        let kc = Kubeconfig::parse(&bytes).map_err(|e2| format!("'{}': {e2}", e.path))?;
        out.push((e.path.clone(), kc));
    }
    Ok(out)
}

fn pem_of(bundle: &[Cert]) -> Result<String, String> {
    let mut pem = String::new();
    for c in bundle {
        pem.push_str(&c.to_pem().map_err(|e| e.to_string())?);
    }
    Ok(pem)
}

/// The changes that make the kubeconfigs' CA data `bundle` (what the CA file holds after the
/// stage) and the signer what `target` wants; the manifest last.
pub(super) fn changes(
    node: &Node,
    pods: &[(String, PodInfo)],
    files: &CaFiles,
    target: Target,
    bundle: &[Cert],
) -> Result<Vec<Change>, String> {
    let mut out = Vec::new();
    let pem = pem_of(bundle)?;
    let want = shas(bundle);
    for (rel, mut kc) in kubeconfigs(node)? {
        let held = embedded_ca(&kc).map_err(|e| format!("'{rel}': {e}"))?;
        // The same certificates in another order trust the same: left alone (the issue's
        // [new, old] would otherwise rewrite kubelet.conf, and the kubelet would have to be
        // restarted again for nothing).
        if held.is_some_and(|b| {
            Cert::all_from_pem(&b, crate::pki::MAX_BUNDLE_CERTS).is_ok_and(|c| shas(&c) == want)
        }) {
            continue;
        }
        kc.replace_ca_data(pem.as_bytes())
            .map_err(|e| format!("'{rel}': {e}"))?;
        let yaml = kc.to_yaml().map_err(|e| format!("'{rel}': {e}"))?;
        out.push(Change {
            rel,
            content: Some(yaml.into_bytes()),
            mode_if_new: 0o600,
        });
    }
    let Some(f) = signer_flag(node, pods, files)? else {
        return Ok(out);
    };
    if f.setting.is_some() {
        // Bottlerocket: the signer file outlives the stage ([`super::bottlerocket`]); while it
        // exists it holds the CA that signs.
        let signer = pem_of(&bundle[..1])?.into_bytes();
        if files::read(node.root(), &f.signer_rel)?.is_some_and(|b| *b != signer) {
            out.push(Change {
                rel: f.signer_rel.clone(),
                content: Some(signer),
                mode_if_new: 0o644,
            });
        }
        return Ok(out);
    }
    let moved = matches!(target, Target::TrustIn | Target::Issue);
    let signer = match moved {
        true => Some(pem_of(&bundle[..1])?.into_bytes()),
        false => None,
    };
    if files::read(node.root(), &f.signer_rel)?
        .as_deref()
        .map(|b| b.as_slice())
        != signer.as_deref()
    {
        out.push(Change {
            rel: f.signer_rel.clone(),
            content: signer,
            mode_if_new: 0o644,
        });
    }
    let want = if moved { &f.signer_value } else { &f.ca_value };
    if f.now != *want {
        let text = read_text(node.root(), &f.manifest)?;
        out.push(Change {
            content: Some(edit_manifest(&text, &f.manifest, &f.now, want)?.into_bytes()),
            rel: f.manifest,
            mode_if_new: 0o600,
        });
    }
    Ok(out)
}

/// The SHA-256 of each certificate, sorted: a bundle's trust, whatever its order.
pub(super) fn shas(certs: &[Cert]) -> Vec<String> {
    let mut out: Vec<String> = certs.iter().map(Cert::sha256_hex).collect();
    out.sort();
    out
}

fn embedded_ca(kc: &Kubeconfig) -> Result<Option<Vec<u8>>, String> {
    Ok(
        match &kc
            .credentials()
            .map_err(|e| e.to_string())?
            .certificate_authority
        {
            Some(Source::Embedded(pem)) => Some(pem.clone()),
            _ => None,
        },
    )
}

/// A kubelet of this node that started before its kubeconfig last changed: it still trusts
/// the CA data it read at start (client-go reads a kubeconfig's CA once). certrotor cannot
/// restart a kubelet on a kubeadm node (a systemd unit); it names the command.
fn kubelet_stale(node: &Node, now: i64) -> Option<String> {
    let rel = node
        .entries()
        .iter()
        .find(|e| e.kind == Kind::Kubeconfig && e.name.split('@').next() == Some("kubelet.conf"))?
        .path
        .clone();
    let pid = stale_kubelet(
        node,
        &rel,
        &|argv| kubeconfig_arg(argv).map(str::to_string),
        now,
    )?;
    Some(format!(
        "the kubelet (PID {pid}) started before '{rel}' changed and still trusts the CA data it \
         read then: restart it ('systemctl restart kubelet'), then run the same command again"
    ))
}

/// A kubelet of this node that started before the file `rel` last changed: a process whose
/// program is named `kubelet` and for which `path_in` (of its command line) names, seen from
/// its own root (`/proc/PID/root`), this node's file (the same device and inode: a kubelet of
/// another root is not this node's); where none can be seen (another PID namespace, a lab
/// node), there is none.
pub(super) fn stale_kubelet(
    node: &Node,
    rel: &str,
    path_in: &dyn Fn(&[String]) -> Option<String>,
    now: i64,
) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let ours = std::fs::metadata(node.root().join(rel)).ok()?;
    let changed = ours.mtime();
    let ticks = crate::sys::procfs::now_ticks()?;
    let stale = crate::sys::procfs::Proc::all().into_iter().find(|p| {
        let Some(argv) = p.cmdline() else {
            return false;
        };
        let kubelet = argv
            .first()
            .is_some_and(|a| a.rsplit('/').next() == Some("kubelet"));
        let reads = path_in(&argv)
            .filter(|path| path.starts_with('/'))
            .and_then(|path| std::fs::metadata(format!("/proc/{}/root{path}", p.pid)).ok())
            .is_some_and(|m| (m.dev(), m.ino()) == (ours.dev(), ours.ino()));
        let age = (crate::sys::procfs::ticks_ms(p.start_time, ticks) / 1000) as i64;
        kubelet && reads && now - age < changed
    })?;
    Some(stale.pid)
}

/// The value of `--kubeconfig` on a command line (`--kubeconfig=PATH` or `--kubeconfig PATH`).
fn kubeconfig_arg(argv: &[String]) -> Option<&str> {
    argv.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--kubeconfig=").or_else(|| {
            (a == "--kubeconfig")
                .then(|| argv.get(i + 1).map(String::as_str))
                .flatten()
        })
    })
}

/// Checks the files after a stage: every kubeconfig trusts the certificates of `bundle` (in
/// any order: a renewal embeds the CA file's), the signer is what `target` wants, and a kubelet
/// running here has read its kubeconfig since it changed.
pub(super) fn check(
    node: &Node,
    pods: &[(String, PodInfo)],
    files: &CaFiles,
    (target, bundle): (Target, &[Cert]),
    now: i64,
) -> Result<(), String> {
    if let Some(stale) = kubelet_stale(node, now) {
        return Err(stale);
    }
    if super::bottlerocket::is_bottlerocket(node) {
        super::bottlerocket::check(node, bundle, now)?;
    }
    let want = shas(bundle);
    for (rel, kc) in kubeconfigs(node)? {
        let held = embedded_ca(&kc).map_err(|e| format!("'{rel}': {e}"))?;
        let held = held
            .map(|b| Cert::all_from_pem(&b, crate::pki::MAX_BUNDLE_CERTS))
            .transpose()
            .map_err(|e| format!("'{rel}': {e}"))?
            .unwrap_or_default();
        if shas(&held) != want {
            return Err(format!(
                "'{rel}' embeds {} CA certificate(s), not the {} of '{}'",
                held.len(),
                want.len(),
                files.cert
            ));
        }
    }
    let Some(f) = signer_flag(node, pods, files)? else {
        return Ok(());
    };
    let moved = matches!(target, Target::TrustIn | Target::Issue);
    let text = read_text(node.root(), &f.manifest)?;
    let want_value = if moved { &f.signer_value } else { &f.ca_value };
    if !text.contains(&format!("--{FLAG}={want_value}")) {
        return Err(format!(
            "'{}' does not name '--{FLAG}={want_value}'",
            f.manifest
        ));
    }
    let signer = files::read(node.root(), &f.signer_rel)?;
    match (moved, signer) {
        (true, Some(b))
            if Cert::all_from_pem(&b, 2)
                .is_ok_and(|c| c.len() == 1 && c[0].der == bundle[0].der) =>
        {
            Ok(())
        }
        (true, _) => Err(format!(
            "'{}' does not hold the signing CA alone",
            f.signer_rel
        )),
        (false, None) => Ok(()),
        (false, Some(_)) => Err(format!("'{}' is still there", f.signer_rel)),
    }
}

#[cfg(test)]
mod tests {
    use super::edit_manifest;

    const KCM: &str = "spec:\n  containers:\n  - command:\n    - kube-controller-manager\n    \
                       - --cluster-signing-cert-file=/etc/kubernetes/pki/ca.crt\n    \
                       - --cluster-signing-key-file=/etc/kubernetes/pki/ca.key\n    \
                       - --root-ca-file=/etc/kubernetes/pki/ca.crt\n";

    #[test]
    fn the_signer_flag_alone_moves_and_moves_back() {
        let (ca, signer) = (
            "/etc/kubernetes/pki/ca.crt",
            "/etc/kubernetes/pki/ca.signer.crt",
        );
        let moved = edit_manifest(KCM, "m", ca, signer).unwrap();
        assert!(moved.contains(&format!("--cluster-signing-cert-file={signer}\n")));
        // The other flags naming ca.crt stay.
        assert!(moved.contains("--root-ca-file=/etc/kubernetes/pki/ca.crt\n"));
        assert_eq!(edit_manifest(&moved, "m", signer, ca).unwrap(), KCM);
    }

    #[test]
    fn a_flag_named_twice_or_not_at_all_or_as_a_prefix_is_refused() {
        let ca = "/etc/kubernetes/pki/ca.crt";
        let twice = format!("{KCM}    - --cluster-signing-cert-file={ca}\n");
        let e = edit_manifest(&twice, "m", ca, "x").unwrap_err();
        assert!(e.contains("2 times"), "{e}");
        let e = edit_manifest(KCM, "m", "/other/ca.crt", "x").unwrap_err();
        assert!(e.contains("0 times"), "{e}");
        // `ca.crt` is not `ca.crt.old`.
        let longer = KCM.replace(
            "ca.crt\n    - --cluster-signing-key",
            "ca.crt.old\n    - --cluster-signing-key",
        );
        let e = edit_manifest(&longer, "m", ca, "x").unwrap_err();
        assert!(e.contains("0 times"), "{e}");
    }
}
