//! The k8s-sim kube-vip stand-in of EKS Anywhere's manifest: `kube-vip manager` (the image's
//! entrypoint with `args: [manager]`, run by kubelet-sim), a TEST DOUBLE.
//!
//! What certrotor depends on is what real kube-vip does with its credentials and its lease:
//!
//! * It reads its configuration from the environment as kube-vip does
//!   (`pkg/kubevip/config_environment.go`): `vip_leaderelection`, `vip_leasename` (default
//!   `plndr-cp-lock`), `cp_namespace` (default `kube-system`), `vip_leaseduration`,
//!   `vip_renewdeadline`, `vip_retryperiod` (defaults 5, 3, 1 s, kube-vip's flag defaults),
//!   `vip_nodename` (default: the host name), `port` (default 6443), `address` (the VIP),
//!   `prometheus_server` (default `:2112`).
//! * It reads the kubeconfig **once, at start**, from `/etc/kubernetes/admin.conf` (or
//!   `--k8sConfigPath`), the container path EKS Anywhere mounts admin.conf (super-admin.conf on
//!   an init node of 1.29 and later) on as a single file; kubelet-sim's `KUBELET_SIM_MOUNTS`
//!   says where that path is on the host. It never reads it again: after a renewal it keeps the
//!   old credentials until it is restarted.
//! * It runs client-go's Lease lock protocol (`resourcelock.LeaseLock`) on
//!   `coordination.k8s.io/v1` Lease `<namespace>/<name>` through the real kube-apiserver:
//!   create when absent; take over when the holder has not renewed for `leaseDurationSeconds`
//!   by its own observation clock, or when the holder is itself (a restart on the same node);
//!   as the leader renew every retry period; when it cannot renew within the renew deadline
//!   (credentials refused, apiserver down) it logs `lost leadership, restarting kube-vip` and
//!   exits 1 (`OnStoppedLeading` is a `log.Fatal` in kube-vip's `clusterLeaderElection.go`).
//!   A follower whose requests fail logs and retries, as client-go does.
//! * On SIGTERM the leader releases the lease (`ReleaseOnCancel`: empty holder, a 1 s lease)
//!   and it exits 1 (client-go calls `OnStoppedLeading` when `Run` returns).
//! * It serves plain-HTTP `GET /metrics` on `prometheus_server`; no HTTPS health endpoint and no
//!   probe, as EKS Anywhere's manifest has none.
//!
//! Where it differs: it announces no VIP (no ARP, nothing bound to `address`); it talks to
//! `https://127.0.0.1:<port>` with TLS server name `kubernetes` (real kube-vip dials
//! `kubernetes:<port>`, which EKS Anywhere's templates map to the node); a host-less
//! `prometheus_server` (`:2112`) binds 127.0.0.1 only (traffic stays on loopback); one request
//! per connection; its metric is the stand-in's own `kube_vip_sim_leader`.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{SigSet, Signal};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::k8s_sim::{self, Error};

/// The container path kube-vip reads its kubeconfig from (its `--k8sConfigPath` default).
pub const KUBECONFIG: &str = "/etc/kubernetes/admin.conf";

/// The environment variable kubelet-sim passes every pod: `mountPath=hostPath` lines.
pub const MOUNTS_ENV: &str = crate::kubelet_sim::MOUNTS_ENV;

/// Largest response read from the apiserver.
const MAX_RESPONSE: usize = 1 << 20;

/// Timeout of one request to the apiserver.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Exit code when leadership is lost or the process is stopped (kube-vip's `log.Fatal`).
pub const EXIT_FATAL: u8 = 1;

/// The manager's configuration, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub leader_election: bool,
    pub lease_name: String,
    pub namespace: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// The lease holder identity.
    pub identity: String,
    pub port: u16,
    pub address: String,
    pub metrics: Option<SocketAddr>,
    /// The kubeconfig's container path.
    pub kubeconfig: String,
}

