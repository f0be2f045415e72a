//! Bottlerocket integration for certrotor: a client for the Bottlerocket API (HTTP/1.1 on the
//! Unix socket `/run/api.sock`, through ureq with a Unix-socket transport).
//!
//! The public interface is [`ApiClient`], [`ApiError`], [`ApiResult`], [`Retry`] and the client
//! constants: read settings (one live value too), stage changes in a private transaction whose
//! name is never reused ([`unique_tx_name`]), `commit_and_apply`, re-run the applier for given
//! keys, list, read and delete pending transactions, toggle static pods; tell transient errors
//! from permanent ones and retry within a caller's deadline.
//! [`DEFAULT_SOCKET`] is the one definition of the socket path.
//!
//! The test doubles that stand in for a Bottlerocket host (API server emulator, kubelet and
//! kube-apiserver stand-ins) live in the separate `testbed` crate (`bottlerocket/testbed/`),
//! which nothing shipped depends on.
//!
//! What this crate does not do: wait for applied settings to take effect (callers watch the
//! manifest directory or the container runtime), retry on its own (the caller owns the time
//! bound; [`Retry`] takes it), or talk to the API's `/exec` WebSocket.

#![deny(unsafe_code)]

mod api_error;
mod client;
mod transport;

pub use api_error::{ApiError, ApiResult};
pub use client::{
    ApiClient, DEFAULT_SOCKET, DEFAULT_TIMEOUT, MAX_RESPONSE_BYTES, Retry, STATIC_PODS_ENABLED_KEY,
    STATIC_PODS_KEY, static_pod_enabled_key, unique_tx_name,
};
