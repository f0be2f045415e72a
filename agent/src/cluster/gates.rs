//! The health gates checked before a restart and again under the lock: every etcd member has a
//! leader and no alarm, and (for kube-apiserver) another control plane's apiserver answers
//! `/readyz`, every registration probed at once within `--cluster-wait`.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::APISERVERS_PREFIX;
use super::client::Client;
use super::discover::NodeInfo;
use crate::node::Node;
use crate::pki::MAX_PEM_FILE_BYTES;
use crate::sys::fsutil;

/// Registrations older than this (seconds) are ignored by the apiserver gate: the control plane
/// is taken as removed from the cluster.
const REGISTRATION_MAX_AGE: i64 = 7 * 24 * 3600;

/// One gate's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gate {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

/// Every etcd member answers with a leader and no alarm.
pub fn etcd_gate(client: &Client) -> Gate {
    etcd_gate_for(client, None).0
}

/// The etcd gate for a node whose own member is `own` (its name): every other member must be
/// healthy; this node's own member may be down (restarting it takes nothing away). Also says
/// whether any member had a leader (the cluster has quorum).
pub(super) fn etcd_gate_for(client: &Client, own: Option<&str>) -> (Gate, bool) {
    let name = "etcd-members-healthy".to_string();
    let members = match client.members() {
        Ok(m) => m,
        Err(e) => {
            return (
                Gate {
                    name,
                    passed: false,
                    detail: e.0,
                },
                false,
            );
        }
    };
    let (mut bad, mut own_down, mut quorum) = (Vec::new(), false, false);
    for m in &members {
        let mut why = "no client URL (not started yet?)".to_string();
        let mut ok = false;
        for u in &m.client_urls {
            match client.member_status(u) {
                Ok(()) => {
                    ok = true;
                    break;
                }
                Err(e) => why = e.0,
            }
        }
        quorum |= ok;
        if ok {
            continue;
        }
        if own == Some(m.name.as_str()) {
            own_down = true;
        } else {
            bad.push(format!("member '{}': {why}", m.name));
        }
    }
    let gate = Gate {
        name,
        passed: bad.is_empty() && !members.is_empty(),
        detail: match (bad.is_empty(), own_down) {
            (true, false) => format!("{} members healthy", members.len()),
            (true, true) => "every other member healthy; this node's own member is not (restarting it takes nothing away)".into(),
            (false, _) => bad.join("; "),
        },
    };
    (gate, quorum)
}

/// Another control plane's kube-apiserver answers `/readyz` (passes where there is none),
/// within the probe timeout. `now` (Unix seconds) dates the registrations' age.
pub fn apiserver_gate(client: &Client, local: &Node, node: &NodeInfo, now: i64) -> Gate {
    apiserver_gate_until(client, local, node, Instant::now() + PROBE_TIMEOUT, now)
}

/// Time given to one `/readyz` probe, handshake and answer together.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Registrations probed at most (the most recently updated first).
const MAX_PROBED: usize = 64;

/// [`apiserver_gate`], bounded by `deadline`: every other registration is probed at once, in
/// parallel, and the first ready one passes the gate (issue 30.7: probed one after another, 20
/// silent registrations turned a 5 s `--cluster-wait` into 123 s, and a trickling one stalled it
/// for good). A registration is this node's own when its address is (the same port on one of
/// this node's addresses), whatever its name.
pub fn apiserver_gate_until(
    client: &Client,
    local: &Node,
    node: &NodeInfo,
    deadline: Instant,
    now: i64,
) -> Gate {
    let name = "another-apiserver-ready".to_string();
    let Some(template) = readyz_probe(local) else {
        return Gate {
            name,
            passed: false,
            detail: "the cluster CA or the apiserver-kubelet-client pair cannot be read to probe \
                     another apiserver; run 'certrotor check'"
                .into(),
        };
    };
    let bounded = |addr| {
        let mut p = template.clone();
        p.address = addr;
        p.timeout = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(100), PROBE_TIMEOUT);
        p
    };
    // This node's apiserver not ready: restarting it cannot take away the last ready one.
    if let Some(own) = node.apiserver
        && let Err(e) = ready(&bounded(own))
    {
        return Gate {
            name,
            passed: true,
            detail: format!(
                "this node's apiserver {own} is not ready ({e}); restarting it takes nothing away"
            ),
        };
    }
    let others = match client.get_prefix(APISERVERS_PREFIX) {
        Ok(list) => list,
        Err(e) => {
            return Gate {
                name,
                passed: false,
                detail: e.0,
            };
        }
    };
    let candidates = candidates(others, node, now);
    if candidates.is_empty() {
        return Gate {
            name,
            passed: true,
            detail: "no other control plane registered".into(),
        };
    }
    match probe_all(&candidates, bounded, deadline) {
        Ok(addr) => Gate {
            name,
            passed: true,
            detail: format!("{addr} ready"),
        },
        Err(tried) => Gate {
            name,
            passed: false,
            detail: format!("no other apiserver ready: {}", tried.join("; ")),
        },
    }
}

