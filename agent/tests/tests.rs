//! certrotor's integration tests: one test binary that runs the real `certrotor` on real files,
//! with openssl as an independent oracle. Each module covers one command.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![forbid(unsafe_code)]

// Harness: fresh folders, the real binary, openssl parsing.
mod util;
// `ca plan` (issue 29): what rotating a CA touches, against openssl and the real kubeadm.
mod ca;
// `ca rotate|continue|abort|status` (issue 29) on lab nodes: stages, abort, refusals, crashes.
mod ca_rotate;
// `check`: agreement with openssl, JSON fields, exit codes, one test per bad input.
mod check;
// Cluster mode: a real three-member etcd cluster, three nodes due together.
mod cluster;
// `lab init`: layouts, topologies, key algorithms, profiles and modes.
mod daemon;
mod engine;
mod etcd;
// Kubernetes Events on the Node, read back with the real kubectl from the real kube-apiserver.
mod events;
// Hostile input: damaged, malicious or unusual nodes (issue 15, 13.8).
mod hostile;
// Issue 30: the second hostile-input campaign, one test per point (`issue30_…`).
mod hostile30;
// The install and operations page (bottlerocket/packaging/README.md), every command run.
mod install;
// The library's house rules: stage order of imports, no CLI in the library (issue 28).
mod layout;
// Parity with the real kubeadm v1.20.2 (images/k8s/build.sh).
mod kubeadm_parity;
mod kubeadm_parity_util;
// The kubelet's client and serving certificates (issue 11.4), with the real kube-apiserver.
mod kubelet;
mod lab;
// Metrics: promtool, a real Prometheus, the alert rule, memory over passes (issue 12).
mod metrics;
mod platform;
mod renew;
mod renew_util;
// No private-key material in anything printed, by every command at every log level and format.
mod secrets;
// State files as untrusted input: damaged, hostile or future-version journal, marker, owed
// restarts, backup manifests (issues 13.1, 14).
mod state;
// `status` (issue 12.3): last pass, next renewal, owed restarts, locks, backups.
mod status;
mod verify;
