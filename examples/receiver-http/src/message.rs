//! A minimal, strict HTTP/1.1 server-side parser and writer: request line, headers,
//! `Content-Length` or `Transfer-Encoding: chunked` bodies, `Expect: 100-continue`,
//! keep-alive and `Connection: close`. Anything it does not understand is refused
//! with a 4xx/5xx and the connection is closed. Responses are written whole
//! (`Content-Length`) or as a stream of chunks (`Transfer-Encoding: chunked`, or
//! close-delimited for an HTTP/1.0 client), which is how SSE is sent.

use std::io::{self, BufRead, Read, Write};

/// Longest request line or header line accepted.
const MAX_LINE: u64 = 8 * 1024;
/// Most header lines accepted in one request.
const MAX_HEADERS: usize = 100;

/// One parsed request.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    pub target: String,
    /// `0` for HTTP/1.0, `1` for HTTP/1.1.
    pub minor: u8,
    /// Header names lowercased, values trimmed, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the client lets the connection stay open after the response.
    pub fn keep_alive(&self) -> bool {
        let tokens = |wanted: &str| {
            self.headers
                .iter()
                .filter(|(n, _)| n == "connection")
                .flat_map(|(_, v)| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case(wanted))
        };
        if self.minor >= 1 {
            !tokens("close")
        } else {
            tokens("keep-alive")
        }
    }
}

/// Why no request could be read.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection (or went idle) between requests.
    Closed,
    /// The socket failed mid-request.
    Io(io::Error),
    /// The request is malformed or unsupported: answer with this status and close.
    Reject(u16, &'static str),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Reads one line (up to and including `\n`), without the line ending.
/// `Ok(None)` is a clean end of stream before any byte.
fn read_line<R: BufRead>(r: &mut R) -> Result<Option<String>, ReadError> {
    let mut buf = Vec::new();
    let n = r.by_ref().take(MAX_LINE + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        if buf.len() as u64 > MAX_LINE {
            return Err(ReadError::Reject(431, "line too long"));
        }
        return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()));
    }
    buf.pop();
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| ReadError::Reject(400, "request line or header is not UTF-8"))
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Reads one request. `w` is used only to send `100 Continue` when asked for.
pub fn read_request<R: BufRead, W: Write>(
    r: &mut R,
    w: &mut W,
    max_body: usize,
) -> Result<Request, ReadError> {
    // RFC 9112 2.2: ignore a few empty lines before the request line.
    let mut line = None;
    for _ in 0..4 {
        match read_line(r) {
            Ok(None) => return Err(ReadError::Closed),
            // A timeout or reset while idle between requests is a close, not an error.
            Err(ReadError::Io(_)) => return Err(ReadError::Closed),
            Err(e) => return Err(e),
            Ok(Some(l)) if l.is_empty() => continue,
            Ok(Some(l)) => {
                line = Some(l);
                break;
            }
        }
    }
    let line = line.ok_or(ReadError::Reject(400, "no request line"))?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Reject(400, "malformed request line"));
    };
    if !is_token(method) || target.is_empty() {
        return Err(ReadError::Reject(400, "malformed request line"));
    }
    let minor = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        _ => {
            return Err(ReadError::Reject(
                505,
                "only HTTP/1.0 and HTTP/1.1 are supported",
            ));
        }
    };

    let mut headers = Vec::new();
    loop {
        let Some(line) = read_line(r)? else {
            return Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()));
        };
        if line.is_empty() {
            break;
        }
        if headers.len() >= MAX_HEADERS {
            return Err(ReadError::Reject(431, "too many headers"));
        }
        if line.starts_with([' ', '\t']) {
            return Err(ReadError::Reject(400, "obsolete header line folding"));
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(ReadError::Reject(400, "header line without a colon"));
        };
        if !is_token(name) {
            return Err(ReadError::Reject(400, "malformed header name"));
        }
        headers.push((
            name.to_ascii_lowercase(),
            value.trim_matches([' ', '\t']).to_string(),
        ));
    }
    let mut req = Request {
        method: method.to_string(),
        target: target.to_string(),
        minor,
        headers,
        body: Vec::new(),
    };

    let chunked = match req.header("transfer-encoding") {
        None => false,
        Some(te) if te.eq_ignore_ascii_case("chunked") => true,
        Some(_) => return Err(ReadError::Reject(501, "unsupported Transfer-Encoding")),
    };
    let mut lengths = req
        .headers
        .iter()
        .filter(|(n, _)| n == "content-length")
        .map(|(_, v)| v.parse::<u64>());
    let length = match (lengths.next(), lengths.next()) {
        (None, _) => None,
        (Some(Ok(n)), None) => Some(n),
        _ => return Err(ReadError::Reject(400, "bad Content-Length")),
    };
    if chunked && length.is_some() {
        return Err(ReadError::Reject(
            400,
            "both Content-Length and Transfer-Encoding",
        ));
    }
    if length.is_some_and(|n| n > max_body as u64) {
        return Err(ReadError::Reject(413, "body too large"));
    }
    let has_body = chunked || length.is_some_and(|n| n > 0);
    if has_body
        && minor >= 1
        && req
            .header("expect")
            .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"))
    {
        w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        w.flush()?;
    }

    if chunked {
        req.body = read_chunked(r, max_body)?;
    } else if let Some(n) = length {
        let mut body = vec![0; n as usize];
        r.read_exact(&mut body)?;
        req.body = body;
    }
    Ok(req)
}

