//! ureq's transport for a Unix stream socket: the connector dials the API socket whatever host the
//! URL names, and the resolver never looks a name up.
//!
//! A blocking `connect(2)` on a Unix stream socket whose listener's backlog is full (an API
//! server that has stopped accepting) waits indefinitely. Linux bounds that wait by the socket's
//! send timeout (`SO_SNDTIMEO`), so the socket is created first, given the request's remaining
//! time as its send timeout, and only then connected; a timed-out connect fails with `EAGAIN`,
//! reported as ureq's connect timeout.
//!
//! ureq's transport API (`ureq::unversioned`) is outside semver: the workspace pins `~3.5`, and
//! this file is the only one that implements it.

use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr, sockopt};
use nix::sys::time::{TimeVal, TimeValLike};
use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, LazyBuffers, NextTimeout, Transport,
};

/// Connects every request to one Unix socket.
#[derive(Debug)]
pub(crate) struct UnixConnector {
    socket: PathBuf,
}

impl UnixConnector {
    pub(crate) fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_path_buf(),
        }
    }
}

/// Marks an I/O error that happened while connecting (so the client reports the socket as
/// unreachable rather than a failed exchange). It travels inside `ureq::Error::Io`.
#[derive(Debug)]
struct ConnectFailed(io::Error);

impl fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// `Ok(os error)` if `error` came from connecting, `Err(error)` unchanged otherwise.
pub(crate) fn connect_error(error: io::Error) -> Result<io::Error, io::Error> {
    if error
        .get_ref()
        .is_some_and(|inner| inner.is::<ConnectFailed>())
    {
        let kind = error.kind();
        match error
            .into_inner()
            .map(|inner| inner.downcast::<ConnectFailed>())
        {
            Some(Ok(failed)) => Ok(failed.0),
            _ => Err(io::Error::from(kind)),
        }
    } else {
        Err(error)
    }
}

impl<In: Transport> Connector<In> for UnixConnector {
    type Out = UnixTransport;

    fn connect(
        &self,
        details: &ConnectionDetails,
        _chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        let timeout = details.timeout;
        if timeout.after.is_zero() {
            return Err(ureq::Error::Timeout(timeout.reason));
        }
        let stream = match connect(&self.socket, timeout.not_zero().map(|left| *left)) {
            Ok(stream) => stream,
            Err(error) if error.kind() == io::ErrorKind::TimedOut => {
                return Err(ureq::Error::Timeout(timeout.reason));
            }
            Err(error) => {
                let kind = error.kind();
                return Err(ureq::Error::Io(io::Error::new(kind, ConnectFailed(error))));
            }
        };
        let config = details.config;
        Ok(Some(UnixTransport {
            stream,
            buffers: LazyBuffers::new(config.input_buffer_size(), config.output_buffer_size()),
        }))
    }
}

/// Connects to the stream socket at `path`, waiting at most `timeout` for the server to accept
/// the connection into its backlog.
pub(crate) fn connect(path: &Path, timeout: Option<Duration>) -> io::Result<UnixStream> {
    let address = UnixAddr::new(path)?;
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    if let Some(timeout) = timeout {
        // A zero timeout means "none" to the kernel: clamp to 1 ms.
        let micros = timeout.max(Duration::from_millis(1)).as_micros();
        let timeout = TimeVal::microseconds(i64::try_from(micros).unwrap_or(i64::MAX));
        socket::setsockopt(&fd, sockopt::SendTimeout, &timeout)?;
    }
    loop {
        match socket::connect(fd.as_raw_fd(), &address) {
            Ok(()) => return Ok(UnixStream::from(fd)),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN | Errno::EINPROGRESS) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the server did not accept the connection in time",
                ));
            }
            Err(errno) => return Err(errno.into()),
        }
    }
}

/// One connected Unix stream and ureq's buffers for it.
#[derive(Debug)]
pub(crate) struct UnixTransport {
    stream: UnixStream,
    buffers: LazyBuffers,
}

/// The time left for the next I/O step, or ureq's timeout error if none is left.
fn left(timeout: NextTimeout) -> Result<Option<Duration>, ureq::Error> {
    if timeout.after.is_zero() {
        Err(ureq::Error::Timeout(timeout.reason))
    } else {
        Ok(timeout.not_zero().map(|left| *left))
    }
}

