//! `--engine kubeadm` against a REAL containerd + runc: a private containerd per test (own
//! config, root, state and socket in the test folder, killed by a drop guard), and the image of
//! `images/k8s/kubeadm-image.sh`: the REAL kubeadm v1.20.2 at /opt/bin/kubeadm (built by
//! `images/k8s/build.sh`; missing, the tests fail naming that script), the etcdadm TEST DOUBLE
//! of `images/kubeadm-standin/` (no registry has etcdadm) and, for failure injection only (a
//! failing tool, one slow enough to kill, one that prints its mounts), the kubeadm TEST DOUBLE
//! at /opt/bin/kubeadm-standin, chosen with `--kubeadm-path`. The real kubeadm proves parity
//! with the native engine, a genuine tool failure (super-admin.conf, unknown to v1.20) and the
//! refusal of what it cannot do (an ECDSA node: kubeadm v1.20 always makes RSA-2048 keys).
//! Without root, containerd, runc or busybox-static the tests FAIL saying what to install
//! (Debian packages containerd, runc, busybox-static, openssl).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::util::{BIN, Ossl, TestDir, base64_decode, certrotor, openssl_verify, walk};

const IMAGE: &str = "localhost/certrotor-kubeadm:v1.20.2";
/// The kubeadm test double inside the same image (failure injection only).
const STANDIN: &str = "/opt/bin/kubeadm-standin";
const NS: &str = "k8s.io";

/// Why these tests cannot run here, if they cannot.
fn missing_prerequisite() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("containerd tests need root".into());
    }
    for tool in [
        "containerd",
        "containerd-shim-runc-v2",
        "runc",
        "ctr",
        "openssl",
        "python3",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!("'{tool}' is not installed"));
        }
    }
    if !Path::new("/bin/busybox").exists() && !Path::new("/usr/bin/busybox").exists() {
        return Some("busybox-static is not installed".into());
    }
    None
}

/// The test runs, or fails saying what is missing (never a silent pass).
fn can_run(test: &str) {
    if let Some(why) = missing_prerequisite() {
        testkit::prereq::missing(test, &why);
    }
}

/// The prerequisites of `test` ([`can_run`]), then its folder `dir` and a containerd of its own
/// there.
fn start(test: &str, dir: &str) -> (TestDir, Containerd) {
    can_run(test);
    let t = TestDir::new(dir);
    let ctd = Containerd::start(t.path());
    (t, ctd)
}

/// The real-kubeadm image archive, built once per test binary.
fn image_tar() -> &'static Path {
    static TAR: OnceLock<PathBuf> = OnceLock::new();
    TAR.get_or_init(|| {
        // One shared archive (the build is deterministic), replaced atomically so that
        // concurrent test binaries never read a half-written one.
        let tar = std::env::temp_dir().join("certrotor-kubeadm-v1.20.2.tar");
        let mine = std::env::temp_dir().join(format!(
            "certrotor-kubeadm-v1.20.2-{}.tar",
            std::process::id()
        ));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/k8s/kubeadm-image.sh");
        let out = Command::new(&script)
            .arg(&mine)
            .env("CERTROTOR_K8S_BIN", crate::kubeadm_parity_util::k8s_bin())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&mine, &tar).unwrap();
        tar
    })
}

/// A private containerd, killed (with everything it runs) on drop.
struct Containerd {
    dir: PathBuf,
    socket: PathBuf,
    child: Child,
}

