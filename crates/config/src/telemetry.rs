//! `[telemetry]`: OpenTelemetry traces, each decision a span, exported over OTLP/gRPC. Off
//! unless `otlp_endpoint` is given. Read once at start: an endpoint change needs a restart.

use serde::Deserialize;
use toml::Spanned;

use super::Errors;

/// `[telemetry]`.
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryConfig {
    /// `otlp_endpoint`: where spans go, an OTLP/gRPC receiver such as the OpenTelemetry
    /// Collector (`http://127.0.0.1:4317`); `None` exports nothing and costs nothing.
    pub otlp_endpoint: Option<String>,
    /// `sample_ratio` (default 1.0): the share of decisions traced when the caller sent no
    /// trace context. A caller's sampled `traceparent` is always followed, an unsampled one
    /// never (parent-based sampling).
    pub sample_ratio: f64,
    /// `service_name` (default `"tollgate"`): the `service.name` the spans carry.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            service_name: "tollgate".to_owned(),
        }
    }
}

/// A number, whole or not, as TOML writes it.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Number {
    Int(i64),
    Float(f64),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    otlp_endpoint: Option<Spanned<String>>,
    sample_ratio: Option<Spanned<Number>>,
    service_name: Option<Spanned<String>>,
}

/// Validates `[telemetry]`; its absence is the default (no traces).
pub(super) fn validate(
    raw: Option<RawTelemetry>,
    errs: &mut Errors<'_>,
) -> Option<TelemetryConfig> {
    let Some(raw) = raw else {
        return Some(TelemetryConfig::default());
    };
    let mut ok = true;
    let mut config = TelemetryConfig::default();
    if let Some(endpoint) = raw.otlp_endpoint {
        let text = endpoint.get_ref().trim();
        let scheme_ok = text.starts_with("http://") || text.starts_with("https://");
        if scheme_ok && text.parse::<http::Uri>().is_ok_and(|u| u.host().is_some()) {
            config.otlp_endpoint = Some(text.to_owned());
        } else {
            errs.at(
                endpoint.span().start,
                format!(
                    "[telemetry] field \"otlp_endpoint\": {text:?} is not an http:// or https:// URL with a host; write e.g. otlp_endpoint = \"http://127.0.0.1:4317\""
                ),
            );
            ok = false;
        }
    }
    if let Some(ratio) = raw.sample_ratio {
        let value = match ratio.get_ref() {
            Number::Int(i) => *i as f64,
            Number::Float(f) => *f,
        };
        if (0.0..=1.0).contains(&value) {
            config.sample_ratio = value;
        } else {
            let shown = errs.shown(ratio.span().start, value);
            errs.at(
                ratio.span().start,
                format!(
                    "[telemetry] field \"sample_ratio\" = {shown} must be from 0 to 1 (the share of decisions traced); write e.g. sample_ratio = 0.01"
                ),
            );
            ok = false;
        }
    }
    if let Some(name) = raw.service_name {
        let text = name.get_ref().trim();
        if text.is_empty() {
            errs.at(
                name.span().start,
                "[telemetry] field \"service_name\" is empty; write e.g. service_name = \"tollgate\""
                    .to_owned(),
            );
            ok = false;
        } else {
            config.service_name = text.to_owned();
        }
    }
    ok.then_some(config)
}
