//! What certrotor tells people and programs: the printed reports ([`report`]), `status`
//! ([`status`]), Prometheus metrics ([`metrics`]), and diagnostics ([`logging`]).

pub mod logging;
pub mod metrics;
pub mod report;
pub mod status;
