//! Cluster mode against a real three-member etcd cluster on 127.0.0.1: the JSON gateway client,
//! the lease lock (exclusion, release, expiry of a dead holder), the etcd health gate, and whole
//! passes of three stacked control-plane nodes started at the same moment, sampled every 100 ms.
//! kubelet-sim runs every node's static pods as host processes: Debian's etcd and the real
//! kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2 (`CERTROTOR_K8S_BIN`,
//! default /var/cache/certrotor/kubernetes-v1.20.2/bin, built by images/k8s/build.sh; missing,
//! the test fails). kubelet-sim is the one double left (no CRI pod sandbox on this host).
//! Needs Debian's `etcd-server` and `etcd-client` (missing, the test fails).

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use certrotor::cluster::{self, Access, Client, LOCK_KEY};
use certrotor::restart::verify::{self, Probe};
use certrotor::sys::clock::{Clock, SystemClock};
use testbed::kubelet_sim::PodState;

use crate::platform::platform_util::{
    KUBELET_SIM_PACE, RESTART_TIMEOUT, RESTART_TIMEOUT_S, pass_bound, sibling,
};
use crate::renew_util::*;
use crate::util::each_field;

/// The longest a single pass may take in these tests: a hang detector, the pass's own bound
/// (`pass_bound`) with the restart timeout the passes get.
const PASS_BOUND: Duration = pass_bound(RESTART_TIMEOUT_S);

/// The longest the passes of a whole cluster may take together: one node at a time under the
/// lock, so three passes' bounds.
const PASSES_DEADLINE: Duration = pass_bound(RESTART_TIMEOUT_S).saturating_mul(3);

/// Longest wait for a cluster's control planes to come up or back: the real kube-apiserver,
/// controller-manager and scheduler of three nodes start together, on a 2-core machine that
/// other tests and QEMU runs load too.
const UP_DEADLINE: Duration = Duration::from_secs(300);

/// The flags of every pass and daemon here: kubeadm restarts, quick polls, a short cluster lease.
const PASS_FLAGS: [&str; 8] = [
    "--platform",
    "kubeadm",
    "--restart-timeout",
    RESTART_TIMEOUT,
    "--poll-interval",
    "100ms",
    "--cluster-lease-ttl",
    "4s",
];

pub(crate) use testkit::ports::{NODE_PORTS as PORTS, offsets};

/// etcd and etcdctl must be installed: without them the test fails saying what to install.
pub(crate) fn etcd_installed(test: &str) {
    testkit::prereq::require_tools(test, &[("etcd", "etcd-server"), ("etcdctl", "etcd-client")]);
}

// === a bare three-member cluster, for the client, the lock and the gate ===

/// Three etcd processes sharing one lab node's etcd PKI (the certificates name 127.0.0.1).
struct Etcd3 {
    dir: PathBuf,
    pki: PathBuf,
    args: Vec<Vec<String>>,
    procs: Vec<Option<Background>>,
    clients: Vec<u16>,
}

impl Etcd3 {
    fn start(t: &TempDir) -> Etcd3 {
        let root = lab(&t.join("pki-node"), &LOOPBACK_ECDSA);
        let pki = root.join("etc/kubernetes/pki");
        let f = |n: &str| pki.join("etcd").join(n).display().to_string();
        let ports: Vec<(u16, u16)> = offsets(3).iter().map(|o| (2379 + o, 2380 + o)).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=https://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut args = Vec::new();
        for (i, (c, p)) in ports.iter().enumerate() {
            args.push(
                [
                    "--name",
                    &format!("m{i}"),
                    "--data-dir",
                    s(&t.join(&format!("data-{i}"))),
                    "--cert-file",
                    &f("server.crt"),
                    "--key-file",
                    &f("server.key"),
                    "--trusted-ca-file",
                    &f("ca.crt"),
                    "--client-cert-auth",
                    "--peer-cert-file",
                    &f("peer.crt"),
                    "--peer-key-file",
                    &f("peer.key"),
                    "--peer-trusted-ca-file",
                    &f("ca.crt"),
                    "--peer-client-cert-auth",
                    "--listen-client-urls",
                    &format!("https://127.0.0.1:{c}"),
                    "--advertise-client-urls",
                    &format!("https://127.0.0.1:{c}"),
                    "--listen-peer-urls",
                    &format!("https://127.0.0.1:{p}"),
                    "--initial-advertise-peer-urls",
                    &format!("https://127.0.0.1:{p}"),
                    "--initial-cluster",
                    &initial,
                ]
                .map(String::from)
                .to_vec(),
            );
        }
        let mut e = Etcd3 {
            dir: t.path.clone(),
            pki,
            args,
            procs: vec![None, None, None],
            clients: ports.iter().map(|(c, _)| *c).collect(),
        };
        for i in 0..3 {
            e.start_member(i);
        }
        let c = e.client(&[0]);
        wait_gate(&c, "3 healthy members");
        e
    }

    fn start_member(&mut self, i: usize) {
        self.procs[i] = Some(
            Cmd::new("etcd")
                .args(&self.args[i])
                .spawn(&self.dir, &format!("etcd-m{i}-{}", now_ms())),
        );
    }

    fn stop_member(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i].take() {
            p.kill();
        }
    }

    fn endpoint(&self, i: usize) -> String {
        format!("https://127.0.0.1:{}", self.clients[i])
    }

    /// A client with the apiserver-etcd-client pair, knowing only `members`' endpoints.
    fn client(&self, members: &[usize]) -> Client {
        let read = |n: &str| fs::read(self.pki.join(n)).unwrap();
        Client::new(&Access::new(
            members.iter().map(|i| self.endpoint(*i)).collect(),
            "apiserver-etcd-client.crt".into(),
            read("etcd/ca.crt"),
            read("apiserver-etcd-client.crt"),
            read("apiserver-etcd-client.key"),
        ))
        .unwrap()
    }
}

/// Polls the etcd gate until it passes (60 s), failing with its last detail.
#[track_caller]
fn wait_gate(c: &Client, what: &str) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let g = cluster::etcd_gate(c);
        if g.passed {
            return;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}: {g:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An int64 of etcd's JSON gateway (sent as a string, sometimes as a number).
fn gw_int(v: &serde_json::Value) -> Option<i64> {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
}

/// The lease `key` is attached to (etcd's range answer), if the key exists.
fn key_lease(c: &Client, key: &str) -> Option<i64> {
    use base64::Engine as _;
    let key = base64::engine::general_purpose::STANDARD.encode(key);
    let v = c
        .post("/v3/kv/range", &serde_json::json!({ "key": key }))
        .unwrap();
    v["kvs"]
        .as_array()?
        .first()
        .map(|kv| gw_int(&kv["lease"]).unwrap_or(0))
}

/// etcd's own word on a lease: (granted TTL, remaining TTL) in seconds, the remaining TTL -1
/// once it expired (or was revoked). What a test asserts about a lease instead of timing it.
fn lease_ttl(c: &Client, lease: i64) -> (i64, i64) {
    let v = c
        .post(
            "/v3/lease/timetolive",
            &serde_json::json!({ "ID": lease.to_string() }),
        )
        .unwrap();
    (
        gw_int(&v["grantedTTL"]).unwrap_or(0),
        gw_int(&v["TTL"]).unwrap_or_else(|| panic!("no TTL for lease {lease}: {v}")),
    )
}

fn now_ms() -> u128 {
    crate::util::since_epoch().as_millis()
}

#[test]
fn gateway_lock_and_gate_on_a_real_three_member_cluster() {
    etcd_installed("cluster::gateway_lock_and_gate");
    let t = TempDir::new("cluster-lock");
    let mut etcd = Etcd3::start(&t);
    let a = Arc::new(etcd.client(&[0]));
    let b = Arc::new(etcd.client(&[1]));

    // The gateway: members, put/get, prefix.
    let members = a.members().unwrap();
    assert_eq!(members.len(), 3, "{members:?}");
    a.put("certrotor/v1/test/x", b"1", 0).unwrap();
    assert_eq!(b.get("certrotor/v1/test/x").unwrap(), Some(b"1".to_vec()));
    assert_eq!(b.get_prefix("certrotor/v1/test/").unwrap().len(), 1);

    // Exclusion: A holds, B is told who.
    let ttl = Duration::from_secs(3);
    let held = cluster::try_lock(&a, "node-a", ttl, SystemClock.now())
        .unwrap()
        .unwrap();
    let refused = cluster::try_lock(&b, "node-b", ttl, SystemClock.now()).unwrap();
    let who = refused.as_ref().err().cloned().unwrap_or_default();
    assert!(who.contains("node-a"), "B took a held lock: {who:?}");
    // The lease is refreshed: still held after twice the TTL.
    std::thread::sleep(ttl * 2);
    assert!(!held.lost());
    assert!(
        cluster::try_lock(&b, "node-b", ttl, SystemClock.now())
            .unwrap()
            .is_err()
    );
    // Release: B gets it at once.
    drop(held);
    let b_held = cluster::try_lock(&b, "node-b", ttl, SystemClock.now())
        .unwrap()
        .expect("B gets the released lock");
    drop(b_held);

    // A dead holder: the key is attached to a lease nobody refreshes; it expires by itself.
    // No assertion on how long that takes by the clock: etcd says what the lease is (granted
    // 3 s, counting down), the refused taker leaves it alone, and once B holds the lock etcd
    // says the dead lease is gone; the wait's deadline only stops a hang.
    let lease = a.grant(ttl).unwrap();
    assert_eq!(
        a.create(LOCK_KEY, b"{\"node\":\"dead\"}", lease).unwrap(),
        None
    );
    let (granted, left) = lease_ttl(&a, lease);
    assert!(
        granted == 3 && (0..=3).contains(&left),
        "dead holder's lease: {granted} s granted, {left} s left"
    );
    assert!(
        cluster::try_lock(&b, "node-b", ttl, SystemClock.now())
            .unwrap()
            .is_err()
    );
    assert_eq!(
        key_lease(&a, LOCK_KEY),
        Some(lease),
        "a refused taker must leave the holder's key and lease alone"
    );
    let got = wait_for(
        "the dead holder's lease to expire",
        Duration::from_secs(120),
        || {
            cluster::try_lock(&b, "node-b", ttl, SystemClock.now())
                .unwrap()
                .ok()
        },
    );
    assert_eq!(
        lease_ttl(&a, lease).1,
        -1,
        "B holds the lock while the dead lease lives"
    );
    drop(got);

    // The gate: a member down fails it and names the member; back up, it passes.
    assert!(cluster::etcd_gate(&a).passed);
    etcd.stop_member(2);
    let gate = cluster::etcd_gate(&a);
    assert!(!gate.passed, "{gate:?}");
    assert!(gate.detail.contains("'m2'"), "{gate:?}");
    assert!(gate.detail.contains(&etcd.endpoint(2)), "{gate:?}");
    // The lock still works with quorum, through any member.
    drop(
        cluster::try_lock(&a, "node-a", ttl, SystemClock.now())
            .unwrap()
            .unwrap(),
    );
    etcd.start_member(2);
    wait_gate(&a, "m2 back");

    // An endpoint that is not etcd: the error names it and says what to do.
    let dead = format!("https://127.0.0.1:{}", free_port());
    let read = |n: &str| fs::read(etcd.pki.join(n)).unwrap();
    let c = Client::new(&Access::new(
        vec![dead.clone()],
        "x".into(),
        read("etcd/ca.crt"),
        read("apiserver-etcd-client.crt"),
        read("apiserver-etcd-client.key"),
    ))
    .unwrap();
    let e = c.members().unwrap_err().0;
    assert!(
        e.contains(&dead) && e.contains("check that the member runs"),
        "{e}"
    );
}

// === three stacked control planes, one etcd cluster, whole passes ===

/// A stacked control-plane node run by kubelet-sim.
struct CpNode {
    root: PathBuf,
    offset: u16,
    kubelet: Option<Background>,
}

impl CpNode {
    fn states(&self) -> BTreeMap<String, PodState> {
        let mut out = BTreeMap::new();
        for pod in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kube-vip",
        ] {
            let p = self.root.join(format!("var/lib/kubelet-sim/{pod}.json"));
            if let Ok(b) = fs::read(&p) {
                out.insert(pod.to_string(), serde_json::from_slice(&b).unwrap());
            }
        }
        out
    }
}

