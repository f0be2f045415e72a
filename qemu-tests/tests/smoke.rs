//! Smoke scenario: proves the harness and the VM image end to end (2 boots, ~1 min under TCG).
//!
//! Boot 1: containerd is up; certrotor's image as users pull it (the linux/amd64 + linux/arm64
//! index of `bottlerocket/packaging/build-image.sh`, pushed by this test to Debian's
//! `docker-registry` on the host's loopback) is pulled by the index's digest through QEMU's user
//! network (the guest reaches the host's 127.0.0.1 as 10.0.2.2), and run as a superpowered host
//! container (`/.bottlerocket/rootfs`, `/run/api.sock`, host PID namespace, all caps): the
//! binary in it is the index's linux/amd64 one. etcd with TLS stores a token on the persistent
//! disk, then QEMU is killed at a marker (power loss). Boot 2, same disk, no network: the image
//! is still there and etcd returns the token.
//! Guest side: `qemu-tests/scenarios/smoke.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use qemu_tests::registry::{HOST_FROM_GUEST, REPOSITORY, Registry, image_index};
use qemu_tests::{Boot, BootOptions, Scenario};
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

fn timing(b: &Boot, out: &mut String) {
    let mut line = format!("boot {}: total {:.1}s", b.index, b.elapsed.as_secs_f64());
    for m in [
        "BOOTED",
        "CONTAINERD-UP",
        "RUN-BEGIN",
        "MARK IMAGE-READY",
        "MARK ETCD-WRITTEN",
        "RESULT",
        "POWEROFF",
    ] {
        if let Some(t) = b.marker_time(&format!("CERTROTOR-E2E: {m}")) {
            write!(line, ", {m} {:.1}s", t.as_secs_f64()).unwrap();
        }
    }
    eprintln!("{line}");
    out.push_str(&line);
    out.push('\n');
}

fn assert_no_failed_checks(b: &Boot) {
    let results = b.read_out("results.txt").unwrap();
    assert!(
        results.lines().any(|l| l.starts_with("OK ")) && !results.contains("FAIL"),
        "{}",
        b.failure(&format!("guest checks failed:\n{results}"))
    );
}

#[test]
fn smoke_boot_container_etcd_power_loss_reboot() {
    let t0 = std::time::Instant::now();
    let mut sc = Scenario::new("smoke").unwrap();
    let arts = sc.artifacts();
    let token = format!(
        "token-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    sc.set_script(include_str!("../scenarios/smoke.sh"))
        .unwrap();
    sc.write_share("token", token.as_bytes()).unwrap();
    // The shipped image index (both static binaries; cargo-cached), in a registry on loopback.
    let index = image_index().unwrap();
    let amd64 = index.platform("linux/amd64").unwrap();
    let registry = Registry::start("smoke").unwrap();
    registry.push(index).unwrap();
    let image_ref = format!(
        "{HOST_FROM_GUEST}:{}/{REPOSITORY}@{}",
        registry.port(),
        index.digest
    );
    sc.write_share("image-ref", image_ref.as_bytes()).unwrap();
    let setup = t0.elapsed();

    // ---- boot 1: everything, then power loss right after the etcd write
    let b1 = sc
        .boot(&BootOptions {
            user_net: true,
            ..BootOptions::kill_at_mark("ETCD-WRITTEN")
        })
        .unwrap();
    b1.expect_killed().unwrap();
    assert_no_failed_checks(&b1);
    b1.assert_out("checks-rc", "0", "checks-rc");
    assert_eq!(b1.read_out("image-was-present").unwrap(), "no");
    assert_eq!(b1.read_out("boot-count").unwrap(), "1");
    let mounts = b1.read_out("mounts.txt").unwrap();
    for want in [
        "api-sock=ok",
        "certrotor-bin=ok",
        "host-rootfs=ok",
        "rootfs-top=ro",
        "host-var=rw",
        "current-dir=ok",
    ] {
        assert!(
            mounts.lines().any(|l| l == want),
            "{}",
            b1.failure(&format!("host container probe: no {want:?} in:\n{mounts}"))
        );
    }
    if b1.read_out("api-sock").unwrap() == "socket" {
        assert!(mounts.lines().any(|l| l == "api-sock=socket"), "{mounts}");
    }
    let version = b1.read_out("certrotor-version.txt").unwrap();
    assert_eq!(
        version.trim(),
        format!("certrotor {}", index.tag),
        "{}",
        b1.failure("`certrotor version` in the pulled image")
    );
    // containerd holds the index under its digest, both platforms listed, and unpacked amd64's.
    b1.assert_out_contains(
        "image-ls.txt",
        &[
            index.digest.as_str(),
            "application/vnd.oci.image.index.v1+json",
            "linux/amd64",
            "linux/arm64",
        ],
        "ctr images ls",
    );
    let sha = format!("certrotor-sha256={}", amd64.binary_sha256);
    assert!(
        mounts.lines().any(|l| l == sha),
        "{}",
        b1.failure(&format!(
            "the host container's binary is not the index's linux/amd64 one ({sha}):\n{mounts}"
        ))
    );
    // host PID namespace: the container sees the host's PID 1
    let host_pid1 = b1.read_out("host-pid1").unwrap();
    assert!(
        mounts.lines().any(|l| l == format!("pid1={host_pid1}")),
        "{}",
        b1.failure(&format!(
            "not in the host PID namespace: host pid1 {host_pid1:?}, probe:\n{mounts}"
        ))
    );
    // superpowered: CAP_SYS_ADMIN (21) and CAP_SYS_MODULE (16) in the effective set
    let caps = mounts
        .lines()
        .find_map(|l| l.strip_prefix("caps="))
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or(0);
    assert!(
        caps & (1 << 21) != 0 && caps & (1 << 16) != 0,
        "caps {caps:#x}\n{mounts}"
    );

    // ---- boot 2: same /local disk after the power loss
    let b2 = sc.boot(&BootOptions::default()).unwrap();
    b2.expect_success().unwrap();
    assert_no_failed_checks(&b2);
    b2.assert_out("boot-count", "2", "boot counter");
    b2.assert_out(
        "image-was-present",
        "yes",
        "containerd store did not persist",
    );
    assert_eq!(
        b2.read_out("etcd-token").unwrap(),
        token,
        "{}",
        b2.failure("etcd lost the key across the power loss")
    );

    drop(registry);

    let mut report = format!(
        "binaries {:.1}s, images {:.1}s (build-vm.sh, {}), image index {:.1}s, setup total {:.1}s\n",
        arts.bins.build_time.as_secs_f64(),
        arts.images.build_time.as_secs_f64(),
        arts.images.kver,
        index.build_time.as_secs_f64(),
        setup.as_secs_f64()
    );
    eprint!("{report}");
    timing(&b1, &mut report);
    timing(&b2, &mut report);
    let total = format!("smoke total {:.1}s\n", t0.elapsed().as_secs_f64());
    eprint!("{total}");
    report.push_str(&total);
    std::fs::write(sc.dir().join("timings.txt"), report).unwrap();
}
