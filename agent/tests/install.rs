//! The install and operations page, `bottlerocket/packaging/README.md`, run as written (issue
//! 27.2, 27.5 and 27.6: every command the page shows is run by a test). The commands are read
//! out of the page itself, so a changed command is the command tested. Each ```sh block of the
//! page is preceded by `<!-- tested: ID -->` or `<!-- not tested: why -->`;
//! [`every_shell_block_names_its_test`] holds the page to that, and each ID below runs its
//! blocks:
//!
//! - `emulator`: the block runs in `sh` with an `apiclient` that records its arguments (and
//!   standard input); each call is then sent to the Bottlerocket API emulator (`apiserver-sim`)
//!   as apiclient sends it on the wire (bottlerocket-api.md §1.5): `set k=v…` as
//!   `PATCH /settings/keypair?tx=apiclient-set-<16 random>` with `{"request_payload":[…]}`
//!   (current apiclient), or for a server without that route (v1.20.5) as the settings JSON the
//!   older apiclient builds client-side, to `PATCH /settings?tx=…`; `apply` as TOML turned into
//!   JSON (Python's `tomllib`), its `settings` table unwrapped, to
//!   `PATCH /settings?tx=apiclient-apply-<16 random>`; then `POST /tx/commit_and_apply`. The
//!   emulator validates against Bottlerocket's settings model (unknown keys, types, the
//!   bootstrap `mode` enum, base64), and the settings read back must be what the page says:
//!   the same as `host-container.toml` and `bootstrap-container.toml`, with user-data that
//!   decodes to command lines certrotor runs and Bottlerocket's container rules accept.
//! - `admin-loop`: the loop runs with the real kubectl v1.20.2 against the real kube-apiserver
//!   v1.20.2 of a lab node, holding CAPI `Machine` objects (CRD) of two clusters: control
//!   planes, etcd machines, a worker, a Machine in another namespace, a Machine with an
//!   internal address too. `ssh` is a stand-in that runs the remote command with `sh` and
//!   records per host; each host's `apiclient apply` goes to its own emulator.
//! - `lab-shell`: the block runs as root with `chroot` into a lab node, with busybox as the
//!   shell and tools (the node's root is where the block's absolute paths point, as in `sudo
//!   sheltie` on Bottlerocket or a root shell on a kubeadm node). The static pod it installs is
//!   then run by kubelet-sim beside the real control plane v1.20.2 (etcd, kube-apiserver,
//!   controller-manager, scheduler): it renews, restarts the control plane one component at a
//!   time, and never itself. The uninstall block runs on a node whose backups hold keys.
//! - `exec` runs in the QEMU scenario `qemu-tests/tests/kubelet_control_plane.rs` (renew_expiring and engine_kubeadm merged into it).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::platform::platform_util::{self, Node, PODS, Platform, Served, sibling, wait_for};
use crate::util::{BIN, TestDir, base64_decode};

/// The page under test.
fn page_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../bottlerocket/packaging/README.md")
}

/// The folder the page's relative paths are relative to.
fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../bottlerocket/packaging")
}

// ---- the page's shell blocks ------------------------------------------------------------------

/// How a shell block of the page is tested.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tag {
    Tested(String),
    NotTested(String),
}

#[derive(Debug, Clone)]
struct Block {
    tag: Option<Tag>,
    /// 1-based line of the opening fence.
    line: usize,
    text: String,
}

/// Every ```sh block of the page, with the tag comment right above it.
fn blocks() -> Vec<Block> {
    let page = fs::read_to_string(page_path()).unwrap();
    let lines: Vec<&str> = page.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "```sh" {
            let tag = i
                .checked_sub(1)
                .map(|p| lines[p].trim())
                .and_then(|l| l.strip_prefix("<!--")?.strip_suffix("-->"))
                .map(str::trim)
                .and_then(|t| {
                    if let Some(id) = t.strip_prefix("tested:") {
                        Some(Tag::Tested(id.trim().to_string()))
                    } else {
                        t.strip_prefix("not tested:")
                            .map(|why| Tag::NotTested(why.trim().to_string()))
                    }
                });
            let start = i;
            let mut text = String::new();
            i += 1;
            while i < lines.len() && lines[i].trim() != "```" {
                text.push_str(lines[i]);
                text.push('\n');
                i += 1;
            }
            out.push(Block {
                tag,
                line: start + 1,
                text,
            });
        }
        i += 1;
    }
    out
}

/// The blocks tested as `id`, in page order (at least one).
fn tested(id: &str) -> Vec<Block> {
    let found: Vec<Block> = blocks()
        .into_iter()
        .filter(|b| b.tag == Some(Tag::Tested(id.into())))
        .collect();
    assert!(!found.is_empty(), "the page has no block tested as '{id}'");
    found
}

/// The IDs these tests (and the QEMU scenario, for `exec`) run.
const IDS: [&str; 4] = ["emulator", "admin-loop", "lab-shell", "exec"];

