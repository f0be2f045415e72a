//! TEST DOUBLES that stand in for a Bottlerocket host in certrotor's tests. Nothing shipped
//! depends on this crate: `certrotor` links only the `bottlerocket` client.
//!
//! - [`apiserver_sim`]: the Bottlerocket API server emulator behind the `apiserver-sim` binary
//!   (transactions, commit/apply semantics, asynchronous rendering of static pods).
//! - [`kubelet_sim`]: runs static pod manifests as host processes (`kubelet-sim`).
//! - [`k8s_sim`]: TLS stand-ins for kube-apiserver, controller-manager and scheduler (`k8s-sim`),
//!   and [`kube_vip`], its stand-in of EKS Anywhere's kube-vip (`kube-vip manager`).
//! - [`recording_api`]: stand-ins of the kubelet's API port (kubelet-sim `--serve-api`) and of
//!   an aggregated API server, recording which client certificate kube-apiserver presents.
//!
//! The emulator parses HTTP with its own minimal server-side reader ([`http`]); the client uses
//! ureq, so a parsing bug cannot hide on both sides of the socket.

#![deny(unsafe_code)]

pub mod apiserver_sim;
pub mod k8s_sim;
pub mod kube_vip;
pub mod kubelet_sim;
pub mod recording_api;

mod http;

/// Standard base64 with `=` padding, as the API's `ValidBase64` settings use; decoding also
/// accepts unpadded input, as the emulator always has.
pub mod base64 {
    use base64ct::{Base64, Base64Unpadded, Encoding};

    /// Encodes `data` as padded standard base64.
    pub fn encode(data: &[u8]) -> String {
        Base64::encode_string(data)
    }

    /// Decodes standard base64, padded or not.
    pub fn decode(text: &str) -> Result<Vec<u8>, base64ct::Error> {
        Base64::decode_vec(text).or_else(|_| Base64Unpadded::decode_vec(text))
    }
}
