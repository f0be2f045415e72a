//! certrotor keeps kubeadm and etcdadm certificates from expiring on immutable nodes.
//!
//! The flow: [`node::inventory`] reads every certificate and kubeconfig of a node; renewal plans
//! what is due and writes it in one crash-safe transaction; restarts and live verification
//! follow. [`pki`] is the only module that touches certificate bytes, [`node::catalog`] the only
//! one that knows the node layouts. See ARCHITECTURE.md for the map.

// `unsafe` only where no safe API exists (`pre_exec`, installing signal handlers), each allowed
// at its use with a SAFETY comment.
#![deny(unsafe_code)]

// The stages, in the order data flows; a stage uses only its own folder and the stages above
// it in this list (ARCHITECTURE.md, "Code map").
pub mod ca;
pub mod cluster;
pub mod lab;
pub mod node;
pub mod output;
pub mod pass;
pub mod pki;
pub mod renew;
pub mod restart;
pub mod sys;
pub mod txn;

#[cfg(test)]
mod core_tests;