#[test]
fn every_shell_block_names_its_test() {
    let all = blocks();
    assert!(all.len() >= 8, "{all:#?}");
    for b in &all {
        match &b.tag {
            Some(Tag::Tested(id)) => assert!(
                IDS.contains(&id.as_str()),
                "README.md:{}: unknown test '{id}' (known: {IDS:?})",
                b.line
            ),
            Some(Tag::NotTested(why)) => assert!(
                why.len() > 20,
                "README.md:{}: say why the block is not run",
                b.line
            ),
            None => panic!(
                "README.md:{}: a shell block without '<!-- tested: ID -->' or '<!-- not tested: why -->' above it:\n{}",
                b.line, b.text
            ),
        }
    }
    for id in IDS {
        tested(id);
    }
}

/// The front README shows a short install (issue 27.6): each of its shell blocks that installs
/// or operates certrotor on a node (it calls `apiclient`, or installs the static pod) must be,
/// character for character, a block of the page tested here.
#[test]
fn the_front_readmes_install_commands_are_the_pages_tested_ones() {
    let front = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = fs::read_to_string(&front).unwrap();
    let tested_blocks: Vec<String> = blocks()
        .into_iter()
        .filter(|b| matches!(b.tag, Some(Tag::Tested(_))))
        .map(|b| b.text)
        .collect();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if line.trim() != "```sh" {
            continue;
        }
        let block: String = lines
            .by_ref()
            .take_while(|(_, l)| l.trim() != "```")
            .map(|(_, l)| format!("{l}\n"))
            .collect();
        if block.contains("apiclient") || block.contains("certrotor-static-pod.yaml") {
            assert!(
                tested_blocks.contains(&block),
                "README.md:{}: an install command block that is not one of \
                 bottlerocket/packaging/README.md's tested blocks (copy it from there):\n{block}",
                n + 1
            );
        }
    }
}

// ---- apiclient and ssh as the blocks see them --------------------------------------------------

