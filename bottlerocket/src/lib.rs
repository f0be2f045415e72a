//! Bottlerocket API client.
pub mod k8s_sim;
pub mod kubelet_sim;
