//! certrotor's own state files as untrusted input (issues 13.1 and 14): a damaged, hostile or
//! future-version journal, pass state (and the restart marker and owed-restarts record of
//! earlier releases) or backup manifest stops the command with a clear error (exit 2) naming
//! the file and the entry, and nothing is written anywhere: every file under the node root AND
//! its parent folder is compared before and after. And the pass state claims only what
//! happened, whatever step a pass was killed at (issues 26.4, 28.3).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::renew_util::*;
use crate::util::each_field;

const STATE: &str = "var/lib/certrotor";
const PKI: &str = "etc/kubernetes/pki";
/// What a rollback says of a backed-up apiserver certificate that does not match its key.
const KEY_MISMATCH: [&str; 2] = ["pki/apiserver.crt", "does not match its key"];

/// A lab node `node` under a fresh folder (with a file `victim.txt` next to it) renewed once,
/// so that it has one backup. Returns (folder, root, backup id).
fn node_with_backup(tag: &str) -> (TempDir, PathBuf, String) {
    let (t, root) = node_with_victim(tag);
    certrotor(&["renew", "--root", s(&root)]).run().ok();
    let ids = backup_ids(&root);
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids[0].clone();
    (t, root, id)
}

/// A lab node `node` (due in two days) under a fresh folder, with a file `victim.txt` next to
/// it. Returns (folder, root).
fn node_with_victim(tag: &str) -> (TempDir, PathBuf) {
    let t = TempDir::new(tag);
    let root = expiring_ecdsa(&t.join("node"));
    std::fs::write(t.join("victim.txt"), "the victim\n").unwrap();
    (t, root)
}

fn backup_dir(root: &Path, id: &str) -> PathBuf {
    root.join(STATE).join("backups").join(id)
}

/// The backup's copy of the PKI file `name` (`apiserver.crt`).
fn backup_copy(root: &Path, id: &str, name: &str) -> PathBuf {
    backup_dir(root, id).join("files").join(PKI).join(name)
}

/// Moves `folder` to `outside` and leaves a symbolic link to it in its place.
fn link_out(folder: &Path, outside: &Path) {
    std::fs::rename(folder, outside).unwrap();
    std::os::unix::fs::symlink(outside, folder).unwrap();
}

fn read_manifest(root: &Path, id: &str) -> Value {
    serde_json::from_slice(&std::fs::read(backup_dir(root, id).join("manifest.json")).unwrap())
        .unwrap()
}

fn write_manifest(root: &Path, id: &str, m: &Value) {
    std::fs::write(
        backup_dir(root, id).join("manifest.json"),
        serde_json::to_vec_pretty(m).unwrap(),
    )
    .unwrap();
}

/// Everything under the test folder (node root and its parent), except the lock file, whose
/// content (the holder's pid) every command rewrites, and the record of the last pass, which a
/// refused `run` writes to say it failed (for `status`).
fn everything(t: &TempDir) -> Snapshot {
    snapshot(
        &t.path,
        &[
            "node/var/lib/certrotor/lock",
            "node/var/lib/certrotor/last-pass.json",
        ],
    )
}

/// Runs `args`, which must fail with exit 2 saying every one of `words`, and change nothing
/// under the test folder.
#[track_caller]
fn refused_and_unchanged(t: &TempDir, args: &[&str], words: &[&str]) -> Output {
    let before = everything(t);
    let out = certrotor(args).run().expect_code(2).says(words);
    assert_same(
        &before,
        &everything(t),
        &format!("after {}", args.join(" ")),
    );
    assert_eq!(
        std::fs::read_to_string(t.join("victim.txt")).unwrap(),
        "the victim\n"
    );
    out
}

/// The path of the state file `name`, its folder made.
fn state_file(root: &Path, name: &str) -> PathBuf {
    let state = root.join(STATE);
    std::fs::create_dir_all(&state).unwrap();
    state.join(name)
}

/// For each (bytes, words) of `cases`: `file` holding the bytes, `args` must be refused saying
/// the words, changing nothing.
#[track_caller]
fn each_refused(t: &TempDir, file: &Path, args: &[&str], cases: &[(&[u8], &[&str])]) {
    for (bytes, words) in cases {
        std::fs::write(file, bytes).unwrap();
        refused_and_unchanged(t, args, words);
    }
}

