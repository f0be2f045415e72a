//! `ca plan`: what rotating one CA touches on this node, read only. The three stages of a
//! rotation with overlapping trust (`field-2026-11.md` §4): **trust-in** (every consumer that
//! verifies certificates of the CA trusts the old one and the new one), **issue** (the new CA
//! signs, every leaf of the CA is issued again) and **trust-out** (the old CA leaves every
//! bundle); for each, what reloads by itself and what must be restarted.
//!
//! What each consumer does with a changed trust file is read from the source of the Kubernetes
//! release the tests run (v1.20.2) and etcd's, and named in [`TrustFlag::why`]: kube-apiserver
//! and kube-controller-manager's delegated authentication reload their client CA bundles
//! (`dynamiccertificates.DynamicFileCAContent`), the kubelet its client CA
//! (`cmd/kubelet/app/auth.go`), kube-controller-manager's CSR signer its pair but never a
//! bundle (`pkg/controller/certificates/signer/ca_provider.go`: "expected 1 certificate");
//! kube-controller-manager reads `--root-ca-file` once at start, kube-apiserver its
//! `--etcd-cafile` once (`storagebackend/factory/etcd3.go`), etcd its CA pools once
//! (etcd-io/etcd#11555); a kubeconfig is read when its program starts.

use std::collections::BTreeSet;

use serde::Serialize;

use rustls::pki_types::pem::PemObject;

use crate::ca::consumers::CaName;
use crate::node::Node;
use crate::node::catalog::Kind;
use crate::node::inventory::{self, Record, Status};
use crate::node::kubeconfig::{Kubeconfig, Source};
use crate::node::manifests::{Component, PodInfo};
use crate::pki::{Cert, MAX_BUNDLE_CERTS, MAX_PEM_FILE_BYTES};
use crate::restart::reload::{self, Action, ComponentVersion, Context, RestartMode};
use crate::sys::fsutil;
use crate::sys::message_error::message_error;

/// The version of the plan's JSON.
pub const PLAN_VERSION: u32 = 1;

/// The kubelet's client CA file Bottlerocket renders from `settings.kubernetes.cluster-certificate`.
const BOTTLEROCKET_KUBELET_CA: &str = "etc/kubernetes/pki/ca.crt";

/// The CA as found on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CaCert {
    pub name: String,
    pub path: String,
    pub subject: Option<String>,
    pub not_after: Option<String>,
    pub residual_seconds: Option<i64>,
    /// Its public key (`RSA-2048`, `ECDSA-P256`): the new CA's, too.
    pub public_key: Option<String>,
    /// Its private key is on this node: the new CA can be made and used to sign here.
    pub signer_here: bool,
}

/// One place that trusts the CA: a static pod's flag, a kubeconfig, the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Trust {
    /// Who reads it: a static pod, `kubelet`, or `people and tools`.
    pub consumer: String,
    /// The flag, `certificate-authority-data`, or the Bottlerocket setting.
    pub source: String,
    /// The file on the node, relative to the root (none for a setting).
    pub file: Option<String>,
    /// The file holds the CA's certificate now.
    pub holds_ca: bool,
    /// Its consumer picks a change up without a restart.
    pub reloads: bool,
    /// The signer's own certificate (one certificate, never a bundle).
    pub signer: bool,
    pub why: String,
}

/// A certificate the issue stage issues again from the new CA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Leaf {
    pub name: String,
    pub path: String,
    /// certrotor renews it today (else another tool's: the kubelet's own serving pair, say).
    pub renewable: bool,
}

/// One stage of the rotation on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stage {
    /// `trust-in`, `issue` or `trust-out`.
    pub stage: &'static str,
    pub changes: String,
    /// Consumers that pick the change up by themselves.
    pub reloads: Vec<String>,
    /// Consumers restarted, one at a time, in this order.
    pub restarts: Vec<String>,
}

/// What rotating one CA touches on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CaPlan {
    pub version: u32,
    pub ca: CaName,
    pub root: String,
    pub certificates: Vec<CaCert>,
    pub trust: Vec<Trust>,
    pub leaves: Vec<Leaf>,
    pub stages: Vec<Stage>,
    pub outside: Vec<String>,
    pub notes: Vec<String>,
}

