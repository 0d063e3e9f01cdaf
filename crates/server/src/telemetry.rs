//! Traces: each decision a span, exported over OTLP/gRPC to the `[telemetry] otlp_endpoint`.
//!
//! A span names its door, each policy that decided with its outcome, and a keyed hash of each
//! key (never the key, so never a credential and never a client address). A caller's W3C
//! `traceparent` (and `tracestate`) makes the span a child in the caller's trace; sampling is
//! parent-based: a sampled parent is always traced, an unsampled one never, and a request
//! without one is traced at `sample_ratio`. Without an endpoint nothing is built and a
//! decision pays one branch.

use std::fmt;
use std::time::SystemTime;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, Span};
use tollgate::Outcome;
use tollgate::key_digest::KeyDigest;

use crate::config::TelemetryConfig;

/// The way in a decision came through, as its span says (`tollgate.door`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Door {
    Proxy,
    Check,
    ForwardAuth,
    Envoy,
    Resp,
}

impl Door {
    fn as_str(self) -> &'static str {
        match self {
            Door::Proxy => "proxy",
            Door::Check => "check",
            Door::ForwardAuth => "forward_auth",
            Door::Envoy => "envoy",
            Door::Resp => "resp",
        }
    }
}

/// Where a decision came from: its door, and the caller's trace context when it sent one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Trace<'a> {
    pub(crate) door: Door,
    pub(crate) parent: Option<&'a [u8]>,
    pub(crate) state: Option<&'a [u8]>,
}

impl<'a> Trace<'a> {
    /// A decision whose caller sent no trace context.
    pub(crate) fn root(door: Door) -> Self {
        Trace {
            door,
            parent: None,
            state: None,
        }
    }

    /// The trace context in `headers`, if any.
    pub(crate) fn from_headers(door: Door, headers: &'a hyper::HeaderMap) -> Self {
        Trace {
            door,
            parent: headers.get("traceparent").map(|v| v.as_bytes()),
            state: headers.get("tracestate").map(|v| v.as_bytes()),
        }
    }

    /// The trace context among header lines (name, value) as a server parsed them.
    pub(crate) fn from_lines<'h>(
        door: Door,
        lines: impl Iterator<Item = (&'h str, &'a [u8])>,
    ) -> Self {
        let mut trace = Trace::root(door);
        for (name, value) in lines {
            if name.eq_ignore_ascii_case("traceparent") {
                trace.parent = Some(value);
            } else if name.eq_ignore_ascii_case("tracestate") {
                trace.state = Some(value);
            }
        }
        trace
    }
}

/// The tracer, when traces are exported.
pub(crate) struct Telemetry {
    inner: Option<Inner>,
}

struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    keys: KeyDigest,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("on", &self.inner.is_some())
            .finish()
    }
}

impl Telemetry {
    /// No traces.
    pub(crate) fn off() -> Self {
        Telemetry { inner: None }
    }

    /// The exporter `config` describes, keyed hashes under `key_secret`. Must be called within
    /// the tokio runtime (the gRPC client lives on it). An exporter that cannot be built is
    /// logged, and the server runs without traces.
    pub(crate) fn start(config: &TelemetryConfig, key_secret: &[u8]) -> Self {
        let Some(endpoint) = &config.otlp_endpoint else {
            return Telemetry::off();
        };
        use opentelemetry_otlp::WithExportConfig;
        let exporter = match opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .build()
        {
            Ok(e) => e,
            Err(error) => {
                tracing::error!(%error, endpoint, "traces cannot be exported; running without them");
                return Telemetry::off();
            }
        };
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(config.service_name.clone())
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("tollgate");
        tracing::info!(
            endpoint,
            ratio = config.sample_ratio,
            "exporting traces over OTLP/gRPC"
        );
        Telemetry {
            inner: Some(Inner {
                provider,
                tracer,
                keys: trace_keys(key_secret),
            }),
        }
    }

    /// Whether spans are made at all (a door need not look for a trace context otherwise).
    pub(crate) fn on(&self) -> bool {
        self.inner.is_some()
    }

