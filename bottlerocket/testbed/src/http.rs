//! The API server emulator's HTTP/1.1 server side: read a request, write a response. Only the
//! test doubles use it; the client (`bottlerocket` crate) speaks HTTP through ureq, so the two
//! ends of the socket do not share a parser. kubelet-sim's kubelet API serves with it too, and
//! the k8s-sim kube-vip stand-in reads the real kube-apiserver's responses with
//! [`read_response`].
//!
//! It covers what the Bottlerocket API uses: a request line, headers, and a body delimited by
//! `Content-Length` or `Transfer-Encoding: chunked`. Every read is bounded: line length, header
//! count and body size.
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

/// Reads a complete response: its status code, head and body (chunked, `Content-Length`, or up
/// to the end of the stream).
pub(crate) fn read_response(
    reader: &mut impl BufRead,
    limit: usize,
) -> Result<(u16, Head, Vec<u8>), FrameError> {
    let head = read_head(reader)?
        .ok_or_else(|| FrameError::Malformed("connection closed before a response".into()))?;
    let status = head
        .start_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| {
            FrameError::Malformed(format!("invalid status line '{}'", head.start_line))
        })?;
    let body = if head.is_chunked() {
        read_chunked(reader, limit)?
    } else if let Some(length) = head.content_length()? {
        read_exact_body(reader, length, limit)?
    } else {
        let mut body = Vec::new();
        reader.take(limit as u64 + 1).read_to_end(&mut body)?;
        if body.len() > limit {
            return Err(FrameError::TooLarge { limit });
        }
        body
    };
    Ok((status, head, body))
}

/// Writes a complete response, with a `content-type` header only when `content_type` is given
/// (the API server's own errors have none). A `204` never gets a `Content-Length`, as actix
/// sends it; a body given with a 204 is written after the head all the same, unframed: what the
/// real server does for `POST /tx/apply` (`NoContent().json(())` sends `null`), which corrupts
/// the next response on a kept-alive connection.
pub(crate) fn write_response(
    writer: &mut impl Write,
    status: u16,
    content_type: Option<&str>,
    body: &[u8],
    close: bool,
) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason_phrase(status));
    if status != 204 {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    if let Some(content_type) = content_type {
        head.push_str(&format!("content-type: {content_type}\r\n"));
    }
    if close {
        head.push_str("connection: close\r\n");
    }
    head.push_str("\r\n");
    writer.write_all(head.as_bytes())?;
    writer.write_all(body)?;
    writer.flush()
}

/// The standard reason phrase for the status codes the emulator sends.
pub(crate) fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
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

    fn request(raw: &str, limit: usize) -> Result<(String, String, Vec<u8>), FrameError> {
        let mut reader = raw.as_bytes();
        let (method, target, head) = read_request_head(&mut reader)?.expect("a request");
        let body = read_request_body(&mut reader, &head, limit)?;
        Ok((method, target, body))
    }

    #[test]
    fn reads_content_length_and_chunked_bodies() {
        let (method, target, body) = request(
            "PATCH /settings HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}extra",
            10,
        )
        .expect("ok");
        assert_eq!(
            (method.as_str(), target.as_str(), body.as_slice()),
            ("PATCH", "/settings", &b"{}"[..])
        );
        let chunked = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
                       4;ext=1\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\nX-Trailer: y\r\n\r\n";
        assert_eq!(request(chunked, 100).expect("ok").2, b"{\"a\":1}");
        let bodiless = "GET /os HTTP/1.1\r\nHost: localhost\r\n\r\n";
        assert!(request(bodiless, 10).expect("ok").2.is_empty());
    }

    #[test]
    fn enforces_limits() {
        let too_long = "PATCH /s HTTP/1.1\r\nContent-Length: 11\r\n\r\nhello world";
        assert!(matches!(
            request(too_long, 10),
            Err(FrameError::TooLarge { limit: 10 })
        ));
        let chunked = "PATCH /s HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
                       6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n";
        assert!(matches!(
            request(chunked, 10),
            Err(FrameError::TooLarge { limit: 10 })
        ));
        let long_line = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_LINE));
        assert!(matches!(
            request(&long_line, 10),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn rejects_malformed_requests() {
        for raw in [
            "garbage\r\n\r\n",
            "GET noslash HTTP/1.1\r\n\r\n",
            "GET / SSH-2.0\r\n\r\n",
            "PATCH / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            "PATCH / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
            "PATCH / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "GET / HTTP/1.1\r\nno-colon\r\n\r\n",
        ] {
            assert!(
                matches!(request(raw, 100), Err(FrameError::Malformed(_))),
                "accepted {raw:?}"
            );
        }
        assert!(
            read_request_head(&mut &b""[..])
                .expect("clean end")
                .is_none()
        );
    }

    #[test]
    fn writes_responses_like_actix() {
        let mut out = Vec::new();
        write_response(&mut out, 204, None, b"", false).expect("write");
        assert_eq!(out, b"HTTP/1.1 204 No Content\r\n\r\n");
        let mut out = Vec::new();
        write_response(&mut out, 204, Some("application/json"), b"null", false).expect("write");
        assert_eq!(
            out,
            b"HTTP/1.1 204 No Content\r\ncontent-type: application/json\r\n\r\nnull"
        );
        let mut out = Vec::new();
        write_response(&mut out, 422, None, b"no", true).expect("write");
        assert_eq!(
            out,
            b"HTTP/1.1 422 Unprocessable Entity\r\ncontent-length: 2\r\n\
              connection: close\r\n\r\nno"
        );
        let mut out = Vec::new();
        write_response(&mut out, 400, Some("text/plain"), b"no", false).expect("write");
        assert_eq!(
            out,
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nno"
        );
    }

    #[test]
    fn reads_responses_framed_three_ways() {
        let read = |raw: &str| {
            let mut reader = raw.as_bytes();
            read_response(&mut reader, 100).map(|(status, _, body)| (status, body))
        };
        assert_eq!(
            read("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}x").unwrap(),
            (200, b"{}".to_vec())
        );
        assert_eq!(
            read("HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
                .unwrap(),
            (201, b"{}".to_vec())
        );
        assert_eq!(
            read("HTTP/1.0 404 Not Found\r\n\r\nnot here").unwrap(),
            (404, b"not here".to_vec())
        );
        assert!(read("HTTP/2 200\r\n\r\n").is_err());
        assert!(matches!(
            read(&format!("HTTP/1.1 200 OK\r\n\r\n{}", "x".repeat(101))),
            Err(FrameError::TooLarge { .. })
        ));
    }
}