/// Three copies of one lab node (same CAs, as in one cluster), each with its own ports; the
/// etcd manifests form one three-member cluster.
struct Stacked3 {
    dir: PathBuf,
    nodes: Vec<CpNode>,
    ca: Vec<u8>,
    etcd_client: (Vec<u8>, Vec<u8>),
    api_ca: Vec<u8>,
    api_client: (Vec<u8>, Vec<u8>),
}

impl Stacked3 {
    fn start(t: &TempDir) -> Stacked3 {
        Stacked3::start_expiring(t, "2d", true)
    }

    /// Leaves expiring in `expires_in`; `healthy`: wait until every member, apiserver,
    /// controller-manager and scheduler is, then bind `kubeadm:cluster-admins` as kubeadm does.
    fn start_expiring(t: &TempDir, expires_in: &str, healthy: bool) -> Stacked3 {
        Stacked3::start_with(t, expires_in, healthy, false)
    }

    /// `hostnames`: each node's kubelet-sim runs its pods under host name `cp-N` (a UTS
    /// namespace of their own, as hostNetwork pods share their node's), the etcd member's name,
    /// so that the three nodes' leader identities (`<host name>_<uuid>`) tell them apart on one
    /// host; and each node runs EKS Anywhere's kube-vip (the k8s-sim stand-in, which holds
    /// `kube-system/plndr-cp-lock` under its host name as kube-vip does).
    fn start_with(t: &TempDir, expires_in: &str, healthy: bool, hostnames: bool) -> Stacked3 {
        let offs = offsets(3);
        let first = t.join("node-0");
        lab_node(&first, &[], expires_in, offs[0]);
        if hostnames {
            certrotor::lab::add_kube_vip(
                &first,
                certrotor::lab::LabLayout::Kubeadm,
                offs[0],
                certrotor::lab::KubeVipShape::EksAnywhere,
                certrotor::lab::manifests::DEFAULT_KUBERNETES_VERSION,
            )
            .unwrap();
        }
        for i in 1..3 {
            copy_tree(&first, &t.join(&format!("node-{i}")));
        }
        let peer = |i: usize| format!("https://127.0.0.1:{}", 2380 + offs[i]);
        let initial = (0..3)
            .map(|i| format!("cp-{i}={}", peer(i)))
            .collect::<Vec<_>>()
            .join(",");
        let bin_dir = t.join("bin");
        testkit::k8s::link_control_plane(&bin_dir);
        if hostnames {
            std::os::unix::fs::symlink(sibling("k8s-sim"), bin_dir.join("kube-vip")).unwrap();
        }
        let mut nodes = Vec::new();
        for (i, off) in offs.iter().enumerate() {
            let root = t.join(&format!("node-{i}"));
            // Ports of the copies, in manifests and kubeconfigs.
            shift_ports(&root, offs[0], *off);
            // etcd's member name and initial cluster.
            let etcd = root.join("etc/kubernetes/manifests/etcd.yaml");
            let text = fs::read_to_string(&etcd)
                .unwrap()
                .replace("--name=cp-1", &format!("--name=cp-{i}"))
                .lines()
                .map(|l| {
                    if l.trim_start().starts_with("- --initial-cluster=") {
                        format!("    - --initial-cluster={initial}")
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n";
            fs::write(&etcd, text).unwrap();
            nodes.push(CpNode {
                root,
                offset: *off,
                kubelet: None,
            });
        }
        let pki = first.join("etc/kubernetes/pki");
        let read = |n: &str| fs::read(pki.join(n)).unwrap();
        let mut st = Stacked3 {
            dir: t.path.clone(),
            ca: read("etcd/ca.crt"),
            etcd_client: (
                read("etcd/healthcheck-client.crt"),
                read("etcd/healthcheck-client.key"),
            ),
            api_ca: read("ca.crt"),
            api_client: (
                read("apiserver-kubelet-client.crt"),
                read("apiserver-kubelet-client.key"),
            ),
            nodes,
        };
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        for (i, n) in st.nodes.iter_mut().enumerate() {
            let hostname = format!("cp-{i}");
            let named: &[&str] = if hostnames {
                &["--hostname", &hostname]
            } else {
                &[]
            };
            n.kubelet = Some(
                kubelet_cmd(&n.root, &path)
                    .args(named)
                    .spawn(&st.dir, &format!("kubelet-sim-{i}")),
            );
        }
        if healthy {
            wait_for(
                "three etcd members and three apiservers healthy",
                UP_DEADLINE,
                || {
                    let x = st.sample();
                    (x.etcd.iter().all(|b| *b) && x.api.iter().all(|b| *b)).then_some(())
                },
            );
            wait_components(&st.nodes);
            testkit::k8s::grant_cluster_admins(
                &st.nodes[0].root.join("etc/kubernetes/super-admin.conf"),
            );
        } else {
            wait_for(
                "three etcd processes running",
                Duration::from_secs(60),
                || {
                    st.nodes
                        .iter()
                        .all(|n| n.states().get("etcd").is_some_and(|p| p.running))
                        .then_some(())
                },
            );
        }
        st
    }
}

/// `lab init DIR` for the nodes here: `first`, then loopback addresses, ECDSA keys, leaves
/// expiring in `expires_in` and ports shifted by `offset`.
fn lab_node(dir: &Path, first: &[&str], expires_in: &str, offset: u16) {
    let offset = offset.to_string();
    let rest = ["--expires-in", expires_in, "--port-offset", &offset];
    lab(dir, &[first, &LOOPBACK_ECDSA[..], &rest[..]].concat());
    testkit::k8s::cut_apiserver_start_up_under(dir);
}

/// Waits until every node's kube-controller-manager and kube-scheduler answer `/healthz`.
fn wait_components(nodes: &[CpNode]) {
    wait_for(
        "every kube-controller-manager and kube-scheduler healthy",
        UP_DEADLINE,
        || {
            nodes
                .iter()
                .all(|n| {
                    [10257, 10259].iter().all(|p| {
                        let probe = Probe {
                            address: SocketAddr::from(([127, 0, 0, 1], p + n.offset)),
                            path: "/healthz".into(),
                            ca_pem: None,
                            client_cert_pem: None,
                            client_key_pem: None,
                            timeout: Duration::from_secs(2),
                        };
                        verify::probe(&probe).is_ok_and(|o| o.healthy())
                    })
                })
                .then_some(())
        },
    );
}

impl Stacked3 {
    /// Probes with node 0's client certificates as they are on disk now.
    fn reload_credentials(&mut self) {
        let pki = self.nodes[0].root.join("etc/kubernetes/pki");
        let read = |n: &str| fs::read(pki.join(n)).unwrap();
        self.etcd_client = (
            read("etcd/healthcheck-client.crt"),
            read("etcd/healthcheck-client.key"),
        );
        self.api_client = (
            read("apiserver-kubelet-client.crt"),
            read("apiserver-kubelet-client.key"),
        );
    }

    fn probe(&self, port: u16, path: &str, ca: &[u8], pair: &(Vec<u8>, Vec<u8>)) -> (bool, bool) {
        probe_state(port, path, ca, pair)
    }

    /// etcd `/health` and kube-apiserver `/readyz` of every node.
    fn sample(&self) -> Sample {
        self.sample_with(
            |_| (self.ca.clone(), self.etcd_client.clone()),
            |_| (self.api_ca.clone(), self.api_client.clone()),
        )
    }

    /// [`Self::sample`], each node's etcd probed with the CA and client pair `etcd_creds(i)`.
    /// Each node's etcd and kube-apiserver probed with the credentials `etcd_creds(i)` and
    /// `api_creds(i)` give: (CA, (client certificate, key)).
    fn sample_with(
        &self,
        etcd_creds: impl Fn(usize) -> Creds,
        api_creds: impl Fn(usize) -> Creds,
    ) -> Sample {
        let mut x = Sample {
            at: Instant::now(),
            etcd_up: vec![false; 3],
            etcd: vec![false; 3],
            api: vec![false; 3],
        };
        for (i, n) in self.nodes.iter().enumerate() {
            let (ca, pair) = etcd_creds(i);
            let (up, healthy) = self.probe(2379 + n.offset, "/health", &ca, &pair);
            x.etcd_up[i] = up;
            x.etcd[i] = healthy;
            let (ca, pair) = api_creds(i);
            x.api[i] = self.probe(6443 + n.offset, "/readyz", &ca, &pair).1;
        }
        x
    }

    /// A gateway client to the cluster's etcd, with the healthcheck client pair.
    fn gateway(&self) -> Client {
        Client::new(&Access::new(
            self.nodes
                .iter()
                .map(|n| format!("https://127.0.0.1:{}", 2379 + n.offset))
                .collect(),
            "healthcheck-client.crt".into(),
            self.ca.clone(),
            self.etcd_client.0.clone(),
            self.etcd_client.1.clone(),
        ))
        .unwrap()
    }

    fn etcdctl(&self, args: &[&str]) -> Output {
        let dir = self.dir.join("etcdctl");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("ca.crt"), &self.ca).unwrap();
        fs::write(dir.join("c.crt"), &self.etcd_client.0).unwrap();
        fs::write(dir.join("c.key"), &self.etcd_client.1).unwrap();
        self.etcdctl_with(
            (dir.join("ca.crt"), dir.join("c.crt"), dir.join("c.key")),
            args,
        )
    }

    /// etcdctl on every member with the CA file and client pair `(ca, cert, key)`.
    fn etcdctl_with(&self, (ca, cert, key): (PathBuf, PathBuf, PathBuf), args: &[&str]) -> Output {
        let eps = self
            .nodes
            .iter()
            .map(|n| format!("https://127.0.0.1:{}", 2379 + n.offset))
            .collect::<Vec<_>>()
            .join(",");
        etcdctl(&eps, &ca, &cert, &key)
            .args(&["--command-timeout", "5s"])
            .args(args)
            .run()
    }

    /// `run --once` on node `i` in the background, cluster mode on.
    /// A pass on node `i`. The nodes' certificates expire in two days, inside the three-day
    /// `--held-cert-margin` these passes are given: kube-apiserver (v1.20.2, which keeps the old
    /// apiserver-kubelet-client on open connections) is restarted, as on a node renewed late,
    /// so that these tests keep exercising apiserver restarts under the cluster lock.
    fn spawn_pass(&self, i: usize, tag: &str, extra: &[&str]) -> Background {
        self.spawn_pass_margin(i, tag, "3d", extra)
    }

    /// A pass on node `i` with `--held-cert-margin margin`.
    fn spawn_pass_margin(&self, i: usize, tag: &str, margin: &str, extra: &[&str]) -> Background {
        certrotor(&["run", "--once", "--root", s(&self.nodes[i].root)])
            .args(&PASS_FLAGS)
            .args(&["--held-cert-margin", margin, "--output", "json"])
            .args(extra)
            .spawn(&self.dir, &format!("pass-{tag}-node-{i}"))
    }
}

impl Drop for Stacked3 {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            // kubelet-sim stops its pods on SIGTERM.
            stop_kubelet(&mut n.kubelet);
        }
        if std::thread::panicking() {
            eprintln!("kept for inspection: {}", self.dir.display());
        }
    }
}

