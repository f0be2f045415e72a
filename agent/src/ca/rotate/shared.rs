//! A CA rotation across the nodes of a cluster, through etcd: one new CA for all, and
//! no stage on any node before every node has finished the previous one.
//!
//! Keys (under `certrotor/v1/`, plain etcd keys: the new CA's key leaves the nodes' PKI folders
//! only for the cluster's etcd, as the issue asks):
//! - `ca/<ca>/<old SHA-256>`: the rotation from that CA: the new CA's certificate and key
//!   (PEM), who began it. Created once (compare-and-swap on its creation): the first node to
//!   begin mints the new CA, every other node takes it from here.
//! - `ca/<ca>/<old SHA-256>/nodes/<member>`: the stage each node reached (`trusted`, `issued`,
//!   `done`, `aborted`), written after the node's files are checked; `abort` once an aborting
//!   node's leaves are issued by the old CA again.
//!
//! Once every node has finished trust-out, the last to finish removes the new CA's key from the
//! record (compare-and-swap; the certificate stays): the key then lives in the nodes' PKI
//! folders only. A rotation aborted on every member is removed when a node begins the next one from the same
//! CA (compare-and-swap on the record: two nodes beginning at once remove it once), so that the
//! next one mints a CA of its own.
//!
//! The nodes are the etcd members (stacked: every control plane is one); for the etcd CA also
//! the control planes registered in etcd that are no member (an external etcd's: they trust
//! the CA, hold no key of it, take the new CA's certificate from the record and the
//! apiserver-etcd-client pair the etcd nodes publish). Restarts still take turns under the
//! cluster lock and its health gates: each stage ends with a pass in cluster mode
//! ([`crate::pass::run::run_once`]).

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::ca::consumers::CaName;
use crate::ca::rotate::files::CaPair;
use crate::ca::rotation::Stage;
use crate::cluster::Session;
use crate::pki::Cert;

/// Where the rotation of `ca` from the CA of SHA-256 `old` is kept.
fn key(ca: CaName, old: &str) -> String {
    format!("{}ca/{}/{old}", crate::cluster::PREFIX, ca.name())
}

fn node_key(ca: CaName, old: &str, member: &str) -> String {
    format!("{}/nodes/{member}", key(ca, old))
}

/// The rotation as etcd holds it.
#[derive(Serialize, Deserialize)]
struct Record {
    version: u32,
    old_sha256: String,
    new_sha256: String,
    cert: String,
    /// The new CA's key (PEM): scrubbed when the record drops.
    key: String,
    started_by: String,
}

impl Drop for Record {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.key);
    }
}

/// A node's stage as etcd holds it.
#[derive(Serialize, Deserialize)]
struct Reached {
    stage: Stage,
    at: String,
}

/// The connected cluster and this node's member name.
pub struct Shared {
    pub session: Session,
    /// The nodes of the rotation: every etcd member's name (this node's included), then
    /// [`Shared::elsewhere`].
    pub members: Vec<String>,
    /// Etcd CA: the control planes registered in etcd that are no member (an external etcd's),
    /// by their registration name (`kube-apiserver@IP:PORT`).
    pub elsewhere: Vec<String>,
}

impl Shared {
    /// The name this node is known by (its etcd member name).
    pub fn me(&self) -> &str {
        &self.session.node.name
    }

    /// The new CA of the rotation from `old_sha256`: the one in etcd, or `mint()`'s, published
    /// first. Refused when etcd holds a rotation from another CA.
    pub fn new_ca(
        &self,
        ca: CaName,
        old_sha256: &str,
        mint: impl FnOnce() -> Result<CaPair, String>,
    ) -> Result<CaPair, String> {
        let client = &self.session.client;
        let e = |e: crate::cluster::ClusterError| format!("etcd: {e}");
        let existing = match client.get(&key(ca, old_sha256)).map_err(e)? {
            Some(bytes) => bytes,
            None => {
                let pair = mint()?;
                let record = Record {
                    version: 1,
                    old_sha256: old_sha256.to_string(),
                    new_sha256: pair.cert.sha256_hex(),
                    cert: pair.cert.to_pem().map_err(|e| e.to_string())?,
                    key: String::from_utf8_lossy(&pair.key_pem).into_owned(),
                    started_by: self.me().to_string(),
                };
                let value = Zeroizing::new(serde_json::to_vec(&record).map_err(|e| e.to_string())?);
                match client.create(&key(ca, old_sha256), &value, 0).map_err(e)? {
                    None => {
                        log::info!("rotation of {}: published the new CA in etcd", ca.name());
                        return Ok(pair);
                    }
                    // Another node published first: its CA is the one.
                    Some(theirs) => theirs,
                }
            }
        };
        let existing = Zeroizing::new(existing);
        let record: Record = serde_json::from_slice(&existing).map_err(|e| {
            format!(
                "etcd key {}: not a rotation record ({e})",
                key(ca, old_sha256)
            )
        })?;
        if record.key.is_empty() {
            return Err(format!(
                "etcd key {}: the rotation from this CA finished on every node and its key was \
                 removed; this node's files are not the rotation's: restore them from a backup \
                 ('certrotor backups') or begin from the CA the cluster has now",
                key(ca, old_sha256)
            ));
        }
        let cert = Cert::from_pem(record.cert.as_bytes()).map_err(|e| e.to_string())?;
        let key_pem = Zeroizing::new(record.key.as_bytes().to_vec());
        let ca_key = crate::pki::PrivateKey::from_pem(&key_pem).map_err(|e| e.to_string())?;
        if !ca_key.matches(&cert) || cert.sha256_hex() != record.new_sha256 {
            return Err(format!(
                "etcd key {}: its certificate and key do not match (the record was changed by \
                 another tool); nothing was changed here: if no node has begun, delete the key \
                 with etcdctl and run this command again, else 'certrotor ca abort --ca {}' on \
                 every node",
                key(ca, old_sha256),
                ca.name()
            ));
        }
        Ok(CaPair { cert, key_pem })
    }

