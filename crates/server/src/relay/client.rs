//! A client connection of the proxy: a TCP socket, or TLS over one (`[proxy] tls_cert`). One
//! type rather than a generic relay, so that the plaintext path stays the code it was (a
//! branch per read or write is all TLS costs it), and read and write halves for the exchange
//! that sends a request up while a response comes down.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp;
use tokio_rustls::server::TlsStream;

use super::conn::READ_CHUNK;

/// The client's side of a proxy connection.
pub(crate) enum Client {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// The reading half of a [`Client`], for one exchange.
pub(super) enum ClientRead<'a> {
    Plain(tcp::ReadHalf<'a>),
    Tls(tokio::io::ReadHalf<&'a mut TlsStream<TcpStream>>),
}

/// The writing half of a [`Client`], for one exchange.
pub(super) enum ClientWrite<'a> {
    Plain(tcp::WriteHalf<'a>),
    Tls(tokio::io::WriteHalf<&'a mut TlsStream<TcpStream>>),
}

impl Client {
    /// Both halves, borrowed. A TCP socket splits for free; a TLS stream's halves share it
    /// behind a lock (its reads may have to write, a key update say).
    pub(super) fn split(&mut self) -> (ClientRead<'_>, ClientWrite<'_>) {
        match self {
            Client::Plain(s) => {
                let (r, w) = s.split();
                (ClientRead::Plain(r), ClientWrite::Plain(w))
            }
            Client::Tls(s) => {
                let (r, w) = tokio::io::split(&mut **s);
                (ClientRead::Tls(r), ClientWrite::Tls(w))
            }
        }
    }
}

impl ClientRead<'_> {
    /// Waits for the client's next bytes, or its close (`Ok(0)` or an error), while its
    /// request is upstream. A TCP socket is peeked, its bytes left where they are; a TLS
    /// stream's bytes can only be read, so they go to `inbuf`, where the connection looks for
    /// its next request head anyway.
    pub(super) async fn next_bytes(&mut self, inbuf: &mut BytesMut) -> io::Result<usize> {
        match self {
            ClientRead::Plain(r) => r.peek(&mut [0u8; 1]).await,
            ClientRead::Tls(r) => {
                inbuf.reserve(READ_CHUNK);
                r.read_buf(inbuf).await
            }
        }
    }
}

macro_rules! delegate_read {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
                    Self::Tls(s) => Pin::new(s).poll_read(cx, buf),
                }
            }
        }
    };
}

macro_rules! delegate_write {
    ($t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
                    Self::Tls(s) => Pin::new(s).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    Self::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    Self::Plain(s) => s.is_write_vectored(),
                    Self::Tls(s) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_flush(cx),
                    Self::Tls(s) => Pin::new(s).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Tls(s) => Pin::new(s).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_read!(Client);
delegate_read!(ClientRead<'_>);
delegate_write!(Client);
delegate_write!(ClientWrite<'_>);
