//! A CA rotation's files on one node: the CA's certificate file (its trust bundle and signer),
//! its key, and the other key kept beside it ([`rotation_key`]); the old and new pairs read
//! back from them; the new CA minted; and what each stage makes of the files.

use std::path::Path;

use zeroize::Zeroizing;

use crate::ca::kubeadm_config::CaPolicy;
use crate::node::files::{NEXT, PREVIOUS, rotation_key};
use crate::pki::{
    Cert, Issuance, MAX_BUNDLE_CERTS, MAX_PEM_FILE_BYTES, PrivateKey, Profile, random_serial,
};
use crate::sys::fsutil;
use crate::txn::Change;

/// A CA certificate and its key's PEM text, as read or made (scrubbed when dropped).
pub struct CaPair {
    pub cert: Cert,
    pub key_pem: Zeroizing<Vec<u8>>,
}

impl CaPair {
    /// The certificate alone, where the node only trusts the CA ([`CaFiles::trust_only`]).
    pub fn cert_only(cert: Cert) -> CaPair {
        CaPair {
            cert,
            key_pem: Zeroizing::new(Vec::new()),
        }
    }
}

/// The files of one CA on the node (relative to the root).
#[derive(Debug, Clone)]
pub struct CaFiles {
    /// The certificate file: the trust bundle every consumer reads, and the signer's
    /// certificate (its first certificate belongs to `key`).
    pub cert: String,
    pub key: String,
    /// The new CA's key until it signs.
    pub next: String,
    /// The old CA's key from the issue until trust-out (what `abort` signs with again).
    pub previous: String,
    /// The CA's certificate without its key (the etcd CA on a control plane of an external
    /// etcd): the node trusts the CA and signs nothing; its key fields are empty.
    pub trust_only: bool,
}

impl CaFiles {
    pub fn of(cert: &str, key: &str) -> CaFiles {
        CaFiles {
            cert: cert.to_string(),
            key: key.to_string(),
            next: rotation_key(key, NEXT),
            previous: rotation_key(key, PREVIOUS),
            trust_only: false,
        }
    }

    /// A CA this node only trusts: its certificate file, no key.
    pub fn trust_only(cert: &str) -> CaFiles {
        CaFiles {
            cert: cert.to_string(),
            key: String::new(),
            next: String::new(),
            previous: String::new(),
            trust_only: true,
        }
    }
}

/// What a stage makes of the files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// [old, new]; the old key signs; the new key waits in `next`.
    TrustIn,
    /// [new, old]; the new key signs; the old key waits in `previous`.
    Issue,
    /// [new]; the new key signs; no other key.
    TrustOut,
    /// [old]; the old key signs; no other key.
    Abort,
}

/// Reads a file of the node: `None` when absent; an error when it exists but cannot be read.
pub fn read(root: &Path, rel: &str) -> Result<Option<Zeroizing<Vec<u8>>>, String> {
    fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES)
        .map(|b| b.map(Zeroizing::new))
        .map_err(|e| format!("'{rel}': {e}"))
}

/// Every certificate of the CA file, in order.
pub fn certs(root: &Path, files: &CaFiles) -> Result<Vec<Cert>, String> {
    let bytes = read(root, &files.cert)?.ok_or_else(|| format!("'{}' is missing", files.cert))?;
    Cert::all_from_pem(&bytes, MAX_BUNDLE_CERTS).map_err(|e| format!("'{}': {e}", files.cert))
}

/// The pair whose certificate has SHA-256 `sha256`, if the CA file holds it and one of the
/// three key files holds its key (a CA only trusted here: its certificate, with no key).
pub fn pair(root: &Path, files: &CaFiles, sha256: &str) -> Result<Option<CaPair>, String> {
    let Some(cert) = certs(root, files)?
        .into_iter()
        .find(|c| c.sha256_hex() == sha256)
    else {
        return Ok(None);
    };
    if files.trust_only {
        return Ok(Some(CaPair::cert_only(cert)));
    }
    for rel in [&files.key, &files.next, &files.previous] {
        let Some(pem) = read(root, rel)? else {
            continue;
        };
        let key = PrivateKey::read_pem(&pem).map_err(|e| format!("'{rel}': {e}"))?;
        if key.matches(&cert) {
            return Ok(Some(CaPair { cert, key_pem: pem }));
        }
    }
    Ok(None)
}

/// A new CA like `old`: the same subject, SANs, key algorithm and key encoding, the same
/// validity period from now (backdated as kubeadm backdates), a new key and serial; the
/// validity and key algorithm the cluster's kubeadm configuration sets, where it sets them.
pub fn mint(old: &CaPair, policy: &CaPolicy, now: i64) -> Result<CaPair, String> {
    let e = |e: crate::pki::PkiError| format!("making the new CA: {e}");
    let old_key = PrivateKey::read_pem(&old.key_pem).map_err(e)?;
    let algorithm = policy
        .algorithm
        .unwrap_or_else(|| old.cert.public_key_algorithm());
    let key = PrivateKey::generate(algorithm).map_err(e)?;
    let facts = old.cert.facts();
    let profile = Profile::ca(
        old.cert.x509.tbs_certificate.subject.clone(),
        facts.dns_names,
    );
    let not_before = now - crate::renew::BACKDATE;
    let issuance = Issuance {
        serial: random_serial().map_err(e)?,
        not_before,
        not_after: not_before
            + policy
                .validity
                .unwrap_or(old.cert.not_after() - old.cert.not_before()),
    };
    let cert =
        crate::pki::issue(&profile, &key.spki().map_err(e)?, None, &key, issuance).map_err(e)?;
    let pem = key.to_pem(old_key.encoding).map_err(e)?;
    Ok(CaPair {
        cert,
        key_pem: Zeroizing::new(pem.0.as_bytes().to_vec()),
    })
}

