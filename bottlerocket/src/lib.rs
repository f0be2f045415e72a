//! Bottlerocket integration for certrotor: a std-only client for the Bottlerocket API (HTTP/1.1
//! on the Unix socket `/run/api.sock`) and test doubles that stand in for a Bottlerocket host in
//! tests (an API server emulator; kubelet and kube-apiserver stand-ins live beside it).
//!
//! The public interface is:
//! - [`ApiClient`], [`ApiError`], [`ApiResult`] and the client constants: read settings, stage
//!   changes in a private transaction, `commit_and_apply`, toggle static pods.
//! - [`base64`]: the encoding of static-pod manifests and other binary settings.
//! - [`apiserver_sim`]: the API server emulator behind the `apiserver-sim` binary. TEST DOUBLE.
//! - `k8s_sim`, `kubelet_sim`: kube-apiserver and kubelet stand-ins. TEST DOUBLES.
//!
//! What this crate does not do: wait for applied settings to take effect (callers watch the
//! manifest directory or the container runtime), or talk to the API's `/exec` WebSocket.

pub mod apiserver_sim;
pub mod base64;
pub mod k8s_sim;
pub mod kubelet_sim;

mod api_error;
mod client;
mod http;
mod percent;
mod uds;

pub use api_error::{ApiError, ApiResult};
pub use client::{ApiClient, DEFAULT_SOCKET, DEFAULT_TIMEOUT, MAX_RESPONSE_BYTES};
