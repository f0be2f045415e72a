//! Cluster mode: nodes that renew in the same hour restart one at a time, coordinated through
//! the etcd every control-plane and etcd node already reaches.
//!
//! - The client is etcd v3's JSON gateway (`/v3/kv/*`, `/v3/lease/*`, `/v3/cluster/*`,
//!   `/v3/maintenance/status`, served by etcd 3.4 on its client port) over HTTPS with mutual TLS,
//!   with ureq and rustls (aws-lc-rs): no gRPC stack. Keys and values are base64 in the JSON.
//! - The lock is one key, [`LOCK_KEY`], created by a transaction that succeeds only if the key
//!   does not exist (`create_revision == 0`) and attached to a lease. While held, a thread
//!   refreshes the lease; when the holder dies, the lease (and the key) expire by themselves
//!   after the TTL. Released by revoking the lease.
//! - Gates, checked before and again under the lock: every etcd member answers its status with a
//!   leader and no alarm (so the cluster keeps quorum while this node's member restarts); for
//!   kube-apiserver, another control plane's apiserver (registered under [`APISERVERS_PREFIX`])
//!   answers `/readyz`, where there is one: every registration probed at once, the gate ended
//!   by `--cluster-wait`, a registration of this node's own address never counted.
//! - What is stored in etcd (under `certrotor/v1/`): the lock (holder name, pid, time), each
//!   control plane's apiserver address, and on external etcd the published
//!   apiserver-etcd-client pair ([`publish_pair`]). Whoever can read etcd already controls the
//!   cluster (every Secret is there), so the pair adds no exposure; it is never logged.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64ct::{Base64, Encoding};
use serde::Serialize;
use serde_json::{Value, json};

use crate::node::catalog;
use crate::node::manifests::{Component, PodInfo};
use crate::pki::MAX_PEM_FILE_BYTES;
use crate::sys::fsutil;

pub mod roles;

/// The key prefix certrotor owns in etcd.
pub const PREFIX: &str = "certrotor/v1/";
/// The cluster-wide restart lock.
pub const LOCK_KEY: &str = "certrotor/v1/lock";
/// `<prefix><node>` → `{"endpoint": "IP:PORT"}` of each control plane's kube-apiserver.
pub const APISERVERS_PREFIX: &str = "certrotor/v1/apiservers/";
/// Registrations older than this (seconds) are ignored by the apiserver gate: the control plane
/// is taken as removed from the cluster.
const REGISTRATION_MAX_AGE: i64 = 7 * 24 * 3600;
/// The published apiserver-etcd-client pair (external etcd).
pub const PAIR_KEY: &str = "certrotor/v1/apiserver-etcd-client";

/// Largest gateway response read.
const MAX_RESPONSE: u64 = 4 * 1024 * 1024;

/// `--cluster`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// On where the node's manifests (or `--etcd-endpoint`) give etcd endpoints.
    Auto,
    /// Act alone.
    Off,
}

/// Cluster options of `run` and `daemon`.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub mode: Mode,
    /// `https://IP:PORT` endpoints overriding the manifests.
    pub endpoints: Vec<String>,
    /// Bound on the wait for the lock and the gates.
    pub wait: Duration,
    /// The lock's lease: how long a dead holder blocks the others.
    pub lease_ttl: Duration,
    /// `--leader-wait`: how long a node holding a leader Lease waits for the other nodes to
    /// restart their followers first ([`roles`]); at most `wait`.
    pub leader_wait: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            mode: Mode::Auto,
            endpoints: vec![],
            wait: Duration::from_secs(600),
            lease_ttl: Duration::from_secs(15),
            leader_wait: Duration::from_secs(300),
        }
    }
}

/// A failure talking to etcd; the message names the endpoint and says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterError(pub String);

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClusterError {}

fn err(m: impl Into<String>) -> ClusterError {
    ClusterError(m.into())
}

/// How this node reaches etcd: endpoints, the etcd CA and a client pair it holds.
#[derive(Clone)]
pub struct Access {
    pub endpoints: Vec<String>,
    /// Where the client certificate came from (for messages).
    pub cert_file: String,
    ca_pem: Vec<u8>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Access({:?}, {})", self.endpoints, self.cert_file)
    }
}

impl Drop for Access {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.key_pem);
    }
}

impl Access {
    /// From PEM bytes (the key buffer is zeroed on drop).
    pub fn new(
        endpoints: Vec<String>,
        cert_file: String,
        ca_pem: Vec<u8>,
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
    ) -> Access {
        Access {
            endpoints,
            cert_file,
            ca_pem,
            cert_pem,
            key_pem,
        }
    }
}

/// Who this node is, what it runs, and how it reaches etcd.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The holder name written in the lock: the etcd member name, else `kube-apiserver@IP:PORT`.
    pub name: String,
    /// This node's kube-apiserver health address, if it runs one.
    pub apiserver: Option<std::net::SocketAddr>,
    /// Whether this node runs an etcd member.
    pub etcd_member: bool,
    pub access: Access,
}

