//! Kubernetes Events on the Node after a pass that renewed, rolled back or failed, so that
//! `kubectl get events` (and `kubectl describe node`) shows what certrotor did.
//!
//! Posted as the kubelet posts node events: core/v1 `Event` in the `default` namespace (a Node
//! is not namespaced), `involvedObject` kind `Node`, name and uid the node name, `source.component`
//! `certrotor`, `firstTimestamp` = `lastTimestamp`, `count` 1, name `<node>.<hex nanoseconds>` as
//! client-go's recorder makes it. Reasons: `CertificatesRenewed` (Normal),
//! `CertificatesRolledBack` and `CertificateRenewalFailed` (Warning); for a CA rotation,
//! `CARotationStage` (Normal) and `CARotationFailed` (Warning).
//!
//! Only on a control-plane node (one with `admin.conf`), with the credentials of that
//! `admin.conf` (server URL, CA, client pair) over mutual TLS ([`crate::cluster::mtls_agent`]).
//! The node name is what kubeadm reads (`getNodeNameFromKubeletConfig`): the CN of kubelet.conf's
//! client certificate without `system:node:`; else the host name in lower case, the kubelet's
//! default. Best effort, bounded (2 s to connect, 5 s in all): a failure is a warning and never
//! changes the pass's result.

use std::path::Path;

use serde_json::{Value, json};

use crate::node::Node;
use crate::node::kubeconfig::{Kubeconfig, Source};
use crate::pass::record::LastPass;
use crate::pki::{Cert, MAX_PEM_FILE_BYTES};
use crate::sys::clock::Clock;
use crate::sys::fsutil;

/// The reason of a pass that renewed what was due.
pub const RENEWED: &str = "CertificatesRenewed";
/// The reason of a pass whose verification failed and that restored the backup.
pub const ROLLED_BACK: &str = "CertificatesRolledBack";
/// The reason of a pass that failed (nothing changed, or the rollback failed too).
pub const FAILED: &str = "CertificateRenewalFailed";
/// The reason of a CA rotation stage reached on this node (the `ca` stage).
pub const CA_STAGE: &str = "CARotationStage";
/// The reason of a CA rotation stage that failed on this node.
pub const CA_FAILED: &str = "CARotationFailed";

/// The longest message posted (the API server accepts more; a person reads this much).
const MAX_MESSAGE: usize = 1024;

/// An Event to post: reason, type (`Normal`/`Warning`) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub reason: &'static str,
    pub kind: &'static str,
    pub message: String,
}

/// The Event a pass calls for, if any: none for a pass with nothing due, or one that could not
/// start because another certrotor holds the lock.
pub fn for_pass(p: &LastPass) -> Option<Event> {
    let names = p.renewed.join(", ");
    let expiry = p
        .new_not_after
        .as_deref()
        .map(|t| format!("; new expiry {t}"))
        .unwrap_or_default();
    let (reason, kind, message) = match p.result.as_str() {
        "renewed" | "deferred" if !p.renewed.is_empty() => (
            RENEWED,
            "Normal",
            format!(
                "certrotor renewed {names}{expiry}{}",
                if p.owed.is_empty() {
                    if p.restarted.is_empty() {
                        String::new()
                    } else {
                        format!("; restarted {}", p.restarted.join(", "))
                    }
                } else {
                    format!("; restarts owed to the next pass: {}", p.owed.join(", "))
                }
            ),
        ),
        "rolled-back" => (
            ROLLED_BACK,
            "Warning",
            format!(
                "certrotor renewed {names} but verification failed ({}); backup {} restored, the \
                 previous certificates are served again",
                p.rollback_reason.as_deref().unwrap_or("unknown"),
                p.backup_id.as_deref().unwrap_or("?")
            ),
        ),
        "rollback-failed" | "failed" => (
            FAILED,
            "Warning",
            format!(
                "certrotor could not renew{}: {}",
                if names.is_empty() {
                    String::new()
                } else {
                    format!(" {names}")
                },
                p.error
                    .as_deref()
                    .or(p.rollback_reason.as_deref())
                    .unwrap_or("see the node's certrotor log")
            ),
        ),
        _ => return None,
    };
    Some(Event {
        reason,
        kind,
        message: bounded(message),
    })
}

