//! HTTP/1.1 message framing over any byte stream, shared by the API client and the API server
//! emulator so that both ends agree on one small, bounded reading of the protocol.
//!
//! It covers what the Bottlerocket API uses: a request line or status line, headers, and a body
//! delimited by `Content-Length`, `Transfer-Encoding: chunked`, or (responses only) end of
//! stream. Every read is bounded: line length, header count and body size.
//!
//! Not covered: pipelining beyond sequential keep-alive, trailers (read and dropped), `Upgrade`
//! (the API's `/exec` WebSocket), compression.

use std::fmt;
use std::io::{self, BufRead, Read, Write};

/// Longest accepted start line or header line, in bytes (actix's default is similar).
pub(crate) const MAX_LINE: usize = 8 * 1024;
/// Most header lines accepted in one message.
pub(crate) const MAX_HEADERS: usize = 100;

/// A parsed start line plus headers; header names are lower-cased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) start_line: String,
    pub(crate) headers: Vec<(String, String)>,
}

/// Why a message could not be read.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The stream failed (including timeouts, which keep their `io::ErrorKind`).
    Io(io::Error),
    /// The bytes are not HTTP/1.1 as understood here.
    Malformed(String),
    /// The body is longer than the caller's limit.
    TooLarge { limit: usize },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(source) => write!(f, "{source}"),
            Self::Malformed(reason) => f.write_str(reason),
            Self::TooLarge { limit } => write!(f, "body exceeds the limit of {limit} bytes"),
        }
    }
}

impl From<io::Error> for FrameError {
    fn from(source: io::Error) -> Self {
        Self::Io(source)
    }
}

impl Head {
    /// The first value of header `name` (lower-case), trimmed.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header == name)
            .map(|(_, value)| value.as_str())
    }

    fn is_chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|value| value.to_ascii_lowercase().contains("chunked"))
    }

    fn content_length(&self) -> Result<Option<usize>, FrameError> {
        match self.header("content-length") {
            None => Ok(None),
            Some(value) => value
                .parse::<usize>()
                .map(Some)
                .map_err(|_| FrameError::Malformed(format!("invalid Content-Length '{value}'"))),
        }
    }
}

/// Builds the bytes of a request. Every request carries `Host: localhost` (the server ignores
/// it, HTTP/1.1 requires it), `Connection: close`, and `Content-Type: application/json` as
/// apiclient sends it; `Content-Length` is sent with a body and on bodiless POST/PATCH/PUT.
pub(crate) fn encode_request(method: &str, target: &str, body: Option<&[u8]>) -> Vec<u8> {
    let mut out = format!(
        "{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Accept: application/json\r\nContent-Type: application/json\r\n"
    );
    match body {
        Some(body) => out.push_str(&format!("Content-Length: {}\r\n", body.len())),
        None if matches!(method, "POST" | "PATCH" | "PUT") => out.push_str("Content-Length: 0\r\n"),
        None => {}
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body.unwrap_or_default());
    bytes
}

/// Reads one response; returns the status code and the body (at most `limit` bytes).
/// Interim `1xx` responses are skipped; `204`, `304` and responses to `HEAD` have no body.
pub(crate) fn read_response(
    reader: &mut impl BufRead,
    method: &str,
    limit: usize,
) -> Result<(u16, Vec<u8>), FrameError> {
    loop {
        let head = read_head(reader)?.ok_or_else(|| {
            FrameError::Malformed("connection closed before a response arrived".to_string())
        })?;
        let status = parse_status_line(&head.start_line)?;
        if (100..200).contains(&status) {
            continue;
        }
        if status == 204 || status == 304 || method == "HEAD" {
            return Ok((status, Vec::new()));
        }
        let body = if head.is_chunked() {
            read_chunked(reader, limit)?
        } else if let Some(length) = head.content_length()? {
            read_exact_body(reader, length, limit)?
        } else {
            read_to_end_limited(reader, limit)?
        };
        return Ok((status, body));
    }
}

/// Reads the head of the next request; `Ok(None)` when the peer closed the connection cleanly
/// between requests.
pub(crate) fn read_request_head(
    reader: &mut impl BufRead,
) -> Result<Option<(String, String, Head)>, FrameError> {
    let Some(head) = read_head(reader)? else {
        return Ok(None);
    };
    let mut parts = head.start_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(FrameError::Malformed(format!(
            "invalid request line '{}'",
            head.start_line
        )));
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Err(FrameError::Malformed(format!(
            "invalid request line '{}'",
            head.start_line
        )));
    }
    Ok(Some((method.to_string(), target.to_string(), head)))
}