/// Finds this node's etcd endpoints and client pair: `--etcd-endpoint`, else kube-apiserver's
/// `--etcd-servers`, else the etcd member's `--advertise-client-urls`. `Ok(None)`: no etcd
/// endpoints here (cluster mode stays off).
pub fn discover(
    root: &Path,
    pods: &[(String, PodInfo)],
    opts: &ClusterOptions,
) -> Result<Option<NodeInfo>, ClusterError> {
    if opts.mode == Mode::Off {
        return Ok(None);
    }
    let find = |c: Component| pods.iter().find(|(_, p)| p.component() == Some(c));
    let apiserver = find(Component::KubeApiserver);
    let etcd = find(Component::Etcd);
    let endpoints: Vec<String> = if !opts.endpoints.is_empty() {
        opts.endpoints.clone()
    } else if let Some(urls) = apiserver.and_then(|(_, p)| p.flag("etcd-servers")) {
        split_urls(urls)
    } else if let Some(urls) = etcd.and_then(|(_, p)| p.flag("advertise-client-urls")) {
        split_urls(urls)
    } else {
        vec![]
    };
    if endpoints.is_empty() {
        return Ok(None);
    }
    let access = client_access(root, endpoints)?;
    let apiserver_addr = apiserver.and_then(|(_, p)| p.endpoint());
    let name = match (etcd.and_then(|(_, p)| p.flag("name")), apiserver_addr) {
        (Some(n), _) => n.to_string(),
        (None, Some(a)) => format!("kube-apiserver@{a}"),
        (None, None) => hostname(),
    };
    Ok(Some(NodeInfo {
        name,
        apiserver: apiserver_addr,
        etcd_member: etcd.is_some(),
        access,
    }))
}

/// The etcd client pair and CA of this node (the first present of kubeadm's and etcdadm's
/// client certificates, and the etcd CA), read inside the root, for `endpoints`.
fn client_access(root: &Path, endpoints: Vec<String>) -> Result<Access, ClusterError> {
    let layouts = catalog::detect(root);
    let entries = catalog::entries(root, &layouts);
    let present = |n: &str| {
        entries
            .iter()
            .find(|e| e.name == n && root.join(&e.path).exists())
    };
    let client = [
        "apiserver-etcd-client",
        "etcdadm-etcdctl-etcd-client",
        "etcd-healthcheck-client",
        "etcdadm-apiserver-etcd-client",
    ]
    .iter()
    .find_map(|n| present(n))
    .ok_or_else(|| {
        err(format!(
            "cluster mode: no etcd client certificate under '{}' (apiserver-etcd-client, etcdctl-etcd-client or healthcheck-client); give --cluster off to act alone",
            root.display()
        ))
    })?;
    let ca = ["etcd-ca", "etcdadm-ca"]
        .iter()
        .find_map(|n| present(n))
        .ok_or_else(|| {
            err(format!(
                "cluster mode: no etcd CA certificate under '{}'; give --cluster off to act alone",
                root.display()
            ))
        })?;
    let read = |rel: &str| -> Result<Vec<u8>, ClusterError> {
        match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
            Ok(Some(b)) => Ok(b),
            Ok(None) => Err(err(format!("cluster mode: '{rel}' does not exist"))),
            Err(e) => Err(err(format!("cluster mode: {e}"))),
        }
    };
    let key_rel = client.key_path.clone().unwrap_or_default();
    Ok(Access::new(
        endpoints,
        client.path.clone(),
        read(&ca.path)?,
        read(&client.path)?,
        read(&key_rel)?,
    ))
}

fn split_urls(s: &str) -> Vec<String> {
    s.split(',')
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .filter(|u| !u.is_empty())
        .collect()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// A ureq agent for mutual TLS over rustls (aws-lc-rs): trusts only `ca_pem`, presents the
/// client pair, bounds the connection by `connect` and the whole request by `global`, and hands
/// back HTTP error statuses as responses. Shared by the etcd client (here) and the Kubernetes
/// Events client (`events`). The error names the part at fault, never its bytes.
pub fn mtls_agent(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    connect: Duration,
    global: Duration,
) -> Result<ureq::Agent, String> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
    let certs = |pem: &[u8], what: &str| -> Result<Vec<Certificate<'static>>, String> {
        ureq::tls::parse_pem(pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{what}: {e}"))
    };
    let roots = certs(ca_pem, "the CA certificate")?;
    let chain = certs(cert_pem, "the client certificate")?;
    let key = PrivateKey::from_pem(key_pem).map_err(|e| format!("the client key: {e}"))?;
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(RootCerts::Specific(Arc::new(roots)))
        .client_cert(Some(ClientCert::new_with_certs(&chain, key)))
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_connect(Some(connect))
        .timeout_global(Some(global))
        .build()
        .new_agent())
}

/// An etcd member, as the member list gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    pub name: String,
    pub client_urls: Vec<String>,
}

/// The etcd v3 JSON gateway client.
pub struct Client {
    endpoints: std::sync::Mutex<Vec<String>>,
    agent: ureq::Agent,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "etcd::Client({:?})", self.endpoints())
    }
}

impl Client {
    /// A client trusting only the etcd CA and presenting the node's client pair.
    pub fn new(access: &Access) -> Result<Client, ClusterError> {
        let agent = mtls_agent(
            &access.ca_pem,
            &access.cert_pem,
            &access.key_pem,
            Duration::from_secs(2),
            Duration::from_secs(5),
        )
        .map_err(|e| {
            err(format!(
                "cluster mode: {e} ({}); check the node's etcd PKI or give --cluster off",
                access.cert_file
            ))
        })?;
        Ok(Client {
            endpoints: std::sync::Mutex::new(access.endpoints.clone()),
            agent,
        })
    }