fn bounded(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// The environment variable that turns Events off (`CERTROTOR_EVENTS=off`): for a node whose
/// admin.conf must not be used, and for the test suite, whose lab nodes name addresses that are
/// not theirs.
pub const ENV_OFF: &str = "CERTROTOR_EVENTS";

/// After a pass: posts its Event on a control-plane node, dated by `clock`; logs a warning when
/// that fails.
pub fn after_pass(local: &Node, pass: &LastPass, clock: &dyn Clock) {
    if let Some(event) = for_pass(pass) {
        post_event(local, &event, clock);
    }
}

/// Posts `event` on a control-plane node, dated by `clock`; logs a warning when that fails
/// (never an error: what certrotor did stands).
pub fn post_event(local: &Node, event: &Event, clock: &dyn Clock) {
    if std::env::var(ENV_OFF).is_ok_and(|v| v == "off") {
        log::debug!("{ENV_OFF}=off: no Kubernetes Event {}", event.reason);
        return;
    }
    let Some(admin) = admin_conf(local) else {
        log::debug!("no admin.conf under the root: not a control plane, no Kubernetes Event");
        return;
    };
    match post(local, &admin, event, clock.now()) {
        Ok(node) => log::info!("posted Kubernetes Event {} on node {node}", event.reason),
        Err(e) => log::warn!(
            "could not post the Kubernetes Event {} ({e}); what certrotor did stands",
            event.reason
        ),
    }
}

/// The admin kubeconfig of the node's layouts, relative to the root, if present.
pub fn admin_conf(local: &Node) -> Option<String> {
    catalog_file(local, "admin.conf")
}

fn catalog_file(local: &Node, name: &str) -> Option<String> {
    local
        .entries()
        .iter()
        .filter(|e| e.name == name || e.name.starts_with(&format!("{name}@")))
        .map(|e| e.path.clone())
        .find(|p| local.root().join(p).exists())
}

/// Reads a credential of the kubeconfig `kubeconfig` (relative to the root): embedded, or a
/// file on the node (under the root; a relative path from the kubeconfig's folder, as client-go
/// resolves it).
fn credential(
    root: &Path,
    kubeconfig: &str,
    source: &Source,
    what: &str,
) -> Result<Vec<u8>, String> {
    match source {
        Source::Embedded(b) => Ok(b.clone()),
        Source::File(p) => {
            let rel = crate::node::kubeconfig::file_under_root(kubeconfig, p);
            match fsutil::read_in_root(root, &rel, MAX_PEM_FILE_BYTES) {
                Ok(Some(b)) => Ok(b),
                Ok(None) => Err(format!("{what} '{p}' does not exist")),
                Err(e) => Err(format!("{what}: {e}")),
            }
        }
    }
}

/// The node name as kubeadm finds it: kubelet.conf's client certificate CN without
/// `system:node:`; else the host name in lower case (the kubelet's default).
pub fn node_name(local: &Node) -> String {
    let root = local.root();
    let from_kubelet = || -> Option<String> {
        let rel = catalog_file(local, "kubelet.conf")?;
        let bytes =
            zeroize::Zeroizing::new(fsutil::read_in_root(root, &rel, MAX_PEM_FILE_BYTES).ok()??);
        let creds = Kubeconfig::parse(&bytes).ok()?.credentials().ok()?;
        let pem = credential(root, &rel, &creds.client_certificate, "client certificate").ok()?;
        let subject = Cert::from_pem(&pem).ok()?.subject();
        subject
            .split([',', '+'])
            .find_map(|rdn| rdn.trim().strip_prefix("CN="))
            .and_then(|cn| cn.strip_prefix("system:node:"))
            .filter(|n| !n.is_empty())
            .map(str::to_string)
    };
    from_kubelet().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_lowercase())
            .unwrap_or_else(|_| "unknown".into())
    })
}

/// The Event object, as the kubelet's recorder makes one for its Node.
pub fn body(node: &str, event: &Event, now: i64, nanos: u128) -> Value {
    let at = crate::sys::clock::rfc3339(now);
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": format!("{node}.{nanos:x}"),
            "namespace": "default",
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Node",
            "name": node,
            "uid": node,
        },
        "reason": event.reason,
        "message": event.message,
        "type": event.kind,
        "source": { "component": "certrotor", "host": node },
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
        "reportingComponent": "certrotor",
        "reportingInstance": node,
    })
}

/// An HTTPS agent with the credentials of `admin` (a kubeconfig relative to the root), and the
/// apiserver URL it names.
fn admin_agent(local: &Node, admin: &str) -> Result<(ureq::Agent, String), String> {
    let root = local.root();
    let bytes = match fsutil::read_in_root(root, admin, MAX_PEM_FILE_BYTES) {
        Ok(Some(b)) => zeroize::Zeroizing::new(b),
        Ok(None) => return Err(format!("'{admin}' does not exist")),
        Err(e) => return Err(e.to_string()),
    };
    let creds = Kubeconfig::parse(&bytes)
        .and_then(|k| k.credentials())
        .map_err(|e| format!("'{admin}': {e}"))?;
    let server = creds
        .server
        .clone()
        .filter(|s| s.starts_with("https://"))
        .ok_or_else(|| format!("'{admin}' names no https:// server"))?;
    let ca = creds
        .certificate_authority
        .as_ref()
        .ok_or_else(|| format!("'{admin}' has no certificate-authority"))
        .and_then(|s| credential(root, admin, s, "certificate-authority"))?;
    let cert = credential(root, admin, &creds.client_certificate, "client-certificate")?;
    let mut key = credential(root, admin, &creds.client_key, "client-key")?;
    let agent = crate::cluster::mtls_agent(
        &ca,
        &cert,
        &key,
        crate::cluster::CONNECT_TIMEOUT,
        crate::cluster::REQUEST_TIMEOUT,
    );
    zeroize::Zeroize::zeroize(&mut key);
    let agent = agent.map_err(|e| format!("'{admin}': {e}"))?;
    Ok((agent, server.trim_end_matches('/').to_string()))
}

