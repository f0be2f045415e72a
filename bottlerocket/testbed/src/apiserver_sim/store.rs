//! The emulator's datastore: live settings plus one pending change set per transaction name,
//! with the real datastore's commit semantics (bottlerocket-api.md §1.4) and its persistence of
//! pending changes ("Faults of the real API server").
//!
//! Imitated: PATCH merges into the pending set of one transaction only; there is no way to
//! delete a key; commit copies *every* pending key to live and returns all their names, even
//! when a value equals the live one (no diff), then drops the transaction; committing an empty
//! or unknown transaction is an error (the API's 422). Pending transactions live on disk, one
//! file per transaction (the real datastore keeps `pending/<tx>/<key path>`), so they survive an
//! API restart and are gone only after a commit, a `DELETE /tx`, or a boot
//! ([`Store::clear_pending`], what storewolf does).
//!
//! Differs: one JSON file per transaction (`<dir>/<percent-encoded name>.json`) instead of one
//! file per key; key lists come back sorted (the routes shuffle them as the real server's hash
//! sets do); no setting metadata or commit-time constraint checks.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use serde_json::Value;

use super::model::{deep_merge, empty_object, leaf_names};

/// Bytes of a transaction name kept as they are in its file name; everything else (including
/// `.` and `/`) is percent-encoded, so a name can never climb out of the directory.
const FILE_NAME: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_');

/// Live settings and pending transactions.
#[derive(Debug)]
pub(crate) struct Store {
    live: Value,
    pending: BTreeMap<String, Value>,
    /// Where pending transactions persist; `None` keeps them in memory (unit tests).
    pending_dir: Option<PathBuf>,
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
    /// A store whose live settings are `live` (already validated), with no transactions, kept
    /// in memory only.
    pub(crate) fn new(live: Value) -> Self {
        Self {
            live,
            pending: BTreeMap::new(),
            pending_dir: None,
        }
    }

    /// A store whose pending transactions persist in `dir`, loading those already there.
    pub(crate) fn with_pending_dir(live: Value, dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let mut pending = BTreeMap::new();
        let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(fs::DirEntry::file_name);
        for entry in entries {
            let file_name = entry.file_name();
            let Some(encoded) = file_name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            let name = percent_decode_str(encoded)
                .decode_utf8()
                .map_err(|error| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("transaction file '{encoded}.json': {error}"),
                    )
                })?
                .into_owned();
            let bytes = fs::read(entry.path())?;
            let value: Value = serde_json::from_slice(&bytes).map_err(|error| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("transaction file '{}': {error}", entry.path().display()),
                )
            })?;
            pending.insert(name, value);
        }
        Ok(Self {
            live,
            pending,
            pending_dir: Some(dir.to_path_buf()),
        })
    }

    /// Drops every pending transaction, in memory and on disk (a boot).
    pub(crate) fn clear_pending(&mut self) -> io::Result<()> {
        self.pending.clear();
        if let Some(dir) = &self.pending_dir {
            match fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
            fs::create_dir_all(dir)?;
        }
        Ok(())
    }

    /// Live settings (the `Settings` object, no wrapper).
    pub(crate) fn live(&self) -> &Value {
        &self.live
    }

    /// Merges validated partial settings into transaction `tx` and saves the transaction. A
    /// patch without any key leaves the transaction untouched, as the real datastore writes no
    /// file for it. On a write error nothing changes.
    pub(crate) fn patch(&mut self, tx: &str, patch: Value) -> io::Result<()> {
        if leaf_names("settings", &patch).is_empty() {
            return Ok(());
        }
        let mut next = self.pending.get(tx).cloned().unwrap_or_else(empty_object);
        deep_merge(&mut next, patch);
        if let Some(path) = self.tx_path(tx) {
            let mut bytes = serde_json::to_vec_pretty(&next).map_err(io::Error::other)?;
            bytes.push(b'\n');
            super::render::write_atomically(&path, &bytes, 0o600)?;
        }
        self.pending.insert(tx.to_string(), next);
        Ok(())
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
    pub(crate) fn discard(&mut self, tx: &str) -> io::Result<Vec<String>> {
        self.remove_tx_file(tx)?;
        Ok(self
            .pending
            .remove(tx)
            .map(|pending| leaf_names("settings", &pending))
            .unwrap_or_default())
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
        // The commit stands; a transaction file that cannot be removed would come back after a
        // restart, which the log says.
        if let Err(error) = self.remove_tx_file(tx) {
            super::log(&format!(
                "committed transaction '{tx}' but could not remove its file: {error}"
            ));
        }
        Ok(keys)
    }

    fn tx_path(&self, tx: &str) -> Option<PathBuf> {
        self.pending_dir
            .as_ref()
            .map(|dir| dir.join(format!("{}.json", utf8_percent_encode(tx, FILE_NAME))))
    }

    fn remove_tx_file(&self, tx: &str) -> io::Result<()> {
        let Some(path) = self.tx_path(tx) else {
            return Ok(());
        };
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        }
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
        store.patch("a", json!({"motd": "hello"})).expect("patch");
        store
            .patch("a", json!({"kubernetes": {"api-server": "https://x"}}))
            .expect("patch");
        store.patch("b", json!({"motd": "other"})).expect("patch");
        store.patch("empty", json!({})).expect("patch");
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
        store.patch("a", json!({"motd": "new"})).expect("patch");
        let result = store.commit("a", |_| Err(io::Error::other("disk full")));
        assert!(matches!(result, Err(CommitError::Persist(_))));
        assert_eq!(store.live()["motd"], "hello");
        assert_eq!(store.pending("a"), json!({"motd": "new"}));
    }

    #[test]
    fn discard_reports_removed_keys() {
        let mut store = store();
        store
            .patch(
                "a",
                json!({"motd": "x", "kubernetes": {"cluster-name": "d"}}),
            )
            .expect("patch");
        assert_eq!(
            store.discard("a").expect("discard"),
            ["settings.kubernetes.cluster-name", "settings.motd"]
        );
        assert!(store.discard("a").expect("discard").is_empty());
        assert_eq!(store.pending("a"), json!({}));
    }

    #[test]
    fn pending_transactions_persist_until_commit_discard_or_boot() {
        let dir = std::env::temp_dir().join(format!("br-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let live = json!({"motd": "hello"});
        let mut first = Store::with_pending_dir(live.clone(), &dir).expect("open");
        for tx in ["certrotor-1-ab", "../escape", "a.b c", "gone", "committed"] {
            first.patch(tx, json!({"motd": tx})).expect("patch");
        }
        first.discard("gone").expect("discard");
        first.commit("committed", |_| Ok(())).expect("commit");
        drop(first);
        let names: Vec<String> = fs::read_dir(&dir)
            .expect("list")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert!(
            names
                .iter()
                .all(|n| !n.starts_with('.') && !n.contains('/')),
            "{names:?}"
        );

        let mut second = Store::with_pending_dir(live.clone(), &dir).expect("reopen");
        assert_eq!(
            second.transactions(),
            ["../escape", "a.b c", "certrotor-1-ab"]
        );
        assert_eq!(second.pending("a.b c"), json!({"motd": "a.b c"}));
        second.clear_pending().expect("boot");
        assert!(second.transactions().is_empty());
        let third = Store::with_pending_dir(live, &dir).expect("reopen");
        assert!(third.transactions().is_empty());
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