/// A finished background command: its exit code and output.
struct Finished {
    stdout: String,
    text: String,
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn finished(p: &mut Background) -> (Option<i32>, Finished) {
    let text = p.describe();
    let status = p.kill().and_then(|s| s.code());
    (
        status,
        Finished {
            stdout: fs::read_to_string(&p.stdout).unwrap_or_default(),
            text,
        },
    )
}

#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    /// Each member answers /health at all.
    etcd_up: Vec<bool>,
    /// Each member answers healthy (up, with a leader).
    etcd: Vec<bool>,
    api: Vec<bool>,
}

/// Samples every 100 ms until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(sample: impl Fn() -> Sample + Send + 'static) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, samples) = (stop.clone(), samples.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let next = Instant::now() + Duration::from_millis(100);
                    let x = sample();
                    samples.lock().unwrap().push(x);
                    if let Some(d) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                }
            })
        };
        Sampler {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<Sample> {
        self.halt();
        self.samples.lock().unwrap().clone()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A test that fails while sampling still stops the thread, which releases its hold on the
/// cluster, so that the cluster's processes are stopped too.
impl Drop for Sampler {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The longest stretch of consecutive samples where `bad` holds.
fn longest(samples: &[Sample], bad: impl Fn(&Sample) -> bool) -> Duration {
    let (mut best, mut start) = (Duration::ZERO, None::<Instant>);
    for (i, x) in samples.iter().enumerate() {
        if bad(x) {
            let s = *start.get_or_insert(x.at);
            let end = samples.get(i + 1).map(|n| n.at).unwrap_or(x.at);
            best = best.max(end - s);
        } else {
            start = None;
        }
    }
    best
}

/// kubelet-sim's down windows of `pod` on a node, (stopped, next started) in ms since epoch,
/// for stops at or after `since_ms` (when the passes began), whatever stopped it: a restart by
/// certrotor or a crash. A stop before the passes (a component that exited while the cluster
/// came up, which kubelet-sim started again) is not the passes' doing.
fn down_windows(states: &BTreeMap<String, PodState>, pod: &str, since_ms: u128) -> Vec<(u64, u64)> {
    let Some(st) = states.get(pod) else {
        return vec![];
    };
    let h = &st.history;
    (0..h.len().saturating_sub(1))
        .filter_map(|i| Some((h[i].stopped_at_ms?, h[i + 1].started_at_ms)))
        .filter(|&(stopped, _)| u128::from(stopped) >= since_ms)
        .collect()
}

fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// `--restart always` (every component restarted, etcd members one at a time under the lock).
#[test]
fn three_stacked_nodes_due_together_restart_one_at_a_time() {
    stacked_rotation("cluster::three_stacked_nodes", true);
}

/// Live rotation (the default): the real etcd members reload their renewed server and peer
/// certificates without a restart, so no member goes down and the raft leader and term do not
/// change; the real kube-apiserver is restarted (its old apiserver-kubelet-client is within
/// the passes' `--held-cert-margin`, see `Stacked3::spawn_pass`), one node at a time under the
/// cluster lock.
#[test]
fn etcd_peer_renewal_keeps_the_leader() {
    stacked_rotation("cluster::etcd_peer_renewal_keeps_the_leader", false);
}

/// The raft leader and term, as every member reports them (all must agree).
fn leader_and_term(c: &Stacked3) -> (u64, u64) {
    let out = c.etcdctl(&["endpoint", "status", "--write-out", "json"]);
    assert!(out.status.success(), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let all: Vec<(u64, u64)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["Status"]["leader"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("no leader: {}", out.stdout)),
                e["Status"]["raftTerm"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("no raftTerm: {}", out.stdout)),
            )
        })
        .collect();
    assert_eq!(all.len(), 3, "{out}");
    assert!(
        all.iter().all(|x| *x == all[0]),
        "members disagree: {all:?}"
    );
    all[0]
}

/// Runs the three passes `spawn` starts (within the same second) while sampling every 100 ms:
/// the finished passes, the samples, how long the passes took, and when they began (ms since
/// the epoch, for [`down_windows`]).
fn passes_sampled(
    c: &Arc<Stacked3>,
    spawn: impl Fn(usize) -> Background,
) -> (Vec<Background>, Vec<Sample>, Duration, u128) {
    let sampler = {
        let c = c.clone();
        Sampler::start(move || c.sample())
    };
    let started = Instant::now();
    let since = now_ms();
    let mut passes: Vec<Background> = (0..3).map(spawn).collect();
    let deadline = Instant::now() + PASSES_DEADLINE;
    while passes.iter_mut().any(|p| p.running()) {
        assert!(Instant::now() < deadline, "passes hung");
        std::thread::sleep(Duration::from_millis(100));
    }
    let whole = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    (passes, sampler.finish(), whole, since)
}

fn stacked_rotation(test: &str, always: bool) {
    etcd_installed(test);
    let t = TempDir::new(if always {
        "cluster-stacked"
    } else {
        "cluster-live"
    });
    let c = Arc::new(Stacked3::start(&t));
    let put = c.etcdctl(&["put", "certrotor-test/kept", "before-rotation"]);
    assert!(put.status.success(), "{put}");
    let leader_before = leader_and_term(&c);
    let mode = if always { "always" } else { "live" };
    let (mut passes, samples, whole, since) =
        passes_sampled(&c, |i| c.spawn_pass(i, "1", &["--restart", mode]));
    let mut reports = Vec::new();
    for (i, p) in passes.iter_mut().enumerate() {
        let out = finished(p);
        assert_eq!(out.0, Some(0), "node {i}\n{}", out.1);
        let out = out.1;
        let r: serde_json::Value = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("node {i}: not JSON ({e}):\n{}", out.text));
        assert!(
            r["renew"]["backup_id"].is_string(),
            "node {i} renewed nothing\n{out}"
        );
        // Which of these a node restarts last depends on the leader Leases it read (leaders
        // last: all three nodes share one host name here); the order between nodes is checked
        // below from kubelet-sim's histories, and leaders_restart_last checks who goes last.
        let mut restarted = each_field(&r["restarted"], "component");
        restarted.sort_unstable();
        let all = [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ];
        let reloaded = each_field(&r["reloaded"], "component");
        if always {
            assert_eq!(restarted, all, "node {i}\n{out}");
            assert!(reloaded.is_empty(), "node {i}\n{out}");
        } else {
            assert_eq!(restarted, all[1..], "node {i}\n{out}");
            assert_eq!(reloaded, ["etcd"], "node {i}\n{out}");
        }
        assert_eq!(r["cluster"]["lock"], "acquired", "node {i}\n{out}");
        assert!(r["rolled_back"].is_null(), "node {i}\n{out}");
        reports.push(r);
    }
    // Independent oracle: kubelet-sim's process history. No two etcd members down at once,
    // no two nodes' restart sequences overlapping.
    let states: Vec<_> = c.nodes.iter().map(|n| n.states()).collect();
    let etcd_windows: Vec<Vec<(u64, u64)>> = states
        .iter()
        .map(|s| down_windows(s, "etcd", since))
        .collect();
    if !always {
        // No member was ever stopped, and no election happened.
        assert!(
            etcd_windows.iter().all(|w| w.is_empty()),
            "an etcd member was restarted: {etcd_windows:?}"
        );
        assert_eq!(
            leader_and_term(&c),
            leader_before,
            "the raft leader or term changed"
        );
    }
    for i in (0..3).filter(|_| always) {
        assert_eq!(etcd_windows[i].len(), 1, "node {i}: {:?}", etcd_windows[i]);
        for j in i + 1..3 {
            assert!(
                !overlap(etcd_windows[i][0], etcd_windows[j][0]),
                "etcd members of nodes {i} and {j} were down together: {etcd_windows:?}"
            );
        }
    }
    let api_windows: Vec<(u64, u64)> = states
        .iter()
        .map(|s| down_windows(s, "kube-apiserver", since)[0])
        .collect();
    assert!(
        !(overlap(api_windows[0], api_windows[1])
            && overlap(api_windows[1], api_windows[2])
            && overlap(api_windows[0], api_windows[2])),
        "all apiservers down together: {api_windows:?}"
    );
    // The samples: never two members down, at least one apiserver ready at every sample.
    assert!(samples.len() > 20, "only {} samples", samples.len());
    for x in &samples {
        let down = x.etcd_up.iter().filter(|u| !**u).count();
        assert!(down <= 1, "two etcd members down at once: {x:?}");
        assert!(always || down == 0, "an etcd member down: {x:?}");
        assert!(x.api.iter().any(|u| *u), "no apiserver ready: {x:?}");
    }
    let any_member_down = longest(&samples, |x| x.etcd_up.iter().any(|u| !*u));
    let any_member_unhealthy = longest(&samples, |x| x.etcd.iter().any(|u| !*u));
    let no_api = longest(&samples, |x| x.api.iter().all(|u| !*u));
    // Data written before is read back after.
    let get = c.etcdctl(&["get", "certrotor-test/kept", "--print-value-only"]);
    assert!(
        get.status.success() && get.stdout.trim() == "before-rotation",
        "{get}"
    );
    let waited: Vec<u128> = reports
        .iter()
        .map(|r| r["cluster"]["waited_ms"].as_u64().unwrap_or(0) as u128)
        .collect();
    eprintln!(
        "FIGURES stacked x3 --restart {mode}: whole cluster rotated in {} ms; longest window with a member down \
         {} ms (unhealthy, including elections, {} ms); longest window with no apiserver ready \
         {} ms; per node, longest window its apiserver was not ready {:?} ms and its etcd \
         member down {:?} ms (health polled every 100 ms); lock waits {waited:?} ms; {} samples",
        whole.as_millis(),
        any_member_down.as_millis(),
        any_member_unhealthy.as_millis(),
        no_api.as_millis(),
        (0..3)
            .map(|i| longest(&samples, |x| !x.api[i]).as_millis())
            .collect::<Vec<_>>(),
        (0..3)
            .map(|i| longest(&samples, |x| !x.etcd_up[i]).as_millis())
            .collect::<Vec<_>>(),
        samples.len()
    );
}

