//! `GET /v1/session/context`: the context inspector ([`crate::session::Session::inspect`]).
//!
//! `?view=request` answers with the exact body of the next request as the provider would
//! receive it (the provider's JSON); otherwise the by-part report. `?input=TEXT` adds a user
//! message the next turn would bring; `?stream=true` renders the request as a streamed turn
//! sends it. `?why=TEXT` answers instead where TEXT went: kept, in a summary's section or a
//! ledger, or archived under a marker ([`cairn_engine::why`]).

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState, busy};
use crate::session::InspectOptions;

pub(super) async fn get_context(
    State(state): State<AppState>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()))?;
    let bad = |what: &str| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", what);
    if let Some(text) = query.get("why") {
        if text.is_empty() {
            return Err(bad("why needs the text to look for"));
        }
        if query.len() > 1 {
            return Err(bad("why takes no other parameter"));
        }
        let session = state.session.try_lock().map_err(|_| busy())?;
        return Ok(axum::Json(session.why(text).await).into_response());
    }
    let raw = match query.get("view").map(String::as_str) {
        None | Some("parts") => false,
        Some("request") => true,
        Some(_) => return Err(bad("view must be parts or request")),
    };
    let stream = match query.get("stream").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(bad("stream must be true or false")),
    };
    let options = InspectOptions {
        input: query.get("input").cloned(),
        stream,
    };
    let mut session = state.session.try_lock().map_err(|_| busy())?;
    let report = session.inspect(options).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_rendered",
            format!("the next request cannot be shown: {e}"),
        )
    })?;
    drop(session);
    if raw {
        return Ok(([(header::CONTENT_TYPE, "application/json")], report.body).into_response());
    }
    Ok(axum::Json(report).into_response())
}
