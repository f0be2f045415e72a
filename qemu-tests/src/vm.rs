//! Scenarios: a work dir with a 9p share and a persistent `/local` disk, booted one or more
//! times under QEMU (TCG), with the serial log captured, markers timed, hang detection and an
//! optional kill (power loss) at a marker.
//!
//! A boot has no time limit of its own: how long a scenario takes depends on the machine (TCG
//! on a loaded 2-core host runs several times slower than on an idle one), and every wait in
//! the guest has its own bound (`e2e_wait_for`, certrotor's `--restart-timeout`, ...). While
//! the guest waits it says so on the console at least every 30 s (`e2e_wait_for`,
//! `node_certrotor`), so a console silent for [`BootOptions::hang_after`] means something hung
//! outside any bounded wait (the kernel, QEMU, a stuck command): QEMU is killed and the boot
//! fails with the log's tail.
//!
//! Work dir layout (`<target>/qemu-tests/<scenario>/`, wiped when the scenario starts):
//! * `serial.log`          — every boot's console, one after the other (`boot-N.serial.log` per boot)
//! * `qemu-boot-N.cmd`     — the exact QEMU command line (to rerun by hand)
//! * `local.qcow2`         — the persistent disk (`/local` = `/var`, `/opt`, `/mnt` in the guest),
//!   a copy-on-write overlay of the images' blank `local-base.img`
//! * `share/`              — 9p share, `/mnt/share` in the guest: `run.sh` (the scenario script)
//!   and inputs; the guest writes `share/out/boot-N/` (`rc`, `results.txt`, logs, values)
//!
//! Environment: `QEMU_TESTS_SMP` (default 1: measured faster than 2 under TCG here for the
//! scenarios without a control plane; a boot's `BootOptions::smp` overrides it, 2 for the
//! real control plane),
//! `QEMU_TESTS_MEM` (MiB, default 1024), `QEMU_TESTS_JOBS` (VMs at once across all test
//! processes, default 1), `QEMU_TESTS_TIMEOUT_FACTOR` (multiplies every boot's `hang_after`,
//! default 1),
//! `QEMU` (the qemu-system-x86_64 binary).

use crate::artifacts::{Artifacts, artifacts};
use crate::error::{Context, Error, Result};
use crate::paths;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Prefix of every line printed by the guest's init and `e2e_mark`.
pub const MARKER_PREFIX: &str = "CERTROTOR-E2E: ";

/// Default [`BootOptions::hang_after`]: ten times the guest's 30 s heartbeat while it waits,
/// and far above its silent steps between two lines (image imports, a kubectl call, the kernel
/// boot), however slow the host.
pub const DEFAULT_HANG_AFTER: Duration = Duration::from_secs(300);

/// Options for one boot.
#[derive(Debug, Clone)]
pub struct BootOptions {
    /// The boot hung when its console has been silent this long (no line at all): QEMU is
    /// killed and the boot fails. Not a limit on the boot's length (see the module doc).
    pub hang_after: Duration,
    /// Kill QEMU (SIGKILL: a power loss) as soon as a console line contains this text.
    pub kill_at: Option<String>,
    /// Extra kernel command line words (e.g. `e2e.shell=1`).
    pub append: Vec<String>,
    /// QEMU `-rtc base=` value (e.g. `2031-01-01T00:00:00` to start the guest clock in the future).
    pub rtc_base: Option<String>,
    /// vCPUs for this boot (overrides `QEMU_TESTS_SMP`); above 1, TCG runs one host thread per
    /// vCPU (`-accel tcg,thread=multi`). The real control plane needs 2 (see ARCHITECTURE.md).
    pub smp: Option<u32>,
    /// Guest memory in MiB for this boot (overrides `QEMU_TESTS_MEM`).
    pub mem_mib: Option<u32>,
    /// A virtio NIC on QEMU's user network (slirp), for pulling from a registry on the host:
    /// the guest's connections to 10.0.2.2 reach the host's 127.0.0.1 (the guest configures it
    /// with `e2e_net_up`, which sets no default route: the guest reaches nothing else). Without
    /// it the VM has no network device at all.
    pub user_net: bool,
}

