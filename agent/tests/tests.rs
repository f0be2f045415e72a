//! certrotor's integration tests: one test binary that runs the real `certrotor` on real files,
//! with openssl as an independent oracle. Each module covers one command.
#![allow(clippy::unwrap_used, clippy::expect_used)]