/// The other control planes' registrations worth probing: not this node's (by name or by
/// address), updated within [`REGISTRATION_MAX_AGE`] of `now`, each address once, the most
/// recently updated first, at most [`MAX_PROBED`].
pub(super) fn candidates(
    others: Vec<(String, Vec<u8>)>,
    node: &NodeInfo,
    now: i64,
) -> Vec<std::net::SocketAddr> {
    let me = format!("{APISERVERS_PREFIX}{}", node.name);
    let mut candidates: Vec<(i64, std::net::SocketAddr)> = Vec::new();
    for (key, value) in others {
        if key == me {
            continue;
        }
        let Ok(v) = serde_json::from_slice::<Value>(&value) else {
            continue;
        };
        // A control plane that has not run a pass for a week is taken as gone.
        let updated = v.get("updated_unix").and_then(Value::as_i64).unwrap_or(0);
        if now - updated > REGISTRATION_MAX_AGE {
            continue;
        }
        let Some(addr) = v
            .get("endpoint")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<std::net::SocketAddr>().ok())
        else {
            continue;
        };
        if node.apiserver.is_some_and(|own| is_own(addr, own))
            || candidates.iter().any(|(_, a)| *a == addr)
        {
            continue;
        }
        candidates.push((updated, addr));
    }
    candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
    candidates.truncate(MAX_PROBED);
    candidates.into_iter().map(|(_, addr)| addr).collect()
}

/// The names of the control planes registered under [`APISERVERS_PREFIX`] (the etcd member
/// name, or `kube-apiserver@IP:PORT` on a control plane of an external etcd), updated within
/// [`REGISTRATION_MAX_AGE`] of `now`: the kube-apiservers that ran certrotor lately.
pub fn registered_apiservers(
    client: &super::Client,
    now: i64,
) -> Result<Vec<String>, super::ClusterError> {
    let mut names = Vec::new();
    for (key, value) in client.get_prefix(APISERVERS_PREFIX)? {
        let updated = serde_json::from_slice::<Value>(&value)
            .ok()
            .and_then(|v| v.get("updated_unix").and_then(Value::as_i64))
            .unwrap_or(0);
        if let Some(name) = key.strip_prefix(APISERVERS_PREFIX)
            && now - updated <= REGISTRATION_MAX_AGE
        {
            names.push(name.to_string());
        }
    }
    Ok(names)
}

/// Probes every address at once and answers with the first ready one, or what each probe
/// said by `deadline`; each probe ends by itself within its timeout, and those still running
/// when the answer (or the deadline) comes are left to end unheard.
fn probe_all(
    candidates: &[std::net::SocketAddr],
    bounded: impl Fn(std::net::SocketAddr) -> crate::restart::verify::Probe,
    deadline: Instant,
) -> Result<std::net::SocketAddr, Vec<String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    for addr in candidates {
        let (sender, probe) = (tx.clone(), bounded(*addr));
        let addr = *addr;
        let spawned = std::thread::Builder::new()
            .name("apiserver-gate".into())
            .spawn(move || {
                let _ = sender.send((addr, ready(&probe)));
            });
        if let Err(e) = spawned {
            let _ = tx.send((addr, Err(format!("cannot start a probe: {e}"))));
        }
    }
    drop(tx);
    let mut tried = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok((addr, Ok(()))) => return Ok(addr),
            Ok((addr, Err(e))) => tried.push(format!("{addr}: {e}")),
            Err(_) => break,
        }
    }
    let silent = candidates.len() - tried.len();
    if silent > 0 {
        tried.push(format!(
            "{silent} more did not answer before the gate's deadline"
        ));
    }
    Err(tried)
}

/// Whether `addr` (a registration) is this node's own apiserver at `own`: the same port, and
/// the same address, a loopback or unspecified one, or one of this host's.
fn is_own(addr: std::net::SocketAddr, own: std::net::SocketAddr) -> bool {
    let ip = addr.ip();
    addr.port() == own.port()
        && (ip == own.ip() || ip.is_loopback() || ip.is_unspecified() || is_local(ip))
}

/// Whether `ip` is one of this host's addresses: a socket can be bound to it.
fn is_local(ip: std::net::IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// A `/readyz` probe with the node's cluster CA and apiserver-kubelet-client pair (its address
/// and timeout set by the caller), or `None` when they cannot be read.
fn readyz_probe(local: &Node) -> Option<crate::restart::verify::Probe> {
    let root = local.root();
    let read = |n: &str, key: bool| {
        local.entries().iter().find(|e| e.name == n).and_then(|e| {
            let rel = if key {
                e.key_path.clone()?
            } else {
                e.path.clone()
            };
            fsutil::read_in_root(root, &rel, MAX_PEM_FILE_BYTES)
                .ok()
                .flatten()
        })
    };
    // `Probe` zeroes its key copy on drop.
    Some(crate::restart::verify::Probe {
        address: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        path: "/readyz".into(),
        ca_pem: Some(read("ca", false)?),
        client_cert_pem: read("apiserver-kubelet-client", false),
        client_key_pem: read("apiserver-kubelet-client", true),
        timeout: PROBE_TIMEOUT,
    })
}

/// One `/readyz` probe: ready, or why not.
fn ready(probe: &crate::restart::verify::Probe) -> Result<(), String> {
    match crate::restart::verify::probe(probe) {
        Ok(o) if o.healthy() => Ok(()),
        Ok(o) => Err(format!("HTTP {}", o.status)),
        Err(e) => Err(e.0),
    }
}
