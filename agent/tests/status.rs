//! `certrotor status` (issue 12.3) on real lab nodes: a fresh node, after a pass that renewed,
//! after a pass that failed and one whose rollback failed (restarts still owed), a held lock, the
//! cluster lock said to be unknown when etcd is down, and a damaged or future-version last-pass
//! record refused with exit 2 and nothing changed. The JSON shape is pinned.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use serde_json::Value;

use crate::renew_util::{LOOPBACK_ECDSA, SHORT_WAITS};
use crate::util::*;

/// A lab node expiring in 3 days whose ports (manifests, kubeconfigs) are all on 127.0.0.1 and
/// shifted by `offset`, so that nothing answers there.
fn node(t: &TestDir, offset: u16) -> std::path::PathBuf {
    let offset = offset.to_string();
    let flags = [
        &["--expires-in", "3d"][..],
        &LOOPBACK_ECDSA,
        &["--port-offset", &offset],
    ];
    t.lab("node", &flags.concat())
}

fn status(root: &Path, extra: &[&str]) -> Value {
    let r = root.to_str().unwrap();
    let base = ["status", "--root", r, "--output", "json"];
    certrotor(&[&base[..], extra].concat()).expect(0).json()
}

/// The `status` table of the node at `r` (cluster mode off), expecting exit 0.
fn status_table(r: &str) -> String {
    certrotor(&["status", "--root", r, "--cluster", "off"])
        .expect(0)
        .stdout
        .clone()
}