    /// Waits (at most `bound`, looking every `poll`) until a node has published the rotation
    /// from `old` (its new CA); `false` when none has.
    pub fn wait_for_record(
        &self,
        ca: CaName,
        old: &str,
        (bound, poll): (std::time::Duration, std::time::Duration),
    ) -> Result<bool, String> {
        let deadline = std::time::Instant::now() + bound;
        loop {
            let found = self
                .session
                .client
                .get(&key(ca, old))
                .map_err(|e| format!("etcd: {e}"))?;
            if found.is_some() {
                return Ok(true);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(poll);
        }
    }

    /// Before a rotation from `old` begins on this node: a previous one aborted on every member
    /// that recorded a stage is removed; one aborted on some of them only is refused (the others
    /// must abort first).
    pub fn begin(&self, ca: CaName, old: &str) -> Result<(), String> {
        let client = &self.session.client;
        let e = |e: crate::cluster::ClusterError| format!("etcd: {e}");
        for _ in 0..3 {
            let Some((_, revision)) = client.get_versioned(&key(ca, old)).map_err(e)? else {
                return Ok(());
            };
            // The record and the nodes' stages in one read (one revision): a node beginning
            // at the same time may remove them.
            let kvs = client.get_prefix(&key(ca, old)).map_err(e)?;
            if !kvs.iter().any(|(k, _)| *k == key(ca, old)) {
                return Ok(());
            }
            let stage_of = |m: &str| {
                kvs.iter()
                    .find(|(k, _)| *k == node_key(ca, old, m))
                    .and_then(|(_, v)| serde_json::from_slice::<Reached>(v).ok())
                    .map(|r| r.stage)
            };
            let (aborting, not_done): (Vec<&String>, Vec<&String>) = (
                self.members
                    .iter()
                    .filter(|m| matches!(stage_of(m), Some(Stage::Abort | Stage::Aborted)))
                    .collect(),
                // A member with no stage never trusted the new CA: nothing to abort there.
                self.members
                    .iter()
                    .filter(|m| stage_of(m).is_some_and(|s| s != Stage::Aborted))
                    .collect(),
            );
            if aborting.is_empty() {
                return Ok(());
            }
            if !not_done.is_empty() {
                let names = |v: Vec<&String>| v.into_iter().cloned().collect::<Vec<_>>().join(", ");
                return Err(format!(
                    "the last rotation of {} was aborted on {} but is not aborted on {}: run \
                     'certrotor ca abort --ca {}' there first",
                    ca.name(),
                    names(aborting),
                    names(not_done),
                    ca.name()
                ));
            }
            if client
                .delete_prefix_if(&key(ca, old), revision, &key(ca, old))
                .map_err(e)?
            {
                log::info!(
                    "rotation of {}: the rotation aborted on every member was removed from etcd",
                    ca.name()
                );
                return Ok(());
            }
        }
        Err(format!(
            "the rotation of {} in etcd kept changing while this node began: run the same \
             command again",
            ca.name()
        ))
    }

    /// Records that this node reached `stage`.
    pub fn reached(&self, ca: CaName, old: &str, stage: Stage, now: i64) -> Result<(), String> {
        let value = serde_json::to_vec(&Reached {
            stage,
            at: crate::sys::clock::rfc3339(now),
        })
        .map_err(|e| e.to_string())?;
        self.session
            .client
            .put(&node_key(ca, old, self.me()), &value, 0)
            .map_err(|e| format!("etcd: {e}"))
    }

    /// Once every node has finished the rotation: removes the new CA's key from its record
    /// (compare-and-swap; the certificate stays). `Ok(true)` when this call removed it.
    pub fn forget_key(&self, ca: CaName, old: &str) -> Result<bool, String> {
        if !self.behind(ca, old, Stage::Done)?.is_empty() {
            return Ok(false);
        }
        let client = &self.session.client;
        let e = |e: crate::cluster::ClusterError| format!("etcd: {e}");
        let Some((bytes, revision)) = client.get_versioned(&key(ca, old)).map_err(e)? else {
            return Ok(false);
        };
        let bytes = Zeroizing::new(bytes);
        let mut record: Record = serde_json::from_slice(&bytes)
            .map_err(|e| format!("etcd key {}: not a rotation record ({e})", key(ca, old)))?;
        if record.key.is_empty() {
            return Ok(false);
        }
        zeroize::Zeroize::zeroize(&mut record.key);
        let value = serde_json::to_vec(&record).map_err(|e| e.to_string())?;
        client.put_if(&key(ca, old), &value, revision).map_err(e)
    }

    /// The members whose recorded stage does not satisfy `ok` (no record: `None`).
    fn members_where(
        &self,
        ca: CaName,
        old: &str,
        ok: impl Fn(Option<Stage>) -> bool,
    ) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for m in &self.members {
            let got = self
                .session
                .client
                .get(&node_key(ca, old, m))
                .map_err(|e| format!("etcd: {e}"))?;
            let at = got.and_then(|b| serde_json::from_slice::<Reached>(&b).ok());
            if !ok(at.map(|r| r.stage)) {
                out.push(m.clone());
            }
        }
        Ok(out)
    }

