//! The etcd CA rotated across an external etcd (issue 29): three etcdadm-layout etcd nodes
//! (real etcd members) and two control planes (real kube-apiservers, controller-managers and
//! schedulers v1.20.2) that trust the etcd CA and hold no key of it, `certrotor ca` run on the
//! five roots at once, round after round, while a client writes and reads through the
//! apiservers.

use super::*;

impl External {
    /// Every etcd node's etcd CA file and etcdctl pair, every control plane's cluster CA and
    /// apiserver-kubelet-client pair, as they are on disk now.
    fn sample_own(&self) -> Sample {
        let read = |root: &Path, f: &str| fs::read(root.join(f)).unwrap_or_default();
        let etcd: Vec<(bool, bool)> = self
            .etcd
            .iter()
            .map(|n| {
                let pki = n.root.join("etc/etcd/pki");
                let pair = (
                    read(&pki, "etcdctl-etcd-client.crt"),
                    read(&pki, "etcdctl-etcd-client.key"),
                );
                probe_state(2379 + n.offset, "/health", &read(&pki, "ca.crt"), &pair)
            })
            .collect();
        let api = self.cps.iter().map(|n| {
            let pki = n.root.join("etc/kubernetes/pki");
            let pair = (
                read(&pki, "apiserver-kubelet-client.crt"),
                read(&pki, "apiserver-kubelet-client.key"),
            );
            tls_ok(6443 + n.offset, "/readyz", &read(&pki, "ca.crt"), &pair)
        });
        Sample {
            at: Instant::now(),
            etcd_up: etcd.iter().map(|e| e.0).collect(),
            etcd: etcd.iter().map(|e| e.1).collect(),
            api: api.collect(),
        }
    }

    /// The five roots: the etcd nodes, then the control planes.
    fn roots(&self) -> Vec<&Path> {
        self.etcd
            .iter()
            .chain(&self.cps)
            .map(|n| n.root.as_path())
            .collect()
    }
}

impl Rotating for External {
    fn root(&self, i: usize) -> &Path {
        self.roots()[i]
    }
    fn dir(&self) -> &Path {
        &self.dir
    }
    fn sample_own(&self) -> Sample {
        External::sample_own(self)
    }
}

/// `certrotor ca SUB --ca etcd-ca` on every node at once, then again on those that stopped at
/// `waiting` (or were killed: `killed` in the first round), until every node reached `last`.
fn to_every_node(
    x: &Arc<External>,
    sub: &str,
    (waiting, last): (&str, &str),
    killed: Option<usize>,
    log: &mut Rounds,
) {
    let mut pending: Vec<usize> = (0..5).collect();
    let mut kill = killed;
    for round in 0.. {
        assert!(
            round < 5,
            "ca {sub}: not at {last} after 5 rounds: {pending:?}"
        );
        let which = (pending.as_slice(), kill.take());
        let stages = round_killing(x, (sub, "etcd-ca"), which, &[waiting, last], log);
        pending = pending
            .iter()
            .zip(&stages)
            .filter(|(_, s)| *s != last)
            .map(|(i, _)| *i)
            .collect();
        if pending.is_empty() {
            return;
        }
    }
}