// === external etcd: three etcdadm nodes, two control planes ===

/// Rewrites a copied lab root's ports (manifests and kubeconfigs) from offset `from` to `to`.
fn shift_ports(root: &Path, from: u16, to: u16) {
    let mut files: Vec<PathBuf> = fs::read_dir(root.join("etc/kubernetes/manifests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.extend(
        fs::read_dir(root.join("etc/kubernetes"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf")),
    );
    for f in files {
        let mut text = fs::read_to_string(&f).unwrap();
        for p in PORTS {
            for sep in [":", "="] {
                text = text.replace(&format!("{sep}{}", p + from), &format!("{sep}{}", p + to));
            }
        }
        fs::write(&f, text).unwrap();
    }
}

/// Sets `--flag=value` in a manifest (the line must exist).
fn set_flag(manifest: &Path, flag: &str, value: &str) {
    let text = fs::read_to_string(manifest).unwrap();
    let prefix = format!("- --{flag}=");
    assert!(
        text.contains(&prefix),
        "{} has no --{flag}",
        manifest.display()
    );
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with(&prefix) {
                format!("    - --{flag}={value}")
            } else {
                l.to_string()
            }
        })
        .collect();
    fs::write(manifest, out.join("\n") + "\n").unwrap();
}

/// kubelet-sim for a node root.
pub(crate) fn kubelet_for(root: &Path, dir: &Path, tag: &str, path: &str) -> Background {
    kubelet_cmd(root, path).spawn(dir, &format!("kubelet-sim-{tag}"))
}

/// The kubelet-sim command line for a node root, with `path` as its `PATH`.
fn kubelet_cmd(root: &Path, path: &str) -> Cmd {
    Cmd::new(sibling("kubelet-sim"))
        .args(&[
            "--manifests",
            s(&root.join("etc/kubernetes/manifests")),
            "--state-dir",
            s(&root.join("var/lib/kubelet-sim")),
            "--root",
            s(root),
            "--log-dir",
            s(&root.join("var/log/pods")),
        ])
        .args(&KUBELET_SIM_PACE)
        .env("PATH", path)
}

pub(crate) fn stop_kubelet(k: &mut Option<Background>) {
    if let Some(mut k) = k.take() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &k.pid().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(10);
        while k.running() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        k.kill();
    }
}

fn tls_ok(port: u16, path: &str, ca: &[u8], pair: &(Vec<u8>, Vec<u8>)) -> bool {
    probe_state(port, path, ca, pair).1
}

/// (answered at all, healthy). A member that answers without a leader (an election) is up but
/// not healthy; one that does not answer is down. "Does not answer" is not a probe that ran out
/// of time on a busy machine: when the first probe (2 s) fails while something still accepts
/// connections on the port, it is asked once more with a longer bound (10 s), and only what
/// fails that too (a refused certificate fails at once again) is down.
/// A CA bundle and a client pair (PEM), as a probe takes them.
type Creds = (Vec<u8>, (Vec<u8>, Vec<u8>));

pub(crate) fn probe_state(
    port: u16,
    path: &str,
    ca: &[u8],
    pair: &(Vec<u8>, Vec<u8>),
) -> (bool, bool) {
    let mut p = Probe {
        address: SocketAddr::from(([127, 0, 0, 1], port)),
        path: path.into(),
        ca_pem: Some(ca.to_vec()),
        client_cert_pem: Some(pair.0.clone()),
        client_key_pem: Some(pair.1.clone()),
        timeout: Duration::from_secs(2),
    };
    let mut answer = verify::probe(&p);
    if answer.is_err() && std::net::TcpStream::connect_timeout(&p.address, p.timeout).is_ok() {
        p.timeout = Duration::from_secs(10);
        answer = verify::probe(&p);
    }
    match answer {
        Ok(o) => (true, o.healthy()),
        Err(_) => (false, false),
    }
}

/// Three etcdadm-layout etcd nodes forming one cluster and two external-etcd control planes,
/// all copies of one lab cluster (same CAs), each run by its own kubelet-sim.
struct External {
    dir: PathBuf,
    etcd: Vec<CpNode>,
    cps: Vec<CpNode>,
    ca: Vec<u8>,
    etcd_client: (Vec<u8>, Vec<u8>),
    api_ca: Vec<u8>,
    api_client: (Vec<u8>, Vec<u8>),
}

impl External {
    fn start(t: &TempDir) -> External {
        External::start_expiring(t, "2d")
    }

    /// Leaves expiring in `expires_in`.
    fn start_expiring(t: &TempDir, expires_in: &str) -> External {
        let offs = offsets(5);
        let template = t.join("template");
        lab_node(
            &template,
            &["--topology", "external-etcd"],
            expires_in,
            offs[0],
        );
        let client_url = |o: u16| format!("https://127.0.0.1:{}", 2379 + o);
        let initial = (0..3)
            .map(|i| format!("e-{i}=https://127.0.0.1:{}", 2380 + offs[i]))
            .collect::<Vec<_>>()
            .join(",");
        let servers = (0..3)
            .map(|i| client_url(offs[i]))
            .collect::<Vec<_>>()
            .join(",");
        let bin_dir = t.join("bin");
        testkit::k8s::link_control_plane(&bin_dir);
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut etcd = Vec::new();
        for (i, off) in offs.iter().enumerate().take(3) {
            let root = t.join(&format!("etcd-{i}"));
            copy_tree(&template.join("etcd"), &root);
            shift_ports(&root, offs[0], *off);
            let m = root.join("etc/kubernetes/manifests/etcd.yaml");
            set_flag(&m, "name", &format!("e-{i}"));
            set_flag(&m, "initial-cluster", &initial);
            etcd.push(CpNode {
                kubelet: Some(kubelet_for(&root, &t.path, &format!("etcd-{i}"), &path)),
                root,
                offset: *off,
            });
        }
        let mut cps = Vec::new();
        for (j, off) in offs.iter().enumerate().skip(3) {
            let root = t.join(&format!("cp-{}", j - 3));
            copy_tree(&template.join("control-plane"), &root);
            shift_ports(&root, offs[0], *off);
            set_flag(
                &root.join("etc/kubernetes/manifests/kube-apiserver.yaml"),
                "etcd-servers",
                &servers,
            );
            cps.push(CpNode {
                kubelet: Some(kubelet_for(&root, &t.path, &format!("cp-{}", j - 3), &path)),
                root,
                offset: *off,
            });
        }
        let e = template.join("etcd/etc/etcd/pki");
        let k = template.join("control-plane/etc/kubernetes/pki");
        let x = External {
            dir: t.path.clone(),
            etcd,
            cps,
            ca: fs::read(e.join("ca.crt")).unwrap(),
            etcd_client: (
                fs::read(e.join("etcdctl-etcd-client.crt")).unwrap(),
                fs::read(e.join("etcdctl-etcd-client.key")).unwrap(),
            ),
            api_ca: fs::read(k.join("ca.crt")).unwrap(),
            api_client: (
                fs::read(k.join("apiserver-kubelet-client.crt")).unwrap(),
                fs::read(k.join("apiserver-kubelet-client.key")).unwrap(),
            ),
        };
        wait_for(
            "three etcd members and two apiservers healthy",
            UP_DEADLINE,
            || {
                let s = x.sample();
                (s.etcd.iter().all(|b| *b) && s.api.iter().all(|b| *b)).then_some(())
            },
        );
        wait_components(&x.cps);
        testkit::k8s::grant_cluster_admins(&x.cps[0].root.join("etc/kubernetes/super-admin.conf"));
        x
    }