    /// A decision's span, started now; `None` when traces are off or this one is not sampled.
    pub(crate) fn begin(&self, trace: &Trace<'_>) -> Option<DecisionSpan> {
        let inner = self.inner.as_ref()?;
        let parent = match trace.parent {
            Some(traceparent) => TraceContextPropagator::new()
                .extract_with_context(&Context::new(), &Carrier(traceparent, trace.state)),
            None => Context::new(),
        };
        let span = inner
            .tracer
            .span_builder("tollgate.decision")
            .with_kind(SpanKind::Server)
            .with_start_time(SystemTime::now())
            .start_with_context(&inner.tracer, &parent);
        span.is_recording().then(|| DecisionSpan {
            span,
            keys: inner.keys.clone(),
            door: trace.door,
            policies: Vec::new(),
            outcomes: Vec::new(),
            key_hashes: Vec::new(),
            worst: None,
            status: 0,
            ended: false,
        })
    }

    /// Exports what is pending and stops (at shutdown).
    pub(crate) fn shutdown(&self) {
        if let Some(inner) = &self.inner
            && let Err(error) = inner.provider.shutdown()
        {
            tracing::warn!(%error, "traces not all exported at shutdown");
        }
    }
}

/// A sampled decision's span: told each policy's outcome ([`record`](DecisionSpan::record)),
/// then ended ([`end`](DecisionSpan::end), or when dropped).
pub(crate) struct DecisionSpan {
    span: Span,
    keys: KeyDigest,
    door: Door,
    policies: Vec<StringValue>,
    outcomes: Vec<StringValue>,
    key_hashes: Vec<StringValue>,
    worst: Option<Outcome>,
    status: u16,
    ended: bool,
}

impl DecisionSpan {
    /// What one policy did: its name, the key as stored (only its keyed hash is written) and
    /// the outcome.
    pub(crate) fn record(&mut self, policy: &str, key: &[u8], outcome: Outcome) {
        self.policies.push(policy.to_owned().into());
        self.outcomes.push(outcome.as_str().into());
        let mut hex = Vec::with_capacity(32);
        self.keys.write_hex(key, &mut hex);
        self.key_hashes
            .push(String::from_utf8_lossy(&hex).into_owned().into());
        if outcome != Outcome::Allowed && self.worst.is_none() {
            self.worst = Some(outcome);
        }
    }

    /// Ends the span, with the HTTP status the door answered (0 when it has none of its own:
    /// the request went on).
    pub(crate) fn end(mut self, status: u16) {
        self.status = status;
        self.close();
    }

    fn close(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        let outcome = match (self.worst, self.policies.is_empty()) {
            (Some(o), _) => o.as_str(),
            (None, true) => "unmatched",
            (None, false) => Outcome::Allowed.as_str(),
        };
        self.span.set_attributes([
            KeyValue::new("tollgate.door", self.door.as_str()),
            KeyValue::new("tollgate.outcome", outcome),
            KeyValue::new(
                "tollgate.policies",
                Value::Array(Array::String(std::mem::take(&mut self.policies))),
            ),
            KeyValue::new(
                "tollgate.outcomes",
                Value::Array(Array::String(std::mem::take(&mut self.outcomes))),
            ),
            KeyValue::new(
                "tollgate.key_hashes",
                Value::Array(Array::String(std::mem::take(&mut self.key_hashes))),
            ),
        ]);
        if self.status != 0 {
            self.span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(self.status),
            ));
        }
        if matches!(self.worst, Some(Outcome::FailClosed | Outcome::FailOpen)) {
            self.span
                .set_status(Status::error("the rate limit store failed"));
        }
        self.span.end();
    }
}

impl Drop for DecisionSpan {
    fn drop(&mut self) {
        self.close();
    }
}

impl tollgate_envoy::CallSpan for DecisionSpan {
    fn record(&mut self, policy: &str, key: &[u8], outcome: Outcome) {
        DecisionSpan::record(self, policy, key, outcome);
    }
}

/// The key a span's key hashes are made under: derived from the key secret, so they match no
/// digest the service shows elsewhere, and are the same on every instance that shares it.
fn trace_keys(secret: &[u8]) -> KeyDigest {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"tollgate trace key hashes v1\0");
    h.update(secret);
    KeyDigest::new(&h.finalize())
}

/// A `traceparent` (and `tracestate`) as the propagator reads them.
struct Carrier<'a>(&'a [u8], Option<&'a [u8]>);

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => std::str::from_utf8(self.0).ok(),
            "tracestate" => self.1.and_then(|s| std::str::from_utf8(s).ok()),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}