    /// The endpoints tried, in order.
    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// POSTs `body` to `path` on one endpoint.
    pub fn post_to(&self, endpoint: &str, path: &str, body: &Value) -> Result<Value, ClusterError> {
        let url = format!("{endpoint}{path}");
        let fail = |e: &dyn fmt::Display| {
            err(format!(
                "etcd at {endpoint}: {path}: {e}; check that the member runs and that this node's etcd client certificate is valid"
            ))
        };
        let mut resp = self
            .agent
            .post(&url)
            .content_type("application/json")
            .send(body.to_string().as_bytes())
            .map_err(|e| fail(&e))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(MAX_RESPONSE)
            .read_to_vec()
            .map_err(|e| fail(&e))?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| fail(&format!("HTTP {status}, not JSON: {e}")))?;
        if status != 200 {
            let message = v
                .get("message")
                .or_else(|| v.get("error"))
                .and_then(Value::as_str)
                .unwrap_or("");
            return Err(fail(&format!("HTTP {status}: {message}")));
        }
        Ok(v)
    }

    /// POSTs to the first endpoint that answers; the error lists every endpoint's failure.
    pub fn post(&self, path: &str, body: &Value) -> Result<Value, ClusterError> {
        let mut errors = Vec::new();
        for e in self.endpoints() {
            match self.post_to(&e, path, body) {
                Ok(v) => return Ok(v),
                Err(x) => errors.push(x.0),
            }
        }
        Err(err(if errors.is_empty() {
            "no etcd endpoints".to_string()
        } else {
            errors.join("; ")
        }))
    }

    /// The members and their client URLs; adds them to the endpoints tried.
    pub fn members(&self) -> Result<Vec<Member>, ClusterError> {
        let v = self.post("/v3/cluster/member/list", &json!({}))?;
        let members: Vec<Member> = v
            .get("members")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|m| Member {
                        name: m
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        client_urls: m
                            .get("clientURLs")
                            .and_then(Value::as_array)
                            .map(|u| {
                                u.iter()
                                    .filter_map(Value::as_str)
                                    .map(|s| s.trim_end_matches('/').to_string())
                                    .collect()
                            })
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        if let Ok(mut eps) = self.endpoints.lock() {
            for m in &members {
                for u in &m.client_urls {
                    if u.starts_with("https://") && !eps.contains(u) {
                        eps.push(u.clone());
                    }
                }
            }
        }
        Ok(members)
    }

    /// The value of `key`, if it exists.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, ClusterError> {
        let v = self.post("/v3/kv/range", &json!({ "key": b64(key.as_bytes()) }))?;
        first_value(&v)
    }

    /// Every `(key, value)` under `prefix`.
    pub fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, ClusterError> {
        let v = self.post(
            "/v3/kv/range",
            &json!({ "key": b64(prefix.as_bytes()), "range_end": b64(&prefix_end(prefix)) }),
        )?;
        let mut out = Vec::new();
        for kv in v.get("kvs").and_then(Value::as_array).into_iter().flatten() {
            let key = unb64(kv.get("key"))?;
            let value = unb64(kv.get("value"))?;
            out.push((String::from_utf8_lossy(&key).into_owned(), value));
        }
        Ok(out)
    }

    /// Writes `key` (with `lease` 0: no lease).
    pub fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), ClusterError> {
        let mut body = json!({ "key": b64(key.as_bytes()), "value": b64(value) });
        if lease != 0 {
            body["lease"] = json!(lease.to_string());
        }
        self.post("/v3/kv/put", &body).map(|_| ())
    }

    /// Grants a lease of `ttl`; returns its id.
    pub fn grant(&self, ttl: Duration) -> Result<i64, ClusterError> {
        let v = self.post(
            "/v3/lease/grant",
            &json!({ "TTL": ttl.as_secs().max(2).to_string() }),
        )?;
        int(v.get("ID")).ok_or_else(|| err(format!("etcd granted no lease: {v}")))
    }

    /// Refreshes a lease; returns its remaining TTL in seconds (0: expired).
    pub fn keepalive(&self, lease: i64) -> Result<i64, ClusterError> {
        let v = self.post("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))?;
        Ok(v.get("result").and_then(|r| int(r.get("TTL"))).unwrap_or(0))
    }

    /// Revokes a lease (and deletes the keys attached to it).
    pub fn revoke(&self, lease: i64) -> Result<(), ClusterError> {
        self.post("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))
            .map(|_| ())
    }

    /// Creates `key` = `value` attached to `lease` if it does not exist. `Ok(None)`: created;
    /// `Ok(Some(current))`: it exists, with this value.
    pub fn create(
        &self,
        key: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<Option<Vec<u8>>, ClusterError> {
        let k = b64(key.as_bytes());
        let v = self.post(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": k, "target": "CREATE", "create_revision": "0" }],
                "success": [{ "request_put": { "key": k, "value": b64(value), "lease": lease.to_string() } }],
                "failure": [{ "request_range": { "key": k } }],
            }),
        )?;
        if v.get("succeeded").and_then(Value::as_bool) == Some(true) {
            return Ok(None);
        }
        let range = v
            .get("responses")
            .and_then(Value::as_array)
            .and_then(|r| r.first())
            .and_then(|r| r.get("response_range"))
            .cloned()
            .unwrap_or(Value::Null);
        Ok(Some(first_value(&range)?.unwrap_or_default()))
    }

    /// The value of `key` and its `mod_revision`, if it exists.
    pub fn get_versioned(&self, key: &str) -> Result<Option<(Vec<u8>, i64)>, ClusterError> {
        let v = self.post("/v3/kv/range", &json!({ "key": b64(key.as_bytes()) }))?;
        match v
            .get("kvs")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
        {
            None => Ok(None),
            Some(kv) => Ok(Some((
                unb64(kv.get("value"))?,
                int(kv.get("mod_revision")).unwrap_or(0),
            ))),
        }
    }

    /// The value of `key`, its `mod_revision` and its lease (0: none), if it exists.
    pub fn get_with_lease(&self, key: &str) -> Result<Option<(Vec<u8>, i64, i64)>, ClusterError> {
        let v = self.post("/v3/kv/range", &json!({ "key": b64(key.as_bytes()) }))?;
        match v
            .get("kvs")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
        {
            None => Ok(None),
            Some(kv) => Ok(Some((
                unb64(kv.get("value"))?,
                int(kv.get("mod_revision")).unwrap_or(0),
                int(kv.get("lease")).unwrap_or(0),
            ))),
        }
    }

    /// Writes `key` attached to `lease` only if it is still at `mod_revision`. `Ok(false)`:
    /// another writer was first.
    pub fn put_if_with_lease(
        &self,
        key: &str,
        value: &[u8],
        mod_revision: i64,
        lease: i64,
    ) -> Result<bool, ClusterError> {
        let k = b64(key.as_bytes());
        let v = self.post(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": k, "target": "MOD", "mod_revision": mod_revision.to_string() }],
                "success": [{ "request_put": { "key": k, "value": b64(value), "lease": lease.to_string() } }],
            }),
        )?;
        Ok(v.get("succeeded").and_then(Value::as_bool) == Some(true))
    }

    /// Writes `key` only if it is still at `mod_revision` (0: only if it does not exist).
    /// `Ok(false)`: another writer was first.
    pub fn put_if(&self, key: &str, value: &[u8], mod_revision: i64) -> Result<bool, ClusterError> {
        let k = b64(key.as_bytes());
        let compare = if mod_revision == 0 {
            json!({ "key": k, "target": "CREATE", "create_revision": "0" })
        } else {
            json!({ "key": k, "target": "MOD", "mod_revision": mod_revision.to_string() })
        };
        let v = self.post(
            "/v3/kv/txn",
            &json!({
                "compare": [compare],
                "success": [{ "request_put": { "key": k, "value": b64(value) } }],
            }),
        )?;
        Ok(v.get("succeeded").and_then(Value::as_bool) == Some(true))
    }

    /// One member's status: `Ok(())` when it has a leader and no error.
    pub fn member_status(&self, endpoint: &str) -> Result<(), ClusterError> {
        let v = self.post_to(endpoint, "/v3/maintenance/status", &json!({}))?;
        // Member ids are uint64: parse as such (an i64 parse fails on half of them).
        let leader = match v.get("leader") {
            Some(Value::String(s)) => s.parse::<u64>().unwrap_or(0),
            Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
            _ => 0,
        };
        if leader == 0 {
            return Err(err(format!("etcd at {endpoint} has no leader")));
        }
        if let Some(errors) = v.get("errors").and_then(Value::as_array)
            && !errors.is_empty()
        {
            return Err(err(format!("etcd at {endpoint} reports {errors:?}")));
        }
        Ok(())
    }
}

