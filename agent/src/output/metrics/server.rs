//! The `/metrics` server on `std::net`: one accepting thread, a short-lived thread per
//! connection (at most `MAX_CONNECTIONS`, the oldest closed for a new one), bounded requests
//! and timeouts.

use super::*;
use crate::node::Node;
use crate::node::inventory::{self};
use crate::sys::clock::SharedClock;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server reads: the node root (for fresh certificate gauges), the counters, and the
/// clock the gauges are read at.
#[derive(Debug)]
pub struct Shared {
    pub root: PathBuf,
    pub counters: Mutex<Counters>,
    pub clock: SharedClock,
}

impl Shared {
    pub fn new(root: &Path, clock: SharedClock) -> Arc<Shared> {
        Arc::new(Shared {
            root: root.to_path_buf(),
            counters: Mutex::new(Counters {
                started_unix: Some(clock.now()),
                ..Counters::default()
            }),
            clock,
        })
    }

    /// The whole page: certificate gauges read now (their failed reads counted), then the
    /// counters, then the restarts owed and the certificates' due dates read now.
    ///
    /// The counters are copied before the files are read: a pass that ends between the two
    /// reads then shows its renewed files beside the counters of before it, never a counted
    /// pass beside the files it replaced (a page is never older on disk than in its counts).
    pub fn page(&self) -> String {
        let mut counters = Counters::default();
        self.update(|c| counters = c.clone());
        let now = self.clock.now();
        // Found again at every scrape: the node's files change while the server runs.
        let inv = inventory::take(&Node::discover(&self.root), now, 0);
        let (mut page, failures) = certificate_read(&self.root, &inv, now);
        self.update(|c| c.count_read_failures(&failures));
        counters.count_read_failures(&failures);
        page.push_str(&counters.render_source_errors());
        page.push_str(&counters.render());
        page.push_str(&node_state(&self.root, &inv, counters.within_seconds));
        page
    }

    /// Runs `f` on the counters.
    pub fn update(&self, f: impl FnOnce(&mut Counters)) {
        match self.counters.lock() {
            Ok(mut c) => f(&mut c),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }
}

/// The connections being served, oldest first: (id, when accepted, a handle to close it).
#[derive(Default)]
struct Connections {
    next: u64,
    open: Vec<(u64, std::time::Instant, TcpStream)>,
}

/// Binds `addr` and serves `/metrics` from a background thread. Errors only on bind.
///
/// At most [`MAX_CONNECTIONS`] are served at once. When all are taken, the oldest gives its
/// slot to the new one (it is closed): a scrape takes milliseconds, so the oldest is a client
/// that is slow on purpose or stuck, and scrapes never wait behind slow clients (issue 30.6).
/// Each connection has [`IO_TIMEOUT`] in all to send its request and take the answer, however
/// it trickles.
pub fn serve(addr: SocketAddr, shared: Arc<Shared>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let conns: Arc<Mutex<Connections>> = Arc::default();
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let Ok(handle) = stream.try_clone() else {
                    continue;
                };
                let id = {
                    let mut c = conns.lock().unwrap_or_else(|p| p.into_inner());
                    if c.open.len() >= MAX_CONNECTIONS {
                        let (_, since, oldest) = c.open.remove(0);
                        log::debug!(
                            "metrics: closing a connection open for {:?} to serve a new one",
                            since.elapsed()
                        );
                        let _ = oldest.shutdown(std::net::Shutdown::Both);
                    }
                    c.next += 1;
                    let id = c.next;
                    c.open.push((id, std::time::Instant::now(), handle));
                    id
                };
                let (shared, mine) = (Arc::clone(&shared), Arc::clone(&conns));
                let done = move |conns: &Mutex<Connections>| {
                    let mut c = conns.lock().unwrap_or_else(|p| p.into_inner());
                    c.open.retain(|(i, _, _)| *i != id);
                };
                let spawned = std::thread::Builder::new()
                    .name("metrics-conn".into())
                    .spawn(move || {
                        if let Err(e) = answer(stream, &shared) {
                            log::debug!("metrics: connection ended: {e}");
                        }
                        done(&mine);
                    });
                if spawned.is_err() {
                    let mut c = conns.lock().unwrap_or_else(|p| p.into_inner());
                    c.open.retain(|(i, _, _)| *i != id);
                }
            }
        })?;
    Ok(bound)
}

/// The time left before `deadline`, or a timeout error when none is left.
fn left(deadline: std::time::Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the request and its answer took longer than the metrics server allows",
        ))
    } else {
        Ok(left)
    }
}

/// Reads one request and answers it, the whole exchange bounded by [`IO_TIMEOUT`] (not each
/// read: a client sending a byte now and then would otherwise hold its slot for ever).
fn answer(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == buf.len() {
            return respond(
                &mut stream,
                deadline,
                "431 Request Header Fields Too Large",
                "",
                "",
            );
        }
        stream.set_read_timeout(Some(left(deadline)?))?;
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(());
        }
        len += n;
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let page = shared.page();
            let body = if method == "HEAD" { "" } else { page.as_str() };
            respond_len(
                &mut stream,
                deadline,
                "200 OK",
                CONTENT_TYPE,
                body,
                page.len(),
            )
        }
        ("GET" | "HEAD", "/") => respond(
            &mut stream,
            deadline,
            "200 OK",
            "text/plain; charset=utf-8",
            "certrotor: metrics at /metrics\n",
        ),
        ("GET" | "HEAD", _) => respond(
            &mut stream,
            deadline,
            "404 Not Found",
            "text/plain",
            "not found\n",
        ),
        _ => respond(
            &mut stream,
            deadline,
            "405 Method Not Allowed",
            "text/plain",
            "use GET\n",
        ),
    }
}

fn respond(
    stream: &mut TcpStream,
    deadline: std::time::Instant,
    status: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    respond_len(stream, deadline, status, ctype, body, body.len())
}

fn respond_len(
    stream: &mut TcpStream,
    deadline: std::time::Instant,
    status: &str,
    ctype: &str,
    body: &str,
    len: usize,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    // Written in pieces, each bounded by the time left: a client that reads slowly cannot hold
    // the connection past the deadline either.
    for part in [head.as_bytes(), body.as_bytes()] {
        for chunk in part.chunks(16 * 1024) {
            stream.set_write_timeout(Some(left(deadline)?))?;
            stream.write_all(chunk)?;
        }
    }
    stream.flush()
}