message_error!(
    /// Why there is no plan.
    #[derive(Debug, Clone, PartialEq, Eq)]
    PlanError
);

/// The plan for `ca` on `node`, whose static pods are `pods` (as the platform lists them) and
/// whose components run `versions`; `now`: Unix seconds.
pub fn plan(
    node: &Node,
    ca: CaName,
    pods: &[(String, PodInfo)],
    versions: &[ComponentVersion],
    now: i64,
) -> Result<CaPlan, PlanError> {
    let inv = inventory::take(node, now, 0);
    let cas: Vec<&Record> = inv
        .certificates
        .iter()
        .filter(|r| r.kind == Kind::Ca && r.status != Status::Missing)
        .filter(|r| ca.catalog_names().contains(&base(&r.name)))
        .collect();
    if cas.is_empty() {
        return Err(not_here(node, ca, &inv.certificates));
    }
    let fingerprints = ca_fingerprints(node, &cas);
    let mut trust = flag_trust(node, ca, pods, &fingerprints);
    if ca == CaName::Ca {
        trust.extend(kubeconfig_trust(
            node,
            &inv.certificates,
            pods,
            &fingerprints,
        ));
        trust.extend(kubelet_trust(node, &fingerprints));
    }
    let ca_names: BTreeSet<&str> = cas.iter().map(|r| r.name.as_str()).collect();
    let leaves: Vec<Leaf> = inv
        .certificates
        .iter()
        .filter(|r| r.kind != Kind::Ca && r.status != Status::Missing)
        .filter(|r| r.ca.as_deref().is_some_and(|c| ca_names.contains(c)))
        // A copy of the CA itself (kube-controller-manager's signer file in a rotation).
        .filter(|r| {
            r.kind == Kind::Kubeconfig
                || !read(node, &r.path)
                    .is_some_and(|b| certs_in(&b).iter().any(|c| fingerprints.contains(c)))
        })
        .map(|r| Leaf {
            name: r.name.clone(),
            path: r.path.clone(),
            renewable: r.renewable,
        })
        .collect();
    // The old leaves stay trusted until trust-out: held as a renewal holds them.
    let held: Vec<(String, i64)> = inv
        .certificates
        .iter()
        .filter(|r| leaves.iter().any(|l| l.name == r.name))
        .filter_map(|r| Some((r.name.clone(), r.not_after_unix?)))
        .collect();
    let ctx = Context {
        mode: RestartMode::Live,
        version: None,
        held: &held,
        now,
        margin: reload::DEFAULT_HELD_CERT_MARGIN,
    };
    let stages = stages(ca, &trust, &leaves, pods, versions, ctx, node);
    let certificates: Vec<CaCert> = cas.iter().map(|r| ca_cert(node, r)).collect();
    let signer_here = certificates.iter().any(|c| c.signer_here);
    Ok(CaPlan {
        version: PLAN_VERSION,
        ca,
        root: node.root().display().to_string(),
        certificates,
        notes: notes(ca, &trust, pods, signer_here),
        trust,
        leaves,
        stages,
        outside: ca.outside().iter().map(|s| s.to_string()).collect(),
    })
}

/// The refusal when `ca` is not on the node: the CAs that are.
fn not_here(node: &Node, ca: CaName, records: &[Record]) -> PlanError {
    let here: Vec<&str> = records
        .iter()
        .filter(|r| r.kind == Kind::Ca && r.status != Status::Missing)
        .map(|r| r.name.as_str())
        .collect();
    PlanError(format!(
        "no {} on this node under '{}' (the CAs here: {}); give --ca one of those, or --root the \
         node's root filesystem; 'certrotor check' lists what is here",
        ca.name(),
        node.root().display(),
        if here.is_empty() {
            "none".to_string()
        } else {
            here.join(", ")
        }
    ))
}

/// A catalog name without its `@layout` suffix.
fn base(name: &str) -> &str {
    name.split('@').next().unwrap_or(name)
}

fn ca_cert(node: &Node, r: &Record) -> CaCert {
    let key_here = r.key_path.as_deref().is_some_and(|k| {
        fsutil::resolve_in_root(node.root(), k)
            .ok()
            .flatten()
            .is_some()
    });
    CaCert {
        name: r.name.clone(),
        path: r.path.clone(),
        subject: r.subject.clone(),
        not_after: r.not_after.clone(),
        residual_seconds: r.residual_seconds,
        public_key: r.public_key.clone(),
        signer_here: key_here,
    }
}

