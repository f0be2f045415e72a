//! certrotor's integration tests: one test binary that runs the real `certrotor` on real files,
//! with openssl as an independent oracle. Each module covers one command.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Harness: fresh folders, the real binary, openssl parsing.
mod util;
// `check`: agreement with openssl, JSON fields, exit codes, one test per bad input.
mod check;
// `lab init`: layouts, topologies, key algorithms, profiles and modes.
mod daemon;
mod engine;
mod etcd;
// Parity with the real kubeadm v1.20.2 (images/k8s/build.sh).
mod kubeadm_parity;
mod kubeadm_parity_util;
mod lab;
mod platform;
mod renew;
mod renew_util;
mod verify;