/// `apiclient` for the blocks: records its arguments (NUL-separated) and, for `apply` from
/// standard input, that input; the test replays them on the wire.
const RECORDING_APICLIENT: &str = r#"#!/bin/sh
dir=${APICLIENT_RECORD:?}
mkdir -p "$dir"
n=0
while [ -e "$dir/$n.args" ]; do n=$((n + 1)); done
if [ "$1" = apply ] && { [ $# -eq 1 ] || [ "$2" = - ]; }; then cat > "$dir/$n.stdin"; fi
: > "$dir/$n.args.tmp"
for a in "$@"; do printf '%s\0' "$a" >> "$dir/$n.args.tmp"; done
mv "$dir/$n.args.tmp" "$dir/$n.args"
"#;

/// `ssh` for the blocks: skips ssh's options, records the user, and runs the remote command
/// (the remaining words joined by spaces, as ssh sends them) with `sh`, standard input passed
/// through, recording that host's apiclient calls in `$SSH_RECORD/<host>`.
const SSH: &str = r#"#!/bin/sh
while [ $# -gt 0 ]; do
  case $1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
dest=$1; shift
host=${dest#*@}
printf '%s\n' "${dest%@*}" > "${SSH_RECORD:?}/$host.user"
APICLIENT_RECORD=$SSH_RECORD/$host exec sh -c "$*"
"#;

fn write_exec(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// One recorded apiclient call.
#[derive(Debug, Clone)]
struct Call {
    args: Vec<String>,
    stdin: Option<Vec<u8>>,
}

/// The calls recorded in `dir`, in order.
fn recorded(dir: &Path) -> Vec<Call> {
    let mut out = Vec::new();
    for n in 0.. {
        let Ok(bytes) = fs::read(dir.join(format!("{n}.args"))) else {
            break;
        };
        let args = bytes
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8(a.to_vec()).unwrap())
            .collect();
        out.push(Call {
            args,
            stdin: fs::read(dir.join(format!("{n}.stdin"))).ok(),
        });
    }
    out
}

/// Runs `block` with `sh -e` in `cwd`, `bin` first on PATH, and `env`; returns stdout,
/// failing the test if the shell fails.
fn run_block(block: &Block, cwd: &Path, bin: &Path, env: &[(&str, &Path)]) -> String {
    let mut cmd = Command::new("sh");
    cmd.arg("-e")
        .arg("-c")
        .arg(&block.text)
        .current_dir(cwd)
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "README.md:{} failed ({}):\n{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        block.line,
        out.status,
        block.text,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---- the emulator, and apiclient's requests ------------------------------------------------------

/// `apiserver-sim` on a socket of its own, stopped when dropped.
struct Emulator {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Emulator {
    /// `keypair`: serve `PATCH /settings/keypair` (current servers; v1.20.5 answers 404).
    fn start(dir: &Path, keypair: bool) -> Emulator {
        fs::create_dir_all(dir.join("root")).unwrap();
        let socket = dir.join("api.sock");
        let log = dir.join("apiserver-sim.log");
        let mut cmd = Command::new(sibling("apiserver-sim"));
        cmd.arg("--socket")
            .arg(&socket)
            .arg("--root")
            .arg(dir.join("root"))
            .stdin(Stdio::null())
            .stdout(fs::File::create(&log).unwrap())
            .stderr(fs::File::create(dir.join("apiserver-sim.err")).unwrap());
        if keypair {
            cmd.arg("--keypair");
        }
        let child = cmd.spawn().unwrap();
        let e = Emulator { child, socket, log };
        wait_for(
            "apiserver-sim's socket",
            Duration::from_secs(30),
            Duration::from_millis(20),
            || {
                if UnixStream::connect(&e.socket).is_ok() {
                    Ok(())
                } else {
                    Err(fs::read_to_string(&e.log).unwrap_or_default())
                }
            },
        );
        e
    }

    /// One HTTP/1.1 request as apiclient makes it (`Content-Type: application/json` on every
    /// request, a body only with data): (status, body).
    fn request(&self, method: &str, uri: &str, body: Option<&str>) -> (u16, String) {
        let mut s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let body = body.unwrap_or("");
        write!(
            s,
            "{method} {uri} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP status from the emulator: {text:?}"));
        let length = head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        });
        let body = match length {
            Some(n) => rest.get(..n).unwrap_or(rest).to_string(),
            None => rest.to_string(),
        };
        (status, body)
    }

    /// apiclient's `raw_request`: any status outside 2xx is an error with its text.
    fn call(&self, method: &str, uri: &str, body: Option<&str>) -> Result<String, String> {
        let (status, text) = self.request(method, uri, body);
        if (200..300).contains(&status) {
            Ok(text)
        } else {
            Err(format!("Status {status} when {method}ing {uri}: {text}"))
        }
    }

    /// The live settings (`GET /settings`).
    fn settings(&self) -> Value {
        serde_json::from_str(&self.call("GET", "/settings", None).unwrap()).unwrap()
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which apiclient sends `set k=v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// Current apiclient: `PATCH /settings/keypair` (the server splits and types the pairs).
    KeyPair,
    /// Older apiclient (and servers like v1.20.5 without the keypair route): the client builds
    /// the settings JSON and sends `PATCH /settings`.
    Json,
}

/// apiclient's transaction suffix: 16 random alphanumerics.
fn rando() -> String {
    let mut seed = [0u8; 16];
    fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut seed)
        .unwrap();
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    seed.iter()
        .map(|b| ALNUM[*b as usize % ALNUM.len()] as char)
        .collect()
}

/// A key's segments, honouring double-quoted segments (`kubernetes.node-labels."a.b"`).
fn key_segments(key: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in key.chars() {
        match c {
            '"' => quoted = !quoted,
            '.' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// What the older apiclient makes of `k=v` pairs: a settings object, each value JSON if it
/// parses as JSON, else a string.
fn pairs_to_json(pairs: &[String]) -> Value {
    let mut root = json!({});
    for pair in pairs {
        let (key, value) = pair.split_once('=').unwrap();
        let mut segments = key_segments(key);
        if segments.first().map(String::as_str) == Some("settings") {
            segments.remove(0);
        }
        let mut nested =
            serde_json::from_str::<Value>(value).unwrap_or(Value::String(value.into()));
        for seg in segments.iter().rev() {
            nested = json!({ seg: nested });
        }
        merge(&mut root, nested);
    }
    root
}

/// Deep-merges `patch` into `target` (objects key by key).
fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p,
    }
}

/// TOML to JSON, as apiclient's `apply` reads its input (TOML first, then JSON).
fn toml_or_json(input: &[u8]) -> Value {
    let script =
        "import json, sys, tomllib; json.dump(tomllib.loads(sys.stdin.read()), sys.stdout)";
    let python = "python3 (images/setup-host.sh installs it)";
    let out = crate::util::run_piped("python3", &["-c", script], input, python);
    if out.status.success() {
        return serde_json::from_slice(&out.stdout).unwrap();
    }
    serde_json::from_slice(input).unwrap_or_else(|e| {
        panic!(
            "apply input is neither TOML ({}) nor JSON ({e})",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Sends one recorded apiclient call to `emu` as that apiclient does on the wire.
fn replay(emu: &Emulator, wire: Wire, call: &Call) -> Result<(), String> {
    let args: Vec<&str> = call.args.iter().map(String::as_str).collect();
    match args.first().copied() {
        Some("set") => {
            let pairs: Vec<String> = args[1..].iter().map(|s| s.to_string()).collect();
            assert!(
                pairs.iter().all(|p| p.contains('=')),
                "apiclient set takes key=value pairs: {pairs:?}"
            );
            let tx = format!("apiclient-set-{}", rando());
            match wire {
                Wire::KeyPair => emu.call(
                    "PATCH",
                    &format!("/settings/keypair?tx={tx}"),
                    Some(&json!({ "request_payload": pairs }).to_string()),
                )?,
                Wire::Json => emu.call(
                    "PATCH",
                    &format!("/settings?tx={tx}"),
                    Some(&pairs_to_json(&pairs).to_string()),
                )?,
            };
            emu.call("POST", &format!("/tx/commit_and_apply?tx={tx}"), None)?;
            Ok(())
        }
        Some("apply") => {
            let sources: Vec<&str> = if args.len() == 1 {
                vec!["-"]
            } else {
                args[1..].to_vec()
            };
            let tx = format!("apiclient-apply-{}", rando());
            for source in sources {
                let input = match source {
                    "-" => call
                        .stdin
                        .clone()
                        .expect("apply from stdin recorded its input"),
                    s if s.starts_with("file://") => fs::read(&s[7..]).unwrap(),
                    s => panic!("apiclient apply: unsupported source '{s}'"),
                };
                let mut value = toml_or_json(&input);
                let inner = value
                    .as_object_mut()
                    .and_then(|m| m.remove("settings"))
                    .ok_or_else(|| {
                        format!(
                            "Settings from '{source}' did not contain a 'settings' key at top level"
                        )
                    })?;
                emu.call(
                    "PATCH",
                    &format!("/settings?tx={tx}"),
                    Some(&inner.to_string()),
                )?;
            }
            emu.call("POST", &format!("/tx/commit_and_apply?tx={tx}"), None)?;
            Ok(())
        }
        other => panic!("apiclient {other:?} is not replayed on the emulator: {args:?}"),
    }
}

// ---- what the settings must be ---------------------------------------------------------------------

/// The certrotor settings of one container kind from a packaging TOML file.
fn toml_settings(file: &str, kind: &str) -> Value {
    let v = toml_or_json(&fs::read(packaging().join(file)).unwrap());
    v["settings"][kind]["certrotor"].clone()
}

fn decode_user_data(v: &Value) -> String {
    String::from_utf8(base64_decode(v["user-data"].as_str().unwrap())).unwrap()
}

/// The words of a user-data text, as certrotor reads them ('#' comments, whitespace).
fn words(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(str::split_whitespace)
        .map(str::to_string)
        .collect()
}

/// Asserts certrotor's two containers as Bottlerocket's schema has them: the host container
/// enabled and superpowered, the bootstrap container `always` and not essential, both from
/// `image`, with the user-data of the packaging TOML files.
fn assert_installed(settings: &Value, image: &str, ctx: &str) {
    let host = &settings["host-containers"]["certrotor"];
    let boot = &settings["bootstrap-containers"]["certrotor"];
    assert_eq!(host["source"], json!(image), "{ctx}: {settings:#}");
    assert_eq!(host["superpowered"], json!(true), "{ctx}: {settings:#}");
    assert_eq!(host["enabled"], json!(true), "{ctx}: {settings:#}");
    assert_eq!(boot["source"], json!(image), "{ctx}: {settings:#}");
    assert_eq!(boot["mode"], json!("always"), "{ctx}: {settings:#}");
    assert_eq!(boot["essential"], json!(false), "{ctx}: {settings:#}");
    let (host_ud, boot_ud) = (decode_user_data(host), decode_user_data(boot));
    // The page's commands and the packaging TOML files agree.
    let toml_host = toml_settings("host-container.toml", "host-containers");
    let toml_boot = toml_settings("bootstrap-container.toml", "bootstrap-containers");
    assert_eq!(host_ud, decode_user_data(&toml_host), "{ctx}");
    assert_eq!(boot_ud, decode_user_data(&toml_boot), "{ctx}");
    for key in ["enabled", "superpowered"] {
        assert_eq!(host[key], toml_host[key], "{ctx}: {key}");
    }
    for key in ["mode", "essential"] {
        assert_eq!(boot[key], toml_boot[key], "{ctx}: {key}");
    }
    // What Bottlerocket's container rules let run (container.rs): a daemon in the host
    // container, a one-shot `run --once` in the bootstrap container.
    let (hw, bw) = (words(&host_ud), words(&boot_ud));
    assert_eq!(hw.first().map(String::as_str), Some("daemon"), "{host_ud}");
    assert_eq!(bw.first().map(String::as_str), Some("run"), "{boot_ud}");
    assert!(bw.iter().any(|w| w == "--once"), "{boot_ud}");
}

/// Runs each documented user-data command line on a lab node (its root added with `--root`,
/// and `--platform none` where it names none: nothing runs there to restart): the bootstrap
/// container's `run --once` renews and exits 0; the host container's daemon makes its first
/// pass and stops on SIGTERM with 0.
fn assert_user_data_runs(t: &TestDir) {
    let boot = words(&decode_user_data(&toml_settings(
        "bootstrap-container.toml",
        "bootstrap-containers",
    )));
    let host = words(&decode_user_data(&toml_settings(
        "host-container.toml",
        "host-containers",
    )));
    let with_root = |w: &[String], root: &Path| {
        let mut a: Vec<String> = w.to_vec();
        a.extend(["--root".into(), root.display().to_string()]);
        if !w.iter().any(|x| x == "--platform") {
            a.extend(["--platform".into(), "none".into()]);
        }
        a
    };
    let root = t.lab("boot", &["--layout", "bottlerocket", "--expires-in", "2d"]);
    let out = Command::new(BIN)
        .args(with_root(&boot, &root))
        .env("CERTROTOR_EVENTS", "off")
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("apiserver"),
        "{boot:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    let root = t.lab("host", &["--layout", "bottlerocket", "--expires-in", "2d"]);
    let log = t.join("daemon.log");
    let mut daemon = Command::new(BIN)
        .args(with_root(&host, &root))
        .env("CERTROTOR_EVENTS", "off")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("pass done:")
    {
        if Instant::now() > deadline || daemon.try_wait().unwrap().is_some() {
            let _ = daemon.kill();
            panic!(
                "{host:?}: no pass done:\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = daemon.wait().unwrap();
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        status.success() && text.contains("daemon stopping"),
        "{status}\n{text}"
    );
    assert!(
        text.contains("pass done: ") && !text.contains("pass done: 0 renewed"),
        "nothing renewed?\n{text}"
    );
}

/// The image and new image the page's blocks name (`IMAGE=…`, `NEW=…`).
fn assigned(blocks: &[Block], var: &str) -> String {
    blocks
        .iter()
        .flat_map(|b| b.text.lines())
        .find_map(|l| l.trim().strip_prefix(&format!("{var}=")))
        .unwrap_or_else(|| panic!("no {var}= in the page's emulator blocks"))
        .trim()
        .to_string()
}

#[test]
fn the_pages_apiclient_commands_land_as_bottlerocket_expects() {
    let t = TestDir::new("install-emulator");
    let blocks = tested("emulator");
    assert_eq!(
        blocks.len(),
        3,
        "install, upgrade, uninstall: update this test with the page"
    );
    let (image, new) = (assigned(&blocks, "IMAGE"), assigned(&blocks, "NEW"));
    assert_ne!(image, new);
    let bin = t.join("bin");
    fs::create_dir_all(&bin).unwrap();
    write_exec(&bin.join("apiclient"), RECORDING_APICLIENT);

    for wire in [Wire::KeyPair, Wire::Json] {
        let dir = t.join(&format!("{wire:?}"));
        let emu = Emulator::start(&dir, wire == Wire::KeyPair);
        for (i, block) in blocks.iter().enumerate() {
            let rec = dir.join(format!("calls-{i}"));
            run_block(block, &packaging(), &bin, &[("APICLIENT_RECORD", &rec)]);
            let calls = recorded(&rec);
            assert!(
                !calls.is_empty(),
                "README.md:{}: no apiclient call",
                block.line
            );
            for call in &calls {
                replay(&emu, wire, call).unwrap_or_else(|e| {
                    panic!(
                        "README.md:{} ({wire:?}): apiclient {:?}: {e}",
                        block.line, call.args
                    )
                });
            }
            let settings = emu.settings();
            let host = &settings["host-containers"]["certrotor"];
            let boot = &settings["bootstrap-containers"]["certrotor"];
            match i {
                0 => assert_installed(&settings, &image, &format!("install ({wire:?})")),
                1 => {
                    assert_eq!(host["source"], json!(new), "upgrade: {settings:#}");
                    assert_eq!(boot["source"], json!(new), "upgrade: {settings:#}");
                    assert_eq!(host["enabled"], json!(true), "upgrade: {settings:#}");
                }
                _ => {
                    // Bottlerocket cannot delete a setting: both are off, the rest stays.
                    assert_eq!(host["enabled"], json!(false), "uninstall: {settings:#}");
                    assert_eq!(boot["mode"], json!("off"), "uninstall: {settings:#}");
                    assert_eq!(host["source"], json!(new), "uninstall: {settings:#}");
                }
            }
        }
        // The same settings through `apiclient apply` of the two TOML files, on a fresh node.
        let fresh = Emulator::start(&dir.join("apply"), wire == Wire::KeyPair);
        let mut both = fs::read(packaging().join("host-container.toml")).unwrap();
        both.extend(fs::read(packaging().join("bootstrap-container.toml")).unwrap());
        replay(
            &fresh,
            wire,
            &Call {
                args: vec!["apply".into()],
                stdin: Some(both),
            },
        )
        .unwrap();
        let toml_image = toml_settings("host-container.toml", "host-containers")["source"]
            .as_str()
            .unwrap()
            .to_string();
        assert_installed(&fresh.settings(), &toml_image, "apply of the TOML files");
    }

    // The model is enforced: a wrong mode or a key Bottlerocket does not know is refused, as
    // the real server refuses them (so the checks above can fail).
    let emu = Emulator::start(&t.join("refusals"), true);
    let bad = |pairs: &[&str]| {
        replay(
            &emu,
            Wire::KeyPair,
            &Call {
                args: std::iter::once("set")
                    .chain(pairs.iter().copied())
                    .map(str::to_string)
                    .collect(),
                stdin: None,
            },
        )
    };
    let e = bad(&["settings.bootstrap-containers.certrotor.mode=sometimes"]).unwrap_err();
    assert!(e.starts_with("Status 400"), "{e}");
    let e = bad(&["settings.host-containers.certrotor.superpowerd=true"]).unwrap_err();
    assert!(e.starts_with("Status 400"), "{e}");

    // The documented command lines run.
    assert_user_data_runs(&t);
}

// ---- a lab node's root as a shell sees it ------------------------------------------------------

/// The busybox applets the `lab-shell` blocks use.
const APPLETS: [&str; 9] = [
    "sh", "cp", "chmod", "rm", "find", "shred", "ls", "cat", "mkdir",
];

/// Runs `block` as root, chrooted into `root` with busybox as its tools, from `cwd` (inside
/// the root): (exit code, stdout, stderr). The busybox files are removed afterwards.
fn chroot_block(test: &str, root: &Path, cwd: &str, block: &Block) -> (i32, String, String) {
    testkit::prereq::require_root(test, "chroot into a lab node");
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            testkit::prereq::missing(test, "busybox (apt-get install busybox-static)")
        });
    let tools = root.join(".e2e-bin");
    fs::create_dir_all(&tools).unwrap();
    fs::copy(busybox, tools.join("busybox")).unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", tools.join(applet)).unwrap();
    }
    // The devices a host's root has and tools open (shred: /dev/zero, /dev/urandom).
    let dev = root.join("dev");
    let made_dev = !dev.exists();
    fs::create_dir_all(&dev).unwrap();
    for (name, minor) in [("null", 3), ("zero", 5), ("urandom", 9)] {
        let path = dev.join(name);
        if !path.exists() {
            nix::sys::stat::mknod(
                &path,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(1, minor),
            )
            .unwrap();
        }
    }
    // coreutils' chroot is in /usr/sbin, which a test's PATH may not hold.
    let chroot = ["/usr/sbin/chroot", "/sbin/chroot", "/usr/bin/chroot"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .unwrap_or_else(|| testkit::prereq::missing(test, "chroot (coreutils)"));
    let out = Command::new(chroot)
        .arg(root)
        .arg("/.e2e-bin/sh")
        .arg("-c")
        .arg(format!("cd {cwd} && {}", block.text))
        .env_clear()
        .env("PATH", "/.e2e-bin")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    fs::remove_dir_all(&tools).unwrap();
    if made_dev {
        fs::remove_dir_all(&dev).unwrap();
    }
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `lab-shell` block whose text contains `needle`.
fn lab_block(needle: &str) -> Block {
    tested("lab-shell")
        .into_iter()
        .find(|b| b.text.contains(needle))
        .unwrap_or_else(|| panic!("no lab-shell block with '{needle}'"))
}

/// Every file under `dir`, relative, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    crate::util::walk(dir)
        .into_iter()
        .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
        .collect()
}

#[test]
fn uninstall_removes_certrotors_state_and_backups_unless_a_renewal_was_cut_short() {
    const TEST: &str = "install::uninstall_removes_certrotors_state_and_backups";
    testkit::prereq::require_root(TEST, "chroot into a lab node");
    let t = TestDir::new("install-uninstall");
    let root = t.lab("node", &["--layout", "bottlerocket", "--expires-in", "2d"]);
    let r = root.to_str().unwrap();
    // Two renewals: two backups holding the previous keys.
    crate::util::certrotor(&["renew", "--root", r, "--all"]).expect(0);
    crate::util::certrotor(&["renew", "--root", r, "--all"]).expect(0);
    let state = root.join("var/lib/certrotor");
    let backups: Vec<String> = files_under(&state.join("backups"));
    assert!(
        backups.iter().filter(|f| f.ends_with(".key")).count() >= 2,
        "{backups:?}"
    );
    // The containers' folders as host-ctr makes them, and one that is not certrotor's.
    for dir in [
        "local/host-containers/certrotor",
        "local/bootstrap-containers/certrotor",
        "local/host-containers/admin",
    ] {
        fs::create_dir_all(root.join(dir)).unwrap();
        fs::write(root.join(dir).join("user-data"), "x\n").unwrap();
    }
    let pki_before = files_under(&root.join("var/lib/kubeadm"));
    let block = lab_block("/var/lib/certrotor");

    // A renewal cut short (its journal names the backup that finishes it): nothing removed.
    fs::write(state.join("journal.json"), "{}").unwrap();
    let (code, _, err) = chroot_block(TEST, &root, "/", &block);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("cut short"), "{err}");
    assert!(state.join("backups").is_dir());
    fs::remove_file(state.join("journal.json")).unwrap();

    let (code, out, err) = chroot_block(TEST, &root, "/", &block);
    // Every tool of the block ran without complaint (find -exec … +, shred -u, rm).
    assert!(code == 0 && err.is_empty(), "exit {code}: {out}{err}");
    for gone in [
        "var/lib/certrotor",
        "local/host-containers/certrotor",
        "local/bootstrap-containers/certrotor",
    ] {
        assert!(!root.join(gone).exists(), "{gone} is still there");
    }
    assert!(root.join("local/host-containers/admin/user-data").is_file());
    assert_eq!(files_under(&root.join("var/lib/kubeadm")), pki_before);
    crate::util::certrotor(&["check", "--root", r, "--warn-within", "1d"]).expect(0);
}

// ---- plain kubeadm: the static pod, then the admin machine's loop -----------------------------

/// kubelet-sim's state of the certrotor pod.
fn certrotor_pod(node: &Node) -> testbed::kubelet_sim::PodState {
    let bytes = fs::read(node.state_dir().join("certrotor.json")).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// One real control plane serves both checks (starting one costs about a minute here): the
/// static pod on a plain kubeadm node, then the same apiserver as the management cluster the
/// admin machine's loop reads its Machines from.
#[test]
fn the_static_pod_renews_a_kubeadm_node_and_the_admin_loop_reaches_every_cp_and_etcd_machine() {
    const TEST: &str = "install::the_static_pod_renews_a_kubeadm_node";
    testkit::prereq::require_root(TEST, "chroot into a lab node");
    let node = Node::start("install-static-pod", Platform::Kubeadm);
    // kubelet-sim runs the pod's /usr/bin/certrotor as the binary under test (a PATH lookup of
    // its name when the container path is not on the host).
    std::os::unix::fs::symlink(BIN, node.dir.join("bin/certrotor")).unwrap();
    let before = node.states();
    let served_before = node.served_sha(Served::Apiserver);
    let pki_before = node.cert_sha("pki/apiserver.crt");

    // The page's install command, in the node's root.
    let stage = node.root.join("root/packaging");
    fs::create_dir_all(&stage).unwrap();
    fs::copy(
        packaging().join("certrotor-static-pod.yaml"),
        stage.join("certrotor-static-pod.yaml"),
    )
    .unwrap();
    let (code, out, err) = chroot_block(
        TEST,
        &node.root,
        "/root/packaging",
        &lab_block("certrotor.yaml"),
    );
    assert_eq!(code, 0, "{out}{err}");
    let manifest = node.root.join("etc/kubernetes/manifests/certrotor.yaml");
    assert_eq!(
        fs::metadata(&manifest).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // The daemon's first pass: renews, restarts what cannot reload, verifies.
    wait_for(
        "the certrotor static pod's first pass",
        Duration::from_secs(600),
        Duration::from_millis(500),
        || {
            let log = node.pod_log("certrotor");
            if log.contains("pass done:") {
                Ok(())
            } else if log.contains("pass failed:") {
                panic!("the static pod's pass failed:\n{log}")
            } else {
                Err(log)
            }
        },
    );
    let log = node.pod_log("certrotor");
    let after = node.states();
    let status = node.on_root("status", &["--output", "json"]);
    status.expect(0);
    let last = &status.json()["last_pass"];
    assert_eq!(last["command"], json!("daemon"), "{last:#}");
    assert_eq!(last["result"], json!("renewed"), "{last:#}\n{log}");
    assert_eq!(last["owed"], json!([]), "{last:#}");
    let restarted: Vec<&str> = last["restarted"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !restarted.iter().any(|r| r.contains("certrotor")),
        "certrotor restarted itself: {restarted:?}"
    );
    assert!(!log.contains("NOT RESTARTED"), "{log}");
    assert!(
        !log.contains("certrotor.yaml"),
        "certrotor named its own pod:\n{log}"
    );
    // The control plane: etcd and kube-apiserver reloaded their certificates live (1.20.2, see
    // reload::TABLE); the other two restarted once each, one at a time (platform.rs proves each
    // restart; here: that the pod did them).
    let windows = platform_util::restarted_once(
        &before,
        &after,
        &["kube-controller-manager", "kube-scheduler"],
    );
    platform_util::one_at_a_time(&windows);
    for live in ["etcd", "kube-apiserver"] {
        assert_eq!(
            before[live].history, after[live].history,
            "{live} restarted\n{log}"
        );
    }
    assert!(PODS.iter().all(|p| after[*p].running));
    let served_after = node.served_sha(Served::Apiserver);
    assert_ne!(served_after, served_before);
    assert_ne!(node.cert_sha("pki/apiserver.crt"), pki_before);
    assert_eq!(served_after, node.file_sha(Served::Apiserver));
    // The pod itself: started once, never stopped, still running.
    let own = certrotor_pod(&node);
    assert!(own.running, "{own:#?}");
    assert_eq!(own.history.len(), 1, "{own:#?}");
    assert!(own.history[0].stopped_at_ms.is_none(), "{own:#?}");

    admin_loop(&node);
}

/// A Machine of a cluster in namespace `ns` with labels and addresses (type, address).
fn machine(name: &str, ns: &str, labels: &[(&str, &str)], addrs: &[(&str, &str)]) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let addresses: Vec<Value> = addrs
        .iter()
        .map(|(t, a)| json!({"type": t, "address": a}))
        .collect();
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"clusterName": "x"},
        "status": {"addresses": addresses}
    })
}

/// The page's loop against `node`'s real apiserver as the management cluster.
fn admin_loop(node: &Node) {
    let t = TestDir::new("install-admin-loop");
    let kubectl = platform_util::kubectl_path();
    let kc = |args: &[&str], input: Option<&str>| {
        let mut cmd = Command::new(&kubectl);
        cmd.arg(format!(
            "--kubeconfig={}",
            node.kfile("admin.conf").display()
        ))
        .arg("--request-timeout=30s")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.unwrap_or("").as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // Cluster API's Machine, as a CRD (the test needs its list and labels, not its schema).
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "machines.cluster.x-k8s.io"},
        "spec": {
            "group": "cluster.x-k8s.io",
            "scope": "Namespaced",
            "names": {"plural": "machines", "singular": "machine", "kind": "Machine", "listKind": "MachineList"},
            "versions": [{"name": "v1beta1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    });
    kc(&["apply", "-f", "-"], Some(&crd.to_string()));
    kc(
        &[
            "wait",
            "--for=condition=established",
            "crd/machines.cluster.x-k8s.io",
            "--timeout=60s",
        ],
        None,
    );
    kc(&["create", "namespace", "eksa-system"], None);
    let cp = [
        ("cluster.x-k8s.io/cluster-name", "my-cluster"),
        ("cluster.x-k8s.io/control-plane", ""),
    ];
    let etcd = [
        ("cluster.x-k8s.io/cluster-name", "my-cluster"),
        ("cluster.x-k8s.io/etcd-cluster", "my-cluster-etcd"),
    ];
    let machines = [
        machine(
            "my-cluster-cp-a",
            "eksa-system",
            &cp,
            &[("InternalIP", "192.168.0.11"), ("ExternalIP", "10.1.0.11")],
        ),
        machine(
            "my-cluster-cp-b",
            "eksa-system",
            &cp,
            &[("ExternalIP", "10.1.0.12")],
        ),
        machine(
            "my-cluster-etcd-a",
            "eksa-system",
            &etcd,
            &[("ExternalIP", "10.1.0.21")],
        ),
        machine(
            "my-cluster-etcd-b",
            "eksa-system",
            &etcd,
            &[("ExternalIP", "10.1.0.22")],
        ),
        machine(
            "my-cluster-md-0-x",
            "eksa-system",
            &[
                ("cluster.x-k8s.io/cluster-name", "my-cluster"),
                ("cluster.x-k8s.io/deployment-name", "my-cluster-md-0"),
            ],
            &[("ExternalIP", "10.1.0.31")],
        ),
        machine(
            "other-cp-a",
            "eksa-system",
            &[
                ("cluster.x-k8s.io/cluster-name", "other"),
                ("cluster.x-k8s.io/control-plane", ""),
            ],
            &[("ExternalIP", "10.2.0.11")],
        ),
        machine(
            "other-etcd-a",
            "eksa-system",
            &[
                ("cluster.x-k8s.io/cluster-name", "my-cluster"),
                ("cluster.x-k8s.io/etcd-cluster", "other-etcd"),
            ],
            &[("ExternalIP", "10.2.0.21")],
        ),
        machine(
            "my-cluster-cp-elsewhere",
            "default",
            &cp,
            &[("ExternalIP", "10.3.0.11")],
        ),
    ];
    let list = json!({"apiVersion": "v1", "kind": "List", "items": machines});
    kc(&["apply", "-f", "-"], Some(&list.to_string()));

    // The admin machine: HOME with the management cluster's kubeconfig and an SSH key,
    // kubectl v1.20.2 and the two stand-ins on PATH.
    let home = t.join("home");
    fs::create_dir_all(home.join("my-cluster")).unwrap();
    fs::create_dir_all(home.join(".ssh")).unwrap();
    fs::copy(
        node.kfile("admin.conf"),
        home.join("my-cluster/my-cluster-eks-a-cluster.kubeconfig"),
    )
    .unwrap();
    fs::write(home.join(".ssh/id_rsa"), "not a key\n").unwrap();
    let bin = t.join("bin");
    fs::create_dir_all(&bin).unwrap();
    write_exec(&bin.join("apiclient"), RECORDING_APICLIENT);
    write_exec(&bin.join("ssh"), SSH);
    std::os::unix::fs::symlink(&kubectl, bin.join("kubectl")).unwrap();
    let record = t.join("ssh");
    fs::create_dir_all(&record).unwrap();
    let blocks = tested("admin-loop");
    assert_eq!(blocks.len(), 1);
    let out = run_block(
        &blocks[0],
        &packaging(),
        &bin,
        &[("HOME", &home), ("SSH_RECORD", &record)],
    );

    // Every control plane and etcd machine of the cluster, once; nothing else.
    let mut hosts: Vec<String> = fs::read_dir(&record)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    hosts.sort();
    assert_eq!(
        hosts,
        ["10.1.0.11", "10.1.0.12", "10.1.0.21", "10.1.0.22"],
        "{out}"
    );
    let mut seen = BTreeMap::new();
    for host in &hosts {
        assert_eq!(
            fs::read_to_string(record.join(format!("{host}.user"))).unwrap(),
            "ec2-user\n"
        );
        let calls = recorded(&record.join(host));
        assert_eq!(calls.len(), 1, "{host}: {calls:?}");
        let emu = Emulator::start(&t.join(&format!("node-{host}")), true);
        replay(&emu, Wire::KeyPair, &calls[0]).unwrap_or_else(|e| panic!("{host}: {e}"));
        let image = toml_settings("host-container.toml", "host-containers")["source"].clone();
        assert_installed(&emu.settings(), image.as_str().unwrap(), host);
        seen.insert(host.clone(), emu.settings());
    }
    assert!(out.contains("== 10.1.0.11"), "{out}");
}