/// The SHA-256 of each copy of the CA's certificate on the node.
fn ca_fingerprints(node: &Node, cas: &[&Record]) -> BTreeSet<String> {
    cas.iter()
        .filter_map(|r| read(node, &r.path))
        .flat_map(|b| certs_in(&b))
        .collect()
}

/// The SHA-256 of every certificate of a PEM text (at most [`MAX_BUNDLE_CERTS`]).
fn certs_in(pem: &[u8]) -> Vec<String> {
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .take(MAX_BUNDLE_CERTS)
        .filter_map(Result::ok)
        .filter_map(|der| Cert::from_der(der.as_ref()).ok())
        .map(|c| c.sha256_hex())
        .collect()
}

fn read(node: &Node, rel: &str) -> Option<Vec<u8>> {
    fsutil::read_in_root(node.root(), rel, MAX_PEM_FILE_BYTES)
        .ok()
        .flatten()
}

fn holds(node: &Node, rel: &str, fingerprints: &BTreeSet<String>) -> bool {
    read(node, rel).is_some_and(|b| certs_in(&b).iter().any(|c| fingerprints.contains(c)))
}

/// A path as the container sees it, on the node (relative to the root): through the pod's
/// hostPath mount with the longest matching mount path.
pub(crate) fn on_node(pod: &PodInfo, path: &str) -> String {
    let best = pod
        .mounts
        .iter()
        .filter_map(|(inside, host)| {
            let inside = inside.trim_end_matches('/');
            let rest = path.strip_prefix(inside)?;
            (rest.is_empty() || rest.starts_with('/')).then_some((inside.len(), host, rest))
        })
        .max_by_key(|(len, _, _)| *len);
    let full = match best {
        Some((_, host, rest)) => format!("{}{rest}", host.trim_end_matches('/')),
        None => path.to_string(),
    };
    full.trim_start_matches('/').to_string()
}

/// The trust files the static pods' flags name.
fn flag_trust(
    node: &Node,
    ca: CaName,
    pods: &[(String, PodInfo)],
    fingerprints: &BTreeSet<String>,
) -> Vec<Trust> {
    let mut out = Vec::new();
    for f in ca.trust_flags() {
        for (name, pod) in pods
            .iter()
            .filter(|(_, p)| p.component() == Some(f.component))
        {
            let Some(path) = pod.flag(f.flag).filter(|p| !p.is_empty()) else {
                continue;
            };
            let file = on_node(pod, path);
            out.push(Trust {
                consumer: consumer_name(name, pod),
                source: format!("--{}", f.flag),
                holds_ca: holds(node, &file, fingerprints),
                file: Some(file),
                reloads: f.reloads,
                signer: f.signer,
                why: f.why.to_string(),
            });
        }
    }
    out
}

/// The kubeconfigs of the node: their `certificate-authority-data` holds the cluster CA; their
/// programs read them at start.
fn kubeconfig_trust(
    node: &Node,
    records: &[Record],
    pods: &[(String, PodInfo)],
    fingerprints: &BTreeSet<String>,
) -> Vec<Trust> {
    let mut out = Vec::new();
    for r in records
        .iter()
        .filter(|r| r.kind == Kind::Kubeconfig && r.status != Status::Missing)
    {
        let ca_pem = read(node, &r.path).and_then(|b| {
            let creds = Kubeconfig::parse(&b).ok()?.credentials().ok()?;
            match creds.certificate_authority.as_ref()? {
                Source::Embedded(pem) => Some(pem.clone()),
                Source::File(p) => {
                    read(node, &crate::node::kubeconfig::file_under_root(&r.path, p))
                }
            }
        });
        let holds_ca =
            ca_pem.is_some_and(|b| certs_in(&b).iter().any(|c| fingerprints.contains(c)));
        let mut readers: Vec<String> = match base(&r.name) {
            "kubelet.conf" => vec!["kubelet".into()],
            n => Component::reading(n)
                .and_then(|c| pod_of(pods, c))
                .into_iter()
                .collect(),
        };
        readers.extend(
            crate::node::manifests::other_consumers(
                node.root(),
                pods,
                std::slice::from_ref(&r.path),
            )
            .into_iter()
            .map(|c| c.pod),
        );
        if readers.is_empty() {
            readers.push("people and tools".into());
        }
        for consumer in readers {
            out.push(Trust {
                consumer,
                source: "certificate-authority-data".into(),
                file: Some(r.path.clone()),
                holds_ca,
                reloads: false,
                signer: false,
                why: "a kubeconfig is read when its program starts".into(),
            });
        }
    }
    out
}

