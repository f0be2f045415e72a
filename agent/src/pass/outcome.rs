//! Exit codes: the one place where an outcome becomes a number.
//!
//! The library returns typed errors ([`crate::pass::ops::OpsError`], [`crate::pass::etcd_client::EtcdClientError`],
//! …) and reports; only the command line turns them into an exit code, with the functions here.
//! The codes are the same for every command (documented in README):
//! - 0: done, everything fine;
//! - 1: `check`: something expires within `--warn-within`;
//! - 2: `check`: something expired, invalid, missing or unreadable; other commands: failed, and
//!   the live PKI is unchanged (or was restored);
//! - 3: renewal applied but live verification failed, and the backup was restored;
//! - 4: another certrotor holds the lock past `--lock-timeout`;
//! - 64: usage error (unknown flag, bad value).

use std::error::Error;

use crate::node::inventory::{Inventory, Status};
use crate::pass::run::RolledBack;
use crate::txn::TxnError;

/// Exit code: done.
pub const EXIT_OK: u8 = 0;
/// Exit code: something expires soon (check).
pub const EXIT_EXPIRING: u8 = 1;
/// Exit code: failure, or something expired/invalid (check).
pub const EXIT_FAILED: u8 = 2;
/// Exit code: verification failed; rolled back.
pub const EXIT_ROLLED_BACK: u8 = 3;
/// Exit code: the lock is held by another run.
pub const EXIT_LOCKED: u8 = 4;
/// Exit code: usage error (sysexits EX_USAGE).
pub const EXIT_USAGE: u8 = 64;

/// The exit code of a failed command: 4 when the cause (anywhere in the `source()` chain) is
/// the lock held by another run, else 2.
pub fn for_error(e: &(dyn Error + 'static)) -> u8 {
    let mut cause: Option<&(dyn Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(TxnError::Locked { .. }) = c.downcast_ref::<TxnError>() {
            return EXIT_LOCKED;
        }
        cause = c.source();
    }
    EXIT_FAILED
}

/// `check`: 0 fine, 1 expiring, 2 expired/invalid/missing; 2 as well when nothing was found.
pub fn for_inventory(inv: &Inventory) -> u8 {
    if inv.layouts.is_empty() {
        return EXIT_FAILED;
    }
    match inv.worst() {
        Some(Status::Expiring) => EXIT_EXPIRING,
        Some(Status::Expired | Status::Invalid | Status::Missing) => EXIT_FAILED,
        _ => EXIT_OK,
    }
}

/// `run`, `etcd-client import`: 0 done, 3 rolled back after a failed verification, 2 when the
/// rollback failed too (an import also when a pod it stopped could not be started again, see
/// [`for_import`]).
pub fn for_rollback(rolled_back: Option<&RolledBack>) -> u8 {
    match rolled_back {
        None => EXIT_OK,
        Some(r) if r.error.is_none() => EXIT_ROLLED_BACK,
        Some(_) => EXIT_FAILED,
    }
}

/// `etcd-client import`: 2 when a static pod it stopped could not be started again; else as
/// [`for_rollback`].
pub fn for_import(r: &crate::pass::import::ImportReport) -> u8 {
    if r.left_disabled.is_empty() {
        for_rollback(r.rolled_back.as_ref())
    } else {
        EXIT_FAILED
    }
}

/// `run`: 2 when a static pod the pass stopped could not be started again; else as
/// [`for_rollback`]; else 2 when the pair published through etcd was refused or a static pod
/// that mounts a renewed file could not be restarted, 4 when cluster mode put the restarts off
/// to the next pass; an installed published pair counts as its own rollback.
pub fn for_run(r: &crate::pass::run::RunReport) -> u8 {
    if !r.left_disabled.is_empty() {
        return EXIT_FAILED;
    }
    let import = r.import.as_ref().map_or(EXIT_OK, for_import);
    let cluster = r.cluster.as_ref();
    match &r.rolled_back {
        None if import != EXIT_OK => import,
        None if cluster.is_some_and(|c| c.pair_error.is_some()) => EXIT_FAILED,
        None if cluster.is_some_and(|c| c.deferred) => EXIT_LOCKED,
        None if !r.pod_errors.is_empty() => EXIT_FAILED,
        rolled_back => for_rollback(rolled_back.as_ref()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(TxnError);
    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "wrapped: {}", self.0)
        }
    }
    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_held_lock_anywhere_in_the_chain_exits_4() {
        let locked = || TxnError::Locked {
            path: "lock".into(),
            holder: "pid 1".into(),
            waited: std::time::Duration::from_secs(1),
        };
        assert_eq!(for_error(&locked()), EXIT_LOCKED);
        assert_eq!(for_error(&Wrapper(locked())), EXIT_LOCKED);
        let state = TxnError::State {
            path: "x".into(),
            detail: "y".into(),
        };
        assert_eq!(for_error(&Wrapper(state)), EXIT_FAILED);
    }

    #[test]
    fn rollback_outcomes() {
        assert_eq!(for_rollback(None), EXIT_OK);
        let mut r = RolledBack {
            failure: "f".into(),
            backup_id: "b".into(),
            restarted: vec![],
            error: None,
        };
        assert_eq!(for_rollback(Some(&r)), EXIT_ROLLED_BACK);
        r.error = Some("e".into());
        assert_eq!(for_rollback(Some(&r)), EXIT_FAILED);
    }
}
