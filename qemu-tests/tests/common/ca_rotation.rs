//! The cluster CA rotated under the real kubelet (issue 29.4; `renew-expiring.sh` with
//! `ca-rotate`): what the guest saved, asserted, and the figures.

use super::*;

/// The certificates of a PEM bundle, each as its base64 body (whitespace removed), in order.
pub fn pem_certs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for l in text.lines().map(str::trim) {
        match (l, cur.as_mut()) {
            ("-----BEGIN CERTIFICATE-----", _) => cur = Some(String::new()),
            ("-----END CERTIFICATE-----", Some(_)) => out.extend(cur.take()),
            (body, Some(c)) => c.push_str(body),
            _ => {}
        }
    }
    out
}

/// One `kubectl logs` call of the poller (`node_logs_poll_start`): begun and ended (guest
/// uptime, ms), and the first line of its error when it failed.
#[derive(Debug, Clone)]
pub struct LogsCall {
    pub begun: u64,
    pub ended: u64,
    pub error: Option<String>,
}

pub fn logs_calls(b: &Boot, name: &str) -> Vec<LogsCall> {
    b.read_out(name)
        .unwrap()
        .lines()
        .map(|l| {
            let mut w = l.splitn(4, ' ');
            let (begun, ended, what) = (w.next(), w.next(), w.next());
            let parse = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok());
            match (parse(begun), parse(ended), what) {
                (Some(begun), Some(ended), Some("ok")) => LogsCall {
                    begun,
                    ended,
                    error: None,
                },
                (Some(begun), Some(ended), Some("fail")) => LogsCall {
                    begun,
                    ended,
                    error: Some(w.next().unwrap_or("").to_string()),
                },
                _ => panic!("{}", b.failure(&format!("{name}: bad line {l:?}"))),
            }
        })
        .collect()
}

/// One restart of the real kubelet by the Bottlerocket API's restart command
/// (`node_kubelet_restart`): the pids, when the stop was requested, when the old process had
/// exited and when the new one answered (guest uptime, ms).
#[derive(Debug, Clone)]
pub struct KubeletRestart {
    pub old_pid: String,
    pub new_pid: String,
    pub stop: u64,
    pub exited: u64,
    pub healthy: u64,
}

pub fn kubelet_restarts(b: &Boot) -> Vec<KubeletRestart> {
    b.read_out("kubelet-restarts.txt")
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let n = |i: usize| w.get(i).and_then(|v| v.parse::<u64>().ok());
            match (w.len(), n(2), n(3), n(4)) {
                (5, Some(stop), Some(exited), Some(healthy)) => KubeletRestart {
                    old_pid: w[0].to_string(),
                    new_pid: w[1].to_string(),
                    stop,
                    exited,
                    healthy,
                },
                _ => panic!(
                    "{}",
                    b.failure(&format!(
                        "kubelet-restarts.txt: a restart that did not end: {l:?}"
                    ))
                ),
            }
        })
        .collect()
}

fn ms(b: &Boot, name: &str) -> u64 {
    b.read_out(name)
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("{}", b.failure(&format!("{name}: {e}"))))
}

/// After a kubelet answers its healthz, how long a request through kube-apiserver may still
/// find it not serving yet (its port 10250 opens with the rest of its servers, a moment later
/// under TCG): the end of a restart's window.
const SERVING_AFTER_HEALTHY_MS: u64 = 5_000;
/// `kubectl logs` calls a restart's window may fail, besides one a second of it: the call in
/// flight when the kubelet stopped, and the one that began as it came back.
const FAILS_PER_RESTART: u64 = 2;