    fn sample(&self) -> Sample {
        let etcd: Vec<(bool, bool)> = self
            .etcd
            .iter()
            .map(|n| probe_state(2379 + n.offset, "/health", &self.ca, &self.etcd_client))
            .collect();
        Sample {
            at: Instant::now(),
            etcd_up: etcd.iter().map(|e| e.0).collect(),
            etcd: etcd.iter().map(|e| e.1).collect(),
            api: self
                .cps
                .iter()
                .map(|n| tls_ok(6443 + n.offset, "/readyz", &self.api_ca, &self.api_client))
                .collect(),
        }
    }

    fn pass(&self, root: &Path, tag: &str) -> Background {
        certrotor(&["run", "--once", "--root", s(root)])
            .args(&PASS_FLAGS)
            .args(&["--output", "json"])
            .spawn(&self.dir, &format!("pass-{tag}"))
    }

    /// A pass on every control plane at once, run to the end ([`wait_passes`]); `tag` names
    /// their logs.
    fn cp_passes(&self, tag: &str) -> Vec<(Option<i32>, serde_json::Value, String)> {
        let passes = self.cps.iter().enumerate();
        wait_passes(
            passes
                .map(|(j, n)| self.pass(&n.root, &format!("{tag}-cp-{j}")))
                .collect(),
        )
    }

    /// The etcd client pair a control plane holds (certificate, key).
    fn cp_pair(&self, j: usize) -> (Vec<u8>, Vec<u8>) {
        let pki = self.cps[j].root.join("etc/kubernetes/pki");
        (
            fs::read(pki.join("apiserver-etcd-client.crt")).unwrap(),
            fs::read(pki.join("apiserver-etcd-client.key")).unwrap(),
        )
    }

    /// `etcdctl get` of the published pair, as JSON.
    fn published(&self) -> Option<serde_json::Value> {
        let dir = self.dir.join("etcdctl");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("ca.crt"), &self.ca).unwrap();
        fs::write(dir.join("c.crt"), &self.etcd_client.0).unwrap();
        fs::write(dir.join("c.key"), &self.etcd_client.1).unwrap();
        let out = self
            .etcdctl()
            .args(&["get", cluster::PAIR_KEY, "--print-value-only"])
            .run();
        assert!(out.status.success(), "{out}");
        let v = out.stdout.trim();
        (!v.is_empty()).then(|| serde_json::from_str(v).unwrap())
    }

    /// Writes a value under the published pair's key (fault injection).
    fn put_published(&self, value: &str) {
        let out = self
            .etcdctl()
            .args(&["put", cluster::PAIR_KEY])
            .stdin(value.as_bytes())
            .run();
        assert!(out.status.success(), "{out}");
    }

    /// `etcdctl` at the first etcd node with the files [`External::published`] writes.
    fn etcdctl(&self) -> Cmd {
        let dir = self.dir.join("etcdctl");
        let endpoint = format!("https://127.0.0.1:{}", 2379 + self.etcd[0].offset);
        let (ca, cert, key) = (dir.join("ca.crt"), dir.join("c.crt"), dir.join("c.key"));
        etcdctl(&endpoint, &ca, &cert, &key)
    }
}

impl Drop for External {
    fn drop(&mut self) {
        for n in self.cps.iter_mut().chain(self.etcd.iter_mut()) {
            stop_kubelet(&mut n.kubelet);
        }
        if std::thread::panicking() {
            eprintln!("kept for inspection: {}", self.dir.display());
        }
    }
}

/// Runs passes to the end ([`PASSES_DEADLINE`]); returns (exit code, JSON report or Null, text).
fn wait_passes(mut passes: Vec<Background>) -> Vec<(Option<i32>, serde_json::Value, String)> {
    let deadline = Instant::now() + PASSES_DEADLINE;
    while passes.iter_mut().any(|p| p.running()) {
        assert!(Instant::now() < deadline, "passes hung");
        std::thread::sleep(Duration::from_millis(100));
    }
    passes
        .iter_mut()
        .map(|p| {
            let (code, f) = finished(p);
            let json = serde_json::from_str(&f.stdout).unwrap_or(serde_json::Value::Null);
            (code, json, f.text)
        })
        .collect()
}

#[test]
fn external_etcd_pair_reaches_every_control_plane_without_a_person() {
    etcd_installed("cluster::external_etcd_pair");
    let t = TempDir::new("cluster-external");
    let x = Arc::new(External::start(&t));
    let old_pair = x.cp_pair(0);
    let sampler = {
        let x = x.clone();
        Sampler::start(move || x.sample())
    };
    let started = Instant::now();
    // Every node starts its pass in the same second.
    let mut passes: Vec<Background> = Vec::new();
    for (i, n) in x.etcd.iter().enumerate() {
        passes.push(x.pass(&n.root, &format!("1-etcd-{i}")));
    }
    for (j, n) in x.cps.iter().enumerate() {
        passes.push(x.pass(&n.root, &format!("1-cp-{j}")));
    }
    let first = wait_passes(passes);
    for (code, r, text) in &first {
        assert_eq!(*code, Some(0), "{text}");
        assert!(
            r["renew"]["backup_id"].is_string(),
            "renewed nothing\n{text}"
        );
    }
    let published_by: Vec<&String> = first[..3]
        .iter()
        .filter(|(_, r, _)| r["cluster"]["pair"].is_string())
        .map(|(_, _, t)| t)
        .collect();
    assert_eq!(
        published_by.len(),
        1,
        "not exactly one publisher: {first:#?}"
    );
    // A control plane whose pass ran before the publication picks it up on its next pass, as
    // the daemon does.
    let second = x.cp_passes("2");
    for (code, _, text) in &second {
        assert_eq!(*code, Some(0), "{text}");
    }
    let whole = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let samples = sampler.finish();
    // One pair cluster-wide: both control planes hold the published pair, which is new.
    let published = x.published().expect("a published pair");
    let pub_cert = published["cert_pem"].as_str().unwrap().as_bytes().to_vec();
    let (p0, p1) = (x.cp_pair(0), x.cp_pair(1));
    assert_ne!(p0.0, old_pair.0, "control plane 0 still has the old pair");
    assert_eq!(p0, p1, "the control planes hold different pairs");
    assert_eq!(
        fingerprint_of(&p0.0),
        fingerprint_of(&pub_cert),
        "control plane pair is not the published one"
    );
    let etcd_files: Vec<Vec<u8>> = x
        .etcd
        .iter()
        .map(|n| fs::read(n.root.join("etc/etcd/pki/apiserver-etcd-client.crt")).unwrap())
        .collect();
    assert!(
        etcd_files
            .iter()
            .any(|f| fingerprint_of(f) == fingerprint_of(&pub_cert)),
        "the published pair is no etcd node's"
    );
    // Both apiservers were restarted after the pair was installed (kube-apiserver reads its
    // etcd client pair only at start) and are ready (/readyz checks etcd with that pair).
    for (j, n) in x.cps.iter().enumerate() {
        let installed_ms = fs::metadata(n.root.join("etc/kubernetes/pki/apiserver-etcd-client.crt"))
            .unwrap()
            .modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let api = &n.states()["kube-apiserver"];
        let started = api.history.last().unwrap().started_at_ms;
        assert!(
            api.running && started >= installed_ms,
            "control plane {j}: kube-apiserver last started at {started}, the pair was installed at \
             {installed_ms}"
        );
    }
    let last = samples.last().unwrap();
    assert!(last.api.iter().all(|u| *u), "{last:?}");
    // Never two members down, at least one apiserver ready at every sample.
    for s in &samples {
        assert!(s.etcd_up.iter().filter(|u| !**u).count() <= 1, "{s:?}");
        assert!(s.api.iter().any(|u| *u), "no apiserver ready: {s:?}");
    }
    eprintln!(
        "FIGURES external 3 etcd + 2 cp: whole cluster rotated in {} ms (two control-plane \
         passes); longest window with a member down {} ms; longest with no apiserver ready {} ms",
        whole.as_millis(),
        longest(&samples, |s| s.etcd_up.iter().any(|u| !*u)).as_millis(),
        longest(&samples, |s| s.api.iter().all(|u| !*u)).as_millis()
    );

    // Faults: a published pair that is corrupt, then one signed by another CA with a later
    // expiry: refused on every control plane with a clear error, nothing installed.
    let before: Vec<_> = (0..2).map(|j| x.cp_pair(j)).collect();
    x.put_published("{\"version\":1,\"cert_pem\":\"garbage\"");
    for (code, r, text) in x.cp_passes("corrupt") {
        assert_eq!(code, Some(2), "{text}");
        let e = r["cluster"]["pair_error"].as_str().unwrap_or_default();
        assert!(
            e.contains("not readable") && e.contains("nothing was installed"),
            "{text}"
        );
    }
    let other = t.join("other-ca");
    lab(
        &other,
        &["--topology", "external-etcd", "--expires-in", "1000d"],
    );
    let o = other.join("etcd/etc/etcd/pki");
    let foreign = serde_json::json!({
        "version": 1,
        "cert_pem": fs::read_to_string(o.join("apiserver-etcd-client.crt")).unwrap(),
        "key_pem": fs::read_to_string(o.join("apiserver-etcd-client.key")).unwrap(),
        "published_by": "intruder",
        "published_at": "2026-01-01T00:00:00Z",
    });
    x.put_published(&foreign.to_string());
    for (code, r, text) in x.cp_passes("foreign") {
        assert_eq!(code, Some(2), "{text}");
        let e = r["cluster"]["pair_error"].as_str().unwrap_or_default();
        assert!(
            e.contains("refused") && e.contains("nothing was changed"),
            "{text}"
        );
        assert!(
            !text.contains("PRIVATE KEY"),
            "key material in the output\n{text}"
        );
    }
    let after: Vec<_> = (0..2).map(|j| x.cp_pair(j)).collect();
    assert_eq!(before, after, "a refused pair changed files");
    // The old pair is still used: the apiservers are ready and were not restarted.
    let s = x.sample();
    assert!(s.api.iter().all(|u| *u), "{s:?}");
}

fn fingerprint_of(pem: &[u8]) -> String {
    openssl_in(pem, &["x509", "-noout", "-fingerprint", "-sha256"])
}

