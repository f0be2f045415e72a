//! The pass: the operations behind the commands that change a node ([`ops`]: renew, roll back,
//! one `run` pass, the daemon loop), the etcd client pair carried between nodes
//! ([`etcd_client`]), the Kubernetes Events that tell the cluster what a pass did
//! ([`events`]), the record of the last pass ([`record`]), and the exit codes chosen from what
//! a pass or command did ([`outcome`]).

pub mod daemon;
pub mod ensure;
pub mod etcd_client;
pub mod events;
pub mod import;
pub mod ops;
pub mod outcome;
pub mod record;
pub mod run;
pub mod state;
