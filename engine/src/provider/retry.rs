//! When to retry a failed provider call, and how long to wait first.
//!
//! Only transient answers are retried: 429 (rate limit), 5xx, and Anthropic's 529
//! (overloaded). A 400 or 413 is never retried: those are overflow or payload rejections and
//! belong to the recovery ladder, where resending the same bytes cannot help. Transport
//! failures are not retried either: a reset on a large request is a payload signal the
//! classifier must see. The one exception is a request that met a connection the server had
//! already closed ([`resend_on_new_connection`]).

use std::time::Duration;

use crate::classify::DEFAULT_SUSPECTED_PAYLOAD_BYTES;

/// Backoff schedule for transient failures.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0 disables retrying).
    pub max_retries: u32,
    /// Delay before the first retry; doubles on each further retry.
    pub base: Duration,
    /// Upper bound of one delay, including a server's `Retry-After`.
    pub max_delay: Duration,
    /// Share of each delay that is randomised (0.0 = none, 1.0 = full jitter).
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            base: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            jitter: 0.5,
        }
    }
}

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Retry(Duration),
    GiveUp,
}

/// A 429 that waiting cannot fix: the account is out of quota or credit (OpenAI's
/// `insufficient_quota`), as opposed to a rate limit.
pub fn is_quota_exhausted(status: u16, body: &str) -> bool {
    status == 429 && body.contains("insufficient_quota")
}

/// Status codes worth another attempt with the same request.
pub fn is_transient(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504 | 529)
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// Decides after attempt number `attempt` (0 = the first try) failed with HTTP `status`.
    /// `retry_after` is the server's requested delay; `unit` is a random number in [0, 1)
    /// used for jitter (injected so the decision is a pure function).
    pub fn decide(
        &self,
        attempt: u32,
        status: Option<u16>,
        retry_after: Option<Duration>,
        unit: f64,
    ) -> Decision {
        let Some(status) = status else {
            return Decision::GiveUp;
        };
        if attempt >= self.max_retries || !is_transient(status) {
            return Decision::GiveUp;
        }
        if let Some(wait) = retry_after {
            // The server knows its own recovery time; jitter would only make us early.
            return Decision::Retry(wait.min(self.max_delay));
        }
        let exp = self
            .base
            .saturating_mul(2u32.saturating_pow(attempt.min(20)))
            .min(self.max_delay);
        let jitter = self.jitter.clamp(0.0, 1.0);
        let unit = unit.clamp(0.0, 1.0);
        let factor = 1.0 - jitter + jitter * unit;
        Decision::Retry(exp.mul_f64(factor))
    }
}

/// Whether a request that got no answer at all, because the connection closed under it, goes
/// out once more, at once, on a new connection. HTTP/1.1 keep-alive has a race: a server may
/// close an idle connection just as the client writes the next request onto it (llama-server
/// closes one after every streamed reply, while its headers promise keep-alive). Only a
/// request that may have gone out on a `reused` pooled connection qualifies, only once, and
/// only below the size at which a cut connection is a payload signal
/// ([`DEFAULT_SUSPECTED_PAYLOAD_BYTES`]): a large one is left to the recovery ladder, which never resends a request unchanged.
pub fn resend_on_new_connection(reused: bool, request_bytes: u64, resent: bool) -> bool {
    reused && !resent && request_bytes < DEFAULT_SUSPECTED_PAYLOAD_BYTES
}

/// Parses a `Retry-After` value: delay seconds (possibly fractional) or an HTTP date.
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e6)));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_retries: 3,
            base: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            jitter: 0.5,
        }
    }

    #[test]
    fn only_a_small_request_on_a_reused_connection_is_resent_and_only_once() {
        let small = DEFAULT_SUSPECTED_PAYLOAD_BYTES - 1;
        assert!(resend_on_new_connection(true, small, false));
        assert!(!resend_on_new_connection(true, small, true), "once");
        assert!(
            !resend_on_new_connection(false, small, false),
            "a new connection that closes unanswered is a real failure"
        );
        assert!(
            !resend_on_new_connection(true, DEFAULT_SUSPECTED_PAYLOAD_BYTES, false),
            "a large request's cut belongs to the recovery ladder"
        );
    }

    #[test]
    fn payload_and_overflow_statuses_are_never_retried() {
        for status in [400, 401, 403, 404, 413, 422, 431] {
            assert_eq!(
                policy().decide(0, Some(status), None, 0.5),
                Decision::GiveUp,
                "{status}"
            );
        }
        assert_eq!(policy().decide(0, None, None, 0.5), Decision::GiveUp);
    }

    #[test]
    fn transient_statuses_back_off_exponentially_with_bounded_jitter() {
        for status in [429, 500, 502, 503, 529] {
            let Decision::Retry(d0) = policy().decide(0, Some(status), None, 0.0) else {
                panic!("{status} must be retried");
            };
            assert_eq!(d0, Duration::from_millis(50));
            let Decision::Retry(d2) = policy().decide(2, Some(status), None, 0.999) else {
                panic!("{status} must be retried");
            };
            assert!(d2 > Duration::from_millis(390) && d2 <= Duration::from_millis(400));
        }
        assert_eq!(policy().decide(3, Some(503), None, 0.5), Decision::GiveUp);
    }

    #[test]
    fn retry_after_is_honoured_and_capped() {
        assert_eq!(
            policy().decide(0, Some(429), Some(Duration::from_secs(1)), 0.9),
            Decision::Retry(Duration::from_secs(1))
        );
        assert_eq!(
            policy().decide(0, Some(429), Some(Duration::from_secs(120)), 0.9),
            Decision::Retry(Duration::from_secs(2))
        );
    }

    #[test]
    fn exhausted_quota_is_not_a_rate_limit() {
        let body = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
        assert!(is_quota_exhausted(429, body));
        assert!(!is_quota_exhausted(
            429,
            r#"{"error":{"code":"rate_limit_exceeded"}}"#
        ));
        assert!(!is_quota_exhausted(400, body));
    }

    #[test]
    fn retry_after_parses_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("0.25", now),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
    }
}
