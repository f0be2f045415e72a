//! certrotor keeps kubeadm and etcdadm certificates from expiring on immutable nodes.
//!
//! The flow: [`inventory`] reads every certificate and kubeconfig of a node; renewal plans what
//! is due and writes it in one crash-safe transaction; restarts and live verification follow.
//! [`pki`] is the only module that touches certificate bytes, [`catalog`] the only one that
//! knows the node layouts. See ARCHITECTURE.md for the map.

// `unsafe` only where no safe API exists (`pre_exec`, installing signal handlers), each allowed
// at its use with a SAFETY comment.
#![deny(unsafe_code)]

mod bignum;
pub mod catalog;
pub mod clock;
pub mod cluster;
pub mod demo;
pub mod engine;
pub mod etcd_client;
pub mod events;
#[cfg(feature = "failpoints")]
pub mod foreign_ca;
pub mod fsutil;
pub mod inventory;
pub mod kubeconfig;
pub mod kubelet;
pub mod lab;
pub mod logging;
pub mod manifests;
pub mod metrics;
pub mod ops;
pub mod outcome;
pub mod par;
pub mod pki;
pub mod procfs;
pub mod reload;
pub mod renew;
pub mod report;
pub mod restart;
pub mod state;
pub mod status;
pub mod txn;
pub mod verify;

#[cfg(test)]
mod core_tests;

/// Completes or undoes an interrupted transaction before any command reads the PKI.
pub fn recover_before_reading(root: &std::path::Path) -> Result<(), ops::OpsError> {
    // Only where certrotor has state: a read-only inspection of a foreign root writes nothing.
    let state = txn::state_dir(root);
    if !state.is_dir() {
        return Ok(());
    }
    // A read-only root (a mounted snapshot, a read-only bind) can still be inspected; say so
    // when an interrupted transaction could not be completed first.
    let writable = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(state.join("lock"));
    if let Err(e) = writable {
        let journal = state.join("journal.json").exists();
        log::warn!(
            "cannot take the lock in '{}' ({e}); reading without it{}",
            state.display(),
            if journal {
                "; an interrupted transaction is pending and the PKI may be half-renewed: run certrotor where the root is writable"
            } else {
                ""
            }
        );
        return Ok(());
    }
    // Reading never waits for another run: a renewal holds the lock for seconds, a daemon's
    // restart pass for minutes. Say that one is in progress and read the files as they are.
    match ops::lock_and_recover(root, std::time::Duration::ZERO) {
        Ok(_lock) => Ok(()),
        Err(ops::OpsError::Txn(txn::TxnError::Locked { .. })) => {
            log::warn!(
                "another certrotor run is in progress (it holds '{}'); reading the PKI as it is \
                 now, without waiting: files being renewed may change in a moment",
                state.join("lock").display()
            );
            Ok(())
        }
        Err(f) => Err(f),
    }
}