    /// The members that have not reached `stage` (or a later stage of a rotation that goes on;
    /// an aborted node never counts).
    pub fn behind(&self, ca: CaName, old: &str, stage: Stage) -> Result<Vec<String>, String> {
        self.members_where(ca, old, |at| {
            at.is_some_and(|s| !matches!(s, Stage::Abort | Stage::Aborted) && s >= stage)
        })
    }

    /// The members that recorded a stage of this rotation other than `abort` or `aborted`.
    pub fn not_aborting(&self, ca: CaName, old: &str) -> Result<Vec<String>, String> {
        self.members_where(ca, old, |at| {
            at.is_none_or(|s| matches!(s, Stage::Abort | Stage::Aborted))
        })
    }

    /// The members that recorded a stage of this rotation other than `aborted` (their trust
    /// files may still hold the new CA).
    pub fn not_aborted(&self, ca: CaName, old: &str) -> Result<Vec<String>, String> {
        self.members_where(ca, old, |at| at.is_none_or(|s| s == Stage::Aborted))
    }

    /// The members that aborted this rotation.
    pub fn aborted(&self, ca: CaName, old: &str) -> Result<Vec<String>, String> {
        self.members_where(ca, old, |at| {
            !matches!(at, Some(Stage::Abort | Stage::Aborted))
        })
    }
}

/// The nodes of a rotation of `ca`: the etcd members, and (the etcd CA) the control planes
/// registered in etcd that are no member (an external etcd's; a registration `now`-fresh as
/// [`crate::cluster::registered_apiservers`] keeps it).
pub(super) fn participants(
    client: &crate::cluster::Client,
    ca: CaName,
    now: i64,
) -> Result<(Vec<String>, Vec<String>), crate::cluster::ClusterError> {
    let members: Vec<String> = client.members()?.into_iter().map(|m| m.name).collect();
    let mut elsewhere = Vec::new();
    if ca == CaName::EtcdCa {
        for cp in crate::cluster::registered_apiservers(client, now)? {
            if !members.contains(&cp) && !elsewhere.contains(&cp) {
                elsewhere.push(cp);
            }
        }
    }
    Ok((members, elsewhere))
}

/// One etcd member's stage of a rotation, as etcd holds it (`status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberStage {
    pub member: String,
    /// `None`: the member has recorded no stage of this rotation.
    pub stage: Option<&'static str>,
    pub at: Option<String>,
}

/// Every node's recorded stage of the rotation of `ca` from the CA `old`, in one read: the etcd
/// members, and for the etcd CA the control planes registered elsewhere (`now`: how fresh a
/// registration must be, as [`crate::cluster::registered_apiservers`]).
pub fn member_stages(
    client: &crate::cluster::Client,
    ca: CaName,
    old: &str,
    now: i64,
) -> Result<Vec<MemberStage>, String> {
    let e = |e: crate::cluster::ClusterError| format!("etcd: {e}");
    let (mut names, elsewhere) = participants(client, ca, now).map_err(e)?;
    names.extend(elsewhere);
    let kvs = client.get_prefix(&key(ca, old)).map_err(e)?;
    Ok(names
        .into_iter()
        .map(|name| {
            let reached = kvs
                .iter()
                .find(|(k, _)| *k == node_key(ca, old, &name))
                .and_then(|(_, v)| serde_json::from_slice::<Reached>(v).ok());
            MemberStage {
                stage: reached.as_ref().map(|r| r.stage.name()),
                at: reached.map(|r| r.at),
                member: name,
            }
        })
        .collect())
}
