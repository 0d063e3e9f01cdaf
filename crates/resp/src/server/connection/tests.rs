//! What a connection holds while it answers: an `EXEC`'s replies are written in pieces, as a
//! pipeline's are, never all held at once.

use super::*;
use tollgate::Limiter;

/// Runs `input` through batches as the connection does, each batch's replies written (taken)
/// before the next; every reply's bytes, and the most one batch held.
async fn answer<D: Decide, S: Store, C: Clock>(
    handler: &Handler<D, S, C>,
    input: &[u8],
) -> (Vec<u8>, usize) {
    let limits = Limits::default();
    let mut session = handler.session(limits.max_pipeline, limits.max_transaction_bytes);
    let (mut all, mut most, mut at) = (Vec::new(), 0, 0);
    loop {
        let mut out = ReplyBuf::new(Protocol::Resp2);
        let (used, end) = batch(
            handler,
            &mut session,
            &input[at..],
            &limits.frame(),
            limits.max_pipeline,
            &mut out,
        )
        .await;
        at += used;
        most = most.max(out.len());
        all.extend_from_slice(out.as_bytes());
        if matches!(end, End::Drained) {
            return (all, most);
        }
    }
}

/// A transaction of a thousand `COMMAND` calls is 9 KB sent and over a megabyte answered: the
/// answer comes whole and in order, but no batch holds much more than the flush size.
#[tokio::test]
async fn an_exec_is_answered_in_pieces() {
    let handler = Handler::for_limiter(Limiter::builder().build().unwrap());
    let (one, _) = answer(&handler, b"COMMAND\r\n").await;
    let mut input = b"MULTI\r\n".to_vec();
    let mut want = b"+OK\r\n".to_vec();
    for _ in 0..1000 {
        input.extend_from_slice(b"COMMAND\r\n");
        want.extend_from_slice(b"+QUEUED\r\n");
    }
    input.extend_from_slice(b"EXEC\r\nPING\r\n");
    want.extend_from_slice(b"*1000\r\n");
    for _ in 0..1000 {
        want.extend_from_slice(&one);
    }
    want.extend_from_slice(b"+PONG\r\n");
    let (all, most) = answer(&handler, &input).await;
    assert!(want.len() > 1_000_000, "{} bytes", want.len());
    assert!(
        all == want,
        "the replies differ from one COMMAND's, a thousand times"
    );
    assert!(
        most < FLUSH_AT + one.len(),
        "a batch held {most} bytes ({} a reply)",
        one.len()
    );
}
