//! Which process listens on a TCP port, which processes run a program, and whether they have
//! exited, from `/proc` (the host's,
//! where certrotor runs with the host's PID and network namespaces: a superpowered host
//! container, a bootstrap container, or a process on a kubeadm node).
//!
//! Why: a component's port closes as soon as it begins to shut down, but the kubelet tears its
//! pod down only after the process exits. Kubelet v1.20.2, given the same static pod back while
//! it still tears the old one down, tries to start the container in the dying sandbox, fails
//! ("failed to create shim task: ttrpc: closed"), backs off 10 s and only then makes a new
//! sandbox (measured in the QEMU scenario `kubelet_control_plane`). So a restart waits for the
//! process that listened to exit before it gives the pod back. Best effort: where the process
//! cannot be seen (another PID namespace), there is nothing to wait for.
//!
//! A static pod without a port or probe (kube-vip as EKS Anywhere renders it) is known by its
//! processes: [`Proc::all`] with each one's command line, environment, cgroup and mounts, and
//! its start time in clock ticks since boot, which orders it against [`now_ticks`].

use std::fs;
use std::time::{Duration, Instant};

/// Clock ticks per second of the times in `/proc` (`USER_HZ`): the kernel exports them in
/// USER_HZ whatever its internal HZ, and USER_HZ is 100 on every architecture Kubernetes nodes
/// run (x86_64, arm64; `sysconf(_SC_CLK_TCK)`).
pub const USER_HZ: u64 = 100;

/// A process, told apart from a later one with the same PID by its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: u32,
    /// `starttime` from `/proc/PID/stat`: clock ticks ([`USER_HZ`]) since boot.
    pub start_time: u64,
}

/// The process that listened on a port when [`listener`] looked.
pub type Listener = Proc;

/// Now, in clock ticks since boot (`/proc/uptime`), on the clock of [`Proc::start_time`].
pub fn now_ticks() -> Option<u64> {
    let text = fs::read_to_string("/proc/uptime").ok()?;
    let secs: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some((secs * USER_HZ as f64) as u64)
}

/// Milliseconds between two tick counts (0 when `later` is not later).
pub fn ticks_ms(earlier: u64, later: u64) -> u64 {
    later.saturating_sub(earlier) * 1000 / USER_HZ
}

/// The process listening on TCP `port` (any address, IPv4 or IPv6), if one can be seen.
pub fn listener(port: u16) -> Option<Listener> {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return None;
    }
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = fs::read_link(fd.path()) else {
                continue;
            };
            let inode = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok());
            if inode.is_some_and(|i| inodes.contains(&i)) {
                let (_, start_time) = stat(pid)?;
                return Some(Listener { pid, start_time });
            }
        }
    }
    None
}

impl Proc {
    /// The process `pid` now, if it runs (a zombie does not).
    pub fn of(pid: u32) -> Option<Proc> {
        let (state, start_time) = stat(pid)?;
        (state != 'Z').then_some(Proc { pid, start_time })
    }

    /// Every process this `/proc` shows, but zombies and this one.
    pub fn all() -> Vec<Proc> {
        let me = std::process::id();
        let Ok(dir) = fs::read_dir("/proc") else {
            return vec![];
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| *pid != me)
            .filter_map(Proc::of)
            .collect()
    }

    /// Its command line, one string per argument; `None` when it is gone (or a kernel thread).
    pub fn cmdline(&self) -> Option<Vec<String>> {
        let list = nul_separated(&format!("/proc/{}/cmdline", self.pid))?;
        (!list.is_empty()).then_some(list)
    }

    /// Its environment, `NAME=value` each (readable by root or its owner only).
    pub fn environ(&self) -> Option<Vec<String>> {
        nul_separated(&format!("/proc/{}/environ", self.pid))
    }