fn read_chunked<R: BufRead>(r: &mut R, max_body: usize) -> Result<Vec<u8>, ReadError> {
    let eof = || ReadError::Io(io::ErrorKind::UnexpectedEof.into());
    let mut body = Vec::new();
    loop {
        let line = read_line(r)?.ok_or_else(eof)?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| ReadError::Reject(400, "bad chunk size"))?;
        if size == 0 {
            break;
        }
        if body.len().saturating_add(size) > max_body {
            return Err(ReadError::Reject(413, "body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        if !read_line(r)?.ok_or_else(eof)?.is_empty() {
            return Err(ReadError::Reject(400, "chunk not followed by CRLF"));
        }
    }
    // Trailer section: ignored, up to the empty line.
    for _ in 0..=MAX_HEADERS {
        if read_line(r)?.ok_or_else(eof)?.is_empty() {
            return Ok(body);
        }
    }
    Err(ReadError::Reject(431, "too many trailers"))
}

/// One response to write.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(status: u16, value: &serde_json::Value) -> Response {
        Response {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: serde_json::to_vec(value).unwrap_or_default(),
        }
    }

    /// `{"error": message}` with `status`.
    pub fn error(status: u16, message: &str) -> Response {
        Response::json(status, &serde_json::json!({ "error": message }))
    }

    /// An empty body with `status`.
    pub fn empty(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Response {
        self.headers.push((name.into(), value.into()));
        self
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        529 => "Site Overloaded",
        _ => "Status",
    }
}

