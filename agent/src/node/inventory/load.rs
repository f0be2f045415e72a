//! The inventory's reading of one catalog entry's files, before any status is decided: the
//! certificate, the public part of its key (the private bytes are scrubbed once read), a
//! kubeconfig's credentials, embedded or in files it names, and the warnings and errors
//! reading met (a private key readable by others, a permission denied).

use std::path::Path;

use crate::node::carrier::Carrier;
use crate::node::catalog::{Entry, Kind};
use crate::node::kubeconfig::{Kubeconfig, Source, file_under_root};
use crate::pki::{Cert, KeyPublic, MAX_BUNDLE_CERTS, MAX_PEM_FILE_BYTES};
use crate::sys::fsutil::{self, ReadError};

/// What was loaded for one entry, before statuses are decided.
pub(super) struct Loaded {
    pub(super) cert: Option<Cert>,
    /// A CA file's further certificates (a trust bundle during a CA rotation): a leaf signed by
    /// one of them is still signed by a CA this node trusts.
    pub(super) also: Vec<Cert>,
    pub(super) key: Option<KeyPublic>,
    /// The file a kubeconfig names its client certificate in (when not embedded).
    pub(super) cert_path: Option<String>,
    pub(super) error: Option<String>,
    pub(super) warnings: Vec<String>,
    pub(super) present: bool,
    /// Whether a key file exists (readable or not): a CA whose key is present but unusable is
    /// not "externally managed".
    pub(super) key_present: bool,
}

/// A warning when the file holding a private key (of permission bits `mode`) is readable or
/// writable by group or others.
fn key_mode_warning(rel: &str, mode: u32) -> Option<String> {
    let mode = mode & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "'{rel}' holds a private key and has mode {mode:04o}: others on the node can read \
             it; run 'chmod 600 {}' (renewal writes keys 0600)",
            rel_abs(rel)
        )
    })
}

/// What to do when a file cannot be read for lack of permission.
fn permission_hint(e: &ReadError) -> &'static str {
    match e {
        ReadError::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            " (permission: run certrotor as root, or as the owner of the PKI)"
        }
        _ => "",
    }
}

fn rel_abs(rel: &str) -> String {
    format!("/{}", rel.trim_start_matches('/'))
}

pub(super) fn read(root: &Path, rel: &str) -> Result<Option<Vec<u8>>, ReadError> {
    fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES)
}

/// Reads a file with its permission bits (a private key's are checked).
fn read_with_mode(root: &Path, rel: &str) -> Result<Option<(Vec<u8>, u32)>, ReadError> {
    fsutil::read_in_root_with_mode(root, rel, MAX_PEM_FILE_BYTES)
}

pub(super) fn load(root: &Path, entry: &Entry) -> Loaded {
    let mut out = Loaded {
        cert: None,
        also: Vec::new(),
        key: None,
        cert_path: None,
        error: None,
        warnings: Vec::new(),
        present: false,
        key_present: false,
    };
    let (bytes, mode) = match read_with_mode(root, &entry.path) {
        Ok(Some(read)) => read,
        Ok(None) => return out,
        Err(e) => {
            out.present = true;
            out.error = Some(e.to_string());
            return out;
        }
    };
    out.present = true;
    if Carrier::of_entry(entry).kubeconfig().is_some() {
        // The text may embed the client key: scrubbed when read.
        load_kubeconfig(root, entry, &zeroize::Zeroizing::new(bytes), mode, &mut out);
        return out;
    }
    match Cert::from_pem(&bytes) {
        Ok(c) => out.cert = Some(c),
        Err(e) => {
            out.error = Some(format!("'{}': {e}", entry.path));
            return out;
        }
    }
    if entry.kind == Kind::Ca {
        match Cert::all_from_pem(&bytes, MAX_BUNDLE_CERTS) {
            Ok(all) => out.also = all.into_iter().skip(1).collect(),
            Err(e) => {
                out.error = Some(format!("'{}': {e}", entry.path));
                return out;
            }
        }
    }
    if let Some(key_path) = &entry.key_path {
        let key_read = read_with_mode(root, key_path);
        out.key_present = !matches!(key_read, Ok(None));
        match key_read {
            // The key's PEM is scrubbed when the match ends (`KeyPublic` keeps only the public part).
            Ok(Some((kb, mode))) => match KeyPublic::read_pem(&zeroize::Zeroizing::new(kb)) {
                Ok(k) => {
                    out.key = Some(k);
                    out.warnings.extend(key_mode_warning(key_path, mode));
                }
                Err(e) => out.error = Some(format!("key '{key_path}': {e}")),
            },
            Ok(None) if entry.kind == Kind::Leaf => {
                out.error = Some(format!(
                    "key '{key_path}' is missing; restore the pair from a backup (list them with \
                     'certrotor backups', restore with 'certrotor rollback --backup ID')"
                ));
            }
            Ok(None) => {}
            Err(e) => {
                out.error = Some(format!("key: {e}{}", permission_hint(&e)));
            }
        }
    }
    out
}

fn load_kubeconfig(root: &Path, entry: &Entry, bytes: &[u8], mode: u32, out: &mut Loaded) {
    let creds = match Kubeconfig::parse(bytes).and_then(|k| k.credentials()) {
        Ok(c) => c,
        Err(e) => {
            out.error = Some(format!("'{}': {e}", entry.path));
            return;
        }
    };
    /// The bytes, the file they are in when not embedded, and that file's permission bits.
    type Fetched<'a> = (std::borrow::Cow<'a, [u8]>, Option<String>, u32);
    fn fetch<'a>(
        root: &Path,
        entry: &Entry,
        mode: u32,
        source: &'a Source,
        what: &str,
    ) -> Result<Fetched<'a>, String> {
        match source {
            Source::Embedded(b) => Ok((b.as_slice().into(), None, mode)),
            Source::File(p) => match read_with_mode(root, &file_under_root(&entry.path, p)) {
                Ok(Some((b, file_mode))) => {
                    Ok((b.into(), Some(file_under_root(&entry.path, p)), file_mode))
                }
                Ok(None) => Err(format!(
                    "{what} '{p}' named by '{}' does not exist",
                    entry.path
                )),
                Err(e) => Err(e.to_string()),
            },
        }
    }
    let fetch = |source, what| fetch(root, entry, mode, source, what);
    match fetch(&creds.client_certificate, "client certificate") {
        Ok((b, path, _)) => {
            out.cert_path = path;
            match Cert::from_pem(&b) {
                Ok(c) => out.cert = Some(c),
                Err(e) => {
                    out.error = Some(format!("client certificate in '{}': {e}", entry.path));
                    return;
                }
            }
        }
        Err(e) => {
            out.error = Some(e);
            return;
        }
    }
    let key_file = match &creds.client_key {
        Source::Embedded(_) => entry.path.clone(),
        Source::File(p) => file_under_root(&entry.path, p),
    };
    match fetch(&creds.client_key, "client key").map(|(b, _, mode)| {
        let key = KeyPublic::read_pem(&b);
        // A key read from its own file is scrubbed here; an embedded one when `creds` drops.
        if let std::borrow::Cow::Owned(mut bytes) = b {
            zeroize::Zeroize::zeroize(&mut bytes);
        }
        (key, mode)
    }) {
        Ok((Ok(k), mode)) => {
            out.key = Some(k);
            out.warnings.extend(key_mode_warning(&key_file, mode));
        }
        Ok((Err(e), _)) => out.error = Some(format!("client key in '{}': {e}", entry.path)),
        Err(e) => out.error = Some(e),
    }
}