    /// Its cgroup membership as `/proc/PID/cgroup` lists it.
    pub fn cgroup(&self) -> Option<String> {
        fs::read_to_string(format!("/proc/{}/cgroup", self.pid)).ok()
    }

    /// The root (the source path inside its filesystem) of the mount at `mount_point` in its
    /// mount namespace, from `/proc/PID/mountinfo`: a bind mount of a file that was renamed
    /// over ends in `//deleted`. `None` when it has no mount there (no mount namespace of its
    /// own: the mount is not visible) or is gone.
    pub fn mount_root(&self, mount_point: &str) -> Option<String> {
        let text = fs::read_to_string(format!("/proc/{}/mountinfo", self.pid)).ok()?;
        // id parent major:minor root mount-point options ... - fstype source super-options
        text.lines().rev().find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 4 && unescape(f[4]) == mount_point).then(|| unescape(f[3]))
        })
    }

    /// Whether it runs in a mount namespace other than this process's (a container's); `None`
    /// when that cannot be read (gone, or not root).
    pub fn own_mount_namespace(&self) -> Option<bool> {
        let ns = |pid: &str| fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
        Some(ns(&self.pid.to_string())? != ns("self")?)
    }

    /// The content of `path` as the process sees it (through `/proc/PID/root`, so in its own
    /// mount namespace): what it reads when it opens that path now. At most `limit` bytes;
    /// `None` when it cannot be read or is larger.
    pub fn read_seen(&self, path: &str, limit: u64) -> Option<Vec<u8>> {
        use std::io::Read;
        let file = fs::File::open(format!("/proc/{}/root{path}", self.pid)).ok()?;
        let mut bytes = Vec::new();
        file.take(limit + 1).read_to_end(&mut bytes).ok()?;
        (bytes.len() as u64 <= limit).then_some(bytes)
    }

    /// The process has exited: gone, a zombie, or its PID now another process's.
    pub fn exited(&self) -> bool {
        match stat(self.pid) {
            None => true,
            Some((state, start_time)) => state == 'Z' || start_time != self.start_time,
        }
    }

    /// Waits (polling every `poll`) until the process has exited; false when it still runs
    /// after `timeout`.
    pub fn wait_exited(&self, timeout: Duration, poll: Duration) -> bool {
        let started = Instant::now();
        loop {
            if self.exited() {
                return true;
            }
            if started.elapsed() >= timeout {
                return false;
            }
            std::thread::sleep(poll.min(timeout.saturating_sub(started.elapsed())));
        }
    }
}

/// A NUL-separated `/proc` file as strings (lossy UTF-8).
fn nul_separated(path: &str) -> Option<Vec<String>> {
    let bytes = fs::read(path).ok()?;
    Some(
        bytes
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The inodes of the sockets listening on `port` (`/proc/net/tcp` and `tcp6`, state 0A).
fn listening_inodes(port: u16) -> Vec<u64> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let local = f[1]
                .rsplit(':')
                .next()
                .and_then(|h| u16::from_str_radix(h, 16).ok());
            if local == Some(port)
                && let Ok(inode) = f[9].parse::<u64>()
                && inode != 0
            {
                out.push(inode);
            }
        }
    }
    out
}