/// Status line and headers, ending with the blank line.
fn head(resp: &Response, framing: &str, keep_alive: bool) -> String {
    let mut out = format!("HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status));
    for (name, value) in &resp.headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str(framing);
    if !keep_alive {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    out
}

/// Writes `resp` in one `write_all`; adds `Content-Length` and, when the connection
/// will be closed afterwards, `Connection: close`.
pub fn write_response<W: Write>(w: &mut W, resp: &Response, keep_alive: bool) -> io::Result<()> {
    let framing = format!("Content-Length: {}\r\n", resp.body.len());
    let mut bytes = head(resp, &framing, keep_alive).into_bytes();
    bytes.extend_from_slice(&resp.body);
    w.write_all(&bytes)?;
    w.flush()
}

/// Writes the head of `resp` announcing its full `Content-Length`, then only the
/// first `send` bytes of its body: the client sees the body end early when the
/// connection is closed afterwards.
pub fn write_truncated<W: Write>(w: &mut W, resp: &Response, send: usize) -> io::Result<()> {
    let framing = format!("Content-Length: {}\r\n", resp.body.len());
    let mut bytes = head(resp, &framing, false).into_bytes();
    bytes.extend_from_slice(&resp.body[..send.min(resp.body.len())]);
    w.write_all(&bytes)?;
    w.flush()
}

/// A response body sent piece by piece: `Transfer-Encoding: chunked` for an HTTP/1.1
/// client, close-delimited for an HTTP/1.0 one. Each [`StreamWriter::send`] is one
/// chunk and one flush (one TCP write, as `TCP_NODELAY` is set).
pub struct StreamWriter<'a, W: Write> {
    w: &'a mut W,
    chunked: bool,
}

impl<'a, W: Write> StreamWriter<'a, W> {
    /// Writes the head of `resp` (its body is ignored).
    pub fn start(
        w: &'a mut W,
        resp: &Response,
        minor: u8,
        keep_alive: bool,
    ) -> io::Result<StreamWriter<'a, W>> {
        let chunked = minor >= 1;
        let framing = if chunked {
            "Transfer-Encoding: chunked\r\n"
        } else {
            ""
        };
        w.write_all(head(resp, framing, keep_alive && chunked).as_bytes())?;
        w.flush()?;
        Ok(StreamWriter { w, chunked })
    }

    /// Whether the connection can carry another request after [`StreamWriter::finish`].
    pub fn reusable(&self) -> bool {
        self.chunked
    }

    pub fn send(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.chunked {
            let mut bytes = format!("{:x}\r\n", data.len()).into_bytes();
            bytes.extend_from_slice(data);
            bytes.extend_from_slice(b"\r\n");
            self.w.write_all(&bytes)?;
        } else {
            self.w.write_all(data)?;
        }
        self.w.flush()
    }

    /// Ends the body properly (the last chunk); without it the body is cut.
    pub fn finish(self) -> io::Result<()> {
        if self.chunked {
            self.w.write_all(b"0\r\n\r\n")?;
        }
        self.w.flush()
    }
}

/// Decodes `%XX` escapes in a path segment; `None` if the result is not UTF-8 or an
/// escape is malformed.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn parse(raw: &str) -> Result<Request, ReadError> {
        read_request(&mut Cursor::new(raw.as_bytes()), &mut Vec::new(), 1024)
    }

    #[test]
    fn parses_content_length_and_keep_alive() {
        let req = parse("POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nIdempotency-Key:  k1 \r\n\r\n{}").unwrap();
        assert_eq!(req.method, "POST");
        assert_eq!(req.target, "/orders");
        assert_eq!(req.header("idempotency-key"), Some("k1"));
        assert_eq!(req.body, b"{}");
        assert!(req.keep_alive());
        let req = parse("GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n").unwrap();
        assert!(!req.keep_alive());
        let req = parse("GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(!req.keep_alive());
        let req = parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").unwrap();
        assert!(req.keep_alive());
    }

    #[test]
    fn parses_chunked() {
        let req = parse(
            "POST /orders HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\n{\"a\r\n4\r\n\":1}\r\n0\r\nTrailer: t\r\n\r\n",
        )
        .unwrap();
        assert_eq!(req.body, br#"{"a":1}"#);
    }

    #[test]
    fn rejects_malformed() {
        for raw in [
            "GET /\r\n\r\n",
            "GET / HTTP/2\r\n\r\n",
            "GET / HTTP/1.1\r\nNo colon\r\n\r\n",
            "GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
            "POST / HTTP/1.1\r\nContent-Length: 5000\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        ] {
            assert!(
                matches!(parse(raw), Err(ReadError::Reject(..))),
                "accepted {raw:?}"
            );
        }
        assert!(matches!(parse(""), Err(ReadError::Closed)));
        assert!(matches!(
            parse("POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\n{}"),
            Err(ReadError::Io(_))
        ));
    }

    #[test]
    fn decodes_percent_escapes() {
        assert_eq!(percent_decode("WIDGET%2D7").as_deref(), Some("WIDGET-7"));
        assert_eq!(percent_decode("a%2"), None);
    }
}