/// `certrotor run --once --root <r> --platform none` and `extra`.
fn run_none(r: &str, extra: &[&str]) -> Run {
    let mut args = vec!["run", "--once", "--root", r, "--platform", "none"];
    args.extend_from_slice(extra);
    certrotor(&args)
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn status_of_a_fresh_node_then_after_a_pass_that_renewed() {
    let t = TestDir::new("status-fresh");
    let root = node(&t, 21_000);
    let r = root.to_str().unwrap();

    // Fresh: no pass yet, nothing owed, lock free, no backups; the next renewal is now (90 d
    // window by default, certificates expire in 3 d).
    let v = status(&root, &["--cluster", "off"]);
    assert_eq!(
        keys(&v),
        set(&[
            "root",
            "generated_at",
            "last_pass",
            "next_pass_at",
            "next_due",
            "owed_restarts",
            "lock",
            "cluster_lock",
            "backups",
            "ca_rotation",
            "ca_rotation_members",
        ]),
        "{v:#}"
    );
    assert!(v["last_pass"].is_null(), "{v:#}");
    assert!(v["ca_rotation"].is_null(), "no CA rotation: {v:#}");
    assert!(v["ca_rotation_members"].is_null(), "{v:#}");
    assert!(v["cluster_lock"].is_null(), "--cluster off: {v:#}");
    let due = &v["next_due"];
    assert_eq!(
        keys(due),
        set(&[
            "name",
            "not_after",
            "residual_seconds",
            "renewal_at",
            "within_seconds",
            "within_from",
        ])
    );
    assert_eq!(due["within_from"], "default");
    assert_eq!(due["within_seconds"], 90 * DAY);
    assert!(due["residual_seconds"].as_i64().unwrap() <= 3 * DAY);
    assert!(
        rfc3339(due["renewal_at"].as_str().unwrap()) <= now() + 60,
        "due now: {due:#}"
    );
    assert_eq!(v["owed_restarts"]["components"], serde_json::json!([]));
    assert_eq!(v["lock"]["held"], false);
    assert_eq!(v["backups"], serde_json::json!([]));
    let table = status_table(r);
    assert!(table.contains("none recorded yet"), "{table}");
    assert!(table.contains("No backups"), "{table}");
    // Reading the status wrote no last-pass record.
    assert!(!root.join("var/lib/certrotor/last-pass.json").exists());

    // A pass that renews (platform none: no restarts).
    let run = run_none(r, &["--output", "json"]);
    run.expect(0);
    let report = run.json();
    let v = status(&root, &["--cluster", "off"]);
    let p = &v["last_pass"];
    assert_eq!(
        keys(p),
        set(&[
            "version",
            "command",
            "started_at",
            "finished_at",
            "finished_unix",
            "result",
            "exit_code",
            "renewed",
            "new_not_after",
            "backup_id",
            "platform",
            "restarted",
            "owed",
            "rollback_reason",
            "error",
            "within_seconds",
            "all",
            "interval_seconds",
        ]),
        "{p:#}"
    );
    assert_eq!(p["version"], 1);
    assert_eq!(p["command"], "run");
    assert_eq!(p["result"], "renewed");
    assert_eq!(p["exit_code"], 0);
    assert_eq!(p["platform"], "none");
    assert_eq!(p["backup_id"], report["renew"]["backup_id"]);
    assert_eq!(p["new_not_after"], report["renew"]["plan"]["not_after"]);
    let renewed = str_items(&p["renewed"]);
    for n in ["apiserver", "etcd-server", "admin.conf"] {
        assert!(renewed.contains(&n), "{n} not in {renewed:?}");
    }
    assert!(p["interval_seconds"].is_null());
    // Next renewal: a year out, minus the pass's 90-day window.
    let due = &v["next_due"];
    assert_eq!(due["within_from"], "last pass");
    assert_eq!(
        rfc3339(due["renewal_at"].as_str().unwrap()),
        rfc3339(due["not_after"].as_str().unwrap()) - 90 * DAY
    );
    assert!(rfc3339(due["not_after"].as_str().unwrap()) > now() + 300 * DAY);
    // --within overrides the recorded window.
    let v30 = status(&root, &["--cluster", "off", "--within", "30d"]);
    assert_eq!(v30["next_due"]["within_from"], "--within");
    assert_eq!(
        rfc3339(v30["next_due"]["renewal_at"].as_str().unwrap()),
        rfc3339(due["not_after"].as_str().unwrap()) - 30 * DAY
    );
    // The backup, verified.
    let backups = v["backups"].as_array().unwrap();
    assert_eq!(backups.len(), 1);
    assert_eq!(backups[0]["id"], p["backup_id"]);
    assert_eq!(backups[0]["status"], "ok");
    // The record is 0600, like every state file.
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(root.join("var/lib/certrotor/last-pass.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let table = status_table(r);
    assert!(table.contains("renewed (run)"), "{table}");
    assert!(table.contains(p["backup_id"].as_str().unwrap()), "{table}");

    // A --dry-run pass is not recorded (it writes nothing).
    let before = fs::read(root.join("var/lib/certrotor/last-pass.json")).unwrap();
    run_none(r, &["--dry-run", "--all"]).expect(0);
    assert_eq!(
        fs::read(root.join("var/lib/certrotor/last-pass.json")).unwrap(),
        before
    );
}

#[test]
fn status_after_a_failed_pass_and_a_failed_rollback_shows_owed_restarts() {
    let t = TestDir::new("status-failed");
    let root = node(&t, 21_100);
    let r = root.to_str().unwrap();

    // A pass refused before anything is written: failed, exit 2, the error recorded.
    run_none(r, &["--cert", "no-such-cert"]).expect(2);
    let p = status(&root, &["--cluster", "off"])["last_pass"].clone();
    assert_eq!(p["result"], "failed", "{p:#}");
    assert_eq!(p["exit_code"], 2);
    assert!(
        p["error"].as_str().unwrap().contains("no-such-cert"),
        "{p:#}"
    );
    assert_eq!(p["renewed"], serde_json::json!([]));

    // Platform kubeadm with nothing running: etcd never comes back, the backup is restored, and
    // the restart after the rollback fails too: every restart stays owed.
    // Nothing runs: the live-reload wait (etcd) is bounded like the restarts.
    let pass = [
        "run",
        "--once",
        "--root",
        r,
        "--platform",
        "kubeadm",
        "--cluster",
        "off",
    ];
    certrotor(&[&pass[..], &SHORT_WAITS].concat()).expect(2);
    let v = status(&root, &["--cluster", "off"]);
    let p = &v["last_pass"];
    assert_eq!(p["result"], "rollback-failed", "{p:#}");
    assert_eq!(p["exit_code"], 2);
    assert!(
        p["rollback_reason"].as_str().unwrap().contains("etcd"),
        "{p:#}"
    );
    assert!(
        p["error"]
            .as_str()
            .unwrap()
            .contains("after restoring backup"),
        "{p:#}"
    );
    let owed = str_items(&v["owed_restarts"]["components"]);
    assert!(
        owed.contains(&"etcd") && owed.contains(&"kube-apiserver"),
        "{v:#}"
    );
    // The renew backup and the rollback's own backup, both verified.
    let kinds = each_field(&v["backups"], "kind");
    assert_eq!(kinds, ["rollback", "renew"], "{v:#}");
    let table = status_table(r);
    assert!(table.contains("rollback-failed"), "{table}");
    assert!(table.contains("OWED RESTARTS"), "{table}");
    assert!(table.contains("kube-apiserver"), "{table}");
}

#[test]
fn status_names_the_lock_holder_and_says_when_etcd_is_unreachable() {
    let t = TestDir::new("status-lock");
    let root = node(&t, 21_200);
    let r = root.to_str().unwrap();
    certrotor(&["backups", "--root", r]).expect(0);
    let dir = root.join("var/lib/certrotor");
    fs::create_dir_all(&dir).unwrap();
    // Another certrotor holds the node's lock (as txn::lock writes it).
    let lock = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join("lock"))
        .unwrap();
    lock.try_lock().unwrap();
    fs::write(dir.join("lock"), "pid 4242").unwrap();
    // Cluster mode applies (the manifests give etcd endpoints) but nothing listens there.
    let v = status(&root, &[]);
    assert_eq!(v["lock"]["held"], true, "{v:#}");
    assert_eq!(v["lock"]["holder"], "pid 4242");
    let c = &v["cluster_lock"];
    assert_eq!(c["reachable"], false, "{v:#}");
    assert!(c["holder"].is_null());
    assert!(
        c["error"].as_str().unwrap().contains("not reachable"),
        "{c:#}"
    );
    assert!(
        c["endpoints"][0]
            .as_str()
            .unwrap()
            .starts_with("https://127.0.0.1:"),
        "{c:#}"
    );
    let run = certrotor(&["status", "--root", r]);
    run.expect(0);
    assert!(run.stdout.contains("held by pid 4242"), "{}", run.stdout);
    assert!(run.stdout.contains("CLUSTER LOCK"), "{}", run.stdout);
    assert!(run.stdout.contains("not reachable"), "{}", run.stdout);
    drop(lock);
    let v = status(&root, &["--cluster", "off"]);
    assert_eq!(v["lock"]["held"], false, "{v:#}");
}

#[test]
fn a_damaged_or_future_last_pass_record_is_an_error_never_absent() {
    let t = TestDir::new("status-damaged");
    let root = node(&t, 21_300);
    let r = root.to_str().unwrap();
    run_none(r, &[]).expect(0);
    let file = root.join("var/lib/certrotor/last-pass.json");
    let good = fs::read_to_string(&file).unwrap();
    let cases: Vec<(&str, String, &[&str])> = vec![
        (
            "truncated",
            good[..good.len() / 2].to_string(),
            &["not valid JSON", "damaged"],
        ),
        (
            "future version",
            good.replacen("\"version\": 1", "\"version\": 9", 1),
            &["version 9", "newer", "another certrotor release"],
        ),
        (
            "no version",
            "{\"result\": \"renewed\"}".into(),
            &["has no version"],
        ),
        (
            "wrong schema",
            "{\"version\": 1, \"result\": 3}".into(),
            &["is damaged"],
        ),
    ];
    for (what, text, words) in cases {
        fs::write(&file, &text).unwrap();
        for output in ["table", "json"] {
            let run = certrotor(&[
                "status",
                "--root",
                r,
                "--output",
                output,
                "--cluster",
                "off",
            ]);
            run.expect(2);
            assert!(
                run.stdout.is_empty(),
                "{what}: nothing printed on stdout\n{run}"
            );
            assert!(
                run.stderr.contains("last-pass record") && run.stderr.contains("last-pass.json"),
                "{what}: the file is named\n{run}"
            );
            for w in words {
                let w = if *w == "newer" {
                    "written by another"
                } else {
                    w
                };
                assert!(run.stderr.contains(w), "{what}: says '{w}'\n{run}");
            }
            assert_eq!(
                fs::read_to_string(&file).unwrap(),
                text,
                "{what}: unchanged"
            );
        }
    }
    // A folder where the file should be: an error too, not "no pass yet".
    fs::remove_file(&file).unwrap();
    fs::create_dir(&file).unwrap();
    let run = certrotor(&["status", "--root", r, "--cluster", "off"]);
    run.expect(2);
    assert!(run.stderr.contains("not a regular file"), "{run}");
}
