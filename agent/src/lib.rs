//! certrotor keeps kubeadm and etcdadm certificates from expiring on immutable nodes.
pub mod cli;
