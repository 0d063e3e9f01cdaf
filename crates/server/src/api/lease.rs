//! `POST /v1/release`: gives back the concurrency slots of a lease that `/v1/check` in
//! `"mode": "acquire"` answered.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use tollgate_http::{LeaseError, Refusal};

use crate::generation::Generation;
use crate::response::{Body, json_response, problem, problem_response};

/// 200 `{"released": n}` with the slots still held; 404 when none was (released already, or
/// taken back at its `lease_ttl`: nothing changes); 400 for a lease that is not one of ours;
/// 503 when the store failed (the slots return at their `lease_ttl`).
pub(crate) async fn release(engine: &Generation, req: Request<Incoming>) -> Response<Body> {
    let value = match super::json_body(engine, req).await {
        Ok(v) => v,
        Err(res) => return res,
    };
    let token = match value.get("lease") {
        Some(Value::String(token)) => token.as_str(),
        None | Some(Value::Null) => {
            return problem_response(&Refusal::bad_field(
                "\"lease\"",
                "is required: the lease /v1/check answered in \"mode\": \"acquire\"",
            ));
        }
        Some(_) => {
            return problem_response(&Refusal::bad_field(
                "\"lease\"",
                "must be a string: the lease /v1/check answered in \"mode\": \"acquire\"",
            ));
        }
    };
    match engine.http().release_lease(token).await {
        Ok(released) => json_response(StatusCode::OK, &json!({ "released": released })),
        Err(LeaseError::NotOurs) => problem_response(&Refusal::bad_field(
            "\"lease\"",
            "is not a lease this service gave out",
        )),
        Err(e @ LeaseError::Unknown) => {
            problem(StatusCode::NOT_FOUND, "Unknown lease", Some(&e.to_string()))
        }
        Err(e @ LeaseError::Store(_)) => {
            tracing::warn!(error = %e, "could not release a lease");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "Store unavailable",
                Some("the lease could not be released now; its slots return at their lease_ttl"),
            )
        }
    }
}
