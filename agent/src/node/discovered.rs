//! The node under a root as detection finds it: its layouts ([`catalog::detect`]) and their
//! catalog entries ([`catalog::entries`]), found once per command (and once per daemon pass)
//! and handed down, instead of every module finding them again.
//!
//! Detection looks at which files exist. Whoever makes files appear or disappear while holding
//! a [`Node`] (a first boot before the PKI exists, `lab init`, a recovery) finds the node again
//! afterwards with a new [`Node::discover`] and says so where it does.

use std::path::{Path, PathBuf};

use crate::node::catalog::{self, Entry, Layout};
use crate::sys::fsutil;

/// A node: its root, detected layouts and their entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    root: PathBuf,
    layouts: Vec<Layout>,
    entries: Vec<Entry>,
}

impl Node {
    /// Detects the layouts under `root` and lists their entries.
    pub fn discover(root: &Path) -> Node {
        fsutil::with_pinned_root(root, || {
            let layouts = catalog::detect(root);
            let entries = catalog::entries(root, &layouts);
            Node {
                root: root.to_path_buf(),
                layouts,
                entries,
            }
        })
    }

    /// The node's root folder (`/`, or the host's root seen from a container).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The layouts found, in detection order.
    pub fn layouts(&self) -> &[Layout] {
        &self.layouts
    }

    /// Every entry of the layouts, named as [`catalog::entries`] names them.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry `name` of the layout `layout`, under its plain name or, where another layout
    /// has an entry of that name too, as `name@layout`.
    pub fn entry_of(&self, layout: &Layout, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| {
            e.layout == layout.name
                && (e.name == name
                    || e.name
                        .strip_suffix(layout.name)
                        .and_then(|n| n.strip_suffix('@'))
                        == Some(name))
        })
    }
}
