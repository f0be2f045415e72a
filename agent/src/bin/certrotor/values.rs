//! Flag values: the types of the flags that are not plain strings or numbers, and the parsers
//! argh calls for them (`from_str_fn`), so that a bad value is a usage error that says what to
//! give, before any command runs.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use certrotor::lab::{KubeVipShape, LabLayout, Topology};
use certrotor::node::manifests::{Component, Version};
use certrotor::pki::KeyAlgorithm;
use certrotor::restart::PlatformChoice;
use certrotor::sys::clock;

/// `--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
}

pub fn format(value: &str) -> Result<Format, String> {
    match value {
        "table" => Ok(Format::Table),
        "json" => Ok(Format::Json),
        _ => Err("use table or json".into()),
    }
}

/// `check --output`: the common formats, or the Prometheus text format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOutput {
    Plain(Format),
    Prometheus,
}

pub fn check_output(value: &str) -> Result<CheckOutput, String> {
    match value {
        "prometheus" => Ok(CheckOutput::Prometheus),
        _ => format(value)
            .map(CheckOutput::Plain)
            .map_err(|_| "use table, json or prometheus".into()),
    }
}

/// `--metrics-address`: IP:PORT.
pub fn metrics_address(value: &str) -> Result<SocketAddr, String> {
    value
        .parse()
        .map_err(|_| "give IP:PORT (127.0.0.1:9793, or 0.0.0.0:9793 for every address)".into())
}

/// `--engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineChoice {
    Native,
    Kubeadm,
}

pub fn engine_choice(value: &str) -> Result<EngineChoice, String> {
    match value {
        "native" => Ok(EngineChoice::Native),
        "kubeadm" => Ok(EngineChoice::Kubeadm),
        _ => Err("use native or kubeadm".into()),
    }
}

/// A duration in seconds, possibly negative (`30d`, `-2d`).
pub fn seconds(value: &str) -> Result<i64, String> {
    clock::parse_duration(value)
}

/// A duration in seconds that must be positive.
pub fn positive_seconds(value: &str) -> Result<i64, String> {
    match clock::parse_duration(value)? {
        s if s > 0 => Ok(s),
        _ => Err("must be a positive duration".into()),
    }
}

/// A duration that must not be negative (`0s` allowed).
pub fn wait(value: &str) -> Result<Duration, String> {
    match clock::parse_duration(value)? {
        s if s >= 0 => Ok(Duration::from_secs(s.unsigned_abs())),
        _ => Err("must not be negative".into()),
    }
}

/// A positive duration, also in milliseconds (`500ms`).
pub fn interval(value: &str) -> Result<Duration, String> {
    if let Some(ms) = value.strip_suffix("ms") {
        return match ms.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Duration::from_millis(n)),
            _ => Err("must be a positive duration".into()),
        };
    }
    positive_seconds(value).map(|s| Duration::from_secs(s.unsigned_abs()))
}

pub fn cluster_mode(value: &str) -> Result<certrotor::cluster::Mode, String> {
    match value {
        "auto" | "on" => Ok(certrotor::cluster::Mode::Auto),
        "off" => Ok(certrotor::cluster::Mode::Off),
        _ => Err("use auto (default) or off".into()),
    }
}

/// `https://IP:PORT[,https://IP:PORT...]`.
pub fn etcd_endpoints(value: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for e in value.split(',') {
        let e = e.trim().trim_end_matches('/');
        if certrotor::node::manifests::parse_https_url(e).is_none() {
            return Err(format!("'{e}': give https://IP:PORT"));
        }
        out.push(e.to_string());
    }
    Ok(out)
}

pub fn lease_ttl(value: &str) -> Result<Duration, String> {
    let d = interval(value)?;
    if d < Duration::from_secs(2) {
        return Err("must be at least 2s".into());
    }
    Ok(d)
}

pub fn ca_name(value: &str) -> Result<certrotor::ca::CaName, String> {
    certrotor::ca::CaName::parse(value)
        .ok_or_else(|| format!("'{value}': expected ca, front-proxy-ca or etcd-ca"))
}

pub fn platform(value: &str) -> Result<PlatformChoice, String> {
    PlatformChoice::parse(value).ok_or_else(|| "use auto, bottlerocket, kubeadm or none".into())
}