impl Default for BootOptions {
    fn default() -> Self {
        BootOptions {
            hang_after: DEFAULT_HANG_AFTER,
            kill_at: None,
            append: Vec::new(),
            rtc_base: None,
            smp: None,
            mem_mib: None,
            user_net: false,
        }
    }
}

impl BootOptions {
    /// Default options with a kill at the guest marker `e2e_mark TEXT` prints.
    pub fn kill_at_mark(text: &str) -> Self {
        BootOptions {
            kill_at: Some(format!("{MARKER_PREFIX}MARK {text} ")),
            ..Self::default()
        }
    }
}

/// How a boot ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The scenario script ran and returned `rc` (guest `RESULT rc=N`), QEMU exited.
    Finished {
        /// Exit status of the scenario script.
        rc: i32,
    },
    /// QEMU was killed when the `kill_at` text appeared.
    KilledAtMarker,
    /// QEMU exited without a `RESULT` line (guest crash, no script, ...).
    NoResult,
}

/// What one boot produced.
#[derive(Debug, Clone)]
pub struct Boot {
    /// 1-based boot index within the scenario.
    pub index: u32,
    /// How it ended.
    pub ending: Ending,
    /// The console of this boot.
    pub serial_log: PathBuf,
    /// `share/out/boot-N`: files the guest wrote.
    pub out_dir: PathBuf,
    /// Every `CERTROTOR-E2E:` line with its time since QEMU started.
    pub markers: Vec<(Duration, String)>,
    /// QEMU start to exit.
    pub elapsed: Duration,
}

impl Boot {
    /// The scenario script's exit status, when it finished.
    pub fn rc(&self) -> Option<i32> {
        match self.ending {
            Ending::Finished { rc } => Some(rc),
            _ => None,
        }
    }

    /// Time of the first marker line containing `text`.
    pub fn marker_time(&self, text: &str) -> Option<Duration> {
        self.markers
            .iter()
            .find(|(_, l)| l.contains(text))
            .map(|(t, _)| *t)
    }

    /// Reads `share/out/boot-N/<name>` (trailing newline trimmed).
    pub fn read_out(&self, name: &str) -> Result<String> {
        let p = self.out_dir.join(name);
        let s = fs::read_to_string(&p)
            .map_err(|e| self.failure(&format!("cannot read guest output {}: {e}", p.display())))?;
        Ok(s.trim_end_matches('\n').to_string())
    }

    /// Fails the test unless the guest output `name` reads `want` (trailing newline trimmed),
    /// saying `what` with the log tail.
    #[track_caller]
    pub fn assert_out(&self, name: &str, want: &str, what: &str) {
        match self.read_out(name) {
            Ok(got) => assert_eq!(got, want, "{}", self.failure(what)),
            Err(e) => panic!("{e:?}"),
        }
    }

    /// Fails the test unless the guest output `name` contains each of `wants`, naming the one
    /// missing, `what` the output is, and the output with the log tail. Returns the output.
    #[track_caller]
    pub fn assert_out_contains(&self, name: &str, wants: &[&str], what: &str) -> String {
        let text = match self.read_out(name) {
            Ok(text) => text,
            Err(e) => panic!("{e:?}"),
        };
        for want in wants {
            assert!(
                text.contains(want),
                "{}",
                self.failure(&format!("no {want:?} in {what}:\n{text}"))
            );
        }
        text
    }

    /// Ok when the scenario script finished with rc 0; else an error with the log tail.
    pub fn expect_success(&self) -> Result<()> {
        match self.ending {
            Ending::Finished { rc: 0 } => Ok(()),
            ref e => Err(self.failure(&format!("boot {} ended with {e:?}", self.index))),
        }
    }

    /// Ok when QEMU was killed at the marker; else an error with the log tail.
    pub fn expect_killed(&self) -> Result<()> {
        match self.ending {
            Ending::KilledAtMarker => Ok(()),
            ref e => Err(self.failure(&format!(
                "boot {} was to be killed at a marker but ended with {e:?}",
                self.index
            ))),
        }
    }