/// The kubelet's client CA: on Bottlerocket a setting, elsewhere its configuration's
/// `clientCAFile`.
fn kubelet_trust(node: &Node, fingerprints: &BTreeSet<String>) -> Option<Trust> {
    if node.layouts().iter().any(|l| l.name == "bottlerocket") {
        return Some(Trust {
            consumer: "kubelet".into(),
            source: "settings.kubernetes.cluster-certificate".into(),
            holds_ca: holds(node, BOTTLEROCKET_KUBELET_CA, fingerprints),
            file: Some(BOTTLEROCKET_KUBELET_CA.into()),
            reloads: false,
            signer: false,
            why: "Bottlerocket renders the kubelet's client CA file from this setting, and a \
                  change to it restarts the kubelet (systemctl try-restart kubelet.service); on \
                  this node certrotor changes it through the API after trust-in and after \
                  trust-out; on a worker: apiclient set \
                  kubernetes.cluster-certificate=<base64 of the PEM bundle>"
                .into(),
        });
    }
    let config = read(node, "var/lib/kubelet/config.yaml")?;
    let text = std::str::from_utf8(&config).ok()?;
    crate::node::kubeconfig::check_yaml_shape(text).ok()?;
    let doc: serde_norway::Value = serde_norway::from_str(text).ok()?;
    let path = doc
        .get("authentication")?
        .get("x509")?
        .get("clientCAFile")?
        .as_str()?;
    let file = path.trim_start_matches('/').to_string();
    Some(Trust {
        consumer: "kubelet".into(),
        source: "clientCAFile".into(),
        holds_ca: holds(node, &file, fingerprints),
        file: Some(file),
        reloads: true,
        signer: false,
        why: "the kubelet reloads its client CA bundle (cmd/kubelet/app/auth.go: \
              DynamicFileCAContent)"
            .into(),
    })
}

/// Adds `name` to `list` once.
fn push_once(list: &mut Vec<String>, name: &str) {
    if !list.iter().any(|n| n == name) {
        list.push(name.to_string());
    }
}

/// The three stages and what each reloads and restarts on this node.
fn stages(
    ca: CaName,
    trust: &[Trust],
    leaves: &[Leaf],
    pods: &[(String, PodInfo)],
    versions: &[ComponentVersion],
    ctx: Context<'_>,
    node: &Node,
) -> Vec<Stage> {
    let (mut reloads, mut restarts) = (Vec::new(), Vec::new());
    for t in trust.iter().filter(|t| t.consumer != "people and tools") {
        if t.reloads {
            push_once(&mut reloads, &t.consumer);
        } else {
            push_once(&mut restarts, &t.consumer);
        }
    }
    reloads.retain(|r| !restarts.contains(r));
    let signer_shared = trust
        .iter()
        .any(|t| t.signer && trust.iter().any(|o| !o.signer && o.file == t.file));
    let kcm = pod_of(pods, Component::KubeControllerManager);
    if signer_shared && let Some(kcm) = &kcm {
        push_once(&mut restarts, kcm);
        reloads.retain(|r| r != kcm);
    }
    let trust_in = Stage {
        stage: "trust-in",
        changes: match (ca, signer_shared) {
            (CaName::Ca, true) => "every trust file and kubeconfig CA above holds [old, new]; \
                 kube-controller-manager's signer moves to a file of its own holding the old CA \
                 alone (it refuses a bundle)"
                .into(),
            _ => "every trust file above holds [old, new]".into(),
        },
        reloads: reloads.clone(),
        restarts: restarts.clone(),
    };
    let issue = issue_stage(ca, leaves, pods, versions, ctx, node);
    let trust_out = Stage {
        stage: "trust-out",
        changes: "every trust file above holds the new CA alone".into(),
        reloads,
        restarts,
    };
    vec![trust_in, issue, trust_out]
}

