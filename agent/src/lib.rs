//! certrotor keeps kubeadm and etcdadm certificates from expiring on immutable nodes.
//!
//! The flow: [`inventory`] reads every certificate and kubeconfig of a node; renewal plans what
//! is due and writes it in one crash-safe transaction; restarts and live verification follow.
//! [`pki`] is the only module that touches certificate bytes, [`catalog`] the only one that
//! knows the node layouts. See ARCHITECTURE.md for the map.

pub mod catalog;
pub mod cli;
pub mod clock;
pub mod demo;
pub mod engine;
pub mod etcd_client;
pub mod foreign_ca;
pub mod fsutil;
pub mod inventory;
pub mod kubeconfig;
pub mod lab;
pub mod manifests;
pub mod ops;
pub mod pki;
pub mod renew;
pub mod report;
pub mod restart;
pub mod txn;
pub mod verify;

/// Completes or undoes an interrupted transaction before any command reads the PKI.
pub fn recover_before_reading(root: &std::path::Path) -> Result<(), cli::Failure> {
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
        log(&format!(
            "cannot take the lock in '{}' ({e}); reading without it{}",
            state.display(),
            if journal {
                "; an interrupted transaction is pending and the PKI may be half-renewed: run certrotor where the root is writable"
            } else {
                ""
            }
        ));
        return Ok(());
    }
    ops::lock_and_recover(root, std::time::Duration::from_secs(60))?;
    Ok(())
}

/// Logs one line to stderr with a UTC timestamp. Never give it key material.
pub fn log(message: &str) {
    eprintln!("{} certrotor: {message}", clock::rfc3339(clock::now()));
}