impl Config {
    /// From `env` (kube-vip's variable names) and the arguments after `manager`.
    pub fn from_env(
        env: &BTreeMap<String, String>,
        args: &[String],
        hostname: &str,
    ) -> Result<Config, Error> {
        let flags = k8s_sim::parse_flags(args)?;
        let get = |k: &str| env.get(k).map(String::as_str).filter(|v| !v.is_empty());
        let seconds = |k: &'static str, default: u64| -> Result<Duration, Error> {
            match get(k) {
                None => Ok(Duration::from_secs(default)),
                Some(v) => v
                    .parse::<u64>()
                    .ok()
                    .filter(|s| *s > 0)
                    .map(Duration::from_secs)
                    .ok_or_else(|| Error::InvalidFlag {
                        flag: k,
                        value: v.to_string(),
                        reason: "expected a positive number of seconds".into(),
                    }),
            }
        };
        let port = match get("port") {
            None => 6443,
            Some(v) => v.parse().map_err(|_| Error::InvalidFlag {
                flag: "port",
                value: v.to_string(),
                reason: "expected a port number".into(),
            })?,
        };
        let text = get("prometheus_server").unwrap_or(":2112");
        let full = match text.strip_prefix(':') {
            Some(port) => format!("127.0.0.1:{port}"),
            None => text.to_string(),
        };
        let metrics = Some(full.parse().map_err(|_| Error::InvalidFlag {
            flag: "prometheus_server",
            value: text.to_string(),
            reason: "expected [IP]:PORT".into(),
        })?);
        Ok(Config {
            leader_election: get("vip_leaderelection") == Some("true"),
            lease_name: get("vip_leasename").unwrap_or("plndr-cp-lock").into(),
            namespace: get("cp_namespace").unwrap_or("kube-system").into(),
            lease_duration: seconds("vip_leaseduration", 5)?,
            renew_deadline: seconds("vip_renewdeadline", 3)?,
            retry_period: seconds("vip_retryperiod", 1)?,
            identity: get("vip_nodename").unwrap_or(hostname).into(),
            port,
            address: get("address").unwrap_or_default().into(),
            metrics,
            kubeconfig: flags.get("k8sConfigPath").unwrap_or(KUBECONFIG).into(),
        })
    }
}

/// Where a container path is on the host, by kubelet-sim's `KUBELET_SIM_MOUNTS` (the longest
/// mount path that is the path or a folder above it wins); the path itself without it.
pub fn resolve(container_path: &str, mounts: Option<&str>) -> PathBuf {
    let mut best: Option<(usize, PathBuf)> = None;
    for line in mounts.unwrap_or_default().lines() {
        let Some((mount, host)) = line.split_once('=') else {
            continue;
        };
        let mount = mount.trim_end_matches('/');
        let rest = if container_path == mount {
            Some("")
        } else {
            container_path
                .strip_prefix(mount)
                .and_then(|r| r.strip_prefix('/'))
        };
        if let Some(rest) = rest
            && best.as_ref().is_none_or(|(l, _)| mount.len() > *l)
        {
            let target = if rest.is_empty() {
                PathBuf::from(host)
            } else {
                Path::new(host).join(rest)
            };
            best = Some((mount.len(), target));
        }
    }
    best.map_or_else(|| PathBuf::from(container_path), |(_, p)| p)
}

/// Runs `kube-vip manager ARGS` until leadership is lost or a signal stops it; returns the exit
/// code.
pub fn run_manager(args: &[String]) -> u8 {
    match manager(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kube-vip (k8s-sim): {e}");
            EXIT_FATAL
        }
    }
}

fn manager(args: &[String]) -> Result<u8, Error> {
    // Blocked before any thread starts (and so in all of them); one thread takes them.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .map_err(|e| Error::Tls(format!("cannot block signals: {e}")))?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        thread::spawn(move || {
            if let Ok(signal) = signals.wait() {
                eprintln!("kube-vip (k8s-sim): received {signal}");
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let config = Config::from_env(&env, args, &hostname)?;
    let path = resolve(&config.kubeconfig, env.get(MOUNTS_ENV).map(String::as_str));
    eprintln!(
        "kube-vip (k8s-sim): manager, VIP {} (not announced), lease {}/{} as '{}', kubeconfig \
         {} read once from {}",
        config.address,
        config.namespace,
        config.lease_name,
        config.identity,
        config.kubeconfig,
        path.display()
    );
    let client = Client::new(&path, config.port)?;
    let leader = Arc::new(AtomicBool::new(false));
    if let Some(address) = config.metrics {
        serve_metrics(address, leader.clone(), &config);
    }
    if !config.leader_election {
        eprintln!("kube-vip (k8s-sim): leader election disabled; running until stopped");
        while !stop.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(100));
        }
        return Ok(EXIT_FATAL);
    }
    let mut election = Election {
        config: &config,
        client: &client,
        observed: None,
    };
    Ok(election.run(&stop, &leader))
}

