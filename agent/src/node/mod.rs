//! The node as certrotor finds it: which files kubeadm, etcdadm and the kubelet keep where
//! ([`catalog`], [`kubelet`]), what they hold ([`inventory`], [`kubeconfig`]), and the static
//! pods that read them ([`manifests`]), and where a renewable certificate lives ([`carrier`]).
//! Reading only: nothing here writes to a node.

pub mod carrier;
pub mod catalog;
mod discovered;
pub use discovered::Node;
pub mod files;
pub mod inventory;
pub mod kubeconfig;
pub mod kubelet;
pub mod manifests;