/// `certrotor backups --output json` lists backup `id` as damaged, with a problem naming `word`.
#[track_caller]
fn listed_damaged(root: &Path, id: &str, word: &str) {
    let out = certrotor(&["backups", "--root", s(root), "--output", "json"])
        .run()
        .ok();
    let list: Value = serde_json::from_str(&out.stdout).unwrap();
    let b = list
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == id)
        .unwrap_or_else(|| panic!("backup {id} not listed\n{out}"));
    assert_eq!(b["status"], "damaged", "{out}");
    assert!(
        b["problem"].as_str().unwrap_or_default().contains(word),
        "problem lacks '{word}'\n{out}"
    );
    // And the table says so.
    certrotor(&["backups", "--root", s(root)])
        .run()
        .ok()
        .says(&["damaged", id]);
}

/// `rollback --backup id` must be refused saying `words`, changing nothing.
#[track_caller]
fn rollback_refused(t: &TempDir, root: &Path, id: &str, words: &[&str]) {
    refused_and_unchanged(t, &rollback_args(root, id), words);
}

/// `renew` must be refused saying `words`, changing nothing.
#[track_caller]
fn renew_refused(t: &TempDir, root: &Path, words: &[&str]) {
    refused_and_unchanged(t, &["renew", "--root", s(root)], words);
}

/// `backups --output json`, parsed.
fn backups_json(root: &Path) -> Value {
    let out = certrotor(&["backups", "--root", s(root), "--output", "json"])
        .run()
        .ok();
    serde_json::from_str(&out.stdout).unwrap()
}

fn rollback_args<'a>(root: &'a Path, id: &'a str) -> Vec<&'a str> {
    vec!["rollback", "--root", s(root), "--backup", id]
}

/// The file entry of the manifest for `path`.
fn entry<'a>(m: &'a mut Value, path: &str) -> &'a mut Value {
    m["files"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|f| f["path"] == path)
        .unwrap()
}

#[test]
fn manifests_are_versioned_with_size_and_sha256() {
    let (_t, root, id) = node_with_backup("manifest-v2");
    let m = read_manifest(&root, &id);
    assert_eq!(m["version"], 2, "{m}");
    for f in m["files"].as_array().unwrap() {
        let path = f["path"].as_str().unwrap();
        if f["existed"] == false {
            // A file the renewal created (the kubelet's new dated file): restoring removes it.
            assert!(f["sha256"].is_null() && f.get("size").is_none(), "{f}");
            continue;
        }
        if let Some(target) = f["link"].as_str() {
            // The kubelet's link: its target is recorded, no copy.
            assert_eq!(f["size"], target.len(), "{path}");
            assert_eq!(f["sha256"], sha256(target.as_bytes()), "{path}");
            assert!(!backup_dir(&root, &id).join("files").join(path).exists());
            continue;
        }
        let data = std::fs::read(backup_dir(&root, &id).join("files").join(path)).unwrap();
        assert_eq!(f["size"], data.len(), "{path}");
        assert_eq!(f["sha256"], sha256(&data), "{path}");
    }
    let list = backups_json(&root);
    assert_eq!(list[0]["status"], "ok", "{list}");
    assert_eq!(list[0]["version"], 2, "{list}");
}

#[test]
fn a_manifest_naming_a_path_outside_the_root_writes_nothing() {
    let (t, root, id) = node_with_backup("traversal");
    // The hostile manifest of issue 14: an entry `../victim.txt` whose copy in the backup has
    // the recorded size and SHA-256, so that only the path check can stop it.
    let evil = b"overwritten by a hostile backup\n";
    std::fs::write(backup_dir(&root, &id).join("victim.txt"), evil).unwrap();
    let mut m = read_manifest(&root, &id);
    m["files"].as_array_mut().unwrap().push(json!({
        "path": "../victim.txt", "existed": true, "sha256": sha256(evil),
        "size": evil.len(), "mode": 0o644
    }));
    write_manifest(&root, &id, &m);
    let args = rollback_args(&root, &id);
    refused_and_unchanged(&t, &args, &["manifest.json", "'../victim.txt'", "damaged"]);
    // The default rollback (newest backup) refuses it the same way.
    refused_and_unchanged(&t, &["rollback", "--root", s(&root)], &["'../victim.txt'"]);
    listed_damaged(&root, &id, "../victim.txt");

    // Deeper: a path that climbs out from inside the PKI folder.
    let mut m = read_manifest(&root, &id);
    let last = m["files"].as_array_mut().unwrap().last_mut().unwrap();
    last["path"] = json!(format!("{PKI}/../../../../victim.txt"));
    write_manifest(&root, &id, &m);
    refused_and_unchanged(&t, &args, &["../victim.txt", "'..' part"]);
}