fn b64(b: &[u8]) -> String {
    Base64::encode_string(b)
}

fn unb64(v: Option<&Value>) -> Result<Vec<u8>, ClusterError> {
    match v.and_then(Value::as_str) {
        None => Ok(vec![]),
        Some(s) => Base64::decode_vec(s).map_err(|e| err(format!("etcd sent bad base64: {e}"))),
    }
}

fn first_value(range: &Value) -> Result<Option<Vec<u8>>, ClusterError> {
    match range
        .get("kvs")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        None => Ok(None),
        Some(kv) => unb64(kv.get("value")).map(Some),
    }
}

/// etcd's range end for a prefix: the prefix with its last byte incremented.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The gateway writes int64 as strings; accept numbers too.
fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

// === the lock ===

/// The cluster-wide restart lock, held under a lease that a thread keeps alive. Dropping it
/// releases the lock (revokes the lease).
pub struct LockGuard {
    client: Arc<Client>,
    pub lease: i64,
    /// What it keeps (for messages).
    what: &'static str,
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockGuard(lease {})", self.lease)
    }
}

impl LockGuard {
    /// Whether the lease could not be refreshed in time (another node may now hold the lock).
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Err(e) = self.client.revoke(self.lease) {
            log::warn!(
                "{}: could not release it ({e}); it expires by itself",
                self.what
            );
        }
    }
}

/// What the lock key holds.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Holder {
    pub node: String,
    pub pid: u32,
    pub since: String,
}

/// What the lock key says of its holder, as text safe to print (its node name comes from etcd:
/// no control character reaches a log or a terminal raw).
pub fn holder_text(value: &[u8]) -> String {
    let text = serde_json::from_slice::<Holder>(value)
        .map(|h| format!("{} (pid {}, since {})", h.node, h.pid, h.since))
        .unwrap_or_else(|_| String::from_utf8_lossy(value).into_owned());
    let text: String = text.chars().take(512).collect();
    crate::sys::text::escape_controls(&text).into_owned()
}