/// A TLS client to the apiserver with the kubeconfig's credentials, read once.
struct Client {
    tls: Arc<ClientConfig>,
    address: SocketAddr,
}

impl Client {
    fn new(kubeconfig: &Path, port: u16) -> Result<Client, Error> {
        let now = SystemTime::now();
        let m = k8s_sim::read_kubeconfig(kubeconfig)?;
        let roots = k8s_sim::load_roots(&m.ca.0, &m.ca.1, now)?;
        let pair = k8s_sim::load_pair(&m.cert.0, &m.cert.1, &m.key.0, &m.key.1, now)?;
        let tls = ClientConfig::builder_with_provider(Arc::new(k8s_sim::provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?
            .with_root_certificates(k8s_sim::root_store(roots))
            .with_client_auth_cert(pair.chain, pair.key)
            .map_err(|e| Error::Tls(e.to_string()))?;
        Ok(Client {
            tls: Arc::new(tls),
            address: SocketAddr::from(([127, 0, 0, 1], port)),
        })
    }

    /// One request on a new connection; the status and the body.
    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, serde_json::Value), String> {
        let fail = |e: &dyn std::fmt::Display| format!("{method} {path}: {e}");
        let name = ServerName::try_from("kubernetes").map_err(|e| fail(&e))?;
        let conn = ClientConnection::new(self.tls.clone(), name).map_err(|e| fail(&e))?;
        let sock =
            TcpStream::connect_timeout(&self.address, REQUEST_TIMEOUT).map_err(|e| fail(&e))?;
        sock.set_read_timeout(Some(REQUEST_TIMEOUT))
            .and_then(|()| sock.set_write_timeout(Some(REQUEST_TIMEOUT)))
            .map_err(|e| fail(&e))?;
        let mut stream = StreamOwned::new(conn, sock);
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: kubernetes:{}\r\nUser-Agent: kube-vip (k8s-sim)\r\n\
             Accept: application/json\r\nConnection: close\r\n",
            self.address.port()
        );
        if body.is_some() {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                payload.len()
            ));
        }
        head.push_str("\r\n");
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(payload.as_bytes()))
            .and_then(|()| stream.flush())
            .map_err(|e| fail(&e))?;
        let (status, _, bytes) =
            crate::http::read_response(&mut BufReader::new(&mut stream), MAX_RESPONSE)
                .map_err(|e| fail(&e))?;
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        Ok((status, json))
    }
}

/// client-go's leader election on a Lease, as kube-vip runs it.
struct Election<'a> {
    config: &'a Config,
    client: &'a Client,
    /// The last record seen (its spec as text) and when it was first seen: client-go's
    /// observed record and observation time, which decide expiry by this process's clock.
    observed: Option<(String, Instant)>,
}