impl Containerd {
    fn start(dir: &Path) -> Containerd {
        let dir = dir.join("ctd");
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("containerd.sock");
        let config = format!(
            "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = \"{1}\"\n",
            dir.display(),
            socket.display()
        );
        std::fs::write(dir.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let c = Containerd { dir, socket, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !c.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not answer on {} within 30s:\n{}",
                c.socket.display(),
                std::fs::read_to_string(c.dir.join("containerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = c.ctr(&["images", "import", image_tar().to_str().unwrap()]);
        assert!(
            out.status.success(),
            "import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .args(["-a", self.socket.to_str().unwrap(), "-n", NS])
            .args(args)
            .output()
            .unwrap()
    }

    fn containers(&self) -> Vec<String> {
        let out = self.ctr(&["containers", "ls", "-q"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// The engine flags for this containerd.
    fn flags(&self) -> Vec<String> {
        [
            "--engine",
            "kubeadm",
            "--kubeadm-image",
            IMAGE,
            "--containerd-socket",
            self.socket.to_str().unwrap(),
            "--containerd-namespace",
            NS,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// The engine flags with the kubeadm TEST DOUBLE instead of the real kubeadm.
    fn standin_flags(&self) -> Vec<String> {
        let mut f = self.flags();
        f.extend(["--kubeadm-path".to_string(), STANDIN.to_string()]);
        f
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for name in self.containers_quiet() {
            let _ = self.ctr(&["tasks", "kill", "-a", "-s", "SIGKILL", &name]);
            let _ = self.ctr(&["tasks", "delete", "-f", &name]);
            let _ = self.ctr(&["containers", "delete", &name]);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Snapshot mounts of a task that could not be removed would keep the folder busy.
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "grep -o ' {0}[^ ]*' /proc/self/mounts | sort -r | xargs -r -n1 umount -l",
                self.dir.display()
            ))
            .status();
    }
}

impl Containerd {
    fn containers_quiet(&self) -> Vec<String> {
        let out = self.ctr(&["containers", "ls", "-q"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }
}

/// Every file under `root` outside certrotor's state, with its bytes.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    walk(root)
        .into_iter()
        .filter(|p| !p.starts_with(root.join("var/lib/certrotor")))
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_default();
            (p, bytes)
        })
        .collect()
}

fn run_with(args: &[&str], engine: &[String]) -> crate::util::Run {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(engine.iter().map(String::as_str));
    certrotor(&all)
}

/// No container is left in containerd.
fn assert_no_containers(ctd: &Containerd) {
    assert!(
        ctd.containers().is_empty(),
        "containers left: {:?}",
        ctd.containers()
    );
}

/// The staging folders left under the root (none after a finished run).
fn staging_left(root: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(root.join("var/lib/certrotor/engine"))
        .map(|l| l.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[test]
fn kubeadm_engine_works_on_a_staging_copy_mounted_twice() {
    let (t, ctd) = start(
        "kubeadm_engine_works_on_a_staging_copy_mounted_twice",
        "engine-mounts",
    );
    let root = t.lab("node", &["--layout", "bottlerocket", "--expires-in", "3d"]);
    let r = root.to_str().unwrap();
    let pki = root.join("var/lib/kubeadm/pki");
    std::fs::write(pki.join(".standin-mounts"), "").unwrap();
    let before = snapshot(&root);
    let run = run_with(
        &[
            "renew",
            "--root",
            r,
            "--cert",
            "apiserver",
            "--cert",
            "admin.conf",
        ],
        &ctd.standin_flags(),
    );
    run.expect(0);
    // The tool saw one folder at both places, and it was the staging copy, not the live one.
    let mounts: Vec<&str> = run
        .stderr
        .lines()
        .filter_map(|l| l.split("standin-mount: ").nth(1))
        .collect();
    let root_of = |dst: &str| -> Vec<String> {
        mounts
            .iter()
            .filter(|m| m.starts_with(&format!("{dst} ")))
            .map(|m| {
                m.split(" root=")
                    .nth(1)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let (etc, var) = (root_of("/etc/kubernetes"), root_of("/var/lib/kubeadm"));
    assert_eq!(etc.len(), 2, "one mount line per tool run\n{run}");
    assert_eq!(etc, var, "both mounts must show the same folder\n{run}");
    for m in &etc {
        assert!(
            m.contains("var/lib/certrotor/engine/") && !m.ends_with("var/lib/kubeadm"),
            "the tool must see the staging copy, not the live folder: {m}\n{run}"
        );
    }
    // Exactly the named certificates changed, validly; everything else is byte-identical.
    let after = snapshot(&root);
    let changed: Vec<String> = before
        .iter()
        .filter(|(p, b)| after.get(*p) != Some(*b))
        .map(|(p, _)| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert_eq!(
        changed,
        [
            "var/lib/kubeadm/admin.conf",
            "var/lib/kubeadm/pki/apiserver.crt",
            "var/lib/kubeadm/pki/apiserver.key"
        ],
        "{run}"
    );
    openssl_verify(&pki.join("ca.crt"), &pki.join("apiserver.crt"), true).unwrap();
    let (c, k) = crate::util::public_keys(&pki.join("apiserver.crt"), &pki.join("apiserver.key"));
    assert_eq!(c, k, "the new key matches the new certificate");
    assert_no_containers(&ctd);
    assert!(
        staging_left(&root).is_empty(),
        "staging left: {:?}",
        staging_left(&root)
    );
}

#[test]
fn failing_kubeadm_is_a_clear_error_and_changes_nothing() {
    a_failing_tool_is_a_clear_error_and_changes_nothing(
        "failing_kubeadm_is_a_clear_error_and_changes_nothing",
        "engine-fail",
        Some(".standin-fail"),
        Containerd::standin_flags,
        &[
            "/opt/bin/kubeadm-standin certs renew",
            "exit code 3",
            "failing as asked",
        ],
    );
}

#[test]
fn real_kubeadm_failing_is_a_clear_error_and_changes_nothing() {
    // A node of kubeadm >= 1.29 has super-admin.conf, which kubeadm v1.20 does not know: a
    // genuine failure of the real tool (exit 1, "invalid subcommand").
    a_failing_tool_is_a_clear_error_and_changes_nothing(
        "real_kubeadm_failing_is_a_clear_error_and_changes_nothing",
        "engine-real-fail",
        None,
        Containerd::flags,
        &[
            "/opt/bin/kubeadm certs renew super-admin.conf",
            "exit code 1",
            "invalid subcommand",
        ],
    );
}

/// `renew` on a fresh lab node (with the stand-in's `marker` file in its PKI, if any) with the
/// engine `flags` fails: exit 2, the error names the socket, the image, `words` and "nothing was
/// changed", the live PKI is unchanged and no container or staging copy is left.
fn a_failing_tool_is_a_clear_error_and_changes_nothing(
    test: &str,
    dir: &str,
    marker: Option<&str>,
    flags: fn(&Containerd) -> Vec<String>,
    words: &[&str],
) {
    let (t, ctd) = start(test, dir);
    let root = t.lab("node", &["--expires-in", "3d"]);
    let r = root.to_str().unwrap();
    if let Some(marker) = marker {
        std::fs::write(root.join("etc/kubernetes/pki").join(marker), "").unwrap();
    }
    let before = snapshot(&root);
    let run = run_with(&["renew", "--root", r], &flags(&ctd));
    run.expect(2);
    let named = [ctd.socket.to_str().unwrap(), IMAGE];
    for word in named.iter().chain(words).chain(&["nothing was changed"]) {
        assert!(
            run.stderr.contains(word),
            "the error must name '{word}'\n{run}"
        );
    }
    assert_eq!(
        before,
        snapshot(&root),
        "the live PKI must be unchanged\n{run}"
    );
    assert_no_containers(&ctd);
    assert!(staging_left(&root).is_empty());
}

#[test]
fn absent_image_and_socket_are_named() {
    let (t, ctd) = start("absent_image_and_socket_are_named", "engine-absent");
    let root = t.lab("node", &["--expires-in", "3d"]);
    let r = root.to_str().unwrap();
    let before = snapshot(&root);
    let mut flags = ctd.flags();
    flags[3] = "localhost/not-here:1".into();
    let run = run_with(&["renew", "--root", r], &flags);
    run.expect(2);
    assert!(
        run.stderr
            .contains("'localhost/not-here:1' is not in containerd")
            && run.stderr.contains(ctd.socket.to_str().unwrap())
            && run.stderr.contains("never pulls"),
        "{run}"
    );
    let images = String::from_utf8_lossy(&ctd.ctr(&["images", "ls", "-q"]).stdout).into_owned();
    assert!(
        !images.contains("not-here"),
        "nothing may be pulled: {images}"
    );
    let gone = t.join("no.sock");
    let mut flags = ctd.flags();
    flags[5] = gone.to_str().unwrap().into();
    let run = run_with(&["renew", "--root", r], &flags);
    run.expect(2);
    assert!(run.stderr.contains(gone.to_str().unwrap()), "{run}");
    assert_eq!(before, snapshot(&root));
    // Flags of the kubeadm engine without it are ignored, with a warning that names them.
    let run = certrotor(&["renew", "--root", r, "--dry-run", "--kubeadm-image", IMAGE]);
    run.expect(0);
    assert!(
        run.stderr
            .contains("--kubeadm-image applies to --engine kubeadm only: ignored"),
        "{run}"
    );
    certrotor(&["renew", "--root", r, "--engine", "docker"]).expect(64);
}

#[test]
fn a_killed_run_leaves_a_container_that_the_next_run_removes() {
    let (t, ctd) = start(
        "a_killed_run_leaves_a_container_that_the_next_run_removes",
        "engine-kill",
    );
    let root = t.lab("node", &["--expires-in", "3d"]);
    let r = root.to_str().unwrap();
    let pki = root.join("etc/kubernetes/pki");
    std::fs::write(pki.join(".standin-sleep"), "300").unwrap();
    let live = std::fs::read(pki.join("apiserver.crt")).unwrap();
    let mut args: Vec<String> = ["renew", "--root", r, "--cert", "apiserver"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(ctd.standin_flags());
    let mut child = Command::new(BIN)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let name = format!("certrotor-kubeadm-{}-0", child.id());
    // Wait until the stand-in has renewed its copy and sleeps.
    let deadline = Instant::now() + Duration::from_secs(60);
    let staged = loop {
        let renewed = walk(&root.join("var/lib/certrotor/engine"))
            .into_iter()
            .find(|p| p.ends_with("pki/apiserver.crt"))
            .filter(|p| std::fs::read(p).is_ok_and(|b| !b.is_empty() && b != live));
        if let Some(p) = renewed
            && ctd.containers().contains(&name)
        {
            break p;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "certrotor ended before it could be killed"
        );
        assert!(
            Instant::now() < deadline,
            "the stand-in never started sleeping"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        std::fs::read(pki.join("apiserver.crt")).unwrap(),
        live,
        "the live file must be untouched while the tool works on {}",
        staged.display()
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        ctd.containers().contains(&name),
        "the killed run's container is left over"
    );
    std::fs::remove_file(pki.join(".standin-sleep")).unwrap();
    // The next run with the real kubeadm cleans up after the killed one.
    let run = run_with(&["renew", "--root", r, "--cert", "apiserver"], &ctd.flags());
    run.expect(0);
    assert!(
        run.stderr.contains(&format!(
            "removing container '{name}' left by an interrupted run"
        )),
        "{run}"
    );
    assert!(run.stderr.contains("staging copy"), "{run}");
    assert_no_containers(&ctd);
    assert!(staging_left(&root).is_empty());
    assert_ne!(std::fs::read(pki.join("apiserver.crt")).unwrap(), live);
}

/// What must be equal between the two engines' certificates. Not compared here (asserted in
/// the test): validity, which kubeadm v1.20 starts at the CA's notBefore, and BasicConstraints,
/// which kubeadm v1.20 leaves out (certrotor follows later kubeadm releases; see
/// kubeadm_parity.rs).
fn identity(o: &Ossl) -> String {
    let mut dns = o.dns.clone();
    dns.sort();
    let mut ips: Vec<String> = o.ips.iter().map(|i| i.to_string()).collect();
    ips.sort();
    let ku = o.ext.get("Key Usage").map(|e| e.critical);
    format!(
        "subject={} issuer={} dns={dns:?} ips={ips:?} ku={:?} critical={ku:?} eku={:?} key={} \
         sig={}",
        o.subject, o.issuer, o.key_usage, o.ext_key_usage, o.public_key, o.signature_algorithm,
    )
}

/// Each renewed certificate of a node (kubeconfigs' embedded ones written out), by name.
fn certificates(root: &Path, out: &Path) -> BTreeMap<String, Ossl> {
    std::fs::create_dir_all(out).unwrap();
    let mut map = BTreeMap::new();
    for p in walk(root) {
        let rel = p.strip_prefix(root).unwrap().display().to_string();
        if rel.starts_with("var/lib/certrotor")
            || rel.starts_with("var/lib/kubelet")
            || rel.ends_with("kubelet.conf")
        {
            continue;
        }
        let name = rel.replace('/', "_");
        if rel.ends_with(".crt") && !rel.ends_with("ca.crt") {
            map.insert(rel, Ossl::read(&p));
        } else if rel.ends_with(".conf") {
            let text = std::fs::read_to_string(&p).unwrap();
            let Some(b64) = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("client-certificate-data:"))
            else {
                continue;
            };
            let file = out.join(format!("{name}.pem"));
            std::fs::write(&file, base64_decode(b64.trim())).unwrap();
            map.insert(rel, Ossl::read(&file));
        }
    }
    map
}

/// A lab node as kubeadm v1.20 has it: without super-admin.conf (kubeadm >= 1.29), which the
/// real kubeadm v1.20 does not know.
fn v120_lab(t: &TestDir, sub: &str, flags: &[&str]) -> PathBuf {
    let root = t.lab(sub, flags);
    for p in walk(&root) {
        if p.ends_with("super-admin.conf") {
            std::fs::remove_file(p).unwrap();
        }
    }
    root
}

#[test]
fn kubeadm_and_native_engines_issue_the_same_certificates() {
    let (t, ctd) = start(
        "kubeadm_and_native_engines_issue_the_same_certificates",
        "engine-parity",
    );
    // RSA-2048 only: kubeadm v1.20 makes nothing else (see the ECDSA test below).
    for layout in ["bottlerocket", "kubeadm"] {
        let native = v120_lab(
            &t,
            &format!("{layout}-native"),
            &["--layout", layout, "--expires-in", "3d"],
        );
        let kubeadm = t.join(&format!("{layout}-kubeadm"));
        let cp = Command::new("cp")
            .arg("-a")
            .arg(&native)
            .arg(&kubeadm)
            .status()
            .unwrap();
        assert!(cp.success());
        let native_start = crate::util::now();
        let started = Instant::now();
        certrotor(&["renew", "--root", native.to_str().unwrap(), "--all"]).expect(0);
        let native_time = started.elapsed();
        let kubeadm_start = crate::util::now();
        let started = Instant::now();
        let run = run_with(
            &["renew", "--root", kubeadm.to_str().unwrap(), "--all"],
            &ctd.flags(),
        );
        run.expect(0);
        let kubeadm_time = started.elapsed();
        let end = crate::util::now();
        eprintln!(
            "WALL TIME renew --all ({layout}, rsa-2048, 10 certificates): native {} ms, real \
             kubeadm v1.20.2 engine {} ms",
            native_time.as_millis(),
            kubeadm_time.as_millis()
        );
        let a = certificates(&native, &t.join(&format!("{layout}-native-out")));
        let b = certificates(&kubeadm, &t.join(&format!("{layout}-kubeadm-out")));
        assert_eq!(a.len(), 10, "{:?}", a.keys());
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        for (rel, n) in &a {
            let k = &b[rel];
            assert_eq!(
                identity(n),
                identity(k),
                "{rel}: native vs kubeadm engine\n{run}"
            );
            assert_ne!(n.pubkey_pem, k.pubkey_pem, "{rel}: each made a new key");
            let year = crate::util::YEAR;
            assert!(
                n.not_after >= native_start + year - 2 && n.not_after <= kubeadm_start + year + 2,
                "{rel}: native notAfter"
            );
            assert!(
                k.not_after >= kubeadm_start + year - 2 && k.not_after <= end + year + 2,
                "{rel}: kubeadm notAfter"
            );
            // kubeadm v1.20: notBefore = the CA's (the lab node's CAs were made 362 days ago for
            // leaves expiring in 3 days), no BasicConstraints.
            assert!(
                k.not_before < kubeadm_start - 360 * 86_400,
                "{rel}: kubeadm v1.20 notBefore is the CA's"
            );
            assert!(!k.ext.contains_key("Basic Constraints"), "{rel}");
        }
    }
}

#[test]
fn real_kubeadm_rsa_keys_on_an_ecdsa_node_are_refused_and_nothing_changes() {
    let (t, ctd) = start(
        "real_kubeadm_rsa_keys_on_an_ecdsa_node_are_refused_and_nothing_changes",
        "engine-ecdsa",
    );
    let root = v120_lab(
        &t,
        "node",
        &["--key-algorithm", "ecdsa-p256", "--expires-in", "3d"],
    );
    let r = root.to_str().unwrap();
    let before = snapshot(&root);
    let run = run_with(&["renew", "--root", r, "--cert", "apiserver"], &ctd.flags());
    run.expect(2);
    assert!(
        run.stderr.contains("key algorithm changed from ECDSA") && run.stderr.contains("RSA"),
        "kubeadm v1.20 always makes RSA-2048 keys: certrotor must refuse them\n{run}"
    );
    assert_eq!(before, snapshot(&root), "nothing may change\n{run}");
    assert_no_containers(&ctd);
    assert!(staging_left(&root).is_empty());
}

#[test]
fn etcdadm_output_is_validated_as_the_node_is_configured() {
    let (t, ctd) = start(
        "etcdadm_output_is_validated_as_the_node_is_configured",
        "engine-etcdadm",
    );
    t.lab(
        "lab",
        &[
            "--layout",
            "bottlerocket",
            "--topology",
            "external-etcd",
            "--expires-in",
            "3d",
        ],
    );
    let root = t.join("lab/etcd");
    let pki = root.join("var/lib/etcd/pki");
    let old = Ossl::read(&pki.join("server.crt"));
    let started = crate::util::now();
    let run = run_with(&["renew", "--root", root.to_str().unwrap()], &ctd.flags());
    let ended = crate::util::now();
    run.expect(0);
    assert!(
        run.stderr.contains("etcdadm join phase certificates"),
        "{run}"
    );
    for f in [
        "server",
        "peer",
        "etcdctl-etcd-client",
        "apiserver-etcd-client",
    ] {
        let new = Ossl::read(&pki.join(format!("{f}.crt")));
        openssl_verify(&pki.join("ca.crt"), &pki.join(format!("{f}.crt")), true).unwrap();
        assert!(
            !new.ext.contains_key("Basic Constraints"),
            "{f}: etcdadm sets none"
        );
        assert_eq!(new.public_key, "RSA-2048", "{f}");
        // One year from a moment within the run (however long the run took), to the second.
        assert!(
            new.not_after >= started + 365 * 86_400 - 2
                && new.not_after <= ended + 365 * 86_400 + 2,
            "{f}: one year from the renewal"
        );
        let head = std::fs::read_to_string(pki.join(format!("{f}.key"))).unwrap();
        assert!(
            head.starts_with("-----BEGIN RSA PRIVATE KEY-----"),
            "{f}: PKCS#1"
        );
    }
    let new = Ossl::read(&pki.join("server.crt"));
    assert_eq!(new.ext_key_usage, old.ext_key_usage);
    assert_no_containers(&ctd);
}
