//! `grpc.health.v1.Health`: `Check` answers the current status, `Watch` streams it (now, then
//! each change), both from one [`Health`] the embedding program sets, so a load balancer or
//! Kubernetes probe and a watching Envoy see the same thing.

use tokio::sync::{mpsc, watch};
use tonic::Status;
use tonic::codegen::BoxFuture;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::server::{ServerStreamingService, UnaryService};

use super::RLS_SERVICE_NAME;
use crate::proto::grpc::health::v1::HealthCheckRequest;
use crate::proto::grpc::health::v1::HealthCheckResponse;
use crate::proto::grpc::health::v1::health_check_response::ServingStatus;

/// Whether the service can answer: `SERVING` or `NOT_SERVING` in `grpc.health.v1.Health`.
///
/// Serving from the start; the embedding program turns it off while the service cannot decide
/// (the server does while its store is unreachable, as its `/readyz` says). Clones share the
/// status; a change reaches every `Watch` stream at once.
#[derive(Clone, Debug)]
pub struct Health {
    status: std::sync::Arc<watch::Sender<bool>>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            status: std::sync::Arc::new(watch::Sender::new(true)),
        }
    }
}

impl Health {
    /// Sets the status; watchers hear of it only when it changes.
    pub fn set_serving(&self, serving: bool) {
        self.status.send_if_modified(|s| {
            let changed = *s != serving;
            *s = serving;
            changed
        });
    }

    /// The current status.
    pub fn is_serving(&self) -> bool {
        *self.status.borrow()
    }

    fn subscribe(&self) -> watch::Receiver<bool> {
        self.status.subscribe()
    }
}

/// As the health checking protocol says: the server as a whole (`""`) and each service it
/// offers have a status; any other name is unknown.
fn known(service: &str) -> bool {
    matches!(service, "" | RLS_SERVICE_NAME)
}

fn answer(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

fn serving_status(serving: bool) -> ServingStatus {
    if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// `Check`: the status now; an unknown service is `NOT_FOUND`.
pub(super) struct HealthCheck(pub(super) Health);

impl UnaryService<HealthCheckRequest> for HealthCheck {
    type Response = HealthCheckResponse;
    type Future = BoxFuture<tonic::Response<HealthCheckResponse>, Status>;

    fn call(&mut self, request: tonic::Request<HealthCheckRequest>) -> Self::Future {
        let result = if known(&request.get_ref().service) {
            Ok(tonic::Response::new(answer(serving_status(
                self.0.is_serving(),
            ))))
        } else {
            Err(Status::not_found("unknown service"))
        };
        Box::pin(async move { result })
    }
}

/// `Watch`: the status at once, then each change, until the client goes or the server shuts
/// down (then `NOT_SERVING` if it was serving, and the stream ends with `OK`). An unknown
/// service is streamed `SERVICE_UNKNOWN` and the call stays open, as the protocol says: a
/// service may be added later (none is, here).
pub(super) struct HealthWatch {
    pub(super) health: Health,
    /// Turns true when the server shuts down.
    pub(super) stop: watch::Receiver<bool>,
}

type Answers = ReceiverStream<Result<HealthCheckResponse, Status>>;

impl ServerStreamingService<HealthCheckRequest> for HealthWatch {
    type Response = HealthCheckResponse;
    type ResponseStream = Answers;
    type Future = BoxFuture<tonic::Response<Answers>, Status>;

    fn call(&mut self, request: tonic::Request<HealthCheckRequest>) -> Self::Future {
        let known = known(&request.get_ref().service);
        let (tx, rx) = mpsc::channel(1);
        let status = self.health.subscribe();
        let stop = self.stop.clone();
        // The task ends with the call: when the client cancels it or leaves (the stream is
        // dropped, `closed` completes), or at shutdown.
        tokio::spawn(stream_status(known, status, stop, tx));
        Box::pin(async move { Ok(tonic::Response::new(ReceiverStream::new(rx))) })
    }
}

async fn stream_status(
    known: bool,
    mut status: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
    tx: mpsc::Sender<Result<HealthCheckResponse, Status>>,
) {
    if !known {
        if tx
            .send(Ok(answer(ServingStatus::ServiceUnknown)))
            .await
            .is_ok()
        {
            tokio::select! {
                () = stopped(&mut stop) => {}
                () = tx.closed() => {}
            }
        }
        return;
    }
    loop {
        let serving = *status.borrow_and_update();
        if tx.send(Ok(answer(serving_status(serving)))).await.is_err() {
            return;
        }
        tokio::select! {
            changed = status.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = stopped(&mut stop) => {
                // Watchers learn the server is going before the stream ends, as gRPC's own
                // health servers tell them at shutdown.
                if serving {
                    let _ = tx.send(Ok(answer(ServingStatus::NotServing))).await;
                }
                return;
            }
            () = tx.closed() => return,
        }
    }
}

/// Completes once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
