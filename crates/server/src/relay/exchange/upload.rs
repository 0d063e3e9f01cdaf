//! The request's way up: the head, then the body as the client sends it, held to the body's
//! bounds (a stall of `header_read_timeout` is the client's fault).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::WriteHalf;
use tokio::time::{Instant, Sleep};

use super::super::body::{BodyCopy, Encoding, Framing, Malformed, Trailers};
use super::super::client::ClientRead;
use super::super::conn::READ_CHUNK;

/// The windows a request body's stall bound (`header_read_timeout`) is watched in: see
/// [`BodyClock`].
const STALL_WINDOWS: u32 = 4;

pub(super) enum UploadError {
    /// The client closed or failed before its body was all read.
    Client,
    /// The client's chunked body is malformed.
    Malformed,
    /// The upstream would not take the request.
    Upstream,
    /// The client sent no byte of the body it owes for `header_read_timeout`, before any
    /// answer went to it.
    Stalled,
}

/// What the upload needs to hold a client to its body's bounds, and to tell the relay whose
/// wait it is.
pub(super) struct Owed<'a> {
    /// No byte of a body for this long is the client's fault: `header_read_timeout`, as for a
    /// head (nginx's client_body_timeout).
    pub(super) stall: Duration,
    /// `Expect: 100-continue`: until told to go on, or until its body starts anyway, the
    /// client waits on the upstream, not the other way round.
    pub(super) expect_continue: bool,
    /// Set while the upload waits for body bytes the client owes.
    pub(super) awaiting: &'a AtomicBool,
    /// A `100 Continue` reached the client.
    pub(super) continued: &'a AtomicBool,
    /// A final head is on its way to the client: past it, a stalled body is left to the
    /// download's bounds, as before.
    pub(super) answered: &'a AtomicBool,
}

/// The stall bound of a request body, watched on a timer of the upload's own (the connection's
/// is the download's) without reading the clock per chunk: the bound is cut in
/// [`STALL_WINDOWS`] windows, a read that returns only marks its window heard, and the timer
/// moves once per window (one clock read). [`STALL_WINDOWS`] windows in a row without a byte
/// are a stall: found between the bound and a window past it after the client's last byte.
/// Armed at the first wait for owed bytes: a body that came with its head, or a request
/// without one, never touches it.
#[derive(Default)]
pub(super) struct BodyClock {
    /// Windows in a row without a byte.
    quiet: u32,
    /// A byte came in the current window.
    heard: bool,
    /// No longer watched (an answer went to the client).
    off: bool,
}

impl BodyClock {
    /// Reads the client's next body bytes into `inbuf`, within the stall bound. `Err`: stalled.
    async fn read(
        &mut self,
        client: &mut ClientRead<'_>,
        inbuf: &mut BytesMut,
        mut timer: Pin<&mut Option<Sleep>>,
        owed: &Owed<'_>,
    ) -> Result<io::Result<usize>, UploadError> {
        let window = owed.stall / STALL_WINDOWS;
        if timer.is_none() && !self.off {
            timer.set(Some(tokio::time::sleep(window)));
        }
        loop {
            let Some(sleep) = timer.as_mut().as_pin_mut() else {
                return Ok(client.read_buf(inbuf).await);
            };
            tokio::select! {
                biased;
                r = client.read_buf(inbuf) => {
                    self.heard = true;
                    return Ok(r);
                }
                () = sleep => {}
            }
            // A window ended. Those that passed while the upload waited on the upstream end
            // here at once, as one: the window its last read was heard in.
            self.quiet = if self.heard { 0 } else { self.quiet + 1 };
            self.heard = false;
            if self.quiet >= STALL_WINDOWS {
                if !owed.answered.load(Ordering::Relaxed) {
                    return Err(UploadError::Stalled);
                }
                self.off = true;
                timer.set(None);
                continue;
            }
            if let Some(sleep) = timer.as_mut().as_pin_mut() {
                sleep.reset(Instant::now() + window);
            }
        }
    }
}

/// Writes the request head to the upstream, with the body's first bytes when they are already
/// here, then the rest of the body, framed as the head says: a length as it came, chunked
/// written again (trailers checked and dropped).
///
/// A client that owes body bytes and sends none for `header_read_timeout` is cut off
/// ([`UploadError::Stalled`]); while the upload waits on it, `owed.awaiting` says so.
pub(super) async fn upload(
    client: &mut ClientRead<'_>,
    inbuf: &mut BytesMut,
    up: &mut WriteHalf<'_>,
    head: &mut Vec<u8>,
    framing: Framing,
    (sent, owed): (&AtomicBool, Owed<'_>),
) -> Result<(), UploadError> {
    let encoding = if framing == Framing::Chunked {
        Encoding::Chunked
    } else {
        Encoding::Identity
    };
    let mut body = BodyCopy::new(framing, encoding, Trailers::Drop);
    // The head goes out with whatever body bytes are already here, in one write. A request
    // without a body leaves `head` whole, to be sent again if a reused connection loses it.
    let take = body
        .copy(inbuf, head)
        .map_err(|Malformed| UploadError::Malformed)?;
    inbuf.advance(take);
    up.write_all(head)
        .await
        .map_err(|_| UploadError::Upstream)?;
    // Some of the body is here: an `Expect: 100-continue` client did not wait.
    let mut started = take > 0;
    let mut clock = BodyClock::default();
    let mut timer = std::pin::pin!(None::<Sleep>);
    while !body.done() {
        if inbuf.is_empty() {
            inbuf.reserve(READ_CHUNK);
            let read = if !owed.expect_continue || started || owed.continued.load(Ordering::Relaxed)
            {
                owed.awaiting.store(true, Ordering::Relaxed);
                let read = clock.read(client, inbuf, timer.as_mut(), &owed).await?;
                owed.awaiting.store(false, Ordering::Relaxed);
                read
            } else {
                client.read_buf(inbuf).await
            };
            match read {
                Ok(0) | Err(_) => return Err(UploadError::Client),
                Ok(_) => started = true,
            }
        }
        head.clear();
        let take = body
            .copy(inbuf, head)
            .map_err(|Malformed| UploadError::Malformed)?;
        inbuf.advance(take);
        if !head.is_empty() {
            up.write_all(head)
                .await
                .map_err(|_| UploadError::Upstream)?;
        }
    }
    sent.store(true, Ordering::Relaxed);
    Ok(())
}
