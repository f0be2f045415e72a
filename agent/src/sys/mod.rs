//! The ground floor: what every stage above uses and nothing here knows of certificates or
//! nodes. Time ([`clock`]), files under a node root ([`fsutil`]), work spread over the cores
//! ([`par`]), which process listens on a port ([`procfs`]), and certrotor's own versioned state
//! files read as untrusted input ([`state`]), text from outside made safe to print
//! ([`text`]), and errors that are one message (`message_error`).

pub mod clock;
pub mod fsutil;
pub(crate) mod message_error;
pub mod par;
pub mod procfs;
pub mod state;
pub mod text;
#[cfg(test)]
pub(crate) mod tmpdir;