/// Tries once to take the lock. `Ok(Err(holder))`: another node holds it.
pub fn try_lock(
    client: &Arc<Client>,
    node: &str,
    ttl: Duration,
) -> Result<Result<LockGuard, String>, ClusterError> {
    let lease = client.grant(ttl)?;
    let holder = Holder {
        node: node.to_string(),
        pid: std::process::id(),
        since: crate::sys::clock::rfc3339(crate::sys::clock::now()),
    };
    let value = serde_json::to_vec(&holder).map_err(|e| err(e.to_string()))?;
    match client.create(LOCK_KEY, &value, lease) {
        Ok(None) => {}
        Ok(Some(current)) => {
            let who = holder_text(&current);
            // A certrotor holder always attaches its lock to a lease, which expires with it. A
            // key without one (written by hand, or by something else) would hold every node's
            // restarts for ever: it is taken over, if it is still the same key.
            match client.get_with_lease(LOCK_KEY) {
                Ok(Some((_, revision, 0))) => {
                    if client.put_if_with_lease(LOCK_KEY, &value, revision, lease)? {
                        log::warn!(
                            "cluster lock: the key {LOCK_KEY} (holder {who}) had no lease, so \
                             nothing would ever have released it; taken over by {node}"
                        );
                    } else {
                        let _ = client.revoke(lease);
                        return Ok(Err(who));
                    }
                }
                Ok(_) => {
                    let _ = client.revoke(lease);
                    return Ok(Err(who));
                }
                Err(e) => {
                    let _ = client.revoke(lease);
                    return Err(e);
                }
            }
        }
        Err(e) => {
            let _ = client.revoke(lease);
            return Err(e);
        }
    }
    Ok(Ok(keep_alive(client, lease, ttl, "cluster lock")))
}

/// Keeps `lease` (of `ttl`) alive from a thread until the guard is dropped, which revokes it
/// (and deletes the keys attached to it): the lock, and a node's restart record ([`roles`]).
/// `what` names it in messages.
pub fn keep_alive(
    client: &Arc<Client>,
    lease: i64,
    ttl: Duration,
    what: &'static str,
) -> LockGuard {
    let stop = Arc::new(AtomicBool::new(false));
    let lost = Arc::new(AtomicBool::new(false));
    let thread = {
        let (client, stop, lost) = (client.clone(), stop.clone(), lost.clone());
        let every = (ttl / 3).max(Duration::from_millis(500));
        std::thread::spawn(move || {
            let mut last_ok = Instant::now();
            let mut next = Instant::now() + every;
            while !stop.load(Ordering::SeqCst) {
                if Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                match client.keepalive(lease) {
                    Ok(t) if t > 0 => last_ok = Instant::now(),
                    Ok(_) => {
                        log::warn!("{what}: the lease expired; it is lost");
                        lost.store(true, Ordering::SeqCst);
                        return;
                    }
                    Err(e) => {
                        log::warn!("{what}: refreshing the lease: {e}");
                        if last_ok.elapsed() >= ttl {
                            lost.store(true, Ordering::SeqCst);
                        }
                    }
                }
                next = Instant::now() + every;
            }
        })
    };
    LockGuard {
        client: client.clone(),
        lease,
        what,
        stop,
        lost,
        thread: Some(thread),
    }
}