/// A live pass (the default `--restart live`) after a full renewal: etcd reloaded its
/// certificates without a restart (or, in a pass that finishes owed restarts, was not
/// touched), the three others were restarted, each with its reason.
#[track_caller]
fn live_pass(r: &serde_json::Value, what: &str) {
    let names = |k: &str| each_field(&r[k], "component");
    assert_eq!(
        names("restarted"),
        [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler"
        ],
        "{what}: {r:#}"
    );
    // A pass that only finishes restarts an earlier pass owed renews nothing and reloads
    // nothing.
    let reloaded = names("reloaded");
    assert!(
        reloaded == ["etcd"] || (reloaded.is_empty() && r["renew"]["backup_id"].is_null()),
        "{what}: {r:#}"
    );
    for x in r["restarted"].as_array().unwrap() {
        assert!(
            x["reason"].as_str().is_some_and(|s| !s.is_empty()),
            "{what}: a restart without its reason: {r:#}"
        );
    }
}

/// The JSON report of a finished pass, asserting its exit code.
#[track_caller]
fn report_of(p: &mut Background, code: i32) -> serde_json::Value {
    let (got, f) = finished(p);
    assert_eq!(got, Some(code), "{f}");
    serde_json::from_str(&f.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{f}"))
}

#[test]
/// `--restart always`: the etcd members are restarted, so the etcd gate is what keeps two of
/// them from going down together.
fn a_member_down_before_the_pass_stops_every_restart_until_it_is_back() {
    etcd_installed("cluster::a_member_down");
    let t = TempDir::new("cluster-member-down");
    let c = Stacked3::start(&t);
    // Node 2's member goes down (its kubelet stops it when the manifest goes away).
    let manifest = c.nodes[2].root.join("etc/kubernetes/manifests/etcd.yaml");
    let aside = t.join("etcd.yaml.aside");
    fs::rename(&manifest, &aside).unwrap();
    wait_for("node 2's etcd down", Duration::from_secs(30), || {
        (!c.sample().etcd[2]).then_some(())
    });
    let before: Vec<_> = c.nodes.iter().map(|n| n.states()).collect();
    let mut passes: Vec<Background> = (0..2)
        .map(|i| c.spawn_pass(i, "down", &["--cluster-wait", "3s", "--restart", "always"]))
        .collect();
    for (i, p) in passes.iter_mut().enumerate() {
        p.finish_within(PASS_BOUND);
        let r = report_of(p, 4);
        // Files are renewed; restarts wait, and the report says for what.
        assert!(r["renew"]["backup_id"].is_string(), "node {i}: {r:#}");
        assert_eq!(
            r["restarted"].as_array().unwrap().len(),
            0,
            "node {i}: {r:#}"
        );
        assert_eq!(r["cluster"]["deferred"], true, "node {i}: {r:#}");
        assert_eq!(r["cluster"]["lock"], "not acquired", "node {i}: {r:#}");
        let waited = r["cluster"]["waited_for"].to_string();
        assert!(
            waited.contains("member 'cp-2'") && waited.contains("etcd-members-healthy"),
            "node {i}: {waited}"
        );
    }
    // Nothing was restarted on nodes 0 and 1 (kubelet-sim's history).
    for (i, before) in before.iter().enumerate().take(2) {
        let after = c.nodes[i].states();
        for pod in ["etcd", "kube-apiserver"] {
            assert_eq!(
                before[pod].history.len(),
                after[pod].history.len(),
                "node {i}: {pod} was restarted while a member was down"
            );
        }
    }
    // The table says the same, and what the node waited for.
    let table = certrotor(&[
        "run",
        "--once",
        "--root",
        s(&c.nodes[0].root),
        "--platform",
        "kubeadm",
        "--cluster-wait",
        "2s",
        "--restart",
        "always",
    ])
    .run()
    .expect_code(4)
    .stdout;
    for words in [
        "Cluster: node cp-0, lock not acquired",
        "gate etcd-members-healthy",
        "FAILED",
        "waited for: gate etcd-members-healthy: member 'cp-2'",
        "put off: they stay owed to the next pass",
    ] {
        assert!(table.contains(words), "table lacks '{words}':\n{table}");
    }
    // The member is back: every node finishes (nodes 0 and 1 the restarts they owe).
    fs::rename(&aside, &manifest).unwrap();
    wait_for("node 2's etcd back", Duration::from_secs(60), || {
        c.sample().etcd[2].then_some(())
    });
    let since = now_ms();
    let mut passes: Vec<Background> = (0..3)
        .map(|i| c.spawn_pass(i, "back", &["--restart", "always"]))
        .collect();
    let deadline = Instant::now() + PASSES_DEADLINE;
    while passes.iter_mut().any(|p| p.running()) {
        assert!(Instant::now() < deadline, "passes hung");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut windows = Vec::new();
    for (i, p) in passes.iter_mut().enumerate() {
        let r = report_of(p, 0);
        assert_eq!(
            r["restarted"].as_array().unwrap().len(),
            4,
            "node {i}: {r:#}"
        );
        let w = down_windows(&c.nodes[i].states(), "etcd", since);
        windows.push(*w.last().unwrap());
    }
    for i in 0..3 {
        for j in i + 1..3 {
            assert!(
                !overlap(windows[i], windows[j]),
                "members {i} and {j} down together: {windows:?}"
            );
        }
    }
}

#[test]
fn killing_the_lock_holder_mid_restart_lets_the_others_proceed_after_the_lease() {
    etcd_installed("cluster::killing_the_lock_holder");
    let t = TempDir::new("cluster-kill-holder");
    let c = Stacked3::start(&t);
    let mut passes: Vec<Background> = (0..3).map(|i| c.spawn_pass(i, "1", &[])).collect();
    // The holder is in the middle of restarting kube-apiserver: its manifest is parked.
    let parked = |i: usize| {
        c.nodes[i]
            .root
            .join("etc/kubernetes/.certrotor-parked/kube-apiserver.yaml")
            .exists()
    };
    let logs: Vec<PathBuf> = passes.iter().map(|p| p.stderr.clone()).collect();
    let log = |i: usize| fs::read_to_string(&logs[i]).unwrap_or_default();
    // Kill when another node has yet to take the lock in this pass (it must wait for this
    // holder's lease). Waiting nodes may be held at the etcd gate rather than the lock while the
    // holder restarts its member, so their log need not say "lock held" yet.
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(120);
    let victim = loop {
        let hit = (0..3).find(|i| {
            let p = parked(*i);
            if p {
                seen.push(*i);
            }
            p && (0..3).any(|j| j != *i && !log(j).contains("cluster lock acquired"))
        });
        if let Some(v) = hit {
            break v;
        }
        assert!(
            Instant::now() < end,
            "no node restarted kube-apiserver while another had yet to take the lock; parked seen: \
             {seen:?}; logs: {:#?}",
            (0..3).map(log).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let acquired = |i: usize| log(i).matches("cluster lock acquired").count();
    let before: Vec<usize> = (0..3).map(acquired).collect();
    // The next holder gets the lock only when the dead holder's lease (4 s, refreshed every
    // 4/3 s) has expired. Shown by etcd, not by the clock: before the kill the lock key names
    // the pass about to die and hangs on its 4 s lease; once another node holds the lock, etcd
    // says that lease is gone (certrotor only ever revokes its own leases).
    let gw = c.gateway();
    let holder = gw.get(LOCK_KEY).unwrap().expect("the holder's lock key");
    let holder = String::from_utf8_lossy(&holder);
    let victim_pid = passes[victim].pid();
    assert!(
        holder.contains(&format!("\"pid\":{victim_pid}")),
        "the lock is not the parked pass's: {holder}"
    );
    let dead_lease = key_lease(&gw, LOCK_KEY).expect("the holder's lock key");
    let (granted, left) = lease_ttl(&gw, dead_lease);
    assert!(
        granted == 4 && left >= 0,
        "the holder's lease: {granted} s granted, {left} s left"
    );
    passes[victim].kill();
    let killed_at = Instant::now();
    wait_for("another node to take the lock", UP_DEADLINE, || {
        (0..3)
            .any(|i| i != victim && acquired(i) > before[i])
            .then_some(())
    });
    let next_after = killed_at.elapsed();
    assert_eq!(
        lease_ttl(&gw, dead_lease).1,
        -1,
        "another node took the lock while the dead holder's lease lived"
    );
    let deadline = Instant::now() + PASSES_DEADLINE;
    while passes
        .iter_mut()
        .enumerate()
        .any(|(i, p)| i != victim && p.running())
    {
        assert!(Instant::now() < deadline, "passes hung");
        std::thread::sleep(Duration::from_millis(100));
    }
    let survivors_done = killed_at.elapsed();
    for (i, p) in passes.iter_mut().enumerate() {
        if i == victim {
            continue;
        }
        let r = report_of(p, 0);
        assert_eq!(r["cluster"]["lock"], "acquired", "node {i}: {r:#}");
        live_pass(&r, &format!("node {i}"));
    }
    // The killed node's apiserver stayed down; its next pass finishes what it owed.
    assert!(!c.sample().api[victim]);
    let mut next = c.spawn_pass(victim, "2", &[]);
    next.finish_within(PASS_BOUND);
    let r = report_of(&mut next, 0);
    let restarted = each_field(&r["restarted"], "component");
    assert!(
        restarted.contains(&"kube-controller-manager") && restarted.contains(&"kube-scheduler"),
        "{r:#}"
    );
    let s = c.sample();
    assert!(
        s.api.iter().all(|u| *u) && s.etcd.iter().all(|u| *u),
        "{s:?}"
    );
    assert!(
        !c.nodes[victim]
            .root
            .join("etc/kubernetes/.certrotor-parked/kube-apiserver.yaml")
            .exists()
    );
    eprintln!(
        "FIGURES kill -9 of the holder: the next node took the lock {} ms after the kill, the \
         two other nodes finished {} ms after the kill (lease TTL 4 s)",
        next_after.as_millis(),
        survivors_done.as_millis()
    );
}

#[test]
fn no_other_apiserver_ready_holds_the_restarts() {
    etcd_installed("cluster::no_other_apiserver_ready");
    let t = TempDir::new("cluster-api-gate");
    let c = Stacked3::start(&t);
    // Nodes 1 and 2 register their apiservers (any pass does; a dry run changes nothing).
    for i in 1..3 {
        let mut p = c.spawn_pass(i, "register", &["--dry-run"]);
        p.finish_within(PASS_BOUND);
        report_of(&mut p, 0);
    }
    // Their apiservers go down.
    let aside = |i: usize| t.join(&format!("kube-apiserver-{i}.yaml"));
    let manifest = |i: usize| {
        c.nodes[i]
            .root
            .join("etc/kubernetes/manifests/kube-apiserver.yaml")
    };
    for i in 1..3 {
        fs::rename(manifest(i), aside(i)).unwrap();
    }
    wait_for("apiservers 1 and 2 down", Duration::from_secs(30), || {
        let s = c.sample();
        (!s.api[1] && !s.api[2]).then_some(())
    });
    let before = c.nodes[0].states();
    let mut p = c.spawn_pass(0, "gated", &["--cluster-wait", "3s"]);
    p.finish_within(PASS_BOUND);
    let r = report_of(&mut p, 4);
    let waited = r["cluster"]["waited_for"].to_string();
    assert!(
        waited.contains("another-apiserver-ready") && waited.contains("no other apiserver ready"),
        "{r:#}"
    );
    let after = c.nodes[0].states();
    assert_eq!(
        before["kube-apiserver"].history.len(),
        after["kube-apiserver"].history.len(),
        "the only ready apiserver was restarted"
    );
    // One comes back: the node proceeds.
    fs::rename(aside(1), manifest(1)).unwrap();
    wait_for("apiserver 1 back", UP_DEADLINE, || {
        c.sample().api[1].then_some(())
    });
    let mut p = c.spawn_pass(0, "ungated", &[]);
    p.finish_within(PASS_BOUND);
    let r = report_of(&mut p, 0);
    live_pass(&r, "node 0");
    fs::rename(aside(2), manifest(2)).unwrap();
}

#[test]
fn a_cluster_whose_certificates_all_expired_comes_back() {
    etcd_installed("cluster::all_expired");
    let t = TempDir::new("cluster-all-expired");
    // Every leaf expired a day ago: the members reject each other, no apiserver is ready.
    let mut c = Stacked3::start_expiring(&t, "-1d", false);
    let mut passes: Vec<Background> = (0..3).map(|i| c.spawn_pass(i, "expired", &[])).collect();
    let deadline = Instant::now() + PASSES_DEADLINE;
    while passes.iter_mut().any(|p| p.running()) {
        assert!(Instant::now() < deadline, "passes hung");
        std::thread::sleep(Duration::from_millis(100));
    }
    c.reload_credentials();
    for (i, p) in passes.iter_mut().enumerate() {
        let r = report_of(p, 0);
        // The gates do not hold a node whose own components are down: nothing to protect.
        live_pass(&r, &format!("node {i}"));
        assert!(r["rolled_back"].is_null(), "node {i}: {r:#}");
    }
    let s = c.sample();
    assert!(
        s.etcd.iter().all(|u| *u) && s.api.iter().all(|u| *u),
        "{s:?}"
    );
    let put = c.etcdctl(&["put", "certrotor-test/after", "ok"]);
    assert!(put.status.success(), "{put}");
    // The real controller-manager and scheduler, whose kubeconfigs had expired too, are back.
    wait_components(&c.nodes);
}

#[test]
fn three_daemons_started_in_the_same_second_take_turns() {
    etcd_installed("cluster::three_daemons");
    let t = TempDir::new("cluster-daemons");
    let c = Arc::new(Stacked3::start(&t));
    let sampler = {
        let c = c.clone();
        Sampler::start(move || c.sample())
    };
    let since = now_ms();
    let mut daemons: Vec<Background> = (0..3)
        .map(|i| {
            certrotor(&["daemon", "--interval", "1h", "--root", s(&c.nodes[i].root)])
                .args(&PASS_FLAGS)
                // Every component restarted, etcd members too: they take turns.
                .args(&["--restart", "always"])
                .spawn(&c.dir, &format!("daemon-{i}"))
        })
        .collect();
    let log = |d: &Background| fs::read_to_string(&d.stderr).unwrap_or_default();
    wait_for("every daemon's first pass", PASSES_DEADLINE, || {
        daemons
            .iter()
            .all(|d| log(d).contains("pass done"))
            .then_some(())
    });
    let samples = sampler.finish();
    for (i, d) in daemons.iter_mut().enumerate() {
        let text = log(d);
        assert!(
            text.contains("4 restarted, 0 reloaded live")
                && text.contains("cluster lock acquired after"),
            "daemon {i}:\n{text}"
        );
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &d.pid().to_string()])
            .status();
    }
    let windows: Vec<(u64, u64)> = c
        .nodes
        .iter()
        .map(|n| {
            let w = down_windows(&n.states(), "etcd", since);
            assert_eq!(w.len(), 1, "{w:?}");
            w[0]
        })
        .collect();
    for i in 0..3 {
        for j in i + 1..3 {
            assert!(!overlap(windows[i], windows[j]), "{windows:?}");
        }
    }
    for x in &samples {
        assert!(x.etcd_up.iter().filter(|u| !**u).count() <= 1, "{x:?}");
        assert!(x.api.iter().any(|u| *u), "no apiserver ready: {x:?}");
    }
    for d in &mut daemons {
        wait_for("daemon to stop on SIGTERM", Duration::from_secs(30), || {
            (!d.running()).then_some(())
        });
    }
}

// === the reload table (reload.rs), against the real kube-apiserver v1.20.2 ===

/// Rows `apiserver` and `apiserver-etcd-client` of the reload table. The real kube-apiserver
/// serves a renewed serving certificate without a restart (its dynamic serving certificate
/// controller re-reads the files about once a minute): `run --once --cert apiserver` waits for
/// it and restarts nothing. It also re-reads its etcd client pair for every new connection to
/// etcd (etcd's client TLS loads the files at each handshake): with a pair on disk that etcd
/// refuses and its etcd member restarted, etcd refuses its reconnections; with the right pair
/// back it is ready again, never restarted. Up to ~90 s of waiting for the reload loop: the
/// row cannot be proven faster.
#[test]
fn apiserver_serves_renewed_cert_without_restart() {
    etcd_installed("cluster::apiserver_serves_renewed_cert_without_restart");
    let t = TempDir::new("reload-apiserver");
    let c = Stacked3::start(&t);
    let n0 = &c.nodes[0];
    let pki = n0.root.join("etc/kubernetes/pki");
    let before = n0.states();
    let mut p = c.spawn_pass(
        0,
        "live-api",
        &[
            "--cert",
            "apiserver",
            "--cluster",
            "off",
            "--reload-timeout",
            "150s",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(200);
    while p.running() {
        assert!(Instant::now() < deadline, "the pass hung");
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = report_of(&mut p, 0);
    assert_eq!(r["restarted"], serde_json::json!([]), "{r:#}");
    let reloaded = r["reloaded"].as_array().unwrap();
    assert_eq!(reloaded.len(), 1, "{r:#}");
    assert_eq!(reloaded[0]["component"], "kube-apiserver", "{r:#}");
    let file = fs::read(pki.join("apiserver.crt")).unwrap();
    let want = fingerprint_of(&file).replace(':', "").trim().to_lowercase();
    assert!(
        want.ends_with(reloaded[0]["served_sha256"].as_str().unwrap()),
        "served {} but the file is {want}",
        reloaded[0]["served_sha256"]
    );
    assert_eq!(
        before["kube-apiserver"].history,
        n0.states()["kube-apiserver"].history,
        "kube-apiserver was restarted"
    );
    eprintln!(
        "FIGURES reload: the real kube-apiserver served its renewed certificate {} ms after the \
         renewal, no restart",
        reloaded[0]["reloaded_after_ms"]
    );

    // apiserver-etcd-client: a pair etcd refuses (signed by the front-proxy CA) on disk.
    let read = |n: &str| fs::read(pki.join(n)).unwrap();
    let saved = (
        read("apiserver-etcd-client.crt"),
        read("apiserver-etcd-client.key"),
    );
    fs::write(
        pki.join("apiserver-etcd-client.crt"),
        read("front-proxy-client.crt"),
    )
    .unwrap();
    fs::write(
        pki.join("apiserver-etcd-client.key"),
        read("front-proxy-client.key"),
    )
    .unwrap();
    // Node 0's apiserver talks to node 0's member only: restart that member.
    let manifest = n0.root.join("etc/kubernetes/manifests/etcd.yaml");
    let aside = t.join("etcd.yaml.aside");
    fs::rename(&manifest, &aside).unwrap();
    wait_for("node 0's etcd down", Duration::from_secs(30), || {
        (!c.sample().etcd_up[0]).then_some(())
    });
    fs::rename(&aside, &manifest).unwrap();
    wait_for(
        "node 0's etcd healthy again",
        Duration::from_secs(60),
        || c.sample().etcd[0].then_some(()),
    );
    // On reconnecting, the apiserver presents the pair now on disk, which etcd refuses (etcd's
    // log names the apiserver's handshake): it re-reads the files for every new connection.
    let etcd_log = n0.root.join("var/log/pods/etcd.log");
    wait_for(
        "etcd to refuse the pair now on disk",
        Duration::from_secs(60),
        || {
            fs::read_to_string(&etcd_log)
                .unwrap_or_default()
                .contains("certificate signed by unknown authority")
                .then_some(())
        },
    );
    assert!(!c.sample().api[0], "ready with a pair etcd refuses");
    // The right pair back on disk: ready again, without a restart.
    fs::write(pki.join("apiserver-etcd-client.crt"), &saved.0).unwrap();
    fs::write(pki.join("apiserver-etcd-client.key"), &saved.1).unwrap();
    wait_for(
        "node 0's apiserver ready again with the pair on disk",
        Duration::from_secs(90),
        || c.sample().api[0].then_some(()),
    );
    assert_eq!(
        before["kube-apiserver"].history,
        n0.states()["kube-apiserver"].history,
        "kube-apiserver was restarted"
    );
}

/// Issue 25.4: a pass with nothing to restart takes no cluster lock. Another node holds the
/// lock (a key under a long etcd lease, as a holder in the middle of its restarts would); node
/// 0 renews its kube-apiserver serving certificate, which the apiserver reloads by itself: the
/// pass finishes (exit 0, nothing restarted, kube-apiserver reloaded) with a 5 s cluster wait
/// that a pass needing the lock would have spent waiting and then put its restarts off (exit
/// 4), and the other holder's lock is untouched.
#[test]
fn a_pass_with_nothing_to_restart_takes_no_cluster_lock() {
    etcd_installed("cluster::a_pass_with_nothing_to_restart_takes_no_cluster_lock");
    let t = TempDir::new("no-restart-no-lock");
    let c = Stacked3::start(&t);
    let grant = c.etcdctl(&["lease", "grant", "600"]);
    assert!(grant.status.success(), "{grant}");
    // "lease 694d9a2f3c8b1e0a granted with TTL(600s)"
    let id = grant.stdout.split_whitespace().nth(1).unwrap().to_string();
    let holder = "{\"node\":\"another-node-restarting\"}";
    let put = c.etcdctl(&["put", LOCK_KEY, holder, "--lease", &id]);
    assert!(put.status.success(), "{put}");
    let before = c.nodes[0].states();
    let mut p = c.spawn_pass(
        0,
        "reload-only",
        &[
            "--cert",
            "apiserver",
            "--cluster-wait",
            "5s",
            "--reload-timeout",
            "150s",
        ],
    );
    p.finish_within(PASS_BOUND);
    let r = report_of(&mut p, 0);
    assert_eq!(r["restarted"], serde_json::json!([]), "{r:#}");
    let reloaded: Vec<&str> = each_field(&r["reloaded"], "component");
    assert_eq!(reloaded, ["kube-apiserver"], "{r:#}");
    assert_eq!(
        r["cluster"]["waited_for"].as_array().map_or(0, Vec::len),
        0,
        "{r:#}"
    );
    let get = c.etcdctl(&["get", LOCK_KEY, "--print-value-only"]);
    assert!(get.status.success(), "{get}");
    assert_eq!(get.stdout.trim(), holder, "the lock changed hands\n{r:#}");
    assert_eq!(
        before["kube-apiserver"].history,
        c.nodes[0].states()["kube-apiserver"].history,
        "kube-apiserver was restarted"
    );
    let revoke = c.etcdctl(&["lease", "revoke", &id]);
    assert!(revoke.status.success(), "{revoke}");
}

// === leaders last (issue 25.4) ===

/// The leader Leases of kube-controller-manager and kube-scheduler (v1.20: `leases` is the
/// default lock of both).
const LEADER_LEASES: [&str; 2] = ["kube-controller-manager", "kube-scheduler"];
/// kube-vip's Lease (EKS Anywhere's manifest leaves `vip_leasename` at its default).
const VIP_LEASE: &str = "plndr-cp-lock";

/// The holder of `kube-system/<name>` as node 0's apiserver gives it, once a live holder renews
/// it (its resourceVersion moves under the same holder): which node (`cp-N`) and its identity.
fn live_holder(c: &Stacked3, name: &str) -> (usize, String) {
    let reader = certrotor::restart::lease::Reader::at(
        &certrotor::node::Node::discover(&c.nodes[0].root),
        SocketAddr::from(([127, 0, 0, 1], 6443 + c.nodes[0].offset)),
    )
    .unwrap();
    let read = || reader.get("kube-system", name).ok().flatten();
    wait_for(
        &format!("a live holder of Lease {name}"),
        UP_DEADLINE,
        || {
            let a = read()?;
            std::thread::sleep(Duration::from_secs(3));
            let b = read()?;
            (a.holder == b.holder && a.resource_version != b.resource_version).then_some(b.holder)
        },
    );
    let holder = read().unwrap().holder;
    // A leader elected by client-go is `<host name>_<uuid>`; kube-vip is its host name.
    let host = holder.rsplit_once('_').map_or(holder.as_str(), |(h, _)| h);
    let node = (0..3)
        .find(|i| host == format!("cp-{i}"))
        .unwrap_or_else(|| panic!("Lease {name}: holder '{holder}' is none of cp-0..2"));
    (node, holder)
}

/// Three stacked nodes due together, each component's leader on some node: every node finishes
/// in one pass (no deferral, nothing owed), and for each leader Lease the holder node's restart
/// of that component begins after the other nodes' restarts of it ended (kubelet-sim's process
/// histories), while some apiserver is ready at every 100 ms sample. Then a node holding a Lease
/// whose peer never finishes (a record no one deletes) waits `--leader-wait` and proceeds.
#[test]
fn leaders_restart_last() {
    etcd_installed("cluster::leaders_restart_last");
    let t = TempDir::new("cluster-leaders");
    let c = Arc::new(Stacked3::start_with(&t, "2d", true, true));
    let holders: Vec<(usize, String)> = LEADER_LEASES.iter().map(|l| live_holder(&c, l)).collect();
    let vip = live_holder(&c, VIP_LEASE);
    // The default --held-cert-margin: kube-apiserver and etcd reload live, so the restarts are
    // kube-controller-manager's and kube-scheduler's, and kube-vip's (admin.conf renewed).
    let (mut passes, samples, whole, since) = passes_sampled(&c, |i| {
        c.spawn_pass_margin(i, "1", "24h", &["--settle", "3s"])
    });
    let reports: Vec<serde_json::Value> = passes.iter_mut().map(|p| report_of(p, 0)).collect();
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(r["cluster"]["deferred"], false, "node {i}\n{r:#}");
        assert_eq!(r["cluster"]["lock"], "acquired", "node {i}\n{r:#}");
        assert_eq!(r["owed_pods"], serde_json::json!([]), "node {i}\n{r:#}");
        let mut restarted: Vec<&str> = each_field(&r["restarted"], "component");
        restarted.sort();
        assert_eq!(restarted, LEADER_LEASES, "node {i}\n{r:#}");
        let pods: Vec<&str> = each_field(&r["restarted_pods"], "pod");
        assert_eq!(pods, ["kube-vip.yaml"], "node {i}\n{r:#}");
        // The VIP holder knows it holds plndr-cp-lock.
        let role = r["cluster"]["roles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["lease"] == format!("kube-system/{VIP_LEASE}"))
            .unwrap_or_else(|| panic!("node {i}: no Lease {VIP_LEASE} in the report\n{r:#}"));
        assert_eq!(role["this_node"], i == vip.0, "node {i}: {role}");
        // The report names each Lease and its holder; the holder node knows it is.
        for (l, (h, holder)) in LEADER_LEASES.iter().zip(&holders) {
            let role = r["cluster"]["roles"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["lease"] == format!("kube-system/{l}"))
                .unwrap_or_else(|| panic!("node {i}: no Lease {l} in the report\n{r:#}"));
            assert!(role["holder"].is_string(), "node {i}: {role}");
            if i == *h {
                assert_eq!(role["holder"], holder.as_str(), "node {i}: {role}");
                assert_eq!(role["this_node"], true, "node {i}: {role}");
                let held = r["cluster"]["leaders_last"]["held"].to_string();
                assert!(held.contains(l), "node {i}: {held}\n{r:#}");
                assert_eq!(
                    r["cluster"]["leaders_last"]["bound_reached"], false,
                    "{r:#}"
                );
            }
        }
    }
    // The oracle: kubelet-sim's histories. Each node restarted each component once; the
    // holder's restart began after every other node's restart of it ended.
    let states: Vec<_> = c.nodes.iter().map(|n| n.states()).collect();
    let mut order = vec![];
    let pods_and_leases = [("kube-vip", &vip)];
    for (l, (h, _)) in LEADER_LEASES
        .iter()
        .zip(&holders)
        .chain(pods_and_leases.iter().map(|(p, v)| (p, *v)))
    {
        let w: Vec<(u64, u64)> = states
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let w = down_windows(s, l, since);
                assert_eq!(w.len(), 1, "node {i}: {l} down windows {w:?}");
                w[0]
            })
            .collect();
        for j in (0..3).filter(|j| j != h) {
            assert!(
                w[j].1 <= w[*h].0,
                "{l}: the holder cp-{h} stopped it at {} before cp-{j}'s restart ended at {}: {w:?}",
                w[*h].0,
                w[j].1
            );
        }
        let mut by_start: Vec<usize> = (0..3).collect();
        by_start.sort_by_key(|i| w[*i].0);
        order.push(format!("{l}: holder cp-{h}, restarted cp-{by_start:?}"));
    }
    assert!(samples.len() > 20, "only {} samples", samples.len());
    for x in &samples {
        assert!(x.api.iter().any(|u| *u), "no apiserver ready: {x:?}");
    }
    let no_api = longest(&samples, |x| x.api.iter().all(|u| !*u));
    let waits: Vec<(u64, u64)> = reports
        .iter()
        .map(|r| {
            (
                r["cluster"]["waited_ms"].as_u64().unwrap_or(0),
                r["cluster"]["leaders_last"]["waited_ms"]
                    .as_u64()
                    .unwrap_or(0),
            )
        })
        .collect();
    eprintln!(
        "FIGURES leaders last x3: whole cluster in {} ms; (lock wait, leaders-last wait) ms per \
         node {waits:?}; longest window with no apiserver ready {} ms; {}",
        whole.as_millis(),
        no_api.as_millis(),
        order.join("; ")
    );

    // A peer that never finishes: a record no one deletes (no lease) listing both components.
    let ghost = serde_json::json!({
        "components": LEADER_LEASES,
        "pods": [],
        "roles": [],
        "since": "2026-01-01T00:00:00Z",
        "pid": 1,
    });
    let key = format!("{}cp-ghost", cluster::roles::RESTARTS_PREFIX);
    let put = c.etcdctl(&["put", &key, &ghost.to_string()]);
    assert!(put.status.success(), "{put}");
    let (h, holder) = live_holder(&c, LEADER_LEASES[0]);
    let mut p = c.spawn_pass_margin(h, "2", "24h", &["--within", "400d", "--leader-wait", "5s"]);
    p.finish_within(PASS_BOUND);
    let r = report_of(&mut p, 0);
    let ll = &r["cluster"]["leaders_last"];
    assert_eq!(ll["bound_reached"], true, "{holder}\n{r:#}");
    assert!(ll["waited_for"].to_string().contains("cp-ghost"), "{r:#}");
    let text = ll.to_string();
    assert!(text.contains("kube-controller-manager"), "{r:#}");
    let del = c.etcdctl(&["del", &key]);
    assert!(del.status.success(), "{del}");
    // Every record of the passes is gone (deleted after their restarts).
    let left = c.etcdctl(&[
        "get",
        "--prefix",
        cluster::roles::RESTARTS_PREFIX,
        "--keys-only",
    ]);
    assert!(
        left.status.success() && left.stdout.trim().is_empty(),
        "{left}"
    );
}

// CA rotation across the three nodes (issue 29).
mod ca;
