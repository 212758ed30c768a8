//! Who may talk to a session: its own bearer token (checked in constant time against the
//! salted digest the operator publishes on the session, so no Secret is read) or a JWT of the
//! configured issuer whose claim lists the namespace. No token is ever logged or put in an
//! error message.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};
use serde_json::Value;
use subtle::ConstantTimeEq;
use tokio::sync::RwLock;

use crate::config::{IdentityClaims, JwksSource, OidcSettings};
use crate::directory::{Directory, DirectoryError};
use crate::error::GatewayError;

/// The bearer token of a request, if it carries one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether `presented` is the token of session `namespace`/`name`, given the digest the
/// operator published for it (`status.apiTokenHash`). Constant time in where they differ.
pub fn token_matches(namespace: &str, name: &str, presented: &str, published: &str) -> bool {
    let computed = cairn_crds::session::api_token_hash(namespace, name, presented);
    computed.as_bytes().ct_eq(published.as_bytes()).into()
}

/// Whether a bearer looks like a JWT (three base64url parts), to be checked as one.
pub fn looks_like_jwt(token: &str) -> bool {
    let mut parts = token.split('.');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
    };
    ok(parts.next()) && ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// Namespaces a claim value allows. Pure.
pub fn namespaces_of(claim: Option<&Value>, prefix: &str) -> Vec<String> {
    let values: Vec<&str> = match claim {
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        Some(Value::String(s)) => s.split([' ', ',']).filter(|s| !s.is_empty()).collect(),
        _ => Vec::new(),
    };
    values
        .into_iter()
        .filter_map(|v| v.strip_prefix(prefix))
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .collect()
}

/// A verified JWT's caller.
#[derive(Debug, Clone)]
pub struct Caller {
    pub subject: Option<String>,
    pub namespaces: Vec<String>,
    /// The Kubernetes identity the lifecycle API authorizes ([`identity_of`]).
    pub identity: Result<Identity, String>,
}

impl Caller {
    pub fn may_use(&self, namespace: &str) -> bool {
        self.namespaces.iter().any(|n| n == namespace)
    }
}

/// A Kubernetes user and its groups, as the API server is to see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

/// The Kubernetes identity a JWT's claims name: the user from the username claim (a
/// string), the groups from the groups claim (an array of strings or one space- or
/// comma-separated string; absent: none), each with its prefix. Refused (with the reason):
/// no user, or a user or group in the `system:` space, which only Kubernetes itself hands
/// out (an issuer must never make a caller `system:masters`). Pure.
pub fn identity_of(claims: &Value, c: &IdentityClaims) -> Result<Identity, String> {
    let user = claims
        .get(&c.username_claim)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| format!("the JWT has no {} claim naming its user", c.username_claim))?;
    let user = format!("{}{user}", c.username_prefix);
    let groups: Vec<String> = namespaces_of(claims.get(&c.groups_claim), "")
        .into_iter()
        .map(|g| format!("{}{g}", c.groups_prefix))
        .collect();
    let reserved = |n: &str| n.starts_with("system:");
    if reserved(&user) {
        return Err(format!("the JWT names the reserved Kubernetes user {user}"));
    }
    if let Some(g) = groups.iter().find(|g| reserved(g)) {
        return Err(format!("the JWT names the reserved Kubernetes group {g}"));
    }
    Ok(Identity { user, groups })
}

/// JWKS refetched on an unknown key id at most this often.
const JWKS_REFETCH_MIN: Duration = Duration::from_secs(30);

/// The configured issuer and its keys.
pub struct Oidc {
    settings: OidcSettings,
    keys: RwLock<(JwkSet, Instant)>,
    http: reqwest::Client,
}

#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    #[error("reading the JWKS {0}: {1}")]
    Read(String, String),
    #[error("the JWKS {0} is not a JSON Web Key Set: {1}")]
    Parse(String, String),
}

