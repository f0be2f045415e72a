//! Unit tests of the plan's pure parts: paths through mounts, bundles, names.

use super::*;

fn pod(mounts: &[(&str, &str)]) -> PodInfo {
    PodInfo {
        name: "kube-apiserver".into(),
        argv: vec!["kube-apiserver".into()],
        command: vec![],
        mounts: mounts
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        host_paths: vec![],
        health: None,
        image: None,
        env: vec![],
    }
}

#[test]
fn a_container_path_is_found_on_the_node_through_the_longest_mount() {
    let p = pod(&[
        ("/etc/kubernetes", "/var/lib/kubeadm"),
        ("/etc/kubernetes/pki/", "/var/lib/kubeadm/pki"),
    ]);
    assert_eq!(
        on_node(&p, "/etc/kubernetes/pki/ca.crt"),
        "var/lib/kubeadm/pki/ca.crt"
    );
    assert_eq!(
        on_node(&p, "/etc/kubernetes/admin.conf"),
        "var/lib/kubeadm/admin.conf"
    );
    // A prefix of a name is not a folder above it; no mount: the path as it is.
    assert_eq!(
        on_node(&p, "/etc/kubernetes-other/ca.crt"),
        "etc/kubernetes-other/ca.crt"
    );
    assert_eq!(on_node(&pod(&[]), "/etc/ssl/ca.crt"), "etc/ssl/ca.crt");
}

#[test]
fn a_bundle_is_read_up_to_its_bound_and_damaged_blocks_are_skipped() {
    use crate::pki::{Issuance, Profile, issue, kubeadm_subject};
    let key = crate::pki::PrivateKey::generate(crate::pki::KeyAlgorithm::EcdsaP256).unwrap();
    let profile = Profile::ca(kubeadm_subject("kubernetes", &[]).unwrap(), vec![]);
    let issuance = Issuance {
        serial: 1,
        not_before: 1_700_000_000,
        not_after: 2_000_000_000,
    };
    let cert = issue(&profile, &key.spki().unwrap(), None, &key, issuance).unwrap();
    let pem = cert.to_pem().unwrap();
    let one = certs_in(pem.as_bytes());
    assert_eq!(one.len(), 1);
    let many = pem.repeat(MAX_BUNDLE_CERTS + 5);
    assert_eq!(certs_in(many.as_bytes()).len(), MAX_BUNDLE_CERTS);
    let damaged = format!("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n{pem}");
    assert_eq!(certs_in(damaged.as_bytes()), one);
}

#[test]
fn the_three_cas_parse_by_their_command_line_names_only() {
    for ca in [CaName::Ca, CaName::FrontProxyCa, CaName::EtcdCa] {
        assert_eq!(CaName::parse(ca.name()), Some(ca));
    }
    assert_eq!(CaName::parse("sa"), None);
    assert_eq!(CaName::parse("etcdadm-ca"), None);
}
