//! `certrotor daemon`: passes repeat at the interval, each decision is logged, and SIGTERM stops
//! it between passes with exit 0.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_certrotor");

/// A fresh `lab init` node (certificates expiring in 2 days) in the temp dir, named by `prefix`
/// and this process.
fn lab_node(prefix: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    crate::renew_util::expiring_ecdsa(&root)
}

/// `certrotor <head> --root <root> --interval <interval> --platform none`, stderr piped.
fn daemon(head: &[&str], root: &Path, interval: &str) -> Child {
    Command::new(BIN)
        .args(head)
        .arg("--root")
        .arg(root)
        .args(["--interval", interval, "--platform", "none"])
        // The lab node's admin.conf names 10.0.0.10: no Kubernetes Events (events.rs tests them).
        .env("CERTROTOR_EVENTS", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// SIGTERM the daemon and wait (20 s at most) for it to exit.
fn sigterm_and_wait(child: &mut Child) -> ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "daemon did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn daemon_repeats_passes_logs_decisions_and_stops_on_sigterm() {
    let root = lab_node("certrotor-daemon");
    let mut child = daemon(&["daemon"], &root, "2s");
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Two passes: the first renews the 11 due certificates, the second finds nothing due.
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while lines
        .iter()
        .filter(|l: &&String| l.contains("pass done"))
        .count()
        < 2
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => {
                let _ = child.kill();
                panic!("fewer than two passes within 60 s:\n{}", lines.join("\n"));
            }
        }
    }
    let status = sigterm_and_wait(&mut child);
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
        lines.push(l);
    }
    let log = lines.join("\n");
    assert!(status.success(), "exit {status:?}\n{log}");
    let passes: Vec<&String> = lines.iter().filter(|l| l.contains("pass done")).collect();
    assert!(passes[0].contains("11 renewed"), "{log}");
    assert!(passes[1].contains("0 renewed"), "{log}");
    assert!(
        log.contains("daemon started")
            && log.contains("next pass in")
            && log.contains("daemon stopping"),
        "{log}"
    );
    assert!(
        log.contains("platform none: restart etcd, kube-apiserver"),
        "{log}"
    );
    assert!(!log.contains("PRIVATE KEY"), "key material in the log");
    let _ = std::fs::remove_dir_all(&root);
}

/// The reader of the daemon's stderr goes away (a log shipper restarted, a closed terminal): the
/// daemon keeps running its passes, renews, and still stops cleanly on SIGTERM.
#[test]
fn daemon_survives_a_closed_stderr() {
    let root = lab_node("certrotor-daemon-epipe");
    let mut child = daemon(&["--log-level", "debug", "daemon"], &root, "1s");
    // Close the only reader at once: every log line now meets EPIPE.
    drop(child.stderr.take());
    // Wait for the first pass to renew: check exits 0 once nothing expires within a day (the
    // lab's leaves expire in 2 days; kubelet.conf, which certrotor never renews, in 46 hours).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the daemon died after its stderr closed"
        );
        let check = Command::new(BIN)
            .args([
                "--log-level",
                "off",
                "check",
                "--warn-within",
                "1d",
                "--root",
            ])
            .arg(&root)
            .output()
            .unwrap();
        if check.status.code() == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "no renewal within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    // More passes (and log lines) after the renewal; still alive.
    std::thread::sleep(Duration::from_secs(3));
    assert!(child.try_wait().unwrap().is_none(), "the daemon died");
    let status = sigterm_and_wait(&mut child);
    assert!(status.success(), "exit {status:?}");
    let _ = std::fs::remove_dir_all(&root);
}