/// The rotation's stages, the CA everywhere the node keeps it, the kubelet's restarts by the API,
/// `kubectl logs` through the kubelet all along, every certificate after trust-out, and the
/// data. Returns the figures' lines.
pub fn assert_cluster_ca_rotated(b: &Boot, sc: &Scenario) -> Vec<String> {
    let old_sha = sha_out(b, "ca-old.sha");
    let new_sha = sha_out(b, "ca-new.sha");
    assert_ne!(old_sha, new_sha, "{}", b.failure("the CA did not change"));
    // Each command: exit 0, the stage it stops at, the two CAs.
    let mut reports = Vec::new();
    for (cmd, stage) in [("rotate", "issued"), ("continue", "done")] {
        let rc = b.read_out(&format!("ca-{cmd}.rc")).unwrap();
        let log = b.read_out(&format!("ca-{cmd}.log")).unwrap_or_default();
        assert_eq!(
            rc,
            "0",
            "{}",
            b.failure(&format!("certrotor ca {cmd} --ca ca exit {rc}:\n{log}"))
        );
        let r = json(b, &format!("ca-{cmd}.json"));
        let fail = |what: &str| b.failure(&format!("ca {cmd}: {what}: {r}"));
        assert_eq!(r["stage"], stage, "{}", fail("stage"));
        assert_eq!(r["old_sha256"], old_sha.as_str(), "{}", fail("old CA"));
        assert_eq!(r["new_sha256"], new_sha.as_str(), "{}", fail("new CA"));
        reports.push(r);
    }

    // The CA where the node keeps it: the CA file (the signer's first), kubernetes.
    // cluster-certificate in the API's settings and the kubelet's client CA file the API
    // rendered from it: the old CA alone before, [old, new] after trust-in and the issue, the
    // new CA alone after trust-out.
    let old = pem_certs(&b.read_out("ca-old.crt").unwrap());
    assert_eq!(old.len(), 1, "{}", b.failure("ca-old.crt"));
    let rotated = pem_certs(&b.read_out("ca-continue-ca.crt").unwrap());
    assert_eq!(
        rotated.len(),
        1,
        "{}",
        b.failure("the CA file after trust-out: not one certificate")
    );
    let (old, new) = (&old[0], &rotated[0]);
    assert_ne!(old, new, "{}", b.failure("the CA file after trust-out"));
    let mut both = vec![old.clone(), new.clone()];
    both.sort();
    for (when, want) in [
        ("before", vec![old.clone()]),
        ("rotate", both.clone()),
        ("continue", vec![new.clone()]),
    ] {
        for (file, what) in [
            ("ca.crt", "the CA file var/lib/kubeadm/pki/ca.crt"),
            (
                "cluster-certificate.pem",
                "settings.kubernetes.cluster-certificate",
            ),
            (
                "kubelet-ca.crt",
                "the kubelet's client CA /etc/kubernetes/pki/ca.crt",
            ),
        ] {
            let mut got = pem_certs(&b.read_out(&format!("ca-{when}-{file}")).unwrap());
            got.sort();
            assert_eq!(
                got,
                want,
                "{}",
                b.failure(&format!(
                    "{what} {}: {} certificate(s), not the expected CAs",
                    if when == "before" {
                        "before the rotation".to_string()
                    } else {
                        format!("after ca {when}")
                    },
                    got.len()
                ))
            );
        }
    }
    // kube-controller-manager's signer: a file of its own (the new CA, which signs from the
    // issue on) through the manifest the API rendered, back to ca.crt at trust-out.
    let signing = |when: &str| -> String {
        let m = b.read_out(&format!("ca-{when}-kcm.yaml")).unwrap();
        let flags: Vec<&str> = m
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- --cluster-signing-cert-file="))
            .collect();
        assert_eq!(
            flags.len(),
            1,
            "{}",
            b.failure(&format!(
                "kube-controller-manager's rendered manifest after {when}:\n{m}"
            ))
        );
        flags[0].to_string()
    };
    assert!(
        signing("before").ends_with("/ca.crt")
            && signing("rotate").ends_with("/ca.signer.crt")
            && signing("continue").ends_with("/ca.crt"),
        "{}",
        b.failure(&format!(
            "kube-controller-manager's --cluster-signing-cert-file: before {}, after rotate {}, \
             after continue {}",
            signing("before"),
            signing("rotate"),
            signing("continue")
        ))
    );
    assert_eq!(
        pem_certs(&b.read_out("ca-rotate-ca.signer.crt").unwrap()),
        std::slice::from_ref(new),
        "{}",
        b.failure("ca.signer.crt after the issue: not the new CA alone")
    );
    assert!(
        b.read_out("ca-continue-ca.signer.crt").is_err(),
        "{}",
        b.failure("ca.signer.crt still there after trust-out")
    );

    // The kubelet restarted by the API at each change of its trust: the restart command ran
    // (apiserver-sim's event) as many times as the kubelet was restarted, at least once in each
    // command, each time a new process that came up.
    let restarts = kubelet_restarts(b);
    let sim = b.read_out("node-apiserver-sim.log").unwrap_or_default();
    assert_eq!(
        sim.matches("kubelet-restarted: ").count(),
        restarts.len(),
        "{}",
        b.failure(&format!(
            "the API's kubelet restarts against the restarts seen: {restarts:?}"
        ))
    );
    assert!(
        !sim.contains("try-restart kubelet.service"),
        "{}",
        b.failure("the API's kubelet restart command failed (node-apiserver-sim.log)")
    );
    let stage_window = |cmd: &str| {
        (
            ms(b, &format!("ca-{cmd}-begin-ms")),
            ms(b, &format!("ca-{cmd}-end-ms")),
        )
    };
    let mut per_stage = Vec::new();
    for cmd in ["rotate", "continue"] {
        let (t0, t1) = stage_window(cmd);
        let n: Vec<&KubeletRestart> = restarts
            .iter()
            .filter(|r| r.stop >= t0 && r.healthy <= t1)
            .collect();
        assert!(
            !n.is_empty(),
            "{}",
            b.failure(&format!(
                "no kubelet restart by the API during ca {cmd}: {restarts:?}"
            ))
        );
        per_stage.push(format!(
            "{cmd} {} ({})",
            n.len(),
            n.iter()
                .map(|r| format!("{} ms", r.healthy - r.stop))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for r in &restarts {
        assert!(
            r.old_pid != r.new_pid && r.stop <= r.exited && r.exited <= r.healthy,
            "{}",
            b.failure(&format!("kubelet restart {r:?}"))
        );
    }

    // `kubectl logs` through the kubelet all along: every call that failed overlapped a restart
    // of the kubelet (from its stop until it serves), at most a few per restart, and calls
    // succeeded after each command.
    let calls = logs_calls(b, "kubectl-logs.txt");
    let in_window = |c: &LogsCall| {
        restarts
            .iter()
            .any(|r| c.begun <= r.healthy + SERVING_AFTER_HEALTHY_MS && c.ended >= r.stop)
    };
    let failed: Vec<&LogsCall> = calls.iter().filter(|c| c.error.is_some()).collect();
    let outside: Vec<&&LogsCall> = failed.iter().filter(|c| !in_window(c)).collect();
    assert!(
        outside.is_empty(),
        "{}",
        b.failure(&format!(
            "kubectl logs failed outside the kubelet's restarts: {outside:?}\nrestarts: {restarts:?}"
        ))
    );
    let allowed: u64 = restarts
        .iter()
        .map(|r| (r.healthy - r.stop + SERVING_AFTER_HEALTHY_MS) / 1000 + FAILS_PER_RESTART)
        .sum();
    assert!(
        failed.len() as u64 <= allowed,
        "{}",
        b.failure(&format!(
            "{} kubectl logs calls failed, {allowed} allowed by {} kubelet restarts: {failed:?}",
            failed.len(),
            restarts.len()
        ))
    );
    let (rotate_begin, _) = stage_window("rotate");
    assert!(
        calls
            .iter()
            .any(|c| c.error.is_none() && c.ended < rotate_begin),
        "{}",
        b.failure("no kubectl logs served before the rotation")
    );
    for cmd in ["rotate", "continue"] {
        let (_, end) = stage_window(cmd);
        assert!(
            calls.iter().any(|c| c.error.is_none() && c.begun >= end),
            "{}",
            b.failure(&format!("no kubectl logs served after ca {cmd}"))
        );
    }

    // After trust-out, the old CA alone verifies nothing the node holds or serves; what the
    // cluster CA signs verifies with the new one.
    let verify = b.read_out("ca-verify.txt").unwrap();
    let lines: Vec<Vec<&str>> = verify.lines().map(|l| l.splitn(4, ' ').collect()).collect();
    for l in &lines {
        assert!(
            l.len() == 4 && l[1] != "none",
            "{}",
            b.failure(&format!("ca-verify.txt: nothing read for {l:?}"))
        );
        assert_ne!(
            l[1],
            "0",
            "{}",
            b.failure(&format!(
                "{} verifies with the old CA after trust-out",
                l[0]
            ))
        );
    }
    let cluster_ca_signed = [
        "pki/apiserver.crt",
        "pki/apiserver-kubelet-client.crt",
        "kubeconfig/admin.conf",
        "kubeconfig/controller-manager.conf",
        "kubeconfig/scheduler.conf",
        "kubelet-client",
        "served/6443",
    ];
    for want in cluster_ca_signed {
        let l = lines
            .iter()
            .find(|l| l[0] == want)
            .unwrap_or_else(|| panic!("{}", b.failure(&format!("ca-verify.txt: no {want}"))));
        assert_eq!(
            l[2],
            "0",
            "{}",
            b.failure(&format!("{want} does not verify with the new CA: {l:?}"))
        );
    }
    for l in &lines {
        assert!(
            l[3] != "kubernetes" || l[2] == "0",
            "{}",
            b.failure(&format!(
                "{} names the cluster CA as issuer and does not verify with the new one",
                l[0]
            ))
        );
    }
    assert!(
        !lines.iter().any(|l| l[0] == "pki/ca.signer.crt"),
        "{}",
        b.failure("ca.signer.crt after trust-out")
    );

    // The data written before the renewals, read after the rotation.
    assert_kubectl_after_as(b, sc, "ca-");
    let token = std::fs::read_to_string(sc.share_dir().join("token")).unwrap();
    assert_eq!(
        b.read_out("ca-etcd-after").unwrap(),
        token,
        "{}",
        b.failure("the etcd key written before, read after the rotation")
    );

    // Figures.
    let took = |cmd: &str| {
        let (t0, t1) = stage_window(cmd);
        (t1 - t0) as f64 / 1000.0
    };
    let mut f = vec![format!(
        "cluster CA rotation under the registered kubelet: ca rotate (trust-in, issue) {:.1} s, \
         ca continue (trust-out) {:.1} s",
        took("rotate"),
        took("continue")
    )];
    for r in &reports {
        let stages: Vec<String> = r["stages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|s| {
                format!(
                    "{}: restarted {}, reloaded {}",
                    s["stage"].as_str().unwrap_or("?"),
                    s["restarted"],
                    s["reloaded"]
                )
            })
            .collect();
        f.push(format!("  {}", stages.join("; ")));
    }
    f.push(format!(
        "kubelet restarts by the API: {} (stop .. healthy: {})",
        restarts.len(),
        per_stage.join("; ")
    ));
    let mut errors: Vec<&str> = failed.iter().filter_map(|c| c.error.as_deref()).collect();
    errors.sort_unstable();
    errors.dedup();
    f.push(format!(
        "kubectl logs through the kubelet: {} calls, {} failed (each in a kubelet restart; \
         allowed {allowed}){}",
        calls.len(),
        failed.len(),
        if errors.is_empty() {
            String::new()
        } else {
            format!(": {}", errors.join(" | "))
        }
    ));
    if let Ok(readyz) = b.read_out("ca-readyz.txt") {
        let (longest, total, polls) = readyz_gaps(&readyz);
        f.push(format!(
            "real apiserver /readyz during the rotation ({polls} polls): longest outage \
             {longest:.1}s, total {total:.1}s"
        ));
    }
    f
}
