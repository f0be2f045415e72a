//! Bottlerocket API client.