impl Election<'_> {
    fn lease_path(&self) -> String {
        format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases/{}",
            self.config.namespace, self.config.lease_name
        )
    }

    /// Runs until leadership is lost or `stop`; the exit code.
    fn run(&mut self, stop: &AtomicBool, leader: &AtomicBool) -> u8 {
        let c = self.config;
        let mut last_renew: Option<Instant> = None;
        loop {
            if stop.load(Ordering::SeqCst) {
                if last_renew.is_some() {
                    match self.release() {
                        Ok(()) => eprintln!("kube-vip (k8s-sim): released the lease"),
                        Err(e) => eprintln!("kube-vip (k8s-sim): releasing the lease: {e}"),
                    }
                }
                leader.store(false, Ordering::SeqCst);
                return EXIT_FATAL;
            }
            match self.try_acquire_or_renew() {
                Ok(true) => {
                    if last_renew.is_none() {
                        eprintln!(
                            "kube-vip (k8s-sim): successfully acquired lease {}/{} as '{}'",
                            c.namespace, c.lease_name, c.identity
                        );
                        leader.store(true, Ordering::SeqCst);
                    }
                    last_renew = Some(Instant::now());
                }
                Ok(false) => {}
                Err(e) => {
                    eprintln!("kube-vip (k8s-sim): error retrieving or updating the lease: {e}")
                }
            }
            if let Some(t) = last_renew
                && t.elapsed() > c.renew_deadline
            {
                leader.store(false, Ordering::SeqCst);
                eprintln!(
                    "kube-vip (k8s-sim): failed to renew lease {}/{} within {} s; lost leadership, \
                     restarting kube-vip",
                    c.namespace,
                    c.lease_name,
                    c.renew_deadline.as_secs()
                );
                return EXIT_FATAL;
            }
            let end = Instant::now() + c.retry_period;
            while Instant::now() < end && !stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// client-go's `tryAcquireOrRenew`: `Ok(true)` when this process holds the lease now.
    fn try_acquire_or_renew(&mut self) -> Result<bool, String> {
        let c = self.config;
        let now = micro_time(SystemTime::now());
        let duration = i64::try_from(c.lease_duration.as_secs()).unwrap_or(i64::MAX);
        let (status, lease) = self.client.request("GET", &self.lease_path(), None)?;
        if status == 404 {
            let body = serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": c.lease_name, "namespace": c.namespace},
                "spec": {
                    "holderIdentity": c.identity,
                    "leaseDurationSeconds": duration,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            });
            let path = format!(
                "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
                c.namespace
            );
            let (status, created) = self.client.request("POST", &path, Some(&body))?;
            return match status {
                201 | 200 => {
                    self.observe(&created);
                    Ok(true)
                }
                409 => Ok(false),
                _ => Err(format!("create: HTTP {status}: {}", reason(&created))),
            };
        }
        if status != 200 {
            return Err(format!("get: HTTP {status}: {}", reason(&lease)));
        }
        let spec = lease.get("spec").cloned().unwrap_or_default();
        self.observe(&lease);
        let holder = spec
            .get("holderIdentity")
            .and_then(|h| h.as_str())
            .unwrap_or_default();
        let held_for = spec
            .get("leaseDurationSeconds")
            .and_then(|d| d.as_u64())
            .unwrap_or(0);
        let observed_at = self.observed.as_ref().map(|(_, t)| *t);
        let valid = observed_at.is_some_and(|t| t.elapsed() < Duration::from_secs(held_for));
        if !holder.is_empty() && valid && holder != c.identity {
            return Ok(false);
        }
        let transitions = spec
            .get("leaseTransitions")
            .and_then(|t| t.as_i64())
            .unwrap_or(0);
        let (acquired, transitions) = if holder == c.identity {
            (
                spec.get("acquireTime")
                    .cloned()
                    .unwrap_or(now.clone().into()),
                transitions,
            )
        } else {
            (now.clone().into(), transitions + 1)
        };
        let mut updated = lease.clone();
        updated["spec"] = serde_json::json!({
            "holderIdentity": c.identity,
            "leaseDurationSeconds": duration,
            "acquireTime": acquired,
            "renewTime": now,
            "leaseTransitions": transitions,
        });
        let (status, body) = self
            .client
            .request("PUT", &self.lease_path(), Some(&updated))?;
        match status {
            200 => {
                self.observe(&body);
                Ok(true)
            }
            409 => Ok(false),
            _ => Err(format!("update: HTTP {status}: {}", reason(&body))),
        }
    }

    /// Records `lease`'s spec as observed now, when it changed.
    fn observe(&mut self, lease: &serde_json::Value) {
        let text = lease.get("spec").map(|s| s.to_string()).unwrap_or_default();
        if self.observed.as_ref().is_none_or(|(seen, _)| *seen != text) {
            self.observed = Some((text, Instant::now()));
        }
    }

    /// client-go's `release`: an empty holder and a 1 s lease, so that another takes it at once.
    fn release(&mut self) -> Result<(), String> {
        let (status, mut lease) = self.client.request("GET", &self.lease_path(), None)?;
        if status != 200 {
            return Err(format!("get: HTTP {status}: {}", reason(&lease)));
        }
        if lease["spec"]["holderIdentity"].as_str() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let now = micro_time(SystemTime::now());
        lease["spec"]["holderIdentity"] = "".into();
        lease["spec"]["leaseDurationSeconds"] = 1.into();
        lease["spec"]["acquireTime"] = now.clone().into();
        lease["spec"]["renewTime"] = now.into();
        let (status, body) = self
            .client
            .request("PUT", &self.lease_path(), Some(&lease))?;
        match status {
            200 => Ok(()),
            _ => Err(format!("update: HTTP {status}: {}", reason(&body))),
        }
    }
}

/// The `message` of a Kubernetes Status, or the body.
fn reason(body: &serde_json::Value) -> String {
    body.get("message")
        .and_then(|m| m.as_str())
        .map_or_else(|| body.to_string(), str::to_string)
}