// === gates ===

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
fn etcd_gate_for(client: &Client, own: Option<&str>) -> (Gate, bool) {
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
/// within the probe timeout.
pub fn apiserver_gate(client: &Client, root: &Path, node: &NodeInfo) -> Gate {
    apiserver_gate_until(client, root, node, Instant::now() + PROBE_TIMEOUT)
}

/// Time given to one `/readyz` probe, handshake and answer together.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Registrations probed at most (the most recently updated first).
const MAX_PROBED: usize = 64;

/// [`apiserver_gate`], bounded by `deadline`: every other registration is probed at once, in
/// parallel, and the first ready one passes the gate (issue 30.7: probed one after another, 20
/// silent registrations turned a 5 s `--cluster-wait` into 123 s, and a trickling one stalled it
/// for good). A registration is this node's own when its address is (the same port on one of
/// this node's addresses), whatever its name.
pub fn apiserver_gate_until(
    client: &Client,
    root: &Path,
    node: &NodeInfo,
    deadline: Instant,
) -> Gate {
    let name = "another-apiserver-ready".to_string();
    let Some(template) = readyz_probe(root) else {
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
    let candidates = candidates(others, node);
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
/// address), updated within [`REGISTRATION_MAX_AGE`], each address once, the most recently
/// updated first, at most [`MAX_PROBED`].
fn candidates(others: Vec<(String, Vec<u8>)>, node: &NodeInfo) -> Vec<std::net::SocketAddr> {
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
        if crate::sys::clock::now() - updated > REGISTRATION_MAX_AGE {
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
fn readyz_probe(root: &Path) -> Option<crate::restart::verify::Probe> {
    let layouts = catalog::detect(root);
    let entries = catalog::entries(root, &layouts);
    let read = |n: &str, key: bool| {
        entries.iter().find(|e| e.name == n).and_then(|e| {
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

// === external etcd: the apiserver-etcd-client pair through etcd ===

/// The format of [`PublishedPair`] this build writes and reads.
const PUBLISHED_PAIR_VERSION: u32 = 1;

/// What [`PAIR_KEY`] holds. The key PEM is in it: never log this value.
#[derive(Serialize, serde::Deserialize)]
struct PublishedPair {
    version: u32,
    cert_pem: String,
    key_pem: String,
    published_by: String,
    published_at: String,
}

impl Drop for PublishedPair {
    fn drop(&mut self) {
        // Overwrite the key text before its buffer is freed.
        zeroize::Zeroize::zeroize(&mut self.key_pem);
    }
}

fn read_rel(root: &Path, rel: &str) -> Result<Vec<u8>, ClusterError> {
    match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(err(format!("'{rel}' does not exist"))),
        Err(e) => Err(err(e.to_string())),
    }
}

/// On an etcd node (etcdadm layout): publishes this node's apiserver-etcd-client pair when the
/// published one is absent, expired or due (within `within` seconds) and this node's own pair is
/// not. The write is a compare-and-swap on the key's revision, so that of the etcd nodes that
/// renewed in the same hour exactly one pair is published. `Ok(Some(what))` when published.
pub fn publish_if_due(
    s: &Session,
    root: &Path,
    within: i64,
) -> Result<Option<String>, ClusterError> {
    use crate::pki::{Cert, PrivateKey};
    let layouts = catalog::detect(root);
    let entries = catalog::entries(root, &layouts);
    let Some(entry) = entries
        .iter()
        .find(|e| e.name == "etcdadm-apiserver-etcd-client" && root.join(&e.path).exists())
    else {
        return Ok(None);
    };
    let now = crate::sys::clock::now();
    let cert_pem = read_rel(root, &entry.path)?;
    let cert = Cert::from_pem(&cert_pem).map_err(|e| err(format!("'{}': {e}", entry.path)))?;
    if cert.not_after() - now <= within {
        // Not renewed (yet): nothing worth publishing.
        return Ok(None);
    }
    let existing = s.client.get_versioned(PAIR_KEY)?;
    let revision = match &existing {
        None => 0,
        Some((bytes, rev)) => {
            let published = serde_json::from_slice::<PublishedPair>(bytes)
                .ok()
                .and_then(|p| Cert::from_pem(p.cert_pem.as_bytes()).ok());
            if let Some(p) = published
                && (p.sha256_hex() == cert.sha256_hex() || p.not_after() - now > within)
            {
                // Ours, or another etcd node's fresh pair: one pair cluster-wide.
                return Ok(None);
            }
            *rev
        }
    };
    let key_rel = entry.key_path.clone().unwrap_or_default();
    let mut key_pem = read_rel(root, &key_rel)?;
    let key = PrivateKey::from_pem(&key_pem).map_err(|e| err(format!("'{key_rel}': {e}")));
    let matches = key.as_ref().is_ok_and(|k| k.matches(&cert));
    let pair = PublishedPair {
        version: PUBLISHED_PAIR_VERSION,
        cert_pem: String::from_utf8_lossy(&cert_pem).into_owned(),
        key_pem: String::from_utf8_lossy(&key_pem).into_owned(),
        published_by: s.node.name.clone(),
        published_at: crate::sys::clock::rfc3339(now),
    };
    zeroize::Zeroize::zeroize(&mut key_pem);
    key?;
    if !matches {
        return Err(err(format!(
            "'{key_rel}' does not match '{}'; not published",
            entry.path
        )));
    }
    let mut value = serde_json::to_vec(&pair).map_err(|e| err(e.to_string()))?;
    let written = s.client.put_if(PAIR_KEY, &value, revision);
    zeroize::Zeroize::zeroize(&mut value);
    if !written? {
        return Ok(None);
    }
    let what = format!(
        "published serial {} (expires {}) under {PAIR_KEY}",
        cert.facts().serial,
        crate::sys::clock::rfc3339(cert.not_after())
    );
    log::info!("cluster mode: {what}");
    Ok(Some(what))
}

/// On an external-etcd control plane: the published pair as an `etcd-client import` bundle
/// (certificate, then key), when it differs from the installed certificate and does not expire
/// before it. The caller checks it as `import` does before installing. Zero the bundle after use.
pub fn published_bundle(s: &Session, root: &Path) -> Result<Option<Vec<u8>>, ClusterError> {
    use crate::pki::Cert;
    let layouts = catalog::detect(root);
    let Some(layout) = layouts
        .iter()
        .find(|l| l.etcd == catalog::EtcdTopology::External)
    else {
        return Ok(None);
    };
    let Some(bytes) = s.client.get(PAIR_KEY)? else {
        return Ok(None);
    };
    let bytes = zeroize::Zeroizing::new(bytes);
    let pair: PublishedPair = serde_json::from_slice(&bytes).map_err(|e| {
        err(format!(
            "the pair published under {PAIR_KEY} is not readable ({e}); nothing was installed, the current pair stays in use; run 'certrotor run' on an etcd node to publish it again, or use 'etcd-client export/import'"
        ))
    })?;
    if pair.version != PUBLISHED_PAIR_VERSION {
        return Err(err(format!(
            "the pair published under {PAIR_KEY} is version {}, which this certrotor does not know (it reads version {PUBLISHED_PAIR_VERSION}); nothing was installed, the current pair stays in use: run the certrotor release that published it on this node, or use 'etcd-client export/import'",
            pair.version
        )));
    }
    let entries = catalog::entries(root, std::slice::from_ref(layout));
    if let Some(entry) = entries.iter().find(|e| e.name == "apiserver-etcd-client")
        && let Ok(installed) = read_rel(root, &entry.path)
        && let Ok(installed) = Cert::from_pem(&installed)
        && let Ok(published) = Cert::from_pem(pair.cert_pem.as_bytes())
        && (published.sha256_hex() == installed.sha256_hex()
            || published.not_after() <= installed.not_after())
    {
        return Ok(None);
    }
    let mut bundle = pair.cert_pem.clone().into_bytes();
    if !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(pair.key_pem.as_bytes());
    Ok(Some(bundle))
}

// === what a pass does ===

/// The cluster part of a pass report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterReport {
    /// This node's name in the lock.
    pub node: String,
    pub endpoints: Vec<String>,
    /// `acquired`, `not needed`, `not acquired`.
    pub lock: String,
    /// Who held the lock while this node waited (last seen).
    pub lock_holder_seen: Option<String>,
    pub gates: Vec<Gate>,
    /// Every reason this node waited, in order, with repeats collapsed.
    pub waited_for: Vec<String>,
    pub waited_ms: u128,
    /// Restarts were put off (they stay owed to the next pass).
    pub deferred: bool,
    /// The lease expired while restarting (another node may have proceeded).
    pub lock_lost: bool,
    /// The apiserver-etcd-client pair this pass published or installed (external etcd).
    pub pair: Option<String>,
    /// A published pair was refused (nothing installed; the current pair stays in use).
    pub pair_error: Option<String>,
    pub error: Option<String>,
    /// The leader Leases of what this node restarts, as last read (under the lock).
    pub roles: Vec<roles::Role>,
    /// Leaders last: what this node, holding a leader Lease, waited for.
    pub leaders_last: Option<roles::LeadersLast>,
}

/// A connected node: its identity and client.
pub struct Session {
    pub node: NodeInfo,
    pub client: Arc<Client>,
}

impl Session {
    /// Discovers the node and connects; `Ok(None)` when cluster mode is off or has no
    /// endpoints. Registers this node's apiserver for the others' gate.
    pub fn start(
        root: &Path,
        pods: &[(String, PodInfo)],
        opts: &ClusterOptions,
    ) -> Result<Option<Session>, ClusterError> {
        let Some(node) = discover(root, pods, opts)? else {
            return Ok(None);
        };
        let client = Arc::new(Client::new(&node.access)?);
        let s = Session { node, client };
        // Best effort: learn every member's endpoint, register the apiserver.
        let _ = s.client.members();
        if let Some(addr) = s.node.apiserver {
            let now = crate::sys::clock::now();
            let value = json!({
                "endpoint": addr.to_string(),
                "updated": crate::sys::clock::rfc3339(now),
                "updated_unix": now,
            });
            if let Err(e) = s.client.put(
                &format!("{APISERVERS_PREFIX}{}", s.node.name),
                value.to_string().as_bytes(),
                0,
            ) {
                log::warn!("cluster mode: registering this apiserver: {e}");
            }
        }
        Ok(Some(s))
    }

    /// The gates, and whether any etcd member had a leader; the apiserver gate ends by
    /// `deadline` (or after one probe's time, when that is later).
    fn gates(&self, root: &Path, components: &[Component], deadline: Instant) -> (Vec<Gate>, bool) {
        let own = self.node.etcd_member.then_some(self.node.name.as_str());
        let (etcd, reached) = etcd_gate_for(&self.client, own);
        let mut gates = vec![etcd];
        if reached
            && components.contains(&Component::KubeApiserver)
            && self.node.apiserver.is_some()
        {
            let deadline = deadline.max(Instant::now() + Duration::from_secs(1));
            gates.push(apiserver_gate_until(
                &self.client,
                root,
                &self.node,
                deadline,
            ));
        }
        (gates, reached)
    }

    /// Waits (bounded by `opts.wait`, with jitter) until the gates pass and the lock is taken.
    /// When no etcd member had a leader during the whole wait (every member down, quorum lost,
    /// or every etcd certificate expired: the cluster is down already and restarting is the way
    /// back), the node acts alone.
    pub fn acquire(
        &self,
        root: &Path,
        components: &[Component],
        opts: &ClusterOptions,
        report: &mut ClusterReport,
    ) -> Acquired {
        let started = Instant::now();
        let mut ever_reached = false;
        let deadline = started + opts.wait;
        let waited = |report: &mut ClusterReport, why: String| {
            if report.waited_for.last() != Some(&why) {
                log::info!("cluster mode: waiting: {why}");
                report.waited_for.push(why);
            }
        };
        loop {
            let (gates, reached) = self.gates(root, components, deadline);
            ever_reached |= reached;
            report.gates = gates.clone();
            let failed: Vec<String> = gates
                .iter()
                .filter(|g| !g.passed)
                .map(|g| format!("gate {}: {}", g.name, g.detail))
                .collect();
            if failed.is_empty() {
                match try_lock(&self.client, &self.node.name, opts.lease_ttl) {
                    Ok(Ok(guard)) => {
                        // Check again under the lock: another holder may have just finished.
                        let again = deadline.max(Instant::now() + PROBE_TIMEOUT);
                        let (gates, _) = self.gates(root, components, again);
                        report.gates = gates.clone();
                        let failed: Vec<String> = gates
                            .iter()
                            .filter(|g| !g.passed)
                            .map(|g| format!("gate {}: {}", g.name, g.detail))
                            .collect();
                        if failed.is_empty() {
                            report.lock = "acquired".into();
                            report.waited_ms = started.elapsed().as_millis();
                            log::info!(
                                "cluster lock acquired by {} (lease {})",
                                self.node.name,
                                guard.lease
                            );
                            return Acquired::Lock(guard);
                        }
                        drop(guard);
                        waited(report, failed.join("; "));
                    }
                    Ok(Err(holder)) => {
                        report.lock_holder_seen = Some(holder.clone());
                        waited(report, format!("lock held by {holder}"));
                    }
                    Err(e) => waited(report, format!("lock: {e}")),
                }
            } else {
                waited(report, failed.join("; "));
            }
            let now = Instant::now();
            if now >= deadline {
                report.waited_ms = started.elapsed().as_millis();
                if !ever_reached {
                    report.lock = "no etcd quorum: acted alone".into();
                    log::warn!(
                        "cluster mode: no etcd member had a leader for {}s; the cluster is down already, so this node restarts alone",
                        opts.wait.as_secs()
                    );
                    return Acquired::Alone;
                }
                report.lock = "not acquired".into();
                report.deferred = true;
                return Acquired::Deferred;
            }
            let pause = jitter_between(Duration::from_millis(500), Duration::from_millis(2000));
            std::thread::sleep(pause.min(deadline - now));
        }
    }
}

/// What [`Session::acquire`] got.
#[derive(Debug)]
pub enum Acquired {
    Lock(LockGuard),
    /// No etcd member had a leader during the whole wait: act alone.
    Alone,
    /// Gates or lock not passed in time: the restarts wait for the next pass.
    Deferred,
}

/// A random duration in `[lo, hi]`.
pub fn jitter_between(lo: Duration, hi: Duration) -> Duration {
    use aws_lc_rs::rand::SecureRandom;
    let mut b = [0u8; 2];
    let _ = aws_lc_rs::rand::SystemRandom::new().fill(&mut b);
    let r = f64::from(u16::from_be_bytes(b)) / f64::from(u16::MAX);
    lo + (hi.saturating_sub(lo)).mul_f64(r)
}

/// Connects for a pass, on a platform that restarts things: `None` when cluster mode is off or
/// finds no etcd endpoints here. A failure is kept in `report`, and restarts then wait.
pub fn start_for_pass(
    root: &Path,
    platform: &crate::restart::Platform,
    opts: &ClusterOptions,
    report: &mut Option<ClusterReport>,
) -> Option<Session> {
    if opts.mode == Mode::Off || matches!(platform, crate::restart::Platform::None) {
        return None;
    }
    let started = crate::restart::pods(platform)
        .map_err(|e| err(format!("cluster mode: {e}")))
        .and_then(|pods| Session::start(root, &pods, opts));
    match started {
        Ok(s) => s,
        Err(e) => {
            log::warn!("{}", e.0);
            report.get_or_insert_with(ClusterReport::default).error = Some(e.0);
            None
        }
    }
}

/// The session to coordinate restarts with after a renewal: `after` (opened on the files as they
/// are now) unless etcd refuses it while `before` (opened on the pair of the start of the pass)
/// still reaches etcd.
pub fn prefer_reachable(after: Option<Session>, before: Option<Session>) -> Option<Session> {
    match (after, before) {
        (Some(a), Some(b)) => match a.client.members() {
            Err(e) if b.client.members().is_ok() => {
                log::warn!(
                    "cluster mode: etcd refuses the client pair as it is now ({e}); \
                         coordinating with the pair this pass started with"
                );
                Some(b)
            }
            _ => Some(a),
        },
        (a, b) => a.or(b),
    }
}

/// The hook `pass::run::run_once` calls before restarting `components`: `Ok(None)` when cluster mode
/// is off (act alone); `Ok(Some(guard))` with the lock; `Err(())` when the restarts must wait
/// (the report says why).
#[allow(clippy::result_unit_err)]
pub fn before_restart(
    root: &Path,
    session: Option<&Session>,
    components: &[Component],
    opts: &ClusterOptions,
    report: &mut Option<ClusterReport>,
) -> Result<Option<LockGuard>, ()> {
    let Some(s) = session else {
        // Cluster mode is on but etcd could not be reached: restarts wait.
        if let Some(r) = report.as_mut().filter(|r| r.error.is_some()) {
            r.lock = "not acquired".into();
            r.deferred = true;
            return Err(());
        }
        return Ok(None);
    };
    let r = report.get_or_insert_with(ClusterReport::default);
    r.node = s.node.name.clone();
    r.endpoints = s.client.endpoints();
    match s.acquire(root, components, opts, r) {
        Acquired::Lock(g) => Ok(Some(g)),
        Acquired::Alone => Ok(None),
        Acquired::Deferred => {
            log::warn!(
                "cluster mode: restarts of {} put off to the next pass: {}",
                components
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                r.waited_for.last().cloned().unwrap_or_default()
            );
            Err(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end("a/"), b"a0".to_vec());
        assert_eq!(int(Some(&json!("42"))), Some(42));
        assert_eq!(int(Some(&json!(7))), Some(7));
        assert_eq!(unb64(Some(&json!(b64(b"x")))).unwrap(), b"x".to_vec());
        assert_eq!(
            split_urls("https://a:1, https://b:2/"),
            vec!["https://a:1", "https://b:2"]
        );
    }
}