/// Reads a request body as framed by `head` (no framing headers = empty body).
pub(crate) fn read_request_body(
    reader: &mut impl BufRead,
    head: &Head,
    limit: usize,
) -> Result<Vec<u8>, FrameError> {
    if head.is_chunked() {
        read_chunked(reader, limit)
    } else if let Some(length) = head.content_length()? {
        read_exact_body(reader, length, limit)
    } else {
        Ok(Vec::new())
    }
}

/// Writes a complete response. `204` gets neither body nor `Content-Length`, as actix sends it.
pub(crate) fn write_response(
    writer: &mut impl Write,
    status: u16,
    content_type: &str,
    body: &[u8],
    close: bool,
) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason_phrase(status));
    if status != 204 {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
        if !body.is_empty() {
            head.push_str(&format!("content-type: {content_type}\r\n"));
        }
    }
    if close {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    writer.write_all(head.as_bytes())?;
    if status != 204 {
        writer.write_all(body)?;
    }
    writer.flush()
}

/// The standard reason phrase for the status codes the emulator sends.
pub(crate) fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        _ => "Unknown",
    }
}

// Implementation note: lines are read through `take` so that a peer sending an endless line
// costs at most MAX_LINE bytes of memory.

fn read_head(reader: &mut impl BufRead) -> Result<Option<Head>, FrameError> {
    let Some(start_line) = read_line(reader)? else {
        return Ok(None);
    };
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader)?
            .ok_or_else(|| FrameError::Malformed("connection closed inside the headers".into()))?;
        if line.is_empty() {
            break;
        }
        if headers.len() == MAX_HEADERS {
            return Err(FrameError::Malformed(format!(
                "more than {MAX_HEADERS} header lines"
            )));
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| FrameError::Malformed(format!("invalid header line '{line}'")))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    Ok(Some(Head {
        start_line,
        headers,
    }))
}

/// One CRLF- (or LF-) terminated line without its terminator; `None` at a clean end of stream.
fn read_line(reader: &mut impl BufRead) -> Result<Option<String>, FrameError> {
    let mut line = Vec::new();
    reader
        .by_ref()
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(FrameError::Malformed(if line.len() > MAX_LINE {
            format!("line longer than {MAX_LINE} bytes")
        } else {
            "connection closed mid-line".to_string()
        }));
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line)
        .map(Some)
        .map_err(|_| FrameError::Malformed("line is not UTF-8".to_string()))
}

fn parse_status_line(line: &str) -> Result<u16, FrameError> {
    let mut parts = line.splitn(3, ' ');
    match (parts.next(), parts.next()) {
        (Some(version), Some(code)) if version.starts_with("HTTP/1.") && code.len() == 3 => code
            .parse::<u16>()
            .map_err(|_| FrameError::Malformed(format!("invalid status line '{line}'"))),
        _ => Err(FrameError::Malformed(format!(
            "invalid status line '{line}'"
        ))),
    }
}

fn read_exact_body(
    reader: &mut impl Read,
    length: usize,
    limit: usize,
) -> Result<Vec<u8>, FrameError> {
    if length > limit {
        return Err(FrameError::TooLarge { limit });
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).map_err(|source| {
        if source.kind() == io::ErrorKind::UnexpectedEof {
            FrameError::Malformed(format!("body shorter than its Content-Length of {length}"))
        } else {
            FrameError::Io(source)
        }
    })?;
    Ok(body)
}

fn read_to_end_limited(reader: &mut impl Read, limit: usize) -> Result<Vec<u8>, FrameError> {
    let mut body = Vec::new();
    reader.take(limit as u64 + 1).read_to_end(&mut body)?;
    if body.len() > limit {
        return Err(FrameError::TooLarge { limit });
    }
    Ok(body)
}