fn timed_out(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

impl Transport for UnixTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        let timeout = timeout.for_write();
        self.stream.set_write_timeout(left(timeout)?)?;
        match self.stream.write_all(&self.buffers.output()[..amount]) {
            Ok(()) => Ok(()),
            Err(error) if timed_out(&error) => Err(ureq::Error::Timeout(timeout.reason)),
            Err(error) => Err(error.into()),
        }
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        let timeout = timeout.for_read();
        self.stream.set_read_timeout(left(timeout)?)?;
        loop {
            match self.stream.read(self.buffers.input_append_buf()) {
                Ok(amount) => {
                    self.buffers.input_appended(amount);
                    return Ok(amount > 0);
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) if timed_out(&error) => {
                    return Err(ureq::Error::Timeout(timeout.reason));
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    fn is_open(&mut self) -> bool {
        // Open means: nothing unasked-for is waiting and the peer has not closed.
        if self.stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut byte = [0];
        let open = matches!(
            self.stream.read(&mut byte),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock
        );
        open && self.stream.set_nonblocking(false).is_ok()
    }
}

/// Never resolves: the host in the URL is only the `Host` header; the connector dials the socket.
#[derive(Debug)]
pub(crate) struct NoResolve;

impl Resolver for NoResolve {
    fn resolve(
        &self,
        _uri: &Uri,
        _config: &Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        // ureq requires at least one address; the Unix connector ignores it.
        let mut addresses = self.empty();
        addresses.push(([127, 0, 0, 1], 80).into());
        Ok(addresses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn socket_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("br-uds-{}-{name}.sock", std::process::id()))
    }

    #[test]
    fn connects_and_talks() {
        let path = socket_path("ok");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind");
        let server = std::thread::spawn(move || {
            let (mut peer, _) = listener.accept().expect("accept");
            peer.write_all(b"hi").expect("write");
        });
        let mut stream = connect(&path, Some(Duration::from_secs(5))).expect("connect");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("read");
        assert_eq!(text, "hi");
        server.join().expect("server thread");
        std::fs::remove_file(&path).expect("cleanup");
    }

    #[test]
    fn reports_missing_socket_and_bad_paths() {
        let missing = connect(&socket_path("missing"), Some(Duration::from_secs(1)));
        assert_eq!(
            missing.map(|_| ()).map_err(|e| e.kind()),
            Err(io::ErrorKind::NotFound)
        );
        let long = Path::new("/tmp").join("x".repeat(200));
        let too_long = connect(&long, Some(Duration::from_secs(1)));
        assert!(too_long.is_err());
    }

    #[test]
    fn a_full_backlog_times_out_instead_of_hanging() {
        let path = socket_path("backlog");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind");
        // Never accept: connections queue until the backlog is full, then connect(2) would
        // block; the send timeout bounds it. The work is bounded (at most 10,000 connections);
        // the loop runs aside so that a connect that ignored its timeout fails this test instead
        // of hanging it (the deadline only stops that hang).
        let dial = path.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            let outcome = loop {
                match connect(&dial, Some(Duration::from_millis(100))) {
                    Ok(stream) if held.len() < 10_000 => held.push(stream),
                    Ok(_) => break None,
                    Err(error) => break Some(error),
                }
            };
            let _ = tx.send((outcome, held));
        });
        let (outcome, held) = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("timed out waiting for a connect to a full backlog to time out");
        let error = outcome.expect("the backlog never filled");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
        drop((held, listener));
        std::fs::remove_file(&path).expect("cleanup");
    }

    #[test]
    fn connect_errors_are_recognised() {
        let marked = io::Error::new(
            io::ErrorKind::NotFound,
            ConnectFailed(io::Error::from(io::ErrorKind::NotFound)),
        );
        assert_eq!(
            connect_error(marked).map(|e| e.kind()).ok(),
            Some(io::ErrorKind::NotFound)
        );
        assert!(connect_error(io::Error::from(io::ErrorKind::BrokenPipe)).is_err());
    }
}
