//! A real OTLP/gRPC trace receiver: the OpenTelemetry collector's `TraceService`, built from
//! its protos, keeping every span it is sent.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

/// A span as received, with the `service.name` of the resource that sent it.
#[derive(Clone, Debug)]
pub struct Received {
    pub service: String,
    pub span: Span,
}

impl Received {
    /// The attribute `key` as text: a string, an integer, or an array of strings joined by `,`.
    pub fn attr(&self, key: &str) -> Option<String> {
        let kv = self.span.attributes.iter().find(|kv| kv.key == key)?;
        text(kv.value.as_ref()?.value.as_ref()?)
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::ArrayValue(a) => Some(
            a.values
                .iter()
                .filter_map(|v| v.value.as_ref().and_then(text))
                .collect::<Vec<_>>()
                .join(","),
        ),
        _ => None,
    }
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.0.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .and_then(|kv| kv.value.as_ref()?.value.as_ref().and_then(text))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    kept.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A receiver on a free loopback port.
pub struct Receiver {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sink = Sink::default();
        let spans = Arc::clone(&sink.0);
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(sink))
                .serve_with_incoming(incoming),
        );
        Receiver { addr, spans }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }
}