#[test]
fn a_manifest_naming_an_absolute_path_writes_nothing() {
    let (t, root, id) = node_with_backup("absolute");
    let victim = t.join("victim.txt");
    let mut m = read_manifest(&root, &id);
    let e = entry(&mut m, &format!("{PKI}/apiserver.crt"));
    e["path"] = json!(s(&victim));
    write_manifest(&root, &id, &m);
    let args = rollback_args(&root, &id);
    refused_and_unchanged(&t, &args, &[s(&victim), "absolute"]);
    listed_damaged(&root, &id, "absolute");
}

#[test]
fn a_manifest_naming_a_file_certrotor_does_not_renew_writes_nothing() {
    let (t, root, id) = node_with_backup("not-catalog");
    // Inside the root, plain names, but not a file certrotor writes: the service-account key
    // (a CA's pair is one since CA rotation, issue 29).
    let mut m = read_manifest(&root, &id);
    entry(&mut m, &format!("{PKI}/apiserver.key"))["path"] = json!(format!("{PKI}/sa.key"));
    write_manifest(&root, &id, &m);
    rollback_refused(
        &t,
        &root,
        &id,
        &["pki/sa.key", "not a file certrotor writes"],
    );
}

#[test]
fn a_symlink_in_the_backup_pointing_out_of_the_root_writes_nothing() {
    let (t, root, id) = node_with_backup("backup-symlink");
    // The backup's copy becomes a link to a file outside the root with the same bytes, so that
    // size and SHA-256 match: only the symlink check can stop it.
    let copy = backup_copy(&root, &id, "apiserver.crt");
    let outside = t.join("outside.crt");
    std::fs::copy(&copy, &outside).unwrap();
    std::fs::remove_file(&copy).unwrap();
    std::os::unix::fs::symlink(&outside, &copy).unwrap();
    rollback_refused(&t, &root, &id, &["apiserver.crt", "symlink"]);
    listed_damaged(&root, &id, "symlink");
    // A linked folder in the backup is refused as well.
    std::fs::remove_file(&copy).unwrap();
    std::fs::copy(&outside, &copy).unwrap();
    link_out(&backup_copy(&root, &id, "etcd"), &t.join("outside-etcd"));
    rollback_refused(&t, &root, &id, &["etcd", "symlink"]);
}

#[test]
fn a_live_folder_linked_out_of_the_root_writes_nothing() {
    let (t, root, id) = node_with_backup("live-symlink");
    // The node's etcd PKI folder is replaced by a link to a folder outside the root: restoring
    // through it would write outside the root.
    link_out(&root.join(PKI).join("etcd"), &t.join("outside-etcd"));
    rollback_refused(&t, &root, &id, &["pki/etcd/", "outside the node root"]);
}

#[test]
fn a_file_missing_from_the_backup_is_refused() {
    let (t, root, id) = node_with_backup("missing");
    std::fs::remove_file(backup_copy(&root, &id, "apiserver.key")).unwrap();
    rollback_refused(&t, &root, &id, &["pki/apiserver.key", "missing", "damaged"]);
    listed_damaged(&root, &id, "missing");
}

