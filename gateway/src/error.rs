//! Every answer the gateway itself gives, in the OpenAI error shape the clients parse.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::json;

/// An error answer: status, a stable code (also the metrics label of a denial) and a message.
#[derive(Debug, Clone)]
pub struct GatewayError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// The request never reached the session (no connection was made): sending it again
    /// cannot do its work twice.
    pub not_delivered: bool,
}

impl GatewayError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            not_delivered: false,
        }
    }

    /// Marks the error as one of a request that never reached the session.
    pub fn not_delivered(mut self) -> Self {
        self.not_delivered = true;
        self
    }

    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, code, message)
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, message)
    }

    /// The OpenAI `type` of the status, as the agent reports it.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind(), "code": self.code, "param": null}})
    }

    /// A denial of access (401/403), counted by reason.
    pub fn is_denial(&self) -> bool {
        matches!(self.status.as_u16(), 401 | 403)
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}
