//! What kubeadm's ClusterConfiguration says a new CA must be. From kubeadm 1.31 (API
//! `kubeadm.k8s.io/v1beta4`) `caCertificateValidityPeriod` (default 87600h) and
//! `encryptionAlgorithm` (RSA-2048 default, RSA-3072, RSA-4096, ECDSA-P256, ECDSA-P384 from
//! 1.34) decide the validity and key of every CA kubeadm makes; kubeadm keeps the configuration
//! in `kube-system/kubeadm-config` (key `ClusterConfiguration`), in its own API version. Older
//! versions (v1beta3) have neither field: the new CA follows the old one.

use crate::node::Node;
use crate::pass::events;
use crate::pki::KeyAlgorithm;

const PATH: &str = "/api/v1/namespaces/kube-system/configmaps/kubeadm-config";

/// What the cluster's kubeadm configuration asks of a new CA; `None` fields follow the old CA.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaPolicy {
    /// `caCertificateValidityPeriod`, in seconds.
    pub validity: Option<i64>,
    /// `encryptionAlgorithm`.
    pub algorithm: Option<KeyAlgorithm>,
}

/// Reads the policy through kube-apiserver with the node's admin kubeconfig. `Ok(default)`: no
/// admin kubeconfig, no `kubeadm-config` (not a kubeadm cluster), or an API version before
/// v1beta4. A value kubeadm would refuse is an error naming it.
pub fn read(node: &Node) -> Result<CaPolicy, String> {
    let Some(admin) = events::admin_conf(node) else {
        return Ok(CaPolicy::default());
    };
    let cm = match events::get_if_found(node, &admin, PATH) {
        Ok(Some(v)) => v,
        Ok(None) => return Ok(CaPolicy::default()),
        Err(e) => return Err(format!("reading kube-system/kubeadm-config: {e}")),
    };
    match cm["data"]["ClusterConfiguration"].as_str() {
        Some(text) => parse(text),
        None => Ok(CaPolicy::default()),
    }
}

/// The policy in a `ClusterConfiguration` document (YAML).
pub fn parse(text: &str) -> Result<CaPolicy, String> {
    let what = "kube-system/kubeadm-config ClusterConfiguration";
    let doc: serde_norway::Value =
        serde_norway::from_str(text).map_err(|e| format!("{what}: not YAML: {e}"))?;
    let field = |name: &str| doc.get(name).and_then(serde_norway::Value::as_str);
    if field("apiVersion") != Some("kubeadm.k8s.io/v1beta4") {
        return Ok(CaPolicy::default());
    }
    let validity = field("caCertificateValidityPeriod")
        .map(|v| {
            crate::sys::clock::parse_duration(v)
                .ok()
                .filter(|s| *s > 0)
                .ok_or_else(|| {
                    format!("{what}: caCertificateValidityPeriod '{v}' is not a duration")
                })
        })
        .transpose()?;
    let algorithm = field("encryptionAlgorithm")
        .map(|a| {
            KeyAlgorithm::parse(a).ok_or_else(|| {
                format!(
                    "{what}: encryptionAlgorithm '{a}' is not one kubeadm knows (RSA-2048, \
                     RSA-3072, RSA-4096, ECDSA-P256, ECDSA-P384)"
                )
            })
        })
        .transpose()?;
    Ok(CaPolicy {
        validity,
        algorithm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1beta4_fields_are_read_and_older_versions_follow_the_old_ca() {
        let v4 = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n\
                  caCertificateValidityPeriod: 43800h0m0s\nencryptionAlgorithm: ECDSA-P256\n";
        assert_eq!(
            parse(v4).unwrap(),
            CaPolicy {
                validity: Some(43800 * 3600),
                algorithm: Some(KeyAlgorithm::EcdsaP256)
            }
        );
        let v3 = "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\n\
                  encryptionAlgorithm: ECDSA-P256\n";
        assert_eq!(parse(v3).unwrap(), CaPolicy::default());
        let none = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n";
        assert_eq!(parse(none).unwrap(), CaPolicy::default());
        for bad in [
            "apiVersion: kubeadm.k8s.io/v1beta4\nencryptionAlgorithm: DSA-1024\n",
            "apiVersion: kubeadm.k8s.io/v1beta4\ncaCertificateValidityPeriod: soon\n",
            "apiVersion: [",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("kubeadm-config"), "{e}");
        }
    }
}
