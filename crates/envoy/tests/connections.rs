//! `serve_with` holds at most `max_connections` connections: one past the bound waits in the
//! accept queue, unserved, until a served one closes. Raw HTTP/2 clients (h2) so the test
//! controls when each connection opens and closes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use h2::client::{ResponseFuture, SendRequest};
use tokio::task::JoinHandle;
use tollgate::Limiter;
use tollgate_envoy::{Config, RlsService, ServeOptions, serve_with};

/// An HTTP/2 connection to `addr` and the task driving it (abort it to close the connection).
async fn connect(addr: std::net::SocketAddr) -> (SendRequest<Bytes>, JoinHandle<()>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    (send, task)
}

/// A call to a method the server does not have: answered at once (UNIMPLEMENTED) when the
/// connection is served.
async fn call(send: &SendRequest<Bytes>) -> ResponseFuture {
    let mut send = send.clone().ready().await.unwrap();
    let request = http::Request::post("http://localhost/no.Such/Method")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    send.send_request(request, true).unwrap().0
}

#[tokio::test]
async fn connections_past_max_connections_wait_until_one_closes() {
    let limiter = Limiter::builder().build().unwrap();
    let service = RlsService::new(limiter, &Config::new()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = ServeOptions {
        max_connections: 1,
        drain: Duration::from_secs(5),
    };
    let server = tokio::spawn(serve_with(
        listener,
        service,
        async {
            let _ = stopped.await;
        },
        options,
    ));

    let (first, first_task) = connect(addr).await;
    assert_eq!(call(&first).await.await.unwrap().status(), 200);
    // The second connection is accepted by the kernel, not by the server.
    let (second, second_task) = connect(addr).await;
    let mut waiting = call(&second).await;
    // Round trips on the first connection give the server every chance to serve the second
    // one, were it not bounded.
    for _ in 0..20 {
        assert_eq!(call(&first).await.await.unwrap().status(), 200);
    }
    let pending = tokio::time::timeout(Duration::ZERO, &mut waiting).await;
    assert!(pending.is_err(), "the second connection was served");
    // Closing the first frees its slot: the second is served.
    first_task.abort();
    drop(first);
    let answered = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once the first connection closed")
        .unwrap();
    assert_eq!(answered.status(), 200);
    second_task.abort();
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