fn read_chunked(reader: &mut impl BufRead, limit: usize) -> Result<Vec<u8>, FrameError> {
    let mut body = Vec::new();
    loop {
        let line = read_line(reader)?
            .ok_or_else(|| FrameError::Malformed("connection closed inside a chunk".into()))?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| FrameError::Malformed(format!("invalid chunk size '{line}'")))?;
        if size == 0 {
            break;
        }
        if size > limit.saturating_sub(body.len()) {
            return Err(FrameError::TooLarge { limit });
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        if read_line(reader)?.as_deref() != Some("") {
            return Err(FrameError::Malformed(
                "chunk not followed by CRLF".to_string(),
            ));
        }
    }
    // Trailer section: header lines up to an empty line, dropped.
    for _ in 0..=MAX_HEADERS {
        match read_line(reader)? {
            None => return Ok(body),
            Some(line) if line.is_empty() => return Ok(body),
            Some(_) => {}
        }
    }
    Err(FrameError::Malformed(format!(
        "more than {MAX_HEADERS} trailer lines"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(raw: &str, limit: usize) -> Result<(u16, Vec<u8>), FrameError> {
        read_response(&mut raw.as_bytes(), "GET", limit)
    }

    #[test]
    fn reads_content_length_body() {
        let (status, body) =
            response("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}extra", 10).expect("ok");
        assert_eq!((status, body.as_slice()), (200, &b"{}"[..]));
    }

    #[test]
    fn reads_chunked_body_with_extensions_and_trailers() {
        let raw = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                   4;ext=1\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\nX-Trailer: y\r\n\r\n";
        let (_, body) = response(raw, 100).expect("ok");
        assert_eq!(body, b"{\"a\":1}");
    }

    #[test]
    fn reads_until_eof_without_framing() {
        let (_, body) = response("HTTP/1.0 200 OK\r\n\r\nhello", 10).expect("ok");
        assert_eq!(body, b"hello");
    }

    #[test]
    fn skips_interim_and_bodiless_statuses() {
        let raw =
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(response(raw, 10).expect("ok"), (204, Vec::new()));
    }

    #[test]
    fn enforces_limits() {
        let too_long = "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world";
        assert!(matches!(
            response(too_long, 10),
            Err(FrameError::TooLarge { limit: 10 })
        ));
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n";
        assert!(matches!(
            response(chunked, 10),
            Err(FrameError::TooLarge { limit: 10 })
        ));
        let eof = "HTTP/1.1 200 OK\r\n\r\nhello world";
        assert!(matches!(
            response(eof, 10),
            Err(FrameError::TooLarge { limit: 10 })
        ));
        let long_line = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(MAX_LINE));
        assert!(matches!(
            response(&long_line, 10),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn rejects_malformed_responses() {
        for raw in [
            "",
            "garbage\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "HTTP/1.1 200 OK\r\nno-colon\r\n\r\n",
        ] {
            assert!(
                matches!(response(raw, 100), Err(FrameError::Malformed(_))),
                "accepted {raw:?}"
            );
        }
    }

    #[test]
    fn encodes_requests() {
        let bytes = encode_request("PATCH", "/settings?tx=a", Some(b"{}"));
        let text = String::from_utf8(bytes).expect("utf8");
        assert!(text.starts_with("PATCH /settings?tx=a HTTP/1.1\r\nHost: localhost\r\n"));
        assert!(text.contains("Content-Type: application/json\r\n"));
        assert!(text.contains("Connection: close\r\n"));
        assert!(text.ends_with("Content-Length: 2\r\n\r\n{}"));
        let post = String::from_utf8(encode_request("POST", "/tx/commit", None)).expect("utf8");
        assert!(post.ends_with("Content-Length: 0\r\n\r\n"));
        let get = String::from_utf8(encode_request("GET", "/os", None)).expect("utf8");
        assert!(!get.contains("Content-Length"));
    }

    #[test]
    fn round_trips_a_request() {
        let raw = encode_request("PATCH", "/settings", Some(b"{\"motd\":\"x\"}"));
        let mut reader = raw.as_slice();
        let (method, target, head) = read_request_head(&mut reader).expect("ok").expect("some");
        let body = read_request_body(&mut reader, &head, 100).expect("body");
        assert_eq!((method.as_str(), target.as_str()), ("PATCH", "/settings"));
        assert_eq!(head.header("content-type"), Some("application/json"));
        assert_eq!(body, b"{\"motd\":\"x\"}");
        assert!(read_request_head(&mut reader).expect("ok").is_none());
    }

    #[test]
    fn writes_responses_like_actix() {
        let mut out = Vec::new();
        write_response(&mut out, 204, "text/plain", b"ignored", false).expect("write");
        assert_eq!(out, b"HTTP/1.1 204 No Content\r\n\r\n");
        let mut out = Vec::new();
        write_response(&mut out, 422, "text/plain", b"no", true).expect("write");
        let (status, body) = read_response(&mut out.as_slice(), "POST", 10).expect("read");
        assert_eq!((status, body.as_slice()), (422, &b"no"[..]));
    }
}
