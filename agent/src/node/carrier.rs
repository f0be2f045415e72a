//! Where a renewable certificate lives: a certificate file with its key file, or a kubeconfig
//! embedding both (`client-certificate-data`, `client-key-data`). The one place that tells the
//! two apart: readers, renewal and the metrics ask a [`Carrier`] instead of looking at the
//! catalog [`Kind`].
//!
//! Key bytes are scrubbed when dropped, as everywhere: a key PEM is held as
//! [`zeroize::Zeroizing`], and a parsed [`Kubeconfig`] scrubs its users' keys itself.

use std::fmt;

use zeroize::Zeroizing;

use crate::node::catalog::{Entry, Kind};
use crate::node::kubeconfig::{Kubeconfig, KubeconfigError, Source};
use crate::pki::{Cert, PkiError};

/// The files a certificate is kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carrier<'a> {
    /// A PEM certificate file and its key file (none for certificates whose key the catalog
    /// does not name).
    Pair { cert: &'a str, key: Option<&'a str> },
    /// A kubeconfig, with the certificate and key embedded in its current context's user.
    Kubeconfig { path: &'a str },
}

/// Why a carrier's certificate or key could not be had.
#[derive(Debug)]
pub enum CarrierError<E = std::convert::Infallible> {
    /// The caller's own read or parse failed.
    Given(E),
    /// A certificate or the CA certificate: bad PEM, or not encodable.
    Pki(PkiError),
    /// The kubeconfig could not be parsed, or its credentials not be had or replaced.
    Kubeconfig(KubeconfigError),
    /// The kubeconfig names a file instead of embedding the client certificate (or key).
    NotEmbedded,
    /// A kubeconfig's new bytes were asked for without the kubeconfig's old document.
    NoDocument,
}

