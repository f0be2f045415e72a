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
//!   apiserver-etcd-client pair ([`publish_if_due`]). Whoever can read etcd already controls the
//!   cluster (every Secret is there), so the pair adds no exposure; it is never logged.
//!
//! Where things are: `client` (the etcd gateway client and [`Access`]), `discover` (this node's
//! endpoints and client pair), `lock` (the restart lock and lease keeper), `gates` (the health
//! gates), `published_pair` (the external-etcd pair through etcd), `session` (what a pass does:
//! connect, wait, lock, report), `roles` (leaders and the VIP holder last).

use std::path::Path;
use std::time::Duration;

use crate::pki::MAX_PEM_FILE_BYTES;
use crate::sys::clock::SharedClock;
use crate::sys::fsutil;
use crate::sys::message_error::message_error;

mod client;
mod discover;
mod gates;
mod lock;
mod published_pair;
pub mod roles;
mod session;
#[cfg(test)]
mod tests;

pub use client::{Access, CONNECT_TIMEOUT, Client, Member, REQUEST_TIMEOUT, mtls_agent};
pub use discover::{NodeInfo, discover};
pub use gates::{Gate, apiserver_gate, apiserver_gate_until, etcd_gate, registered_apiservers};
pub use lock::{Holder, LockGuard, holder_text, keep_alive, try_lock};
pub use published_pair::{publish_if_due, published_bundle, published_cert};
pub use session::{
    Acquired, ClusterReport, Session, before_restart, jitter_between, prefer_reachable,
    start_for_pass,
};

/// The key prefix certrotor owns in etcd.
pub const PREFIX: &str = "certrotor/v1/";
/// The cluster-wide restart lock.
pub const LOCK_KEY: &str = "certrotor/v1/lock";
/// `<prefix><node>` → `{"endpoint": "IP:PORT"}` of each control plane's kube-apiserver.
pub const APISERVERS_PREFIX: &str = "certrotor/v1/apiservers/";
/// The published apiserver-etcd-client pair (external etcd).
pub const PAIR_KEY: &str = "certrotor/v1/apiserver-etcd-client";

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
    /// The date for registrations, lock stamps and the pair's age, handed down by the edge.
    pub clock: SharedClock,
}

impl ClusterOptions {
    /// The defaults, reading the date from `clock`.
    pub fn new(clock: SharedClock) -> Self {
        ClusterOptions {
            mode: Mode::Auto,
            endpoints: vec![],
            wait: Duration::from_secs(600),
            lease_ttl: Duration::from_secs(15),
            leader_wait: Duration::from_secs(300),
            clock,
        }
    }
}

message_error!(
    /// A failure talking to etcd; the message names the endpoint and says what to do.
    #[derive(Debug, Clone, PartialEq, Eq)]
    ClusterError
);

fn err(m: impl Into<String>) -> ClusterError {
    ClusterError(m.into())
}

/// A PEM file at `rel` inside the node's root; the error names the file.
fn read_rel(root: &Path, rel: &str) -> Result<Vec<u8>, ClusterError> {
    match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(err(format!("'{rel}' does not exist"))),
        Err(e) => Err(err(e.to_string())),
    }
}