#[test]
fn a_file_altered_after_the_backup_is_refused() {
    let (t, root, id) = node_with_backup("altered");
    let copy = backup_copy(&root, &id, "apiserver.crt");
    let original = std::fs::read(&copy).unwrap();
    // Grown: the size differs.
    let mut grown = original.clone();
    grown.extend_from_slice(b"\n");
    std::fs::write(&copy, &grown).unwrap();
    rollback_refused(&t, &root, &id, &["pki/apiserver.crt", "bytes", "altered"]);
    // Same size, one byte changed: the SHA-256 differs.
    let mut flipped = original.clone();
    let i = flipped.len() / 2;
    flipped[i] ^= 0x01;
    std::fs::write(&copy, &flipped).unwrap();
    rollback_refused(&t, &root, &id, &["pki/apiserver.crt", "sha-256", "altered"]);
    listed_damaged(&root, &id, "SHA-256");
    // A certificate that does not match its key, with size and SHA-256 recorded to match: the
    // copy of another certificate.
    std::fs::write(&copy, &original).unwrap();
    let other = std::fs::read(backup_copy(&root, &id, "front-proxy-client.crt")).unwrap();
    std::fs::write(&copy, &other).unwrap();
    let mut m = read_manifest(&root, &id);
    let e = entry(&mut m, &format!("{PKI}/apiserver.crt"));
    e["sha256"] = json!(sha256(&other));
    e["size"] = json!(other.len());
    write_manifest(&root, &id, &m);
    rollback_refused(&t, &root, &id, &KEY_MISMATCH);
}

#[test]
fn a_manifest_of_an_unknown_version_is_refused() {
    let (t, root, id) = node_with_backup("future-manifest");
    let mut m = read_manifest(&root, &id);
    m["version"] = json!(99);
    write_manifest(&root, &id, &m);
    rollback_refused(
        &t,
        &root,
        &id,
        &["manifest.json", "version 99", "does not know"],
    );
    listed_damaged(&root, &id, "version 99");
    // Truncated.
    let text = serde_json::to_string(&read_manifest_raw(&root, &id)).unwrap();
    std::fs::write(
        backup_dir(&root, &id).join("manifest.json"),
        &text[..text.len() / 2],
    )
    .unwrap();
    rollback_refused(&t, &root, &id, &["manifest.json", "not valid JSON"]);
}