impl<E: fmt::Display> fmt::Display for CarrierError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CarrierError::Given(e) => e.fmt(f),
            CarrierError::Pki(e) => e.fmt(f),
            CarrierError::Kubeconfig(e) => e.fmt(f),
            CarrierError::NotEmbedded => f.write_str("the client certificate is not embedded"),
            CarrierError::NoDocument => {
                f.write_str("internal error: the kubeconfig to update was not read")
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for CarrierError<E> {}

/// What a carrier holds, read: the certificate (as the caller's `cert` step made it), the key
/// PEM, and the kubeconfig document they are embedded in.
pub struct Held<C> {
    pub cert: C,
    pub key_pem: Zeroizing<Vec<u8>>,
    pub kubeconfig: Option<Kubeconfig>,
}

/// One file to write: (path relative to the root, content, mode if new). Contents may hold key
/// PEM: whoever keeps them scrubs them.
pub type NewFile = (String, Vec<u8>, u32);

/// A kubeconfig or a private key file: readable by its owner only.
const SECRET_MODE: u32 = 0o600;
/// A certificate file.
const CERT_MODE: u32 = 0o644;

impl<'a> Carrier<'a> {
    /// The carrier of a catalog kind's files.
    pub fn of(kind: Kind, path: &'a str, key: Option<&'a str>) -> Carrier<'a> {
        match kind {
            Kind::Kubeconfig => Carrier::Kubeconfig { path },
            Kind::Ca | Kind::Leaf | Kind::Other => Carrier::Pair { cert: path, key },
        }
    }

    /// The carrier of a catalog entry.
    pub fn of_entry(entry: &'a Entry) -> Carrier<'a> {
        Carrier::of(entry.kind, &entry.path, entry.key_path.as_deref())
    }

    /// The file the certificate is in: the certificate file, or the kubeconfig.
    pub fn path(&self) -> &'a str {
        match *self {
            Carrier::Pair { cert, .. } | Carrier::Kubeconfig { path: cert } => cert,
        }
    }

    /// The file holding the certificate alone (PEM); `None` for a kubeconfig.
    pub fn cert_file(&self) -> Option<&'a str> {
        match *self {
            Carrier::Pair { cert, .. } => Some(cert),
            Carrier::Kubeconfig { .. } => None,
        }
    }

    /// The kubeconfig the certificate is embedded in, if it is.
    pub fn kubeconfig(&self) -> Option<&'a str> {
        match *self {
            Carrier::Pair { .. } => None,
            Carrier::Kubeconfig { path } => Some(path),
        }
    }

    /// Reads the certificate and key with `read` (a path relative to the root → its bytes):
    /// the certificate file then the key file, or the kubeconfig's embedded pair. `cert` turns
    /// the certificate PEM into what the caller wants; for a pair it runs before the key file
    /// is read. A kubeconfig must embed both the certificate and the key.
    pub fn read_held<C, E>(
        &self,
        mut read: impl FnMut(&str) -> Result<Vec<u8>, E>,
        cert: impl FnOnce(Vec<u8>) -> Result<C, E>,
    ) -> Result<Held<C>, CarrierError<E>> {
        match *self {
            Carrier::Pair { cert: path, key } => {
                let cert =
                    cert(read(path).map_err(CarrierError::Given)?).map_err(CarrierError::Given)?;
                let key_pem =
                    Zeroizing::new(read(key.unwrap_or_default()).map_err(CarrierError::Given)?);
                Ok(Held {
                    cert,
                    key_pem,
                    kubeconfig: None,
                })
            }
            Carrier::Kubeconfig { path } => {
                let bytes = Zeroizing::new(read(path).map_err(CarrierError::Given)?);
                let kc = Kubeconfig::parse(&bytes).map_err(CarrierError::Kubeconfig)?;
                let mut creds = kc.credentials().map_err(CarrierError::Kubeconfig)?;
                // Moved out, not copied: `Credentials` scrubs only what it still holds.
                let (Source::Embedded(c), Source::Embedded(k)) =
                    (&mut creds.client_certificate, &mut creds.client_key)
                else {
                    return Err(CarrierError::NotEmbedded);
                };
                let key_pem = Zeroizing::new(std::mem::take(k));
                let cert = cert(std::mem::take(c)).map_err(CarrierError::Given)?;
                Ok(Held {
                    cert,
                    key_pem,
                    kubeconfig: Some(kc),
                })
            }
        }
    }

    /// The certificate in `bytes`, the content of the carrier's file (as found or as written),
    /// and the kubeconfig document when it is one. Only the certificate need be embedded.
    pub fn cert_in(&self, bytes: &[u8]) -> Result<(Cert, Option<Kubeconfig>), CarrierError> {
        match self {
            Carrier::Pair { .. } => Ok((Cert::from_pem(bytes).map_err(CarrierError::Pki)?, None)),
            Carrier::Kubeconfig { .. } => {
                let kc = Kubeconfig::parse(bytes).map_err(CarrierError::Kubeconfig)?;
                let cert = match &kc
                    .credentials()
                    .map_err(CarrierError::Kubeconfig)?
                    .client_certificate
                {
                    Source::Embedded(c) => Cert::from_pem(c).map_err(CarrierError::Pki)?,
                    Source::File(_) => return Err(CarrierError::NotEmbedded),
                };
                Ok((cert, Some(kc)))
            }
        }
    }

    /// The files to write for a new certificate: the old kubeconfig `document` with the new
    /// pair and `trust` embedded as its CA data (mode 0600), or the key file (when `write_key`;
    /// 0600) and the certificate file (0644). `trust`: every certificate of the CA file, the
    /// signer first; kubeadm embeds the CA file's certificate, and in the middle of a CA
    /// rotation the file is the bundle [old, new] or [new, old] every consumer trusts.
    pub fn new_files(
        &self,
        document: Option<Kubeconfig>,
        cert_pem: Vec<u8>,
        key_pem: &[u8],
        trust: &[Cert],
        write_key: bool,
    ) -> Result<Vec<NewFile>, CarrierError> {
        match *self {
            Carrier::Pair { cert, key } => {
                let mut files = Vec::new();
                if write_key {
                    let key = key.unwrap_or_default().to_string();
                    files.push((key, key_pem.to_vec(), SECRET_MODE));
                }
                files.push((cert.to_string(), cert_pem, CERT_MODE));
                Ok(files)
            }
            Carrier::Kubeconfig { path } => {
                let mut kc = document.ok_or(CarrierError::NoDocument)?;
                let mut ca_pem = String::new();
                for c in trust {
                    ca_pem.push_str(&c.to_pem().map_err(CarrierError::Pki)?);
                }
                kc.replace_credentials(&cert_pem, key_pem, ca_pem.as_bytes())
                    .map_err(CarrierError::Kubeconfig)?;
                let yaml = kc.to_yaml().map_err(CarrierError::Kubeconfig)?;
                Ok(vec![(path.to_string(), yaml.into_bytes(), SECRET_MODE)])
            }
        }
    }

    /// The x509-certificate-exporter's source of the certificate (`abs`: the carrier's path from
    /// `/`): (`kubeconfig`, the kubeconfig) or (`file`, the certificate file's folder).
    pub fn metrics_source(&self, abs: &str) -> (&'static str, String) {
        match self {
            Carrier::Kubeconfig { .. } => ("kubeconfig", abs.to_string()),
            Carrier::Pair { .. } => {
                let dir = abs.rsplit_once('/').map(|(d, _)| d).unwrap_or_default();
                (
                    "file",
                    if dir.is_empty() {
                        "/".into()
                    } else {
                        dir.into()
                    },
                )
            }
        }
    }

    /// The exporter's reason code for a carrier file that was read but gave no certificate.
    pub fn decode_error(&self) -> &'static str {
        match self {
            Carrier::Kubeconfig { .. } => "decode_failed",
            Carrier::Pair { .. } => "bad_pem",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki;

    /// A self-signed certificate and its key's PEM.
    fn pair(cn: &str) -> (Cert, Vec<u8>, Vec<u8>) {
        let (cert, key) = pki::test_ca(cn, (1_700_000_000, 2_000_000_000));
        let cert_pem = cert.to_pem().unwrap().into_bytes();
        let key_pem = key.to_pem(key.encoding).unwrap().0.as_bytes().to_vec();
        (cert, cert_pem, key_pem)
    }

    const KC: Carrier<'static> = Carrier::Kubeconfig { path: "admin.conf" };
    const PAIR: Carrier<'static> = Carrier::Pair {
        cert: "pki/a.crt",
        key: Some("pki/a.key"),
    };

    #[test]
    fn a_pair_is_read_certificate_first_and_written_key_first() {
        let (cert, cert_pem, key_pem) = pair("a");
        let mut read = Vec::new();
        let failed = PAIR.read_held(
            |rel| {
                read.push(rel.to_string());
                Ok::<_, String>(cert_pem.clone())
            },
            |_| Err::<(), _>("bad certificate".to_string()),
        );
        assert!(matches!(failed, Err(CarrierError::Given(e)) if e == "bad certificate"));
        assert_eq!(read, ["pki/a.crt"]);
        let held = PAIR
            .read_held(|_| Ok::<_, String>(key_pem.clone()), Ok)
            .unwrap();
        assert!(held.kubeconfig.is_none());
        let files = PAIR
            .new_files(
                None,
                cert_pem.clone(),
                &key_pem,
                std::slice::from_ref(&cert),
                true,
            )
            .unwrap();
        let written: Vec<_> = files.iter().map(|(p, _, m)| (p.as_str(), *m)).collect();
        assert_eq!(written, [("pki/a.key", 0o600), ("pki/a.crt", 0o644)]);
        let files = PAIR
            .new_files(None, cert_pem, &key_pem, std::slice::from_ref(&cert), false)
            .unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(PAIR.cert_in(&files[0].1).unwrap().0.der, cert.der);
        assert_eq!(PAIR.cert_file(), Some("pki/a.crt"));
        assert_eq!(PAIR.kubeconfig(), None);
    }

    #[test]
    fn a_kubeconfig_carries_its_embedded_pair_and_takes_a_new_one() {
        let (ca, ca_pem, _) = pair("ca");
        let (old, old_pem, old_key) = pair("old");
        let (new, new_pem, new_key) = pair("new");
        let yaml = Kubeconfig::new_embedded("k", "https://x", "u", &ca_pem, &old_pem, &old_key)
            .to_yaml()
            .unwrap();
        let held = KC
            .read_held(|_| Ok::<_, String>(yaml.clone().into_bytes()), Ok)
            .unwrap();
        assert_eq!((held.cert, held.key_pem.to_vec()), (old_pem, old_key));
        let (found, document) = KC.cert_in(yaml.as_bytes()).unwrap();
        assert_eq!(found.der, old.der);
        let files = KC
            .new_files(
                document,
                new_pem,
                &new_key,
                std::slice::from_ref(&ca),
                false,
            )
            .unwrap();
        assert_eq!(
            (files.len(), files[0].0.as_str(), files[0].2),
            (1, "admin.conf", 0o600)
        );
        assert_eq!(KC.cert_in(&files[0].1).unwrap().0.der, new.der);
        assert!(matches!(
            KC.new_files(None, vec![], &[], std::slice::from_ref(&ca), true),
            Err(CarrierError::NoDocument)
        ));
        let named = yaml.replace("client-certificate-data", "client-certificate");
        let not_embedded = KC.read_held(|_| Ok::<_, String>(named.clone().into_bytes()), Ok);
        assert!(matches!(not_embedded, Err(CarrierError::NotEmbedded)));
        assert!(matches!(
            KC.cert_in(named.as_bytes()),
            Err(CarrierError::NotEmbedded)
        ));
        assert_eq!(
            (KC.cert_file(), KC.kubeconfig()),
            (None, Some("admin.conf"))
        );
    }

    #[test]
    fn the_exporter_names_the_source_and_the_decode_error() {
        let abs = "/etc/kubernetes/admin.conf";
        assert_eq!(KC.metrics_source(abs), ("kubeconfig", abs.to_string()));
        assert_eq!(KC.decode_error(), "decode_failed");
        let file = Carrier::of(Kind::Leaf, "ca.crt", None);
        assert_eq!(file.metrics_source("/ca.crt"), ("file", "/".to_string()));
        assert_eq!(
            PAIR.metrics_source("/etc/kubernetes/pki/a.crt"),
            ("file", "/etc/kubernetes/pki".to_string())
        );
        assert_eq!(PAIR.decode_error(), "bad_pem");
    }
}