fn pod_of(pods: &[(String, PodInfo)], c: Component) -> Option<String> {
    pods.iter()
        .any(|(_, p)| p.component() == Some(c))
        .then(|| c.name().to_string())
}

/// How the plan names a static pod: its component, else its name on the platform.
fn consumer_name(key: &str, pod: &PodInfo) -> String {
    pod.component()
        .map_or_else(|| key.to_string(), |c| c.name().to_string())
}

/// The issue stage: the new CA signs, and every leaf is issued again; what reads the leaves
/// reloads or restarts as after a renewal ([`reload::decide`]).
fn issue_stage(
    ca: CaName,
    leaves: &[Leaf],
    pods: &[(String, PodInfo)],
    versions: &[ComponentVersion],
    ctx: Context<'_>,
    node: &Node,
) -> Stage {
    let names: Vec<String> = leaves.iter().map(|l| base(&l.name).to_string()).collect();
    let (mut reloads, mut restarts) = (Vec::new(), Vec::new());
    for c in Component::ALL {
        if !names.iter().any(|n| Component::reading(n) == Some(c)) {
            continue;
        }
        let Some(pod) = pod_of(pods, c) else {
            continue;
        };
        let version = versions.iter().find(|v| v.component == c);
        let decision = reload::decide(c, &names, &Context { version, ..ctx });
        match decision.action {
            Action::WaitLive => push_once(&mut reloads, &pod),
            Action::Restart { .. } => push_once(&mut restarts, &pod),
        }
    }
    let files: Vec<String> = leaves.iter().map(|l| l.path.clone()).collect();
    for c in crate::node::manifests::other_consumers(node.root(), pods, &files) {
        push_once(&mut restarts, &c.pod);
    }
    if ca == CaName::Ca && leaves.iter().any(|l| l.name.starts_with("kubelet")) {
        push_once(&mut restarts, "kubelet");
    }
    if ca == CaName::Ca
        && let Some(kcm) = pod_of(pods, Component::KubeControllerManager)
        && !restarts.contains(&kcm)
    {
        // The CSR signer reloads its pair: new kubelet certificates are signed by the new CA.
        push_once(&mut reloads, &kcm);
    }
    Stage {
        stage: "issue",
        changes: format!(
            "the new {} signs (its key written 0600 beside the old one's, the certificate file \
             holds [new, old]); {} issued again from it",
            ca.name(),
            match leaves.len() {
                1 => "the leaf is".to_string(),
                n => format!("the {n} leaves are"),
            }
        ),
        reloads,
        restarts,
    }
}

/// What the operator should know before starting.
fn notes(
    ca: CaName,
    trust: &[Trust],
    pods: &[(String, PodInfo)],
    signer_here: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    if pods.is_empty() {
        out.push(
            "no static pod was found (platform none, or no manifests): the consumers' flags were \
             not read; give --platform"
                .to_string(),
        );
    }
    for t in trust.iter().filter(|t| !t.holds_ca && t.file.is_some()) {
        out.push(format!(
            "{} {} '{}' does not hold this {} now: check it before rotating",
            t.consumer,
            t.source,
            t.file.as_deref().unwrap_or_default(),
            ca.name()
        ));
    }
    if !signer_here {
        out.push(format!(
            "the {} key is not on this node: the new CA is made on a node that has the key and \
             reaches this one through etcd, as the published etcd client pair does",
            ca.name()
        ));
    }
    let bottlerocket = trust
        .iter()
        .any(|t| t.source == "settings.kubernetes.cluster-certificate");
    if ca == CaName::Ca
        && !bottlerocket
        && trust.iter().any(|t| t.consumer == "kubelet" && !t.reloads)
    {
        out.push(
            "the kubelet reads kubelet.conf's CA once, at start, and certrotor cannot restart it \
             on a kubeadm node: after trust-in and after trust-out, restart it ('systemctl \
             restart kubelet'); the stage waits for a kubelet it can see to have done so"
                .to_string(),
        );
    }
    if ca == CaName::EtcdCa {
        out.push(
            "etcd members restart one at a time behind the quorum gate, twice (trust-in and \
             trust-out); no peer certificate of the new CA is issued before every member trusts \
             both"
                .to_string(),
        );
    }
    out
}

#[cfg(test)]
mod tests;
