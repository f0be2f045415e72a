//! Bottlerocket integration for certrotor: a client for the Bottlerocket API (HTTP/1.1 on the
//! Unix socket `/run/api.sock`, through ureq with a Unix-socket transport).
//!
//! The public interface is [`ApiClient`], [`ApiError`], [`ApiResult`] and the client constants:
//! read settings, stage changes in a private transaction, `commit_and_apply`, toggle static pods.
//! [`DEFAULT_SOCKET`] is the one definition of the socket path.
//!
//! The test doubles that stand in for a Bottlerocket host (API server emulator, kubelet and
//! kube-apiserver stand-ins) live in the separate `testbed` crate (`bottlerocket/testbed/`),
//! which nothing shipped depends on.
//!
//! What this crate does not do: wait for applied settings to take effect (callers watch the
//! manifest directory or the container runtime), or talk to the API's `/exec` WebSocket.

#![deny(unsafe_code)]

mod api_error;
mod client;
mod transport;

pub use api_error::{ApiError, ApiResult};
pub use client::{ApiClient, DEFAULT_SOCKET, DEFAULT_TIMEOUT, MAX_RESPONSE_BYTES};
