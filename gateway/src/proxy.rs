//! Forwarding one request to a session's API: hop-by-hop headers dropped, the session's
//! token as the upstream bearer, the answer streamed (an SSE answer is passed on chunk by
//! chunk as it arrives), bounded by a connect timeout, a time to response headers
//! and a longest silence between chunks.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures::StreamExt;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};

use crate::error::GatewayError;

/// Headers that describe one connection, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Drops the hop-by-hop headers, those the `Connection` header names, and `host`. Pure.
pub fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (k, v) in headers {
        let name = k.as_str();
        if HOP_BY_HOP.contains(&name) || name == "host" || named.iter().any(|n| n == name) {
            continue;
        }
        out.append(k.clone(), v.clone());
    }
    out
}

/// The upstream's HTTP client.
pub fn client(connect_timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        // Under the 30 s after which an agent closes a kept-alive connection that sent no
        // request (its header timeout): a request is never written onto a connection the
        // agent is closing, which would get no answer.
        .pool_idle_timeout(Duration::from_secs(20))
        .tcp_nodelay(true)
        // A session's Service is plain HTTP inside the cluster; never follow redirects.
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

pub struct Forward<'a> {
    pub http: &'a reqwest::Client,
    /// The session's base URL (no trailing slash).
    pub base: &'a str,
    /// Path after the base, starting with `/v1/`, plus the query if any.
    pub path_and_query: &'a str,
    pub method: Method,
    pub headers: &'a HeaderMap,
    /// The request body, read within the size limit.
    pub body: bytes::Bytes,
    /// The session's own token: the agent checks it.
    pub token: &'a str,
    pub response_timeout: Duration,
    pub stream_idle_timeout: Duration,
}

/// Sends the request upstream and answers with the upstream's answer, streamed.
pub async fn forward(f: Forward<'_>) -> Result<Response, GatewayError> {
    let url = format!("{}{}", f.base, f.path_and_query);
    let mut headers = end_to_end(f.headers);
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::CONTENT_LENGTH);
    let bearer = HeaderValue::from_str(&format!("Bearer {}", f.token)).map_err(|_| {
        GatewayError::new(
            StatusCode::BAD_GATEWAY,
            "token_unusable",
            "the session's token is not a valid header value",
        )
    })?;
    headers.insert(header::AUTHORIZATION, bearer);
    let body = reqwest::Body::from(f.body);
    let send = f
        .http
        .request(f.method, &url)
        .headers(headers)
        .body(body)
        .send();
    let upstream = match tokio::time::timeout(f.response_timeout, send).await {
        Err(_) => {
            return Err(GatewayError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                format!(
                    "the session did not answer within {} s",
                    f.response_timeout.as_secs()
                ),
            ));
        }
        Ok(Err(e)) => {
            tracing::warn!(url, error = %e, "forwarding to the session");
            let err = GatewayError::new(
                StatusCode::BAD_GATEWAY,
                "upstream_unreachable",
                "the session's API could not be reached",
            );
            return Err(if e.is_connect() {
                err.not_delivered()
            } else {
                err
            });
        }
        Ok(Ok(r)) => r,
    };
    let status = upstream.status();
    let headers = end_to_end(upstream.headers());
    let idle = f.stream_idle_timeout;
    let stream = upstream.bytes_stream();
    // Chunks are forwarded as they arrive; a silence longer than `idle` ends the answer.
    let body = futures::stream::unfold(Box::pin(stream), move |mut s| async move {
        match tokio::time::timeout(idle, s.next()).await {
            Ok(Some(item)) => Some((item.map_err(std::io::Error::other), s)),
            Ok(None) => None,
            Err(_) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the session went silent mid-answer",
                )),
                s,
            )),
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    // Buffering proxies in front of the gateway (nginx) pass an event stream on at once.
    if is_event_stream(response.headers()) {
        response.headers_mut().insert(
            HeaderName::from_static("x-accel-buffering"),
            HeaderValue::from_static("no"),
        );
    }
    Ok(response)
}

fn is_event_stream(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-trace".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-trace", "1".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("host", "gw".parse().unwrap());
        h.insert("content-type", "application/json".parse().unwrap());
        h.insert("accept", "text/event-stream".parse().unwrap());
        let out = end_to_end(&h);
        let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "accept"]);
    }
}
