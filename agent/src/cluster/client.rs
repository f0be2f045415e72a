//! The etcd v3 JSON gateway client (`/v3/kv/*`, `/v3/lease/*`, `/v3/cluster/*`,
//! `/v3/maintenance/status`) over mutual TLS, and [`Access`], what it connects with: the
//! endpoints, the etcd CA and the node's client pair. Also [`mtls_agent`], shared with the
//! Kubernetes Events client.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64ct::{Base64, Encoding};
use serde::Serialize;
use serde_json::{Value, json};

use super::{ClusterError, err};

/// Largest gateway response read.
const MAX_RESPONSE: u64 = 4 * 1024 * 1024;

/// Bound on connecting to an etcd member (or the apiserver, for Events), the TLS handshake with
/// client authentication included. 5 s rather than etcdctl's 2 s: an unattended agent on a node
/// whose CPUs are busy must not give up on a member that is only slow (measured: on a 2-core
/// machine at load 40 two handshakes in a row with a local etcd took over 2 s, and the pass lost
/// its publication). A member that is down refuses at once whatever the bound.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Bound on one whole request, connection included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

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
        .unversioned_rustls_crypto_provider(Arc::new(crate::pki::tls::provider()))
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
            CONNECT_TIMEOUT,
            REQUEST_TIMEOUT,
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
        Ok(self
            .get_with_lease(key)?
            .map(|(value, mod_revision, _)| (value, mod_revision)))
    }

    /// The value of `key`, its `mod_revision` and its lease (0: none), if it exists.
    pub fn get_with_lease(&self, key: &str) -> Result<Option<(Vec<u8>, i64, i64)>, ClusterError> {
        let v = self.post("/v3/kv/range", &json!({ "key": b64(key.as_bytes()) }))?;
        match first_kv(&v) {
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

    /// Deletes every key under `prefix` only if `key` is still at `mod_revision`. `Ok(false)`:
    /// `key` changed (or went) since it was read.
    pub fn delete_prefix_if(
        &self,
        key: &str,
        mod_revision: i64,
        prefix: &str,
    ) -> Result<bool, ClusterError> {
        let v = self.post(
            "/v3/kv/txn",
            &json!({
                "compare": [{ "key": b64(key.as_bytes()), "target": "MOD", "mod_revision": mod_revision.to_string() }],
                "success": [{ "request_delete_range": { "key": b64(prefix.as_bytes()), "range_end": b64(&prefix_end(prefix)) } }],
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

pub(super) fn b64(b: &[u8]) -> String {
    Base64::encode_string(b)
}

pub(super) fn unb64(v: Option<&Value>) -> Result<Vec<u8>, ClusterError> {
    match v.and_then(Value::as_str) {
        None => Ok(vec![]),
        Some(s) => Base64::decode_vec(s).map_err(|e| err(format!("etcd sent bad base64: {e}"))),
    }
}

/// The first key-value of a range response, if any.
fn first_kv(range: &Value) -> Option<&Value> {
    range
        .get("kvs")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
}

fn first_value(range: &Value) -> Result<Option<Vec<u8>>, ClusterError> {
    match first_kv(range) {
        None => Ok(None),
        Some(kv) => unb64(kv.get("value")).map(Some),
    }
}

/// etcd's range end for a prefix: the prefix with its last byte incremented.
pub(super) fn prefix_end(prefix: &str) -> Vec<u8> {
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
pub(super) fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}