impl Oidc {
    pub async fn load(settings: OidcSettings) -> Result<Self, OidcError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| OidcError::Read("client".into(), e.to_string()))?;
        let keys = fetch_jwks(&http, &settings.jwks).await?;
        Ok(Self {
            settings,
            keys: RwLock::new((keys, Instant::now())),
            http,
        })
    }

    /// Verifies a JWT: signature by a key of the set, issuer, audience, expiry.
    pub async fn verify(&self, token: &str) -> Result<Caller, GatewayError> {
        let invalid = |why: &str| {
            GatewayError::unauthorized("invalid_token", format!("the bearer JWT is invalid: {why}"))
        };
        let header = decode_header(token).map_err(|_| invalid("its header does not decode"))?;
        let key = match self.key(header.kid.as_deref()).await {
            Some(k) => k,
            None => return Err(invalid("it is signed by no key of the issuer")),
        };
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[self.settings.issuer.as_str()]);
        match &self.settings.audience {
            Some(aud) => validation.set_audience(&[aud.as_str()]),
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&["exp", "iss"]);
        let data = decode::<Value>(token, &key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::ExpiredSignature => invalid("it has expired"),
                K::InvalidIssuer => invalid("it is from another issuer"),
                K::InvalidAudience => invalid("it is for another audience"),
                K::InvalidAlgorithm => invalid("its algorithm does not match the key"),
                K::InvalidSignature => invalid("its signature does not verify"),
                _ => invalid("it does not verify"),
            }
        })?;
        Ok(Caller {
            subject: data
                .claims
                .get("sub")
                .and_then(Value::as_str)
                .map(str::to_string),
            namespaces: namespaces_of(
                data.claims.get(&self.settings.namespace_claim),
                &self.settings.namespace_prefix,
            ),
            identity: identity_of(&data.claims, &self.settings.identity),
        })
    }

    async fn key(&self, kid: Option<&str>) -> Option<DecodingKey> {
        if let Some(k) = self.find(kid).await {
            return Some(k);
        }
        // An unknown key id: the issuer may have rotated its keys.
        let stale = self.keys.read().await.1.elapsed() >= JWKS_REFETCH_MIN;
        if stale {
            match fetch_jwks(&self.http, &self.settings.jwks).await {
                Ok(set) => *self.keys.write().await = (set, Instant::now()),
                Err(e) => {
                    tracing::warn!(error = %e, "refreshing the JWKS");
                    self.keys.write().await.1 = Instant::now();
                }
            }
            return self.find(kid).await;
        }
        None
    }

    async fn find(&self, kid: Option<&str>) -> Option<DecodingKey> {
        let keys = self.keys.read().await;
        let jwk = match kid {
            Some(kid) => keys.0.find(kid),
            None if keys.0.keys.len() == 1 => keys.0.keys.first(),
            None => None,
        }?;
        DecodingKey::from_jwk(jwk).ok()
    }
}

async fn fetch_jwks(http: &reqwest::Client, source: &JwksSource) -> Result<JwkSet, OidcError> {
    let (name, text) = match source {
        JwksSource::File(p) => (
            p.display().to_string(),
            tokio::fs::read_to_string(p)
                .await
                .map_err(|e| OidcError::Read(p.display().to_string(), e.to_string()))?,
        ),
        JwksSource::Url(u) => {
            let r = http
                .get(u)
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .map_err(|e| OidcError::Read(u.clone(), e.to_string()))?;
            (
                u.clone(),
                r.text()
                    .await
                    .map_err(|e| OidcError::Read(u.clone(), e.to_string()))?,
            )
        }
    };
    serde_json::from_str(&text).map_err(|e| OidcError::Parse(name, e.to_string()))
}

/// A session's token as read (`None`: no Secret or key) and when it was read, by session.
type Entries = HashMap<(String, String), (Option<Arc<str>>, Instant)>;

/// Sessions' tokens, read from their Secrets and trusted for a short time: what the upstream
/// request of a JWT caller carries (a session-token caller's own token is forwarded).
pub struct TokenCache {
    ttl: Duration,
    entries: std::sync::Mutex<Entries>,
}

impl TokenCache {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn cached(&self, ns: &str, name: &str) -> Option<(Option<Arc<str>>, Duration)> {
        let entries = self.entries.lock().ok()?;
        entries
            .get(&(ns.to_string(), name.to_string()))
            .map(|(t, at)| (t.clone(), at.elapsed()))
    }