/// `(state, starttime)` of `pid` from `/proc/PID/stat` (the fields after the command name,
/// which may itself hold spaces and parentheses).
fn stat(pid: u32) -> Option<(char, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = text.get(text.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // state is field 3, starttime field 22
    let start_time = fields.nth(18)?.parse().ok()?;
    Some((state, start_time))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_this_process_listening_and_sees_a_killed_child_exit() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let found = listener(port).expect("this process listens");
        assert_eq!(found.pid, std::process::id());
        assert!(!found.exited());
        drop(l);
        assert_eq!(listener(port), None, "nothing listens any more");

        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let (_, start_time) = stat(child.id()).unwrap();
        let c = Listener {
            pid: child.id(),
            start_time,
        };
        assert!(!c.wait_exited(Duration::from_millis(50), Duration::from_millis(10)));
        child.kill().unwrap();
        // a zombie until reaped: already exited
        assert!(c.wait_exited(Duration::from_secs(5), Duration::from_millis(10)));
        child.wait().unwrap();
        assert!(c.exited());
        // the same PID with another start time is another process
        let me = Listener {
            pid: std::process::id(),
            start_time: stat(std::process::id()).unwrap().1 + 1,
        };
        assert!(me.exited());
    }

    #[test]
    fn a_child_is_seen_with_its_command_line_environment_and_start_time() {
        let before = now_ticks().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .env("CERTROTOR_PROCFS_TEST", "a b")
            .spawn()
            .unwrap();
        let p = Proc::of(child.id()).unwrap();
        assert!(Proc::all().contains(&p));
        assert!(!Proc::all().iter().any(|x| x.pid == std::process::id()));
        // spawn returns once the child's exec has replaced its memory (vfork), which is a
        // moment before the kernel sets the new command line's bounds: until then it reads
        // empty. A bounded number of looks, a millisecond apart.
        let cmdline = (0..5000)
            .find_map(|_| {
                let c = p.cmdline();
                if c.is_none() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                c
            })
            .expect("the child's command line never appeared");
        assert_eq!(cmdline, ["sleep", "60"]);
        assert!(
            p.environ()
                .unwrap()
                .iter()
                .any(|e| e == "CERTROTOR_PROCFS_TEST=a b")
        );
        // Started after `before`, within a second or so of now (ticks of 10 ms; uptime's
        // hundredths are rounded down).
        assert!(p.start_time + 1 >= before, "{} < {before}", p.start_time);
        assert_eq!(p.own_mount_namespace(), Some(false));
        assert!(p.cgroup().is_some());
        // The root filesystem is mounted at / in every mount namespace.
        assert!(p.mount_root("/").is_some());
        assert_eq!(p.mount_root("/no/such/mount/point"), None);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            Proc::of(p.pid).filter(|q| q.start_time == p.start_time),
            None
        );
        assert_eq!(unescape("/a\\040b//deleted"), "/a b//deleted");
        assert_eq!(unescape("/a\\04"), "/a\\04");
    }

    /// A single-file bind mount in a mount namespace of its own (what containerd gives a
    /// container), then the file renamed over on the host as certrotor writes it: the process
    /// still sees the old content at its mount point, and mountinfo says `//deleted`.
    #[test]
    fn a_single_file_mount_renamed_over_shows_deleted_and_keeps_the_old_content() {
        use std::io::BufRead;
        let dir = std::env::temp_dir().join(format!("certrotor-procfs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let (src, target) = (dir.join("admin.conf"), dir.join("mounted"));
        fs::write(&src, "old").unwrap();
        fs::write(&target, "").unwrap();
        let script = format!(
            "mount --bind {} {} && echo ready && exec sleep 60",
            src.display(),
            target.display()
        );
        let mut child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("unshare (util-linux) runs; this test needs root");
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n", "needs root to mount");
        let p = Proc::of(child.id()).unwrap();
        let at = target.to_str().unwrap();
        assert_eq!(p.own_mount_namespace(), Some(true));
        assert!(p.mount_root(at).unwrap().ends_with("/admin.conf"));
        assert_eq!(p.read_seen(at, 100).unwrap(), b"old");
        assert_eq!(p.read_seen(at, 2), None);
        let next = dir.join("admin.conf.new");
        fs::write(&next, "new").unwrap();
        fs::rename(&next, &src).unwrap();
        let root = p.mount_root(at).unwrap();
        assert!(root.ends_with("/admin.conf//deleted"), "{root}");
        assert_eq!(p.read_seen(at, 100).unwrap(), b"old");
        assert_eq!(fs::read(&target).unwrap(), b"");
        child.kill().unwrap();
        child.wait().unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
