//! The connections the API is served on, and what they answer before any route does.
//!
//! HTTP/1 refuses a request it cannot parse — a URI longer than its limit (64 KiB), a head
//! larger than its buffer, a request line that is not one — by itself, before the router ever
//! sees it, with a bare status and no body. Every answer of this surface is a problem with a
//! stable code, so the connection rewrites those: [`ProblemIo`] recognises the parser's own
//! response as it is written (a 400, 414 or 431 head without body that lacks the headers every
//! response of the router carries, [`crate::limits::security_headers`]) and writes the
//! problem instead, with the same status, the router's headers and `Connection: close`.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::Request;
use axum::serve::IncomingStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::limits::CONTENT_SECURITY_POLICY;
use crate::problem::{Problem, ProblemCode, PROBLEM_JSON};

/// A TCP listener whose connections rewrite the HTTP parser's bare refusals.
#[derive(Debug)]
pub struct Listener(pub TcpListener);

impl axum::serve::Listener for Listener {
    type Io = ProblemIo<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        let (stream, addr) = axum::serve::Listener::accept(&mut self.0).await;
        (ProblemIo::new(stream), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// The peer address of a connection of [`Listener`].
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl Connected<IncomingStream<'_, Listener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, Listener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

/// Puts the peer address where the handlers read it (`ConnectInfo<SocketAddr>`).
pub async fn peer_address(mut request: Request) -> Request {
    if let Some(ConnectInfo(Peer(addr))) = request.extensions().get::<ConnectInfo<Peer>>() {
        let addr = *addr;
        request.extensions_mut().insert(ConnectInfo(addr));
    }
    request
}

/// A connection that writes a problem where the HTTP parser would write a bare refusal.
#[derive(Debug)]
pub struct ProblemIo<T> {
    inner: T,
    /// The problem being written in place of a refusal, and how much of it is written.
    replacing: Option<(Vec<u8>, usize)>,
}

impl<T> ProblemIo<T> {
    pub fn new(inner: T) -> ProblemIo<T> {
        ProblemIo {
            inner,
            replacing: None,
        }
    }
}

/// The problem of a bare refusal the parser writes, if `buf` is one: a whole head, no body,
/// with a status it refuses with and without the router's headers.
fn refusal(buf: &[u8]) -> Option<ProblemCode> {
    let head = buf.strip_prefix(b"HTTP/1.1 ")?;
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    if end + 4 != head.len() {
        return None;
    }
    let head = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
    if head.contains("\r\ncontent-security-policy:") {
        return None;
    }
    match head.get(..3)? {
        "400" => Some(ProblemCode::MalformedRequest),
        "414" => Some(ProblemCode::UriTooLong),
        "431" => Some(ProblemCode::HeadersTooLarge),
        _ => None,
    }
}

/// The whole response that replaces a refusal: the problem, with the router's headers.
fn replacement(code: ProblemCode) -> Vec<u8> {
    let body = serde_json::to_vec(&Problem::new(code).details()).unwrap_or_default();
    let status = code.status();
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: {PROBLEM_JSON}\r\ncontent-length: {}\r\n\
         connection: close\r\ncontent-security-policy: {CONTENT_SECURITY_POLICY}\r\n\
         x-content-type-options: nosniff\r\nx-frame-options: DENY\r\n\
         referrer-policy: no-referrer\r\ncache-control: no-store\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
    );
    [head.into_bytes(), body].concat()
}

impl<T: AsyncRead + Unpin> AsyncRead for ProblemIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> ProblemIo<T> {
    /// Writes the rest of the replacement; `buf` counts as written once all of it is.
    fn poll_replace(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        while let Some((bytes, written)) = &mut self.replacing {
            if *written == bytes.len() {
                self.replacing = None;
                return Poll::Ready(Ok(buf.len()));
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(buf.len()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ProblemIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.replacing.is_none() {
            match refusal(buf) {
                Some(code) => this.replacing = Some((replacement(code), 0)),
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        this.poll_replace(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // A refusal is written as a head alone: one buffer.
        let first = bufs.iter().find(|b| !b.is_empty());
        let alone = bufs.iter().filter(|b| !b.is_empty()).count() == 1;
        match first {
            Some(buf) if alone && (self.replacing.is_some() || refusal(buf).is_some()) => {
                self.poll_write(cx, buf)
            }
            _ => Pin::new(&mut self.inner).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_parsers_bare_refusals_are_replaced() {
        let bare = b"HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\ndate: Wed, 02 Dec 2026 19:54:38 GMT\r\n\r\n";
        assert_eq!(refusal(bare), Some(ProblemCode::UriTooLong));
        let bad = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(refusal(bad), Some(ProblemCode::MalformedRequest));
        // The router's own answers carry its headers, or a body, or another status.
        let routed = b"HTTP/1.1 400 Bad Request\r\ncontent-security-policy: default-src 'none'\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(refusal(routed), None);
        assert_eq!(refusal(b"HTTP/1.1 414 URI Too Long\r\n\r\n{}"), None);
        assert_eq!(refusal(b"HTTP/1.1 200 OK\r\n\r\n"), None);
        assert_eq!(refusal(b"{\"HTTP/1.1 414\"}"), None);

        let problem = String::from_utf8(replacement(ProblemCode::UriTooLong)).unwrap();
        let (head, body) = problem.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{head}");
        assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], "uri_too_long");
    }
}
