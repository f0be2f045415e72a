//! The inventory's record of the service-account key pair (`sa.key`, `sa.pub`): not a
//! certificate, so not renewed, but checked: the private key readable, the public key file
//! its match.

use std::path::Path;

use crate::node::catalog::{self, Layout};
use crate::node::inventory::load::read;
use crate::node::inventory::{KeyRecord, Status};
use crate::pki::KeyPublic;

/// The service-account key pair of `layout`, when it has one: the private key read, and
/// whether the public key file matches it.
pub(super) fn service_account(root: &Path, layout: &Layout) -> Option<KeyRecord> {
    let (key_path, pub_path) = catalog::service_account_keys(layout)?;
    let mut rec = KeyRecord {
        name: "sa".into(),
        path: key_path.clone(),
        public_path: pub_path.clone(),
        public_key: None,
        key_matches: None,
        status: Status::Ok,
        error: None,
    };
    match read(root, &key_path) {
        Ok(None) => {
            rec.status = Status::Missing;
            rec.error = Some(format!("'{key_path}' does not exist"));
        }
        Err(e) => {
            rec.status = Status::Invalid;
            rec.error = Some(e.to_string());
        }
        Ok(Some(bytes)) => match KeyPublic::read_pem(&bytes) {
            Err(e) => {
                rec.status = Status::Invalid;
                rec.error = Some(format!("'{key_path}': {e}"));
            }
            Ok(key) => {
                rec.public_key = Some(key.algorithm().to_string());
                match read(root, &pub_path)
                    .ok()
                    .flatten()
                    .and_then(|p| public_key_bits(&p))
                {
                    Some(bits) => {
                        let ok = bits == key.public_key_bits();
                        rec.key_matches = Some(ok);
                        if !ok {
                            rec.status = Status::Invalid;
                            rec.error = Some(format!("'{pub_path}' does not match '{key_path}'"));
                        }
                    }
                    None => {
                        rec.status = Status::Invalid;
                        rec.error =
                            Some(format!("'{pub_path}' is missing or not a PUBLIC KEY PEM"));
                    }
                }
            }
        },
    }
    Some(rec)
}

/// The subjectPublicKey bits of a `PUBLIC KEY` PEM.
fn public_key_bits(pem: &[u8]) -> Option<Vec<u8>> {
    use der::Decode;
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::SubjectPublicKeyInfoDer::from_pem_slice(pem).ok()?;
    let spki = x509_cert::spki::SubjectPublicKeyInfoOwned::from_der(der.as_ref()).ok()?;
    Some(spki.subject_public_key.raw_bytes().to_vec())
}
