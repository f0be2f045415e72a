//! Issue 9 §3.4: scenario a (`renew-expiring.sh`) with the static pods under the real kubelet
//! v1.20.2 instead of kubelet-sim: standalone (no API server of its own), containerd's CRI,
//! `--pod-manifest-path` the folder the Bottlerocket API renders into, and the components as OCI
//! images built here without docker (kube-apiserver, kube-controller-manager, kube-scheduler
//! v1.20.2, Debian's etcd, the pause sandbox). certrotor renews from its host container and
//! restarts each static pod through the API; the real kubelet stops and starts the containers.
//! Asserted: exit 0, the new certificates served, kubectl with the renewed admin.conf.
//! Figures: the time to a healthy control plane under the real kubelet, and the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn k8s_bin() -> PathBuf {
    std::env::var_os("CERTROTOR_K8S_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(qemu_tests::artifacts::DEFAULT_K8S_BIN))
}

/// `images/oci-image.sh BINARY OUT --name REF --dest DEST [--add SRC:DEST]...`
fn image(binary: &Path, out: &Path, reference: &str, dest: &str, adds: &[String]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut c = Command::new("bash");
    c.arg(root.join("images/oci-image.sh"))
        .arg(binary)
        .arg(out)
        .args(["--name", reference, "--dest", dest]);
    for a in adds {
        c.args(["--add", a]);
    }
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{reference}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The shared libraries of a dynamically linked binary, as `--add SRC:SRC` specs.
fn libraries(binary: &Path) -> Vec<String> {
    let o = Command::new("ldd").arg(binary).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(|lib| {
            let real = std::fs::canonicalize(lib).unwrap();
            format!("{}:{lib}", real.display())
        })
        .collect()
}

#[test]
#[ignore = "issue 9 §3.4 measurement: the real kubelet in the VM (run with --ignored); kubelet-sim \
            runs the static pods in the suite, see README for the figures"]
fn real_kubelet_runs_the_static_pods_and_certrotor_renews() {
    let (mut sc, t0) = scenario(
        "real-kubelet",
        include_str!("../scenarios/renew-expiring.sh"),
    );
    let bin = k8s_bin();
    for needed in ["kubelet", "pause"] {
        assert!(
            bin.join(needed).is_file(),
            "{} missing: build Kubernetes v1.20.2 with images/k8s/build.sh",
            bin.join(needed).display()
        );
    }
    let images = sc.share_dir().join("k8s-images");
    std::fs::create_dir_all(&images).unwrap();
    let started = std::time::Instant::now();
    for name in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        image(
            &bin.join(name),
            &images.join(format!("{name}.tar")),
            &format!("k8s.gcr.io/{name}:v1.20.2"),
            &format!("/usr/local/bin/{name}"),
            &[],
        );
    }
    let etcd = Path::new("/usr/bin/etcd");
    image(
        etcd,
        &images.join("etcd.tar"),
        "k8s.gcr.io/etcd:3.4.13-0",
        "/usr/local/bin/etcd",
        &libraries(etcd),
    );
    image(
        &bin.join("pause"),
        &images.join("pause.tar"),
        "k8s.gcr.io/pause:3.2",
        "/pause",
        &[],
    );
    let image_time = started.elapsed();
    std::fs::copy(bin.join("kubelet"), sc.share_dir().join("kubelet")).unwrap();
    sc.write_share("real-kubelet", b"yes").unwrap();

    let b = sc
        .boot(&qemu_tests::BootOptions {
            timeout: boot_timeout(3),
            ..qemu_tests::BootOptions::default()
        })
        .unwrap();
    let mut f = Figures::new("real-kubelet (issue 9 §3.4)");
    f.line(format!(
        "component images built on the host in {:.1}s",
        image_time.as_secs_f64()
    ));
    f.boot(&b);
    if let Ok(t) = b.read_out("node-kubelet-times.txt") {
        f.line(t);
    }
    b.expect_success().unwrap();
    assert_guest_checks(&b);
    assert_eq!(
        b.read_out("run.rc").unwrap(),
        "0",
        "{}",
        b.failure("run rc")
    );
    let report = json(&b, "run.json");
    assert_served_equals_files(&b, "served-after.txt");
    assert_kubectl_after(&b, &sc, "after", true);
    f.unavailability(&b, "host container run --once", &report, None);
    f.readyz(&b, "host container run --once", "readyz.txt");
    f.finish(&sc, t0);
}
