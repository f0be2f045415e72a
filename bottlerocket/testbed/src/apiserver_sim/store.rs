//! The emulator's datastore: live settings plus one pending change set per transaction name,
//! with the real datastore's commit semantics (bottlerocket-api.md §1.4).
//!
//! Imitated: PATCH merges into the pending set of one transaction only; there is no way to
//! delete a key; commit copies *every* pending key to live and returns all their names, even
//! when a value equals the live one (no diff), then drops the transaction; committing an empty
//! or unknown transaction is an error (the API's 422).
//!
//! Differs: everything is in memory (the caller persists live settings after a commit, pending
//! transactions are lost on restart); key lists come back sorted rather than in hash order; no
//! setting metadata or commit-time constraint checks.

use std::collections::BTreeMap;
use std::io;

use serde_json::Value;

use super::model::{deep_merge, empty_object, leaf_names};

/// Live settings and pending transactions.
#[derive(Debug)]
pub(crate) struct Store {
    live: Value,
    pending: BTreeMap<String, Value>,
}

/// Why a commit did not happen.
#[derive(Debug)]
pub(crate) enum CommitError {
    /// The transaction has no pending changes.
    NothingPending,
    /// The new live settings could not be saved; nothing changed.
    Persist(io::Error),
}

impl Store {
    /// A store whose live settings are `live` (already validated) and with no transactions.
    pub(crate) fn new(live: Value) -> Self {
        Self {
            live,
            pending: BTreeMap::new(),
        }
    }

    /// Live settings (the `Settings` object, no wrapper).
    pub(crate) fn live(&self) -> &Value {
        &self.live
    }

    /// Merges validated partial settings into transaction `tx`. A patch without any key leaves
    /// the transaction untouched, as the real datastore writes no file for it.
    pub(crate) fn patch(&mut self, tx: &str, patch: Value) {
        if leaf_names("settings", &patch).is_empty() {
            return;
        }
        deep_merge(
            self.pending
                .entry(tx.to_string())
                .or_insert_with(empty_object),
            patch,
        );
    }

    /// Pending settings of `tx`; `{}` if it has none.
    pub(crate) fn pending(&self, tx: &str) -> Value {
        self.pending.get(tx).cloned().unwrap_or_else(empty_object)
    }

    /// Names of transactions with pending changes.
    pub(crate) fn transactions(&self) -> Vec<String> {
        self.pending.keys().cloned().collect()
    }

    /// Drops transaction `tx`; returns the key names it held (empty if it did not exist).
    pub(crate) fn discard(&mut self, tx: &str) -> Vec<String> {
        self.pending
            .remove(tx)
            .map(|pending| leaf_names("settings", &pending))
            .unwrap_or_default()
    }

    /// Commits `tx`: computes the new live settings, hands them to `persist`, and only if that
    /// succeeds makes them live and drops the transaction. Returns every committed key name.
    pub(crate) fn commit(
        &mut self,
        tx: &str,
        persist: impl FnOnce(&Value) -> io::Result<()>,
    ) -> Result<Vec<String>, CommitError> {
        let Some(pending) = self.pending.get(tx) else {
            return Err(CommitError::NothingPending);
        };
        let keys = leaf_names("settings", pending);
        if keys.is_empty() {
            return Err(CommitError::NothingPending);
        }
        let mut next = self.live.clone();
        deep_merge(&mut next, pending.clone());
        persist(&next).map_err(CommitError::Persist)?;
        self.live = next;
        self.pending.remove(tx);
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store() -> Store {
        Store::new(json!({"motd": "hello", "kubernetes": {"cluster-name": "c"}}))
    }

    #[test]
    fn transactions_are_isolated_and_commit_everything_pending() {
        let mut store = store();
        store.patch("a", json!({"motd": "hello"}));
        store.patch("a", json!({"kubernetes": {"api-server": "https://x"}}));
        store.patch("b", json!({"motd": "other"}));
        store.patch("empty", json!({}));
        assert_eq!(store.transactions(), ["a", "b"]);
        assert_eq!(store.pending("b"), json!({"motd": "other"}));
        let keys = store.commit("a", |_| Ok(())).expect("commit");
        assert_eq!(keys, ["settings.kubernetes.api-server", "settings.motd"]);
        assert_eq!(
            store.live(),
            &json!({"motd": "hello", "kubernetes": {"cluster-name": "c", "api-server": "https://x"}})
        );
        assert_eq!(store.transactions(), ["b"]);
        assert!(matches!(
            store.commit("a", |_| Ok(())),
            Err(CommitError::NothingPending)
        ));
        assert!(matches!(
            store.commit("empty", |_| Ok(())),
            Err(CommitError::NothingPending)
        ));
    }

    #[test]
    fn failed_persist_changes_nothing() {
        let mut store = store();
        store.patch("a", json!({"motd": "new"}));
        let result = store.commit("a", |_| Err(io::Error::other("disk full")));
        assert!(matches!(result, Err(CommitError::Persist(_))));
        assert_eq!(store.live()["motd"], "hello");
        assert_eq!(store.pending("a"), json!({"motd": "new"}));
    }

    #[test]
    fn discard_reports_removed_keys() {
        let mut store = store();
        store.patch(
            "a",
            json!({"motd": "x", "kubernetes": {"cluster-name": "d"}}),
        );
        assert_eq!(
            store.discard("a"),
            ["settings.kubernetes.cluster-name", "settings.motd"]
        );
        assert!(store.discard("a").is_empty());
        assert_eq!(store.pending("a"), json!({}));
    }
}