/// The certificates the CA file holds after `target`, in order (the signer first).
pub fn bundle(
    files: &CaFiles,
    target: Target,
    old: Option<&CaPair>,
    new: Option<&CaPair>,
) -> Result<Vec<Cert>, String> {
    let n = || {
        new.map(|p| p.cert.clone()).ok_or_else(|| {
            "the new CA is not on the node (its certificate or key is gone)".to_string()
        })
    };
    let o = || {
        old.map(|p| p.cert.clone()).ok_or_else(|| {
            format!(
                "the old CA or its key is no longer in '{}' and the key files beside it: the \
                 files were changed outside certrotor; restore them from a backup ('certrotor \
                 backups')",
                files.cert
            )
        })
    };
    Ok(match target {
        Target::TrustIn => vec![o()?, n()?],
        Target::Issue => vec![n()?, o()?],
        Target::TrustOut => vec![n()?],
        Target::Abort => vec![o()?],
    })
}

/// The changes that make the files what `target` wants, leaving alone what already is.
pub fn changes(
    root: &Path,
    files: &CaFiles,
    target: Target,
    old: Option<&CaPair>,
    new: Option<&CaPair>,
) -> Result<Vec<Change>, String> {
    let mut pem = String::new();
    for c in bundle(files, target, old, new)? {
        pem.push_str(&c.to_pem().map_err(|e| e.to_string())?);
    }
    let key = |p: Option<&CaPair>| p.map(|p| p.key_pem.to_vec());
    let (signer, next, previous) = match target {
        Target::TrustIn => (key(old), key(new), None),
        Target::Issue => (key(new), None, key(old)),
        Target::TrustOut => (key(new), None, None),
        Target::Abort => (key(old), None, None),
    };
    let wanted = [
        (&files.cert, Some(pem.into_bytes()), 0o644),
        (&files.key, signer, 0o600),
        (&files.next, next, 0o600),
        (&files.previous, previous, 0o600),
    ];
    let mut out = Vec::new();
    // A CA only trusted here has its certificate file alone.
    let kept = if files.trust_only { 1 } else { wanted.len() };
    for (rel, content, mode) in wanted.into_iter().take(kept) {
        let now = read(root, rel)?;
        if now.as_deref().map(|b| b.as_slice()) == content.as_deref() {
            // Scrub the copy that is not needed.
            drop(Change {
                rel: rel.clone(),
                content,
                mode_if_new: mode,
            });
            continue;
        }
        out.push(Change {
            rel: rel.clone(),
            content,
            mode_if_new: mode,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki;
    use crate::sys::tmpdir::TmpDir;

    /// A CA of its own (certificate and key), as read from a node.
    fn ca(cn: &str) -> CaPair {
        let (cert, key) = pki::test_ca(cn, (1_700_000_000, 2_000_000_000));
        let pem = key.to_pem(key.encoding).unwrap().0.as_bytes().to_vec();
        CaPair {
            cert,
            key_pem: Zeroizing::new(pem),
        }
    }

    #[test]
    fn a_ca_only_trusted_changes_its_certificate_file_and_no_key() {
        let root = TmpDir::new("files", "trust-only");
        let (old, new) = (ca("etcd-ca"), ca("etcd-ca"));
        fs_write(&root, "pki/etcd/ca.crt", &old.cert.to_pem().unwrap());
        let files = CaFiles::trust_only("pki/etcd/ca.crt");
        // Read back: the certificate, no key.
        let read = pair(&root, &files, &old.cert.sha256_hex())
            .unwrap()
            .unwrap();
        assert!(read.key_pem.is_empty());
        let new_cert = CaPair::cert_only(new.cert.clone());
        for (target, want) in [
            (Target::TrustIn, vec![&old.cert, &new.cert]),
            (Target::Issue, vec![&new.cert, &old.cert]),
            (Target::TrustOut, vec![&new.cert]),
        ] {
            let c = changes(&root, &files, target, Some(&read), Some(&new_cert)).unwrap();
            assert_eq!(c.len(), 1, "{target:?}: only the certificate file");
            assert_eq!(c[0].rel, "pki/etcd/ca.crt");
            let written = Cert::all_from_pem(c[0].content.as_deref().unwrap(), 4).unwrap();
            let shas: Vec<String> = written.iter().map(|c| c.sha256_hex()).collect();
            let want: Vec<String> = want.iter().map(|c| c.sha256_hex()).collect();
            assert_eq!(shas, want, "{target:?}");
        }
        // A CA whose key is here writes its key files too.
        fs_write(
            &root,
            "pki/etcd/ca.key",
            &String::from_utf8_lossy(&old.key_pem),
        );
        let signed = CaFiles::of("pki/etcd/ca.crt", "pki/etcd/ca.key");
        let c = changes(&root, &signed, Target::TrustIn, Some(&old), Some(&new)).unwrap();
        let rels: Vec<&str> = c.iter().map(|c| c.rel.as_str()).collect();
        assert_eq!(rels, ["pki/etcd/ca.crt", "pki/etcd/ca.next.key"]);
    }

    fn fs_write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}
