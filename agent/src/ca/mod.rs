//! CA rotation with overlapping trust (issue 29), one stage at a time. What is here so far is
//! the plan: what rotating the cluster CA, the front-proxy CA or the etcd CA touches on this
//! node, stage by stage, and what each stage reloads or restarts ([`plan`]). Read only.
//!
//! A stage above `cluster`: the rotation itself will write through `txn`, restart through
//! `restart` and take turns with the other nodes through `cluster`.

pub mod consumers;
pub mod kubeadm_config;
pub mod plan;
pub mod rotate;
pub mod rotation;

pub use consumers::CaName;
pub use plan::{CaPlan, PlanError, plan};
