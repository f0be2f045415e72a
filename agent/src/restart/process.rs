//! The processes of a static pod, found in `/proc` by what its manifest says it runs: how a
//! restart of a pod without a probe (kube-vip as EKS Anywhere renders it) is proven.
//!
//! A pod's [`Signature`]: its program (the file name of `command[0]`, or of the image's
//! entrypoint by the image-entrypoint convention: kube-vip's image runs `/kube-vip`), the
//! arguments after it, and every literal `env` pair of the manifest (the kubelet passes them to
//! the container's process; they tell apart side-by-side pods of one image). An argument or
//! value that starts with a volume's `mountPath` also matches the same path under the volume's
//! host path (how kubelet-sim, which has no mount namespaces, rewrites them). Where some
//! candidates run in a `kubepods` cgroup (the kubelet's containers), only those count.
//!
//! What a process proves, with [`crate::sys::procfs`]: its start time orders it against the
//! stop; `/proc/PID/mountinfo` shows, in a container's mount namespace, whether a single-file
//! mount still holds a file that was renamed over (`//deleted`).

use std::path::Path;

use crate::node::manifests::PodInfo;
use crate::sys::procfs::Proc;

/// What the processes of a static pod look like (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `(mountPath, the host path as seen from here: under the root)`.
    pub mounts: Vec<(String, String)>,
}

impl Signature {
    /// The signature of `info`'s first container on the node under `root`; `None` when it
    /// names no program (no command and no image).
    pub fn of(root: &Path, info: &PodInfo) -> Option<Signature> {
        let mounts = info
            .mounts
            .iter()
            .map(|(path, host)| {
                let on_node = root.join(host.trim_start_matches('/'));
                let text = on_node.to_string_lossy();
                (path.clone(), text.trim_end_matches('/').to_string())
            })
            .collect();
        Some(Signature {
            program: info.program()?,
            args: info.program_args().to_vec(),
            env: info.env.clone(),
            mounts,
        })
    }

    /// Whether a process with this command line and environment is one of the pod's.
    pub fn matches(&self, cmdline: &[String], environ: &[String]) -> bool {
        let Some((first, rest)) = cmdline.split_first() else {
            return false;
        };
        let program = first.rsplit('/').next().unwrap_or(first);
        program == self.program
            && rest.len() == self.args.len()
            && rest
                .iter()
                .zip(&self.args)
                .all(|(got, want)| self.same(want, got))
            && self.env.iter().all(|(name, want)| {
                environ.iter().any(|e| {
                    e.split_once('=')
                        .is_some_and(|(n, got)| n == name && self.same(want, got))
                })
            })
    }

    /// `got` is `want`, or `want` with a mount path replaced by its host path (also as the value
    /// of `--flag=value`).
    fn same(&self, want: &str, got: &str) -> bool {
        if want == got {
            return true;
        }
        if let (Some((wf, wv)), Some((gf, gv))) = (want.split_once('='), got.split_once('='))
            && wf == gf
            && wf.starts_with('-')
        {
            return self.same_path(wv, gv);
        }
        self.same_path(want, got)
    }

    fn same_path(&self, want: &str, got: &str) -> bool {
        self.mounts.iter().any(|(path, host)| {
            let path = path.trim_end_matches('/');
            want.strip_prefix(path).is_some_and(|rest| {
                (rest.is_empty() || rest.starts_with('/')) && got == format!("{host}{rest}")
            })
        })
    }

    /// The running processes of the pod (see the module doc for the `kubepods` rule).
    pub fn find(&self) -> Vec<Proc> {
        let found: Vec<Proc> = Proc::all()
            .into_iter()
            .filter(|p| {
                let (Some(cmd), Some(env)) = (p.cmdline(), p.environ()) else {
                    return false;
                };
                self.matches(&cmd, &env)
            })
            .collect();
        let kubepods: Vec<Proc> = found
            .iter()
            .copied()
            .filter(|p| p.cgroup().is_some_and(|c| c.contains("kubepods")))
            .collect();
        if kubepods.is_empty() { found } else { kubepods }
    }

    /// How the pod's processes are recognised, for messages.
    pub fn describe(&self) -> String {
        let mut text = std::iter::once(self.program.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        if !self.env.is_empty() {
            text.push_str(&format!(" with its {} environment values", self.env.len()));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kube_vip() -> Signature {
        let yaml = "metadata: {name: kube-vip}\nspec:\n  containers:\n  - args: [manager]\n    \
                    image: public.ecr.aws/l0g8r8j6/kube-vip/kube-vip:v0.7.0\n    env:\n    \
                    - {name: port, value: \"6443\"}\n    - {name: cfg, value: /etc/kubernetes/admin.conf}\n    \
                    volumeMounts:\n    - {mountPath: /etc/kubernetes/admin.conf, name: k}\n  \
                    volumes:\n  - hostPath: {path: /var/lib/kubeadm/admin.conf}\n    name: k\n";
        let info = PodInfo::parse(yaml.as_bytes()).unwrap();
        Signature::of(Path::new("/r"), &info).unwrap()
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn matches_the_entrypoint_its_args_and_env_with_mount_paths_on_either_side() {
        let sig = kube_vip();
        assert_eq!(sig.program, "kube-vip");
        let env = strings(&["PATH=/bin", "port=6443", "cfg=/etc/kubernetes/admin.conf"]);
        // containerd: the image's entrypoint by its path; kubelet-sim: by its name.
        assert!(sig.matches(&strings(&["/kube-vip", "manager"]), &env));
        assert!(sig.matches(&strings(&["kube-vip", "manager"]), &env));
        // kubelet-sim rewrites a mount path to the host path.
        let rewritten = strings(&["port=6443", "cfg=/r/var/lib/kubeadm/admin.conf"]);
        assert!(sig.matches(&strings(&["kube-vip", "manager"]), &rewritten));
        // Another node's kube-vip on the same host (another port), other programs, args.
        let other = strings(&["port=7443", "cfg=/etc/kubernetes/admin.conf"]);
        assert!(!sig.matches(&strings(&["kube-vip", "manager"]), &other));
        assert!(!sig.matches(&strings(&["kube-vip", "manager", "x"]), &env));
        assert!(!sig.matches(&strings(&["kube-vipx", "manager"]), &env));
        assert!(!sig.matches(&strings(&["/bin/sh", "-c", "kube-vip manager"]), &env));
        assert!(!sig.matches(&[], &env));
        let wrong_host = strings(&["port=6443", "cfg=/other/var/lib/kubeadm/admin.conf"]);
        assert!(!sig.matches(&strings(&["kube-vip", "manager"]), &wrong_host));
        assert!(sig.describe().starts_with("kube-vip manager with its 2"));
    }

    #[test]
    fn finds_a_running_child_by_its_signature() {
        let mut child = std::process::Command::new("sleep")
            .arg("61")
            .env("certrotor_signature_test", std::process::id().to_string())
            .spawn()
            .unwrap();
        // The child runs `sleep` once it has exec'd; until then /proc shows the test binary.
        let cmdline = format!("/proc/{}/cmdline", child.id());
        for _ in 0..1000 {
            if std::fs::read(&cmdline).is_ok_and(|c| c.starts_with(b"sleep\0")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let sig = Signature {
            program: "sleep".into(),
            args: vec!["61".into()],
            env: vec![(
                "certrotor_signature_test".into(),
                std::process::id().to_string(),
            )],
            mounts: vec![],
        };
        let found = sig.find();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pid, child.id());
        assert!(sig.find().is_empty());
    }
}
