//! The pass: the operations behind the commands that change a node ([`ops`]: renew, roll back;
//! [`run`]: one pass, top to bottom, with what its steps call beside it: [`live_reload`],
//! [`leaders_last`], [`rollback`], [`pods`], [`run_report`]; [`daemon`]: the loop around a
//! pass), the etcd client pair carried between nodes
//! ([`etcd_client`]), the Kubernetes Events that tell the cluster what a pass did
//! ([`events`]), the record of the last pass ([`record`]), and the exit codes chosen from what
//! a pass or command did ([`outcome`]).

pub mod daemon;
pub mod ensure;
pub mod etcd_client;
pub mod events;
pub mod import;
pub mod leaders_last;
pub mod live_reload;
pub mod ops;
pub mod outcome;
pub mod pods;
pub mod record;
pub mod rollback;
pub mod run;
pub mod run_report;
pub mod state;
