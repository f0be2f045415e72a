//! The cluster-wide restart lock: one etcd key created only if absent and attached to a lease
//! that a thread keeps alive ([`keep_alive`], also used for a node's restart record); the lease,
//! and the key with it, expire by themselves when the holder dies.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::client::Client;
use super::{ClusterError, LOCK_KEY, err};

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

/// Tries once to take the lock, stamped `now` (Unix seconds). `Ok(Err(holder))`: another node
/// holds it.
pub fn try_lock(
    client: &Arc<Client>,
    node: &str,
    ttl: Duration,
    now: i64,
) -> Result<Result<LockGuard, String>, ClusterError> {
    let lease = client.grant(ttl)?;
    let holder = Holder {
        node: node.to_string(),
        pid: std::process::id(),
        since: crate::sys::clock::rfc3339(now),
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
/// (and deletes the keys attached to it): the lock, and a node's restart record
/// ([`roles`](super::roles)). `what` names it in messages.
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