    async fn refresh(
        &self,
        dir: &dyn Directory,
        ns: &str,
        name: &str,
    ) -> Result<Option<Arc<str>>, GatewayError> {
        let token = dir.fetch_token(ns, name).await.map_err(|e| {
            tracing::warn!(namespace = ns, session = name, error = %e, "reading the session's token Secret");
            let message = match e {
                DirectoryError::Kube(kube::Error::Api(s)) if s.code == 403 => format!(
                    "the gateway may not read session tokens in namespace {ns}, which a JWT \
                     caller needs (chart value gateway.oidc.tokenSecretNamespaces); use the \
                     session's own token"
                ),
                _ => "the session's token could not be read; retry".to_string(),
            };
            GatewayError::new(
                http::StatusCode::SERVICE_UNAVAILABLE,
                "token_unavailable",
                message,
            )
        })?;
        let token: Option<Arc<str>> = token.map(Arc::from);
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(
                (ns.to_string(), name.to_string()),
                (token.clone(), Instant::now()),
            );
        }
        Ok(token)
    }

    /// The session's token (for the upstream request), read or cached.
    pub async fn token(
        &self,
        dir: &dyn Directory,
        ns: &str,
        name: &str,
    ) -> Result<Option<Arc<str>>, GatewayError> {
        match self.cached(ns, name) {
            Some((t, age)) if age < self.ttl => Ok(t),
            _ => self.refresh(dir, ns, name).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bearer_is_read_case_insensitively_and_empty_is_none() {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, "bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(http::header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(http::header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn a_token_matches_only_its_own_sessions_digest() {
        let published = cairn_crds::session::api_token_hash("team-a", "chat", "s3cret");
        assert!(token_matches("team-a", "chat", "s3cret", &published));
        assert!(!token_matches("team-a", "chat", "s3cre", &published));
        assert!(!token_matches("team-a", "other", "s3cret", &published));
        assert!(!token_matches("team-b", "chat", "s3cret", &published));
        assert!(!token_matches("team-a", "chat", "s3cret", ""));
        assert!(!token_matches("team-a", "chat", "s3cret", "s3cret"));
    }

    #[test]
    fn jwts_are_told_from_plain_tokens() {
        assert!(looks_like_jwt("eyJh.eyJz.c2ln"));
        assert!(!looks_like_jwt("a8f3e0c1d2"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a.b.c.d"));
        assert!(!looks_like_jwt("a..c"));
    }

    #[test]
    fn namespaces_come_from_arrays_strings_and_prefixed_groups() {
        assert_eq!(
            namespaces_of(Some(&json!(["team-a", "team-b"])), ""),
            ["team-a", "team-b"]
        );
        assert_eq!(
            namespaces_of(Some(&json!("team-a team-b")), ""),
            ["team-a", "team-b"]
        );
        assert_eq!(
            namespaces_of(Some(&json!(["cairn:team-a", "admins"])), "cairn:"),
            ["team-a"]
        );
        assert!(namespaces_of(Some(&json!(42)), "").is_empty());
        assert!(namespaces_of(None, "").is_empty());
    }

    #[test]
    fn the_kubernetes_identity_comes_from_the_claims_with_prefixes_and_never_system() {
        let c = IdentityClaims::default();
        let id = identity_of(&json!({"sub": "alice", "groups": ["team-a", "devs"]}), &c)
            .expect("identity");
        assert_eq!(id.user, "alice");
        assert_eq!(id.groups, ["team-a", "devs"]);
        let prefixed = IdentityClaims {
            username_claim: "email".into(),
            username_prefix: "oidc:".into(),
            groups_claim: "roles".into(),
            groups_prefix: "oidc:".into(),
        };
        let id = identity_of(
            &json!({"sub": "x", "email": "a@example.com", "roles": "ops, devs"}),
            &prefixed,
        )
        .expect("identity");
        assert_eq!(id.user, "oidc:a@example.com");
        assert_eq!(id.groups, ["oidc:ops", "oidc:devs"]);
        assert!(identity_of(&json!({"sub": "alice"}), &c).is_ok_and(|i| i.groups.is_empty()));
        assert!(identity_of(&json!({"groups": ["a"]}), &c).is_err());
        assert!(identity_of(&json!({"sub": ""}), &c).is_err());
        let e = identity_of(&json!({"sub": "alice", "groups": ["system:masters"]}), &c)
            .expect_err("reserved group");
        assert!(e.contains("system:masters"), "{e}");
        assert!(identity_of(&json!({"sub": "system:admin"}), &c).is_err());
    }
}
