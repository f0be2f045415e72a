//! Tests of the restart stage's platform detection and of starting again a pod a crashed run
//! left stopped.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use super::api::ApiStats;
use super::platform::BOTTLEROCKET_STATIC_PODS;
use super::stop::PARKED;
use super::*;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("certrotor-restart-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("root")).unwrap();
    dir
}

fn options(socket: PathBuf, timeout: Duration) -> RestartOptions {
    RestartOptions {
        platform: PlatformChoice::Auto,
        api_socket: socket,
        timeout,
        poll: Duration::from_millis(20),
        endpoints: BTreeMap::new(),
        mode: reload::RestartMode::Always,
        reload_timeout: Duration::ZERO,
        reload: Default::default(),
        settle: Duration::ZERO,
    }
}

#[test]
fn a_bottlerocket_node_is_known_by_its_marks_while_its_api_socket_is_absent() {
    let dir = temp("marks");
    let (root, socket) = (dir.join("root"), dir.join("api.sock"));
    let opts = options(socket.clone(), Duration::from_millis(300));
    assert!(matches!(detect(&root, &opts), Ok(Platform::None)));
    // The static pods folder: Bottlerocket, and the socket does not come within the bound.
    fs::create_dir_all(root.join(BOTTLEROCKET_STATIC_PODS)).unwrap();
    let err = detect(&root, &opts).unwrap_err();
    assert!(err.message.contains("did not appear within"), "{err}");
    fs::remove_dir_all(root.join("etc")).unwrap();
    // os-release says so; the socket appears while certrotor waits for it.
    fs::create_dir_all(root.join("usr/lib")).unwrap();
    fs::write(
        root.join("usr/lib/os-release"),
        "NAME=Bottlerocket\nID=bottlerocket\n",
    )
    .unwrap();
    assert!(bottlerocket_mark(&root).is_some());
    let opts = options(socket.clone(), Duration::from_secs(30));
    let binder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        std::os::unix::net::UnixListener::bind(&socket).unwrap()
    });
    assert!(matches!(
        detect(&root, &opts),
        Ok(Platform::Bottlerocket { .. })
    ));
    drop(binder.join().unwrap());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ensure_enabled_starts_a_parked_pod_and_leaves_a_running_one_alone() {
    let dir = temp("ensure");
    let root = dir.join("root");
    fs::create_dir_all(root.join(KUBEADM_MANIFESTS)).unwrap();
    fs::create_dir_all(root.join(PARKED)).unwrap();
    fs::write(root.join(PARKED).join("etcd.yaml"), "kind: Pod\n").unwrap();
    let stopped = |pod: &str| Stopped {
        platform: "kubeadm".into(),
        pod: pod.into(),
        api_socket: None,
        component: None,
    };
    let bound = (Duration::from_secs(1), Duration::from_millis(10));
    let mut stats = ApiStats::default();
    let first = ensure_enabled(&root, &stopped("etcd.yaml"), bound, &mut stats);
    assert_eq!(first.unwrap(), Ensured::Started);
    assert!(root.join(KUBEADM_MANIFESTS).join("etcd.yaml").exists());
    let again = ensure_enabled(&root, &stopped("etcd.yaml"), bound, &mut stats);
    assert_eq!(again.unwrap(), Ensured::Running);
    assert!(stats.is_clean());
    fs::remove_dir_all(&dir).unwrap();
}

/// A component whose port is closed when its turn comes (starting again by itself) is waited
/// for before it is stopped, so that its stop can be seen.
#[test]
fn a_component_starting_again_by_itself_is_waited_for_before_it_is_stopped() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let opts = options(PathBuf::from("/nonexistent"), Duration::from_secs(60));
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let l = std::net::TcpListener::bind(address).unwrap();
        // Held until the test has looked.
        rx.recv().unwrap();
        drop(l);
    });
    wait_up("kube-scheduler", address, &opts);
    let up = std::net::TcpStream::connect(address).is_ok();
    tx.send(()).unwrap();
    server.join().unwrap();
    assert!(
        up,
        "wait_up returned before anything accepted connections on {address}"
    );
}