pub fn restart_mode(value: &str) -> Result<certrotor::restart::reload::RestartMode, String> {
    certrotor::restart::reload::RestartMode::parse(value).ok_or_else(|| "use live or always".into())
}

pub fn endpoint(value: &str) -> Result<(Component, SocketAddr), String> {
    certrotor::restart::parse_endpoint(value)
}

/// `--kubernetes-version X.Y[.Z]` (`v` allowed).
pub fn version(value: &str) -> Result<Version, String> {
    Version::parse_flag(value).ok_or_else(|| "give a version X.Y or X.Y.Z, e.g. 1.31.4".into())
}

/// `--component-version NAME=X.Y[.Z]`.
pub fn component_version(value: &str) -> Result<(Component, Version), String> {
    let (name, v) = value.split_once('=').ok_or_else(|| {
        "give NAME=X.Y[.Z], e.g. kube-apiserver=1.31.4 or etcd=3.5.16".to_string()
    })?;
    let component = Component::ALL
        .into_iter()
        .find(|c| c.name() == name)
        .ok_or_else(|| {
            format!(
                "unknown component '{name}' (etcd, kube-apiserver, kube-controller-manager, \
                 kube-scheduler)"
            )
        })?;
    Ok((component, version(v)?))
}

/// `lab init --kube-vip`.
pub fn kube_vip(value: &str) -> Result<KubeVipShape, String> {
    match value {
        "eks-anywhere" => Ok(KubeVipShape::EksAnywhere),
        "probe" => Ok(KubeVipShape::Probe),
        _ => Err("use eks-anywhere or probe".into()),
    }
}

pub fn layout(value: &str) -> Result<LabLayout, String> {
    match value {
        "kubeadm" => Ok(LabLayout::Kubeadm),
        "bottlerocket" => Ok(LabLayout::Bottlerocket),
        _ => Err("use kubeadm or bottlerocket".into()),
    }
}

pub fn topology(value: &str) -> Result<Topology, String> {
    match value {
        "stacked" => Ok(Topology::Stacked),
        "external-etcd" => Ok(Topology::ExternalEtcd),
        _ => Err("use stacked or external-etcd".into()),
    }
}

pub fn key_algorithm(value: &str) -> Result<KeyAlgorithm, String> {
    KeyAlgorithm::parse(value)
        .ok_or_else(|| "use rsa-2048, rsa-3072, rsa-4096, ecdsa-p256 or ecdsa-p384".into())
}

pub fn ip(value: &str) -> Result<IpAddr, String> {
    value.parse().map_err(|_| "not an IP address".into())
}

pub fn node_name(value: &str) -> Result<String, String> {
    if value.is_empty() || value.contains('/') {
        return Err("not a valid node name".into());
    }
    Ok(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_flag_values_parse_and_bad_ones_are_refused() {
        assert_eq!(cluster_mode("off"), Ok(certrotor::cluster::Mode::Off));
        assert!(cluster_mode("sometimes").is_err());
        assert_eq!(
            etcd_endpoints("https://127.0.0.1:2379,https://127.0.0.2:2379/").unwrap(),
            ["https://127.0.0.1:2379", "https://127.0.0.2:2379"]
        );
        assert!(etcd_endpoints("http://127.0.0.1:2379").is_err());
        assert!(etcd_endpoints("https://etcd.example:2379").is_err());
        assert!(lease_ttl("1s").is_err());
        assert_eq!(lease_ttl("5s"), Ok(Duration::from_secs(5)));
    }

    #[test]
    fn version_flag_values() {
        assert_eq!(version("v1.31.4"), Ok(Version::new(1, 31, 4)));
        assert_eq!(version("1.29"), Ok(Version::new(1, 29, 0)));
        assert!(version("1.31.4-eks-1").is_err());
        assert!(version("latest").is_err());
        assert_eq!(
            component_version("etcd=3.5.16"),
            Ok((Component::Etcd, Version::new(3, 5, 16)))
        );
        assert!(component_version("kube-vip=0.7").is_err());
        assert!(component_version("kube-apiserver").is_err());
        assert_eq!(kube_vip("probe"), Ok(KubeVipShape::Probe));
        assert!(kube_vip("yes").is_err());
    }
}