fn read_manifest_raw(root: &Path, id: &str) -> Value {
    let text = std::fs::read_to_string(backup_dir(root, id).join("manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|_| json!({}))
}

/// Backups made by the first release (manifest without version and sizes, SHA-256 only) exist
/// on real nodes: they are restored after their SHA-256 is checked, with a note that sizes
/// were not recorded; altered, they are refused like any other.
#[test]
fn a_version_1_manifest_is_verified_by_sha256_and_restored() {
    let (t, root, id) = node_with_backup("manifest-v1");
    let mut m = read_manifest(&root, &id);
    m.as_object_mut().unwrap().remove("version");
    for f in m["files"].as_array_mut().unwrap() {
        f.as_object_mut().unwrap().remove("size");
    }
    write_manifest(&root, &id, &m);
    let list = backups_json(&root);
    assert_eq!(list[0]["status"], "ok", "{list}");
    assert_eq!(list[0]["version"], 1, "{list}");
    assert!(list[0]["note"].as_str().unwrap().contains("version 1"));
    // Altered, it is refused.
    let copy = backup_copy(&root, &id, "apiserver.crt");
    let original = std::fs::read(&copy).unwrap();
    std::fs::write(&copy, [original.as_slice(), b"\n"].concat()).unwrap();
    rollback_refused(&t, &root, &id, &["sha-256"]);
    std::fs::write(&copy, &original).unwrap();
    // Intact, it is restored: the live files are the backup's copies again.
    certrotor(&rollback_args(&root, &id))
        .run()
        .ok()
        .says(&["manifest version 1", &format!("Restored backup {id}")]);
    for f in m["files"].as_array().unwrap() {
        let path = f["path"].as_str().unwrap();
        if f["existed"] == false {
            assert!(
                std::fs::symlink_metadata(root.join(path)).is_err(),
                "{path}"
            );
            continue;
        }
        if let Some(target) = f["link"].as_str() {
            assert_eq!(
                std::fs::read_link(root.join(path)).unwrap(),
                Path::new(target),
                "{path}"
            );
            continue;
        }
        assert_eq!(
            std::fs::read(root.join(path)).unwrap(),
            std::fs::read(backup_dir(&root, &id).join("files").join(path)).unwrap(),
            "{path}"
        );
    }
}

// === Recovery (issue 13.1) ===

/// A node whose renewal was killed right after its journal was written: the live PKI is old,
/// the staged files and the journal are there.
fn interrupted(tag: &str) -> (TempDir, PathBuf) {
    let (t, root) = node_with_victim(tag);
    certrotor(&["renew", "--root", s(&root)])
        .env("CERTROTOR_FAILPOINT", "journaled")
        .run()
        .expect_sigkill();
    assert!(root.join(STATE).join("journal.json").is_file());
    (t, root)
}

fn staging_folders(root: &Path) -> usize {
    snapshot(root, &[])
        .keys()
        .filter(|k| {
            let name = k.rsplit('/').next().unwrap_or_default();
            name.starts_with(".certrotor-staging-")
        })
        .count()
}

/// The journal of an interrupted node: (its path, its bytes, its JSON).
fn read_journal(root: &Path) -> (PathBuf, Vec<u8>, Value) {
    let journal = root.join(STATE).join("journal.json");
    let original = std::fs::read(&journal).unwrap();
    let j = serde_json::from_slice(&original).unwrap();
    (journal, original, j)
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec(v).unwrap()).unwrap();
}

/// Renewing after the journal is usable again completes the interrupted transaction.
#[track_caller]
fn rolls_forward(root: &Path) {
    certrotor(&["renew", "--root", s(root)])
        .run()
        .ok()
        .says(&["completed an interrupted renew"]);
    assert_eq!(staging_folders(root), 0);
    assert!(!root.join(STATE).join("journal.json").exists());
}

#[test]
fn an_unreadable_journal_stops_recovery_and_keeps_the_staged_files() {
    let (t, root) = interrupted("journal-unreadable");
    let journal = root.join(STATE).join("journal.json");
    let staged = staging_folders(&root);
    assert!(staged > 0);
    // A journal that exists but cannot be read (here: a folder in its place; the tests run as
    // root, so permissions would not stop the read). The old code took this for "no journal"
    // and removed the staging folders, making the roll forward impossible.
    let saved = t.join("journal.saved");
    std::fs::rename(&journal, &saved).unwrap();
    std::fs::create_dir(&journal).unwrap();
    for args in [
        vec!["renew", "--root", s(&root)],
        vec!["check", "--root", s(&root)],
        vec!["backups", "--root", s(&root)],
    ] {
        refused_and_unchanged(
            &t,
            &args,
            &["journal", "journal.json", "not a regular file"],
        );
    }
    assert_eq!(staging_folders(&root), staged);
    std::fs::remove_dir(&journal).unwrap();
    std::fs::rename(&saved, &journal).unwrap();
    rolls_forward(&root);
}

#[test]
fn a_journal_of_a_future_version_is_refused() {
    let (t, root) = interrupted("journal-future");
    let (journal, original, mut j) = read_journal(&root);
    j["version"] = json!(2);
    write_json(&journal, &j);
    renew_refused(&t, &root, &["journal.json", "version 2", "does not know"]);
    // Truncated.
    std::fs::write(&journal, &original[..original.len() / 3]).unwrap();
    renew_refused(&t, &root, &["journal.json", "not valid JSON"]);
    std::fs::write(&journal, &original).unwrap();
    rolls_forward(&root);
}

#[test]
fn a_journal_naming_a_path_outside_the_root_writes_nothing() {
    let (t, root) = interrupted("journal-traversal");
    let (journal, original, j) = read_journal(&root);
    let cases: [(&str, Value, &[&str]); 3] = [
        // The first staged file would be renamed over `../victim.txt`.
        (
            "/files/0/rel",
            json!("../victim.txt"),
            &["journal.json", "'../victim.txt'"],
        ),
        // A staged path elsewhere than the live file's staging folder.
        (
            "/files/0/staged",
            json!(format!("{STATE}/backups/x")),
            &["not a staged copy"],
        ),
        // A staging folder to remove that is not one.
        (
            "/staging_dirs/0",
            json!("etc/kubernetes"),
            &["'etc/kubernetes'", "not the staging folder"],
        ),
    ];
    for (field, value, words) in cases {
        let mut evil = j.clone();
        *evil.pointer_mut(field).unwrap() = value;
        write_json(&journal, &evil);
        renew_refused(&t, &root, words);
    }
    std::fs::write(&journal, &original).unwrap();
    rolls_forward(&root);
}

#[test]
fn a_truncated_restart_marker_is_an_error_not_absent() {
    let (t, root) = node_with_victim("marker");
    let marker = state_file(&root, "restart.json");
    let whole =
        br#"{"version":1,"platform":"kubeadm","pod":"kube-apiserver.yaml","api_socket":null}"#;
    let cases: [(&[u8], &[&str]); 4] = [
        // Truncated.
        (
            &whole[..30],
            &[
                "restart marker",
                "restart.json",
                "not valid JSON",
                "static pod may be stopped",
            ],
        ),
        // A future version.
        (
            br#"{"version":5,"platform":"kubeadm","pod":"kube-apiserver.yaml"}"#,
            &["version 5"],
        ),
        // A pod name that climbs out of the parked folder.
        (
            br#"{"version":1,"platform":"kubeadm","pod":"../../../../victim.txt"}"#,
            &["pod ../../../../victim.txt"],
        ),
        // An unknown platform is refused, not taken for kubeadm.
        (
            br#"{"version":1,"platform":"systemd","pod":"kube-apiserver.yaml"}"#,
            &["platform systemd", "unknown platform"],
        ),
    ];
    each_refused(&t, &marker, &["renew", "--root", s(&root)], &cases);
}

#[test]
fn a_damaged_owed_restarts_record_stops_the_pass() {
    let (t, root) = node_with_victim("pending");
    let pending = state_file(&root, "pending-restarts.json");
    let run = ["run", "--once", "--root", s(&root), "--platform", "kubeadm"];
    let cases: [(&[u8], &[&str]); 4] = [
        (
            br#"{"version":1,"components":["kube-apiser"#,
            &[
                "owed-restarts record",
                "pending-restarts.json",
                "not valid JSON",
            ],
        ),
        (
            br#"{"version":3,"components":[]}"#,
            &["pending-restarts.json", "version 3"],
        ),
        (
            br#"{"version":1,"components":["kube-apiserver"],"backup_id":"../../../x"}"#,
            &["backup_id ../../../x"],
        ),
        (
            br#"{"version":2,"components":[],"pods":["../kube-vip.yaml"],"backup_id":null}"#,
            &["pods ../kube-vip.yaml"],
        ),
    ];
    each_refused(&t, &pending, &run, &cases);
}

/// A renewal with `--reuse-keys` backs up certificates without their keys: the backup's
/// certificates are checked against the live keys, and restored.
#[test]
fn a_backup_without_keys_is_checked_against_the_live_keys() {
    let (t, root) = expiring_in("reuse-keys");
    let before = snapshot(&root.join("etc/kubernetes"), &[]);
    certrotor(&["renew", "--root", s(&root), "--reuse-keys"])
        .run()
        .ok();
    let id = backup_ids(&root).pop().unwrap();
    let m = read_manifest(&root, &id);
    let paths = each_field(&m["files"], "path");
    assert!(paths.contains(&"etc/kubernetes/pki/apiserver.crt"), "{m}");
    assert!(!paths.contains(&"etc/kubernetes/pki/apiserver.key"), "{m}");
    certrotor(&rollback_args(&root, &id)).run().ok();
    assert_same(
        &before,
        &snapshot(&root.join("etc/kubernetes"), &[]),
        "after rollback",
    );
    // A live key that no longer matches the backed-up certificate makes the backup unusable.
    std::fs::write(t.join("victim.txt"), "the victim\n").unwrap();
    let live_key = root.join(PKI).join("apiserver.key");
    let other = std::fs::read(root.join(PKI).join("front-proxy-client.key")).unwrap();
    std::fs::write(&live_key, other).unwrap();
    rollback_refused(&t, &root, &id, &KEY_MISMATCH);
}

/// A backup folder that exists but cannot be listed is an error, never "no backups".
#[test]
fn an_unlistable_backup_folder_is_an_error() {
    let (t, root, _id) = node_with_backup("unlistable");
    let backups = root.join(STATE).join("backups");
    std::fs::rename(&backups, t.join("backups.saved")).unwrap();
    std::fs::write(&backups, "not a folder").unwrap();
    for args in [
        vec!["backups", "--root", s(&root)],
        vec!["rollback", "--root", s(&root)],
    ] {
        refused_and_unchanged(&t, &args, &["backups", "cannot be listed"]);
    }
}

#[test]
fn a_damaged_pass_state_stops_every_command() {
    let (t, root) = node_with_victim("pass-state");
    let pass = state_file(&root, "pass.json");
    let commands: [&[&str]; 4] = [
        &["check", "--root", s(&root)],
        &["renew", "--root", s(&root)],
        &["run", "--once", "--root", s(&root), "--platform", "kubeadm"],
        &["status", "--root", s(&root), "--cluster", "off"],
    ];
    std::fs::write(&pass, br#"{"version":1,"stage":"writ"#).unwrap();
    for args in commands {
        refused_and_unchanged(&t, args, &["pass state", "pass.json", "not valid JSON"]);
    }
    let cases: [(&[u8], &[&str]); 4] = [
        (br#"{"version":2,"stage":"written"}"#, &["pass.json", "version 2"]),
        (
            br#"{"version":1,"stage":"written","backup_id":"../../../x"}"#,
            &["backup ../../../x"],
        ),
        (
            br#"{"version":1,"stage":"written","owed":{"pods":["../kube-vip.yaml"]}}"#,
            &["pods ../kube-vip.yaml"],
        ),
        (
            br#"{"version":1,"stage":"restarting","stopped":{"platform":"kubeadm","pod":"../../../../victim.txt"}}"#,
            &["pod ../../../../victim.txt"],
        ),
    ];
    each_refused(&t, &pass, &["renew", "--root", s(&root)], &cases);
}

/// A `run` pass killed at each step of its renewal's transaction: before the journal nothing
/// changed and nothing is owed (the next command says so); from the journal on the files are
/// renewed and the restarts are owed, against the renewal's backup.
#[test]
fn a_pass_killed_while_writing_owes_restarts_only_if_it_renewed() {
    let t = TempDir::new("pass-kill");
    let pristine = expiring_ecdsa(&t.join("pristine"));
    for point in [
        "staged-all",
        "backed-up",
        "journaled",
        "renamed",
        "staging-removed",
    ] {
        let root = t.join(point);
        copy_tree(&pristine, &root);
        let run = ["run", "--once", "--root", s(&root), "--platform", "kubeadm"];
        let out = certrotor(&run).env("CERTROTOR_FAILPOINT", point).run();
        out.expect_sigkill();
        let status = certrotor(&[
            "status",
            "--root",
            s(&root),
            "--cluster",
            "off",
            "--output",
            "json",
        ])
        .run()
        .ok();
        let report: Value = serde_json::from_str(&status.stdout).unwrap();
        let owed = &report["owed_restarts"];
        let stderr = status.stderr.clone();
        let pass: Value = serde_json::from_slice(
            &std::fs::read(root.join(STATE).join("pass.json")).unwrap_or_default(),
        )
        .unwrap_or(Value::Null);
        if ["staged-all", "backed-up"].contains(&point) {
            assert_eq!(owed["components"], json!([]), "{point}: {status}");
            assert!(owed["backup_id"].is_null(), "{point}: {status}");
            assert!(
                stderr.contains("stopped before it changed any file; nothing new is owed"),
                "{point}: {status}"
            );
            assert!(pass.is_null(), "{point}: the pass state is left: {pass}");
        } else {
            assert_eq!(
                owed["components"],
                json!([
                    "etcd",
                    "kube-apiserver",
                    "kube-controller-manager",
                    "kube-scheduler"
                ]),
                "{point}: {status}"
            );
            let backup = owed["backup_id"].as_str().unwrap();
            assert_eq!(backup_ids(&root), [backup.to_string()], "{point}");
            assert!(
                stderr.contains(&format!(
                    "an interrupted pass renewed files (backup {backup})"
                )),
                "{point}: {status}"
            );
            assert_eq!(pass["stage"], "written", "{point}: {pass}");
        }
    }
}