/// Creates (or deletes) Node objects labelled as control planes through the first control
/// plane's apiserver, as the kubelets of control planes register them.
fn control_plane_nodes(x: &External, names: &[&str], create: bool) {
    let conf = x.cps[0].root.join("etc/kubernetes/admin.conf");
    for n in names {
        let mut kubectl = std::process::Command::new(testkit::k8s::kubectl_path());
        kubectl.arg(format!("--kubeconfig={}", conf.display()));
        if create {
            let manifest = json!({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": n, "labels": {"node-role.kubernetes.io/control-plane": ""}}});
            let file = x.dir.join(format!("{n}.json"));
            fs::write(&file, manifest.to_string()).unwrap();
            kubectl.arg("create").arg("-f").arg(&file);
        } else {
            kubectl.args(["delete", "node", n]);
        }
        let out = kubectl.stdin(std::process::Stdio::null()).output().unwrap();
        testkit::assert_succeeded(&format!("kubectl {n}"), &out);
    }
}

/// The etcd nodes' leaves (etcdadm's four) and the control planes' etcd client certificate.
const ETCD_LEAVES: [&str; 4] = [
    "etc/etcd/pki/server.crt",
    "etc/etcd/pki/peer.crt",
    "etc/etcd/pki/etcdctl-etcd-client.crt",
    "etc/etcd/pki/apiserver-etcd-client.crt",
];
const CP_CA: &str = "etc/kubernetes/pki/etcd/ca.crt";
const CP_LEAF: &str = "etc/kubernetes/pki/apiserver-etcd-client.crt";

#[test]
fn an_external_etcd_and_its_control_planes_rotate_the_etcd_ca_without_a_failed_request() {
    etcd_installed("an_external_etcd_and_its_control_planes_rotate_the_etcd_ca");
    let t = TempDir::new("cluster-ca-external");
    let x = Arc::new(External::start_expiring(&t, "300d"));
    let old = fs::read(x.etcd[0].root.join("etc/etcd/pki/ca.crt")).unwrap();
    let old_key = fs::read(x.etcd[0].root.join("etc/etcd/pki/ca.key")).unwrap();
    fs::write(t.join("old-ca.crt"), &old).unwrap();
    // Each control plane's certrotor registers it in etcd (here one pass with nothing due), so
    // that the etcd nodes wait for it before they issue from the new CA.
    for (code, r, text) in x.cp_passes("register") {
        assert_eq!(code, Some(0), "{text}");
        assert!(r["renew"]["backup_id"].is_null(), "renewed\n{text}");
    }
    x.published(); // writes etcdctl's files
    // A control plane the etcd nodes do not know of (one whose certrotor never registered it in
    // etcd) stops the rotation where it is seen, on the control planes, before anything changes.
    control_plane_nodes(&x, &["cp-0", "cp-1", "cp-unregistered"], true);
    let ca_before = fs::read(x.cps[0].root.join(CP_CA)).unwrap();
    let refused = certrotor(&[
        "ca",
        "rotate",
        "--ca",
        "etcd-ca",
        "--root",
        s(&x.cps[0].root),
    ])
    .args(&PASS_FLAGS)
    .run();
    let refused = refused.expect_code(2);
    assert!(
        refused.stderr.contains("3 control-plane nodes")
            && refused.stderr.contains("2 registered in etcd")
            && refused.stderr.contains("on every control plane")
            && refused.stderr.contains("cp-unregistered"),
        "{refused}"
    );
    assert_eq!(fs::read(x.cps[0].root.join(CP_CA)).unwrap(), ca_before);
    assert!(
        !x.cps[0]
            .root
            .join("var/lib/certrotor/ca-rotation.json")
            .exists()
    );
    control_plane_nodes(&x, &["cp-unregistered"], false);
    let put = x
        .etcdctl()
        .args(&["put", "certrotor-test/kept", "before-ca-rotation"])
        .run();
    assert!(put.status.success(), "{put}");
    let cps: Vec<&Path> = x.cps.iter().map(|n| n.root.as_path()).collect();
    let writer = Writer::start_on(&cps);
    let since = now_ms();
    let mut log = Rounds::default();
    let all = [0, 1, 2, 3, 4];
    // A rotation to the issue everywhere, then aborted everywhere: the etcd nodes issue again
    // from the old CA and publish its pair, the control planes install it, and no node drops
    // the new CA before every node has.
    to_every_node(&x, "rotate", ("trusted", "issued"), None, &mut log);
    let aborted_ca: BTreeSet<String> = certs_of(&fs::read(x.roots()[3].join(CP_CA)).unwrap())
        .difference(&certs_of(&old))
        .cloned()
        .collect();
    assert_eq!(aborted_ca.len(), 1);
    to_every_node(&x, "abort", ("abort", "aborted"), None, &mut log);
    for (i, r) in x.roots().iter().enumerate() {
        let file = if i < 3 { "etc/etcd/pki/ca.crt" } else { CP_CA };
        assert_eq!(
            fs::read(r.join(file)).unwrap(),
            old,
            "node {i}: CA file after the abort"
        );
    }
    for e in &x.etcd {
        assert_eq!(
            fs::read(e.root.join("etc/etcd/pki/ca.key")).unwrap(),
            old_key
        );
    }
    for cp in &cps {
        openssl_verify(&t.join("old-ca.crt"), &cp.join(CP_LEAF), true)
            .unwrap_or_else(|e| panic!("{}: {e}", cp.display()));
    }
    // The rotation again, to its end: a control plane is killed (SIGKILL) in the middle of its
    // trust-in (its files written, its restart not made) and resumed by the next round.
    to_every_node(&x, "rotate", ("trusted", "issued"), Some(3), &mut log);
    // `status` on an etcd node shows the five nodes' stages as etcd holds them.
    let status = certrotor(&["status", "--root", s(&x.etcd[0].root), "--output", "json"]).run();
    assert_eq!(status.code(), Some(0), "{status}");
    let v: Value = serde_json::from_str(&status.stdout).unwrap();
    let members = v["ca_rotation_members"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(members.len(), 5, "{v:#}");
    assert!(members.iter().all(|m| m["stage"] == "issued"), "{v:#}");
    // The control planes hold no key of the etcd CA, before and after.
    for cp in &cps {
        assert!(!cp.join("etc/kubernetes/pki/etcd/ca.key").exists());
    }
    // Before trust-out every node still trusts the old CA and the new.
    for (i, r) in x.roots().iter().enumerate() {
        let file = if i < 3 { "etc/etcd/pki/ca.crt" } else { CP_CA };
        assert_eq!(
            certs_of(&fs::read(r.join(file)).unwrap()).len(),
            2,
            "node {i}"
        );
    }
    round_to(&x, ("continue", "etcd-ca"), &all, &["done"], &mut log);
    let writes = writer.finish();

    // One new CA on all five; the old key stays only in the backups.
    let new = fs::read(x.etcd[0].root.join("etc/etcd/pki/ca.crt")).unwrap();
    assert_eq!(certs_of(&new).len(), 1);
    assert!(certs_of(&new).is_disjoint(&certs_of(&old)), "not rotated");
    assert!(
        certs_of(&new).is_disjoint(&aborted_ca),
        "the aborted CA came back"
    );
    fs::write(t.join("new-ca.crt"), &new).unwrap();
    for e in &x.etcd {
        assert_eq!(fs::read(e.root.join("etc/etcd/pki/ca.crt")).unwrap(), new);
        assert_ne!(
            fs::read(e.root.join("etc/etcd/pki/ca.key")).unwrap(),
            old_key
        );
    }
    for cp in &cps {
        assert_eq!(fs::read(cp.join(CP_CA)).unwrap(), new, "{}", cp.display());
    }
    // openssl: every leaf verifies with the new CA alone, none with the old alone.
    let mut leaves: Vec<PathBuf> = x
        .etcd
        .iter()
        .flat_map(|e| ETCD_LEAVES.iter().map(|l| e.root.join(l)))
        .collect();
    leaves.extend(cps.iter().map(|cp| cp.join(CP_LEAF)));
    for leaf in &leaves {
        openssl_verify(&t.join("new-ca.crt"), leaf, true)
            .unwrap_or_else(|e| panic!("{}: {e}", leaf.display()));
        assert!(
            openssl_verify(&t.join("old-ca.crt"), leaf, true).is_err(),
            "{} verifies with the old CA",
            leaf.display()
        );
    }
    // Every member serves a certificate of the new CA, not of the old.
    for e in &x.etcd {
        let pki = e.root.join("etc/etcd/pki");
        let pair = (
            fs::read(pki.join("etcdctl-etcd-client.crt")).unwrap(),
            fs::read(pki.join("etcdctl-etcd-client.key")).unwrap(),
        );
        let port = 2379 + e.offset;
        assert_eq!(probe_state(port, "/health", &new, &pair), (true, true));
        assert!(
            !probe_state(port, "/health", &old, &pair).0,
            "old CA served"
        );
    }
    // The data written before is read back through an apiserver's etcd client pair.
    let cp_pki = cps[0].join("etc/kubernetes/pki");
    let endpoint = format!("https://127.0.0.1:{}", 2379 + x.etcd[1].offset);
    let get = etcdctl(
        &endpoint,
        &cp_pki.join("etcd/ca.crt"),
        &cp_pki.join("apiserver-etcd-client.crt"),
        &cp_pki.join("apiserver-etcd-client.key"),
    )
    .args(&["get", "certrotor-test/kept", "--print-value-only"])
    .run();
    let states: Vec<_> = x.etcd.iter().map(|n| n.states()).collect();
    served_throughout(&get, &writes, &log, &states, since);
    // Every node finished: the last one removed the new CA's key from etcd (the rotation's
    // records keep the certificate, the aborted one's was removed when this one began).
    let records = etcdctl(
        &endpoint,
        &cp_pki.join("etcd/ca.crt"),
        &cp_pki.join("apiserver-etcd-client.crt"),
        &cp_pki.join("apiserver-etcd-client.key"),
    )
    .args(&["get", "--prefix", "certrotor/v1/ca/", "--print-value-only"])
    .run();
    let records: Vec<serde_json::Value> = records
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("cert").is_some())
        .collect();
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["key"], "", "the new CA's key is still in etcd");
    assert!(records[0]["cert"].as_str().unwrap().contains("CERTIFICATE"));
    let restarts: Vec<usize> = x
        .etcd
        .iter()
        .map(|n| down_windows(&n.states(), "etcd", since).len())
        .chain(
            x.cps
                .iter()
                .map(|n| down_windows(&n.states(), "kube-apiserver", since).len()),
        )
        .collect();
    eprintln!(
        "FIGURES etcd CA rotation, external etcd (3 etcd nodes, 2 control planes; real etcd, \
         kube-apiserver v1.20.2): rounds {:?} ms; restarts (etcd ×3, kube-apiserver ×2) \
         {restarts:?}; {}",
        log.took_ms(),
        disruption(&log, &writes)
    );
}