/// GETs `path` (`/api/v1/...`) from the apiserver with `admin`'s credentials: the JSON body.
pub fn get(local: &Node, admin: &str, path: &str) -> Result<Value, String> {
    get_if_found(local, admin, path)?.ok_or_else(|| format!("{path}: not found (HTTP 404)"))
}

/// [`get`], `Ok(None)` when the apiserver answers that the object does not exist (HTTP 404).
pub fn get_if_found(local: &Node, admin: &str, path: &str) -> Result<Option<Value>, String> {
    let (agent, server) = admin_agent(local, admin)?;
    let url = format!("{server}{path}");
    let mut resp = match agent.get(&url).call() {
        Ok(r) => r,
        Err(ureq::Error::StatusCode(404)) => return Ok(None),
        Err(e) => return Err(format!("{url}: {e}")),
    };
    let text = resp
        .body_mut()
        .with_config()
        .limit(4 * 1024 * 1024)
        .read_to_vec()
        .map_err(|e| format!("{url}: {e}"))?;
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| format!("{url}: not JSON: {e}"))
}

/// PUTs the JSON `body` at `path` with `admin`'s credentials: `Ok(true)` when written,
/// `Ok(false)` on a conflict (the object changed since it was read: read it again).
pub fn put(local: &Node, admin: &str, path: &str, body: &Value) -> Result<bool, String> {
    let (agent, server) = admin_agent(local, admin)?;
    let url = format!("{server}{path}");
    let resp = agent
        .put(&url)
        .config()
        .http_status_as_error(false)
        .build()
        .content_type("application/json")
        .send(body.to_string().as_bytes())
        .map_err(|e| format!("{url}: {e}"))?;
    match resp.status().as_u16() {
        200 | 201 => Ok(true),
        409 => Ok(false),
        s => Err(format!("{url}: HTTP {s}")),
    }
}

/// Posts `event` on this node with `admin` (a kubeconfig relative to the root), dated `now` (Unix
/// seconds). Returns the node name.
pub fn post(local: &Node, admin: &str, event: &Event, now: i64) -> Result<String, String> {
    let (agent, server) = admin_agent(local, admin)?;
    let node = node_name(local);
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // The name's suffix only has to be unique (client-go's `name.UnixNano`), not a date.
    let body = body(&node, event, now, since_epoch.as_nanos());
    let url = format!("{server}/api/v1/namespaces/default/events");
    let mut resp = agent
        .post(&url)
        .content_type("application/json")
        .send(body.to_string().as_bytes())
        .map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status().as_u16();
    if status == 201 || status == 200 {
        return Ok(node);
    }
    let text = resp
        .body_mut()
        .with_config()
        .limit(64 * 1024)
        .read_to_vec()
        .unwrap_or_default();
    let message = serde_json::from_slice::<Value>(&text)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default();
    Err(format!("{url}: HTTP {status}: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(result: &str) -> LastPass {
        LastPass {
            version: 1,
            command: "run".into(),
            started_at: "2026-11-23T00:00:00Z".into(),
            finished_at: "2026-11-23T00:00:01Z".into(),
            finished_unix: 0,
            result: result.into(),
            exit_code: 0,
            renewed: vec!["apiserver".into(), "admin.conf".into()],
            new_not_after: Some("2027-11-23T00:00:00Z".into()),
            backup_id: Some("b1".into()),
            platform: Some("kubeadm".into()),
            restarted: vec!["kube-apiserver".into()],
            owed: vec![],
            rollback_reason: Some("kube-apiserver did not come back".into()),
            error: None,
            within_seconds: 0,
            all: false,
            interval_seconds: None,
        }
    }

    #[test]
    fn reasons_and_messages() {
        let e = for_pass(&pass("renewed")).unwrap();
        assert_eq!((e.reason, e.kind), (RENEWED, "Normal"));
        assert!(e.message.contains("apiserver, admin.conf"), "{}", e.message);
        assert!(e.message.contains("2027-11-23T00:00:00Z"), "{}", e.message);
        let e = for_pass(&pass("rolled-back")).unwrap();
        assert_eq!((e.reason, e.kind), (ROLLED_BACK, "Warning"));
        assert!(e.message.contains("did not come back"), "{}", e.message);
        let e = for_pass(&pass("failed")).unwrap();
        assert_eq!((e.reason, e.kind), (FAILED, "Warning"));
        assert!(for_pass(&pass("nothing-due")).is_none());
        assert!(for_pass(&pass("locked")).is_none());
        let b = body("cp-1", &e, 0, 0xabc);
        assert_eq!(b["metadata"]["name"], "cp-1.abc");
        assert_eq!(b["involvedObject"]["kind"], "Node");
        assert_eq!(b["source"]["component"], "certrotor");
        assert!(bounded("é".repeat(2000)).len() <= MAX_MESSAGE);
    }
}