/// A `metav1.MicroTime`: RFC 3339 in UTC with microseconds.
fn micro_time(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let whole = k8s_sim::format_rfc3339(UNIX_EPOCH + Duration::from_secs(since.as_secs()));
    format!(
        "{}.{:06}Z",
        whole.trim_end_matches('Z'),
        since.subsec_micros()
    )
}

/// Serves `GET /metrics` (plain HTTP) in a thread; a port that cannot be bound is logged.
fn serve_metrics(address: SocketAddr, leader: Arc<AtomicBool>, config: &Config) {
    let listener = match TcpListener::bind(address) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kube-vip (k8s-sim): cannot serve metrics on {address}: {e}");
            return;
        }
    };
    eprintln!("kube-vip (k8s-sim): metrics on http://{address}/metrics");
    let lease = format!("{}/{}", config.namespace, config.lease_name);
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let value = u8::from(leader.load(Ordering::SeqCst));
            let lease = lease.clone();
            thread::spawn(move || {
                let _ = metrics_connection(stream, &lease, value);
            });
        }
    });
}

fn metrics_connection(stream: TcpStream, lease: &str, leader: u8) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let Ok(Some((_, target, _))) = crate::http::read_request_head(&mut reader) else {
        return Ok(());
    };
    let mut writer = stream;
    if target.split('?').next() == Some("/metrics") {
        let body = format!(
            "# HELP kube_vip_sim_leader Whether this kube-vip stand-in holds its lease.\n\
             # TYPE kube_vip_sim_leader gauge\nkube_vip_sim_leader{{lease=\"{lease}\"}} {leader}\n"
        );
        crate::http::write_response(
            &mut writer,
            200,
            Some("text/plain; version=0.0.4"),
            body.as_bytes(),
            true,
        )
    } else {
        crate::http::write_response(&mut writer, 404, None, b"404 page not found\n", true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_container_paths_through_the_mounts() {
        let mounts = "/etc/kubernetes/admin.conf=/r/var/lib/kubeadm/admin.conf\n\
                      /etc/kubernetes/pki=/r/pki\n/etc/kubernetes=/r/etc\n";
        assert_eq!(
            resolve(KUBECONFIG, Some(mounts)),
            Path::new("/r/var/lib/kubeadm/admin.conf")
        );
        assert_eq!(
            resolve("/etc/kubernetes/pki/ca.crt", Some(mounts)),
            Path::new("/r/pki/ca.crt")
        );
        assert_eq!(
            resolve("/etc/kubernetes/other", Some(mounts)),
            Path::new("/r/etc/other")
        );
        assert_eq!(
            resolve("/etc/kubernetesx", Some(mounts)),
            Path::new("/etc/kubernetesx")
        );
        assert_eq!(resolve(KUBECONFIG, None), Path::new(KUBECONFIG));
    }

    #[test]
    fn reads_kube_vips_environment() {
        let env: BTreeMap<String, String> = [
            ("vip_leaderelection", "true"),
            ("vip_leaseduration", "15"),
            ("vip_renewdeadline", "10"),
            ("vip_retryperiod", "2"),
            ("port", "6543"),
            ("address", "192.0.2.10"),
            ("prometheus_server", ":2212"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let c = Config::from_env(&env, &[], "cp-1").unwrap();
        assert!(c.leader_election);
        assert_eq!(c.lease_name, "plndr-cp-lock");
        assert_eq!(c.namespace, "kube-system");
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        assert_eq!(c.identity, "cp-1");
        assert_eq!(c.port, 6543);
        assert_eq!(c.metrics, Some("127.0.0.1:2212".parse().unwrap()));
        assert_eq!(c.kubeconfig, KUBECONFIG);
        let c = Config::from_env(&BTreeMap::new(), &["--k8sConfigPath=/k".into()], "h").unwrap();
        assert!(!c.leader_election);
        assert_eq!(c.port, 6443);
        assert_eq!(c.lease_duration, Duration::from_secs(5));
        assert_eq!(c.metrics, Some("127.0.0.1:2112".parse().unwrap()));
        assert_eq!(c.kubeconfig, "/k");
        let bad: BTreeMap<String, String> = [("vip_leaseduration".to_string(), "0".to_string())]
            .into_iter()
            .collect();
        assert!(Config::from_env(&bad, &[], "h").is_err());
    }

    #[test]
    fn micro_times_as_kubernetes_writes_them() {
        let t = UNIX_EPOCH + Duration::from_micros(1_795_356_916_000_042);
        assert_eq!(micro_time(t), "2026-11-22T14:15:16.000042Z");
    }
}
