//! An independent check of AWS Signature Version 4 on the requests the simulator receives:
//! the canonical request is rebuilt from what arrived on the wire (method, path as sent,
//! signed headers, body) and signed with the secret the test registered for the access key.

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Characters AWS leaves unencoded in a path segment.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// What the simulator saw of a SigV4 request.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct SigV4Seen {
    /// The access key id the request names (not a secret).
    pub access_key_id: String,
    /// Whether an `x-amz-security-token` was sent and signed.
    pub session_token: bool,
    /// `valid`, `invalid` (signature mismatch) or `unknown_key` (no secret registered).
    pub verdict: String,
}

/// Checks `headers`' SigV4 authorization for a request of `method` to `path` (exactly as
/// sent, percent-encoded) with an empty query. `None` when the request is not SigV4-signed.
pub fn check(
    method: &str,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
    secret_for: impl Fn(&str) -> Option<String>,
) -> Option<SigV4Seen> {
    let auth = headers.get("authorization")?.to_str().ok()?;
    let rest = auth.strip_prefix("AWS4-HMAC-SHA256 ")?;
    let field = |name: &str| {
        rest.split(',')
            .map(str::trim)
            .find_map(|p| p.strip_prefix(name))
            .map(str::to_string)
    };
    let credential = field("Credential=")?;
    let signed_headers = field("SignedHeaders=")?;
    let mut scope = credential.splitn(2, '/');
    let access_key_id = scope.next()?.to_string();
    let scope = scope.next()?.to_string();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let session_token = header("x-amz-security-token").is_some()
        && signed_headers
            .split(';')
            .any(|h| h == "x-amz-security-token");
    let seen = |verdict: &str| SigV4Seen {
        access_key_id: access_key_id.clone(),
        session_token,
        verdict: verdict.into(),
    };
    let Some(secret) = secret_for(&access_key_id) else {
        return Some(seen("unknown_key"));
    };
    let mut parts = scope.split('/');
    let (Some(date), Some(region), Some(service)) = (parts.next(), parts.next(), parts.next())
    else {
        return Some(seen("invalid"));
    };
    let Some(stamp) = header("x-amz-date") else {
        return Some(seen("invalid"));
    };
    let canonical_headers: String = signed_headers
        .split(';')
        .map(|h| format!("{h}:{}\n", header(h).unwrap_or_default().trim()))
        .collect();
    let canonical_path: String = path
        .split('/')
        .map(|seg| utf8_percent_encode(seg, PATH_SEGMENT).to_string())
        .collect::<Vec<_>>()
        .join("/");
    let canonical = format!(
        "{method}\n{canonical_path}\n\n{canonical_headers}\n{signed_headers}\n{}",
        hex::encode(Sha256::digest(body)),
    );
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    );
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    let expected = hex::encode(hmac(&k_signing, to_sign.as_bytes()));
    let ok = field("Signature=").is_some_and(|s| s == expected) && stamp.starts_with(date);
    Some(seen(if ok { "valid" } else { "invalid" }))
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length, so construction cannot fail.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut m) => {
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Bedrock Converse request signed by botocore (the AWS SDK for Python).
    #[test]
    fn accepts_botocores_signature_and_nothing_else() {
        let body = br#"{"messages":[{"role":"user","content":[{"text":"hi"}]}],"inferenceConfig":{"maxTokens":64}}"#;
        let mut h = HeaderMap::new();
        let mut set = |k: &'static str, v: &str| {
            h.insert(k, v.parse().expect("header"));
        };
        set("host", "bedrock-runtime.us-east-1.amazonaws.com");
        set("content-type", "application/json");
        set("x-amz-date", "20261130T093408Z");
        set("x-amz-security-token", "session-token-xyz");
        set(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261130/us-east-1/bedrock/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, \
             Signature=deb1800b25e2cdfa7c7fc42a12f3f2ff0fdb37665d2211ec677a55aa7a81d192",
        );
        let path = "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse";
        let secret = |id: &str| {
            (id == "AKIDEXAMPLE").then(|| "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".to_string())
        };
        let seen = check("POST", path, &h, body, secret).expect("sigv4");
        assert_eq!(seen.verdict, "valid");
        assert!(seen.session_token);
        assert_eq!(
            check("POST", path, &h, b"{}", secret).map(|s| s.verdict),
            Some("invalid".into())
        );
        assert_eq!(
            check("POST", path, &h, body, |_| None).map(|s| s.verdict),
            Some("unknown_key".into())
        );
        h.insert("x-amz-security-token", "other".parse().expect("header"));
        assert_eq!(
            check("POST", path, &h, body, secret).map(|s| s.verdict),
            Some("invalid".into())
        );
    }
}
