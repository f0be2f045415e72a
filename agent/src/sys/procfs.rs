//! Which process listens on a TCP port, and whether it has exited, from `/proc` (the host's,
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

use std::fs;
use std::time::{Duration, Instant};

/// The process that listened on a port when [`listener`] looked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    pub pid: u32,
    /// `starttime` from `/proc/PID/stat`: tells a reused PID apart.
    start_time: u64,
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

impl Listener {
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
}
