//! An OTLP/gRPC trace receiver that counts the spans it is sent and drops them: a stand-in
//! collector for `scripts/bench-policy-cost.sh traces`.
//!
//! ```sh
//! cargo run --release -p tollgate-server --example otlp_sink -- 127.0.0.1:4317
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};

#[derive(Default)]
struct Count(AtomicU64);

#[tonic::async_trait]
impl TraceService for Count {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = request
            .get_ref()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        let total = self.0.fetch_add(spans as u64, Ordering::Relaxed) + spans as u64;
        eprintln!("otlp_sink: {total} spans");
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4317".to_owned())
        .parse()?;
    tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(Count::default()))
        .serve(addr)
        .await?;
    Ok(())
}