    /// An error for this boot: `msg`, the serial log's path and its last lines.
    pub fn failure(&self, msg: &str) -> Error {
        Error(format!(
            "{msg}\n{}",
            log_excerpt(&self.serial_log, &self.out_dir)
        ))
    }
}

fn log_excerpt(serial: &Path, out_dir: &Path) -> String {
    let tail = fs::read_to_string(serial)
        .map(|s| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        })
        .unwrap_or_else(|e| format!("(cannot read: {e})"));
    format!(
        "serial log: {}\nguest outputs: {}\n--- last lines of the serial log ---\n{tail}\n---",
        serial.display(),
        out_dir.display()
    )
}

/// A scenario: one work dir, one persistent disk, any number of boots.
#[derive(Debug)]
pub struct Scenario {
    name: String,
    dir: PathBuf,
    artifacts: &'static Artifacts,
    boots: u32,
}

impl Scenario {
    /// Builds the artifacts if needed (once per process), then creates a fresh work dir
    /// `<target>/qemu-tests/<name>` with an empty share and a new `/local` disk.
    pub fn new(name: &str) -> Result<Scenario> {
        let sc = Scenario::empty(name, artifacts()?)?;
        sc.new_local_disk()?;
        Ok(sc)
    }

    /// A fresh work dir with an empty share and no disk yet.
    fn empty(name: &str, artifacts: &'static Artifacts) -> Result<Scenario> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        {
            return Err(Error(format!("bad scenario name {name:?}")));
        }
        let dir = paths::work_root().join(name);
        if dir.exists() {
            fs::remove_dir_all(&dir).ctx(format!("remove {}", dir.display()))?;
        }
        fs::create_dir_all(dir.join("share/out")).ctx(format!("create {}", dir.display()))?;
        Ok(Scenario {
            name: name.to_string(),
            dir,
            artifacts,
            boots: 0,
        })
    }

    /// The scenario's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The work dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The 9p share (`/mnt/share` in the guest).
    pub fn share_dir(&self) -> PathBuf {
        self.dir.join("share")
    }

    /// The binaries and images in use.
    pub fn artifacts(&self) -> &'static Artifacts {
        self.artifacts
    }

    /// The combined serial log of all boots.
    pub fn serial_log(&self) -> PathBuf {
        self.dir.join("serial.log")
    }

    /// Number of boots so far.
    pub fn boots(&self) -> u32 {
        self.boots
    }

    /// A second scenario, `name`, that goes on from this one's disk as its last boot left it:
    /// its own work dir, a copy of this one's share (the guest script, its inputs and the outputs
    /// so far) and a persistent disk that is a fresh copy-on-write overlay of this one's. That
    /// disk is frozen here as the disk this scenario's next boot starts from, so the next boot
    /// of either one writes to an overlay of its own. Boots go on counting from this one's.
    /// Two branches of one node after one set-up: e.g. one power loss, recovered two ways.
    pub fn fork(&mut self, name: &str) -> Result<Scenario> {
        let index = self.boots + 1;
        if !self.disk_before(index).exists() {
            self.overlay_disk(index)?;
        }
        let child = Scenario::empty(name, self.artifacts)?;
        let st = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", self.share_dir().display()))
            .arg(child.share_dir())
            .status()
            .ctx("cp")?;
        if !st.success() {
            return Err(Error(format!(
                "copy {} to {} failed: {st}",
                self.share_dir().display(),
                child.share_dir().display()
            )));
        }
        child.create_disk(&self.disk_before(index), "qcow2")?;
        Ok(Scenario {
            boots: self.boots,
            ..child
        })
    }

    /// Replaces the persistent disk by a fresh copy-on-write overlay of the blank base.
    pub fn new_local_disk(&self) -> Result<()> {
        self.create_disk(&self.artifacts.images.local_base, "raw")
    }

    /// Creates `local.qcow2` (replacing it) as an empty qcow2 overlay of `backing`.
    fn create_disk(&self, backing: &Path, backing_format: &str) -> Result<()> {
        let disk = self.dir.join("local.qcow2");
        if disk.exists() {
            fs::remove_file(&disk).ctx(format!("remove {}", disk.display()))?;
        }
        let st = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", backing_format, "-b"])
            .arg(backing)
            .arg(&disk)
            .status()
            .ctx("qemu-img (images/setup-host.sh installs qemu-utils)")?;
        if st.success() {
            Ok(())
        } else {
            Err(Error(format!(
                "qemu-img create {} failed: {st}",
                disk.display()
            )))
        }
    }

    /// Writes the scenario script run by the guest's init (`share/run.sh`).
    pub fn set_script(&self, text: &str) -> Result<()> {
        self.write_share("run.sh", text.as_bytes())
    }

    /// Writes `share/<rel>` (parent dirs created).
    pub fn write_share(&self, rel: &str, data: &[u8]) -> Result<()> {
        let p = self.share_dir().join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).ctx(format!("create {}", parent.display()))?;
        }
        fs::write(&p, data).ctx(format!("write {}", p.display()))
    }

    /// Puts an OCI archive of the certrotor binary (as `/usr/bin/certrotor`, the entrypoint,
    /// named `reference`) into the share as `file_name`.
    pub fn add_certrotor_image(&self, reference: &str, file_name: &str) -> Result<()> {
        crate::artifacts::oci_image(
            &self.artifacts.bins.certrotor,
            "/usr/bin/certrotor",
            reference,
            &self.share_dir().join(file_name),
        )
    }

    /// The QEMU command for boot `index`.
    fn qemu_command(&self, index: u32, opts: &BootOptions) -> Command {
        let img = &self.artifacts.images;
        let smp = opts
            .smp
            .map(u64::from)
            .unwrap_or_else(|| env_num("QEMU_TESTS_SMP", 1));
        let accel = if smp > 1 { "tcg,thread=multi" } else { "tcg" };
        let mem = opts
            .mem_mib
            .map(u64::from)
            .unwrap_or_else(|| env_num("QEMU_TESTS_MEM", 1024));
        let qemu = std::env::var_os("QEMU").unwrap_or_else(|| "qemu-system-x86_64".into());
        let mut c = Command::new(qemu);
        c.args([
            "-machine",
            "pc",
            "-accel",
            accel,
            "-nodefaults",
            "-no-user-config",
        ])
        .args(["-smp", &smp.to_string(), "-m", &mem.to_string()])
        .args(["-display", "none", "-serial", "stdio", "-no-reboot"])
        .args(["-device", "virtio-rng-pci"])
        .arg("-kernel")
        .arg(&img.vmlinux)
        .arg("-initrd")
        .arg(&img.initramfs)
        .arg("-drive")
        .arg(drive_arg(&img.rootfs, "root", "raw", true))
        .args(["-device", "virtio-blk-pci,drive=root,serial=vmroot"])
        .arg("-drive")
        .arg(drive_arg(
            &self.dir.join("local.qcow2"),
            "local",
            "qcow2",
            false,
        ))
        .args(["-device", "virtio-blk-pci,drive=local,serial=local"])
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=share,security_model=none,id=share",
            self.share_dir().display()
        ));
        if opts.user_net {
            // ipv6=off: 10.0.2.0/24 only; romfile=: no iPXE option ROM (nothing boots from it).
            c.args(["-netdev", "user,id=net0,ipv6=off"])
                .args(["-device", "virtio-net-pci,netdev=net0,romfile="]);
        }
        if let Some(base) = &opts.rtc_base {
            c.args(["-rtc", &format!("base={base}")]);
        }
        let mut cmdline = format!("console=ttyS0 quiet panic=-1 e2e.boot={index}");
        for a in &opts.append {
            cmdline.push(' ');
            cmdline.push_str(a);
        }
        c.arg("-append").arg(cmdline);
        c
    }

    /// Boots the VM once on the scenario's persistent disk and waits until QEMU exits, the
    /// `kill_at` marker shows up (QEMU is then SIGKILLed) or the console stays silent for
    /// `hang_after` (error: the boot hung).
    ///
    /// One exception, printed: a boot in which the guest kernel's soft-lockup watchdog fired (a
    /// vCPU stuck in the kernel, which multi-threaded TCG has produced three times in this
    /// project's runs: twice inside runc, once in a simulator process, each time before
    /// certrotor ran, and the guest never recovered) is an emulator fault. QEMU is killed at the
    /// watchdog's line, not when the console falls silent, and the boot runs
    /// again once, on the disk exactly as it was before the locked-up attempt (each boot writes
    /// to a new copy-on-write overlay of the disk its predecessor left, so the attempt's writes
    /// are thrown away with its overlay), its serial log kept as `boot-N.lockup.serial.log`. A
    /// lockup in that second try waits for the silence (a guest may recover) and then fails, as
    /// any other hang does.
    pub fn boot(&mut self, opts: &BootOptions) -> Result<Boot> {
        let index = self.boots + 1;
        // Frozen already when a fork took this disk as its start.
        if !self.disk_before(index).exists() {
            self.overlay_disk(index)?;
        }
        match self.boot_once(opts, true)? {
            Attempt::Done(b) => Ok(b),
            Attempt::LockedUp(_) => {
                let serial = self.dir.join(format!("boot-{index}.serial.log"));
                let kept = self.dir.join(format!("boot-{index}.lockup.serial.log"));
                fs::rename(&serial, &kept).ctx(format!("keep {}", serial.display()))?;
                let out = self.share_dir().join(format!("out/boot-{index}"));
                if out.exists() {
                    fs::remove_dir_all(&out).ctx(format!("remove {}", out.display()))?;
                }
                self.new_overlay(index)?;
                self.boots = index - 1;
                eprintln!(
                    "qemu-tests: {}: the guest kernel locked up under TCG (soft-lockup watchdog) \
                     in boot {index}: boot {index} again, once, on the disk as it was before it \
                     (the locked-up boot's serial log: {})",
                    self.name,
                    kept.display()
                );
                match self.boot_once(opts, false)? {
                    Attempt::Done(b) => Ok(b),
                    Attempt::LockedUp(e) => Err(e),
                }
            }
        }
    }

    /// The disk boot `index` starts from, kept read-only: the backing file of its overlays.
    fn disk_before(&self, index: u32) -> PathBuf {
        self.dir.join(format!("local.before-boot-{index}.qcow2"))
    }

    /// Freezes the persistent disk as boot `index` finds it (`disk_before`) and puts a fresh
    /// overlay on top of it for the boot to write to.
    fn overlay_disk(&self, index: u32) -> Result<()> {
        let disk = self.dir.join("local.qcow2");
        let before = self.disk_before(index);
        fs::rename(&disk, &before).ctx(format!("rename {}", disk.display()))?;
        self.new_overlay(index)
    }

    /// Replaces `local.qcow2` by an empty overlay of the disk boot `index` started from.
    fn new_overlay(&self, index: u32) -> Result<()> {
        self.create_disk(&self.disk_before(index), "qcow2")
    }

    /// `stop_at_lockup`: QEMU is killed at the soft-lockup watchdog's first line (the boot is
    /// then `LockedUp`) instead of running on into the silence.
    fn boot_once(&mut self, opts: &BootOptions, stop_at_lockup: bool) -> Result<Attempt> {
        self.boots += 1;
        let index = self.boots;
        let out_dir = self.share_dir().join(format!("out/boot-{index}"));
        let serial = self.dir.join(format!("boot-{index}.serial.log"));
        let mut cmd = self.qemu_command(index, opts);
        let cmd_file = self.dir.join(format!("qemu-boot-{index}.cmd"));
        fs::write(&cmd_file, format!("{cmd:?}\n")).ctx(format!("write {}", cmd_file.display()))?;

        let _slot = VmSlot::acquire()?;
        let factor = env_num("QEMU_TESTS_TIMEOUT_FACTOR", 1).max(1);
        let hang_after = opts
            .hang_after
            .saturating_mul(u32::try_from(factor).unwrap_or(1));
        eprintln!(
            "qemu-tests: {}: boot {index} (hung after {}s of console silence), serial log {}",
            self.name,
            hang_after.as_secs(),
            serial.display()
        );
        let mut log = SerialLog::create(&serial, &self.serial_log(), index)?;
        let t0 = Instant::now();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .ctx("cannot start qemu-system-x86_64 (images/setup-host.sh installs it)")?;
        let (tx, rx) = mpsc::channel::<Line>();
        spawn_reader(child.stdout.take(), "", tx.clone());
        spawn_reader(child.stderr.take(), "[qemu stderr] ", tx);

        // Moves on with every console line: only silence runs into it.
        let mut deadline = t0 + hang_after;
        let mut markers = Vec::new();
        let mut result_rc: Option<i32> = None;
        let mut killed = false;
        loop {
            let now = Instant::now();
            if now >= deadline {
                kill(&mut child);
                // Reaped, so that no zombie QEMU stays behind for the rest of the run.
                let _ = child.wait();
                log.line(
                    t0.elapsed(),
                    "[harness] HUNG: no console line for the hang bound; QEMU killed",
                );
                let excerpt = log_excerpt(&serial, &out_dir);
                let error = Error(format!(
                    "{}: boot {index} timed out: its console was silent for {}s (hung; every \
                     wait in the guest prints at least every 30 s)\n{excerpt}",
                    self.name,
                    hang_after.as_secs()
                ));
                let locked_up =
                    fs::read_to_string(&serial).is_ok_and(|log| log.contains(SOFT_LOCKUP));
                return if locked_up {
                    Ok(Attempt::LockedUp(error))
                } else {
                    Err(error)
                };
            }
            match rx.recv_timeout(deadline - now) {
                Ok(Line(text)) => {
                    deadline = Instant::now() + hang_after;
                    let at = t0.elapsed();
                    log.line(at, &text);
                    if let Some(pos) = text.find(MARKER_PREFIX) {
                        let m = text[pos..].to_string();
                        if let Some(rc) = parse_result(&m) {
                            result_rc = Some(rc);
                        }
                        markers.push((at, m));
                    }
                    if stop_at_lockup && text.contains(SOFT_LOCKUP) {
                        kill(&mut child);
                        log.line(
                            t0.elapsed(),
                            "[harness] guest soft lockup: QEMU killed, the boot is tried again",
                        );
                        // Reap QEMU; its exit status says nothing more (SIGKILL).
                        let _ = child.wait();
                        return Ok(Attempt::LockedUp(Error(format!(
                            "{}: boot {index}: the guest kernel locked up after {:.0}s",
                            self.name,
                            at.as_secs_f64()
                        ))));
                    }
                    if let Some(k) = &opts.kill_at
                        && text.contains(k.as_str())
                    {
                        kill(&mut child);
                        killed = true;
                        log.line(
                            t0.elapsed(),
                            &format!("[harness] killed QEMU at marker {k:?}"),
                        );
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child.wait().ctx("wait for qemu")?;
        let elapsed = t0.elapsed();
        log.line(elapsed, &format!("[harness] QEMU exited: {status}"));
        let ending = if killed {
            Ending::KilledAtMarker
        } else if let Some(rc) = result_rc {
            Ending::Finished { rc }
        } else {
            Ending::NoResult
        };
        eprintln!(
            "qemu-tests: {}: boot {index}: {ending:?} after {:.1}s",
            self.name,
            elapsed.as_secs_f64()
        );
        Ok(Attempt::Done(Boot {
            index,
            ending,
            serial_log: serial,
            out_dir,
            markers,
            elapsed,
        }))
    }
}

/// What the guest kernel prints when a CPU has been stuck in the kernel for over 20 s.
const SOFT_LOCKUP: &str = "watchdog: BUG: soft lockup";

/// One boot: it ended (as [`Boot`] says), or the guest kernel locked up (QEMU killed at the
/// watchdog's line, or timed out after it).
enum Attempt {
    Done(Boot),
    LockedUp(Error),
}

fn drive_arg(file: &Path, id: &str, format: &str, readonly: bool) -> String {
    // QEMU option values escape ',' as ',,'
    let f = file.display().to_string().replace(',', ",,");
    let ro = if readonly { ",readonly=on" } else { "" };
    format!("file={f},if=none,id={id},format={format},cache=writeback{ro}")
}

fn env_num(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// `CERTROTOR-E2E: RESULT rc=N ...` -> N
fn parse_result(marker: &str) -> Option<i32> {
    let rest = marker
        .strip_prefix(MARKER_PREFIX)?
        .strip_prefix("RESULT rc=")?;
    rest.split_whitespace().next()?.parse().ok()
}

fn kill(child: &mut Child) {
    // SIGKILL; an error means it has exited already
    let _ = child.kill();
}

struct Line(String);

fn spawn_reader<R: Read + Send + 'static>(
    src: Option<R>,
    prefix: &'static str,
    tx: mpsc::Sender<Line>,
) {
    let Some(src) = src else { return };
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let s = String::from_utf8_lossy(&buf);
                    let s = s.trim_end_matches(['\n', '\r']);
                    if tx.send(Line(format!("{prefix}{s}"))).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

/// Writes console lines with their time since QEMU started to the boot's log and the
/// scenario's combined log.
struct SerialLog {
    boot: File,
    all: File,
}

impl SerialLog {
    fn create(boot: &Path, all: &Path, index: u32) -> Result<SerialLog> {
        let b = File::create(boot).ctx(format!("create {}", boot.display()))?;
        let mut a = OpenOptions::new()
            .create(true)
            .append(true)
            .open(all)
            .ctx(format!("open {}", all.display()))?;
        writeln!(a, "===== boot {index} =====").ctx("write serial log")?;
        Ok(SerialLog { boot: b, all: a })
    }

    fn line(&mut self, at: Duration, text: &str) {
        let l = format!("[{:8.3}] {text}\n", at.as_secs_f64());
        // Logging must not abort a boot; a full disk shows up elsewhere soon enough.
        let _ = self.boot.write_all(l.as_bytes());
        let _ = self.all.write_all(l.as_bytes());
    }
}

/// A slot for one running VM (`QEMU_TESTS_JOBS` slots, default 1), held through a file lock
/// so that parallel tests and test binaries do not overload the (2-core) machine.
struct VmSlot {
    _file: File,
}

impl VmSlot {
    fn acquire() -> Result<VmSlot> {
        let dir = paths::work_root().join(".vm-slots");
        fs::create_dir_all(&dir).ctx(format!("create {}", dir.display()))?;
        let jobs = env_num("QEMU_TESTS_JOBS", 1).max(1);
        let open = |i: u64| {
            let p = dir.join(format!("slot-{i}"));
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&p)
                .ctx(format!("open {}", p.display()))
        };
        for i in 0..jobs {
            let f = open(i)?;
            if f.try_lock().is_ok() {
                return Ok(VmSlot { _file: f });
            }
        }
        // All busy: wait on one of them (blocking lock, released when its holder ends).
        let f = open(u64::from(std::process::id()) % jobs)?;
        f.lock().ctx("lock VM slot")?;
        Ok(VmSlot { _file: f })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn parses_result_marker() {
        assert_eq!(
            parse_result("CERTROTOR-E2E: RESULT rc=0 uptime=3.2"),
            Some(0)
        );
        assert_eq!(
            parse_result("CERTROTOR-E2E: RESULT rc=17 uptime=3.2"),
            Some(17)
        );
        assert_eq!(parse_result("CERTROTOR-E2E: RESULT rc=x"), None);
        assert_eq!(parse_result("CERTROTOR-E2E: BOOTED boot=1"), None);
    }

    #[test]
    fn kill_at_mark_matches_the_whole_word() {
        let o = BootOptions::kill_at_mark("ETCD-WRITTEN");
        let k = o.kill_at.unwrap();
        assert!("CERTROTOR-E2E: MARK ETCD-WRITTEN uptime=3.1".contains(&k));
        assert!(!"CERTROTOR-E2E: MARK ETCD-WRITTEN-2 uptime=3.1".contains(&k));
    }

    #[test]
    fn drive_escapes_commas() {
        assert_eq!(
            drive_arg(Path::new("/a,b/x.img"), "r", "raw", true),
            "file=/a,,b/x.img,if=none,id=r,format=raw,cache=writeback,readonly=on"
        );
    }
}
