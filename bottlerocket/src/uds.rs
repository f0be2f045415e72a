//! Connecting to a Unix-domain socket with a timeout, which `std` does not offer.
//!
//! A blocking `connect(2)` on a Unix stream socket whose listener's backlog is full (an API
//! server that has stopped accepting) waits indefinitely. Linux bounds that wait by the socket's
//! send timeout (`SO_SNDTIMEO`), so the socket is created first, given its timeout, and only then
//! connected; a timed-out connect fails with `EAGAIN`, reported here as `ErrorKind::TimedOut`.

use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Connects to the stream socket at `path`, waiting at most `timeout` for the server to accept
/// the connection into its backlog. The returned stream keeps `timeout` as its write timeout.
pub(crate) fn connect(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    let path_bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid (empty) value.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path_bytes.is_empty()
        || path_bytes.contains(&0)
        || path_bytes.len() >= address.sun_path.len()
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path must be 1 to {} bytes without NUL",
                address.sun_path.len() - 1
            ),
        ));
    }
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (slot, byte) in address.sun_path.iter_mut().zip(path_bytes) {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: plain syscall; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket owned by nothing else; the stream closes it on drop.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    // std sets SO_SNDTIMEO here; a zero timeout would be rejected, so clamp to 1 ms.
    stream.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    let length = std::mem::offset_of!(libc::sockaddr_un, sun_path) + path_bytes.len() + 1;
    loop {
        // SAFETY: `address` is a valid sockaddr_un of at least `length` bytes.
        let result = unsafe {
            libc::connect(
                fd,
                (&raw const address).cast::<libc::sockaddr>(),
                length as libc::socklen_t,
            )
        };
        if result == 0 {
            return Ok(stream);
        }
        let error = io::Error::last_os_error();
        match error.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(code) if code == libc::EAGAIN || code == libc::EINPROGRESS => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the server did not accept the connection in time",
                ));
            }
            _ => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    fn socket_path(name: &str) -> std::path::PathBuf {
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
        let mut stream = connect(&path, Duration::from_secs(5)).expect("connect");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("read");
        assert_eq!(text, "hi");
        server.join().expect("server thread");
        std::fs::remove_file(&path).expect("cleanup");
    }

    #[test]
    fn reports_missing_socket_and_bad_paths() {
        let missing = connect(&socket_path("missing"), Duration::from_secs(1));
        assert_eq!(
            missing.map(|_| ()).map_err(|e| e.kind()),
            Err(io::ErrorKind::NotFound)
        );
        let long = Path::new("/tmp").join("x".repeat(200));
        let too_long = connect(&long, Duration::from_secs(1));
        assert_eq!(
            too_long.map(|_| ()).map_err(|e| e.kind()),
            Err(io::ErrorKind::InvalidInput)
        );
    }
}
