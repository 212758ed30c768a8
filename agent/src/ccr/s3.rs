//! The durable tier: S3 or any S3-compatible store (MinIO, Garage, Ceph, moto).
//!
//! One session's originals live under `<prefix>/<namespace>/<session>/ccr/<key>`; the journal
//! shares the session's root (`.../journal/`). Every request is bounded: a connect timeout, a
//! per-attempt timeout and an overall operation timeout, with a few retries backing off in
//! between, so an unreachable or stalled store makes `archive` fail within a known time instead
//! of hanging a turn.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};

use super::stats::ArchiveCounters;
use super::{ArchiveError, Hashed, Key, ObjectArchive, Store};
use crate::aws::AwsIdentity;
use crate::storage::{ObjectStore, S3Objects};

/// Where one session's objects live inside a bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionScope {
    prefix: String,
    namespace: String,
    session: String,
}

/// A scope component that would let one session's objects leak into another's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScopeError {
    #[error("archive prefix {0:?} must be relative, without '..', empty segments or spaces")]
    Prefix(String),
    #[error("{what} {value:?} is not a valid Kubernetes object name")]
    Name { what: &'static str, value: String },
}

impl ScopeError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Prefix(_) => "invalid_prefix",
            Self::Name { .. } => "invalid_name",
        }
    }
}

impl SessionScope {
    /// The scope of session `namespace/session` under `archive.prefix` (default `cairn`).
    pub fn for_session(
        spec: &cairn_crds::session::ArchiveSpec,
        namespace: &str,
        session: &str,
    ) -> Result<Self, ScopeError> {
        Self::new(
            spec.prefix.as_deref().unwrap_or(DEFAULT_PREFIX),
            namespace,
            session,
        )
    }

    /// Validates every component: a namespace or session name can never climb out of its
    /// directory or reach into a sibling's (`a/b` + `c` vs `a` + `b/c`).
    pub fn new(prefix: &str, namespace: &str, session: &str) -> Result<Self, ScopeError> {
        let prefix = prefix.trim_end_matches('/');
        let prefix_ok = prefix.is_empty()
            || (prefix.len() <= 512
                && prefix.split('/').all(|seg| {
                    !seg.is_empty()
                        && seg != "."
                        && seg != ".."
                        && seg.chars().all(|c| c.is_ascii_graphic())
                }));
        if !prefix_ok {
            return Err(ScopeError::Prefix(prefix.to_owned()));
        }
        for (what, value) in [("namespace", namespace), ("session", session)] {
            if !is_object_name(value) {
                return Err(ScopeError::Name {
                    what,
                    value: value.to_owned(),
                });
            }
        }
        Ok(Self {
            prefix: prefix.to_owned(),
            namespace: namespace.to_owned(),
            session: session.to_owned(),
        })
    }

    /// `<prefix>/<namespace>/<session>/`: everything the session owns (archive and journal).
    pub fn root(&self) -> String {
        cairn_crds::session::archive_root(&self.prefix, &self.namespace, &self.session)
    }

    /// `<root>ccr/`.
    pub fn ccr_prefix(&self) -> String {
        format!("{}ccr/", self.root())
    }

    /// `<root>journal/`.
    pub fn journal_prefix(&self) -> String {
        format!("{}journal/", self.root())
    }

    /// The object name of an archived original. Only a validated [`Key`] reaches here.
    pub fn object_key(&self, key: &Key) -> String {
        format!("{}{}", self.ccr_prefix(), key.as_str())
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn session(&self) -> &str {
        &self.session
    }
}

fn is_object_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b.iter()
            .all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !s.contains("..")
}

/// Why an S3 tier could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum S3ConfigError {
    #[error("S3 endpoint {0:?} must be an http:// or https:// URL")]
    Endpoint(String),
    #[error(transparent)]
    Scope(#[from] ScopeError),
}

impl S3ConfigError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Endpoint(_) => "invalid_endpoint",
            Self::Scope(e) => e.label(),
        }
    }
}

/// How long a request may take. Generous enough for multi-megabyte originals inside a
/// cluster, short enough that a dead store turns a lossy step into a no-op within seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct S3Timeouts {
    pub connect: Duration,
    /// One attempt (request sent to response read).
    pub attempt: Duration,
    /// All attempts and the backoff between them.
    pub operation: Duration,
    pub max_attempts: u32,
    pub initial_backoff: Duration,
}

impl Default for S3Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(3),
            attempt: Duration::from_secs(10),
            operation: Duration::from_secs(30),
            max_attempts: 3,
            initial_backoff: Duration::from_millis(200),
        }
    }
}

/// Connection settings of the durable tier.
#[derive(Clone, Debug)]
pub struct S3Config {
    pub bucket: String,
    /// Endpoint override (self-hosted stores); `None` is AWS.
    pub endpoint: Option<String>,
    pub region: String,
    /// `endpoint/bucket/key` addressing, which most self-hosted stores need.
    pub force_path_style: bool,
    /// Static keys, a mounted directory, or the SDK's default chain (`crate::aws`).
    pub credentials: AwsIdentity,
    pub timeouts: S3Timeouts,
    /// Trusted authorities and forward proxies (`crate::net`).
    pub net: crate::net::NetPath,
}

/// `archive.prefix` when neither the session nor the operator sets one.
pub const DEFAULT_PREFIX: &str = "cairn";
/// `archive.region` when neither the session nor the operator sets one.
pub const DEFAULT_REGION: &str = "us-east-1";

impl S3Config {
    /// From `AgentSession.spec.archive` (the operator has already filled in its own defaults;
    /// the remaining ones are the CRD's documented defaults). `None` when no bucket is
    /// configured: the session then archives to a local directory only.
    pub fn from_spec(
        spec: &cairn_crds::session::ArchiveSpec,
        credentials: AwsIdentity,
    ) -> Result<Option<Self>, S3ConfigError> {
        let Some(bucket) = spec.bucket.clone() else {
            return Ok(None);
        };
        if let Some(endpoint) = &spec.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(S3ConfigError::Endpoint(endpoint.clone()));
        }
        Ok(Some(Self {
            bucket,
            endpoint: spec.endpoint.clone(),
            region: spec
                .region
                .clone()
                .unwrap_or_else(|| DEFAULT_REGION.to_owned()),
            // Self-hosted stores (any endpoint override) mostly need path-style addressing.
            force_path_style: spec.force_path_style.unwrap_or(spec.endpoint.is_some()),
            credentials,
            timeouts: S3Timeouts::default(),
            net: crate::net::NetPath::default(),
        }))
    }

    /// An SDK client for these settings (rustls with ring); its identity cache refreshes
    /// expiring credentials.
    pub fn client(&self) -> Result<Client, S3ConfigError> {
        if let Some(endpoint) = &self.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(S3ConfigError::Endpoint(endpoint.clone()));
        }
        let t = &self.timeouts;
        let http = crate::aws::http_client(&self.net);
        let creds = self.credentials.provider("s3", &self.region, http.clone());
        let mut builder = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(http)
            .region(Region::new(self.region.clone()))
            .credentials_provider(creds)
            .force_path_style(self.force_path_style)
            // Flexible checksums are not implemented by every S3-compatible store.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(t.max_attempts.max(1))
                    .with_initial_backoff(t.initial_backoff),
            )
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(t.connect)
                    .operation_attempt_timeout(t.attempt)
                    .operation_timeout(t.operation)
                    .build(),
            );
        if let Some(endpoint) = &self.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        Ok(Client::from_conf(builder.build()))
    }
}

/// One session's originals in S3: the archive over [`S3Objects`] at `<root>ccr/`.
#[derive(Clone)]
pub struct S3Store {
    originals: ObjectArchive<S3Objects>,
    scope: SessionScope,
    counters: Arc<ArchiveCounters>,
}

/// The session's journal in S3: `<root>journal/`, written as JSON.
pub fn journal_objects(client: Client, bucket: &str, scope: &SessionScope) -> S3Objects {
    S3Objects::new(client, bucket, scope.journal_prefix()).with_content_type("application/json")
}

impl S3Store {
    pub fn new(config: &S3Config, scope: SessionScope) -> Result<Self, S3ConfigError> {
        Ok(Self::with_client(config.client()?, &config.bucket, scope))
    }

    pub fn with_client(client: Client, bucket: &str, scope: SessionScope) -> Self {
        Self {
            originals: ObjectArchive::new(S3Objects::new(client, bucket, scope.ccr_prefix())),
            scope,
            counters: Arc::new(ArchiveCounters::default()),
        }
    }

    /// Requests of one pass kept in flight at once (`archive.maxInFlight`; at least 1).
    pub fn with_in_flight(mut self, in_flight: usize) -> Self {
        self.originals = self.originals.with_in_flight(in_flight);
        self
    }

    pub fn with_counters(mut self, counters: Arc<ArchiveCounters>) -> Self {
        self.counters = counters;
        self
    }

    pub fn scope(&self) -> &SessionScope {
        &self.scope
    }

    pub fn client(&self) -> &Client {
        self.objects().client()
    }

    pub fn bucket(&self) -> &str {
        self.objects().bucket()
    }

    /// Everything the session owns (`<root>`): for the probe and the purge of the session.
    fn root(&self) -> S3Objects {
        S3Objects::new(self.client().clone(), self.bucket(), self.scope.root())
    }

    /// The originals as named objects (`<root>ccr/<key>`), past any cache.
    pub fn objects(&self) -> &S3Objects {
        self.originals.objects()
    }

    /// Stores `content` under `key` (computed by the caller with [`Key::of`]) and returns once
    /// the store has acknowledged it.
    pub async fn put(&self, key: &Key, content: &[u8]) -> Result<(), ArchiveError> {
        self.originals.put(key, content).await
    }

    /// The object's bytes, verified against the key; `None` when this session has no such key.
    pub async fn get(&self, key: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        self.originals.get(key).await
    }

    /// Proves the archive answers with this client's credentials: writes a small probe
    /// object under `<root>probe/`, reads it back, compares and deletes it. The error is
    /// the S3 client's, naming the operation that failed.
    pub async fn probe(&self) -> Result<(), ArchiveError> {
        const BODY: &[u8] = b"cairn archive probe";
        let root = self.root();
        let name = format!("probe/{:016x}", fastrand::u64(..));
        root.put(&name, BODY.to_vec()).await?;
        let read = root.get(&name).await?;
        root.delete(&name).await?;
        let key = format!("{}{name}", root.prefix());
        match read {
            Some(read) if read == BODY => Ok(()),
            Some(read) => Err(ArchiveError::Unavailable(format!(
                "S3 get: the probe object {key} came back as {} different bytes",
                read.len()
            ))),
            None => Err(ArchiveError::Unavailable(format!(
                "S3 get: the probe object {key} is not there"
            ))),
        }
    }

    /// `s3://BUCKET/ROOT`, as the operator names the session's archive.
    pub fn location(&self) -> String {
        format!("s3://{}/{}", self.bucket(), self.scope.root())
    }

    /// Deletes everything under the session's root (archive and journal): the operator's
    /// finalizer when `retainOnDelete` is false. Objects are deleted one by one because
    /// several S3-compatible stores reject or mishandle batch deletes. Returns the number of
    /// objects deleted.
    pub async fn delete_session_prefix(&self) -> Result<u64, ArchiveError> {
        let root = self.root();
        let mut deleted = 0;
        for name in root.list("").await? {
            root.delete(&name).await?;
            deleted += 1;
        }
        Ok(deleted)
    }
}

#[async_trait]
impl Store for S3Store {
    async fn put_hashed(&self, original: Hashed<'_>) -> Result<(), ArchiveError> {
        if let Err(e) = self.put(&original.key(), original.bytes()).await {
            self.counters.record_failure();
            return Err(e);
        }
        self.counters.record_put(original.bytes().len());
        Ok(())
    }

    async fn fetch(&self, key: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        let found = self.get(key).await?;
        self.counters.record_fetch(found.as_deref());
        Ok(found)
    }

    fn in_flight(&self) -> usize {
        self.originals.in_flight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_prefix_namespace_session_ccr_key() {
        let scope = SessionScope::new("cairn/", "team-a", "s1").expect("scope");
        let key = Key::of(b"x");
        assert_eq!(scope.root(), "cairn/team-a/s1/");
        assert_eq!(scope.object_key(&key), format!("cairn/team-a/s1/ccr/{key}"));
        assert_eq!(scope.journal_prefix(), "cairn/team-a/s1/journal/");
        let bare = SessionScope::new("", "ns", "s").expect("scope");
        assert_eq!(bare.ccr_prefix(), "ns/s/ccr/");
    }

    #[test]
    fn config_from_the_spec() {
        use cairn_crds::session::ArchiveSpec;
        let creds = AwsIdentity::fixed("a", "s", None);
        assert!(
            S3Config::from_spec(&ArchiveSpec::default(), creds.clone())
                .expect("ok")
                .is_none()
        );
        let spec = ArchiveSpec {
            bucket: Some("b".into()),
            endpoint: Some("http://garage:3900".into()),
            ..Default::default()
        };
        let c = S3Config::from_spec(&spec, creds.clone())
            .expect("ok")
            .expect("configured");
        assert_eq!((c.region.as_str(), c.force_path_style), ("us-east-1", true));
        let scope = SessionScope::for_session(&spec, "ns", "s").expect("scope");
        assert_eq!(scope.root(), "cairn/ns/s/");
        let bad = ArchiveSpec {
            bucket: Some("b".into()),
            endpoint: Some("garage:3900".into()),
            ..Default::default()
        };
        assert_eq!(
            S3Config::from_spec(&bad, creds)
                .map_err(|e| e.label())
                .err(),
            Some("invalid_endpoint")
        );
    }

    #[test]
    fn scope_components_cannot_escape() {
        for (p, n, s) in [
            ("/abs", "ns", "s"),
            ("a/../b", "ns", "s"),
            ("a//b", "ns", "s"),
            ("a b", "ns", "s"),
            ("p", "a/b", "s"),
            ("p", "ns", "../s"),
            ("p", "ns", ""),
            ("p", "NS", "s"),
            ("p", "ns", "s."),
        ] {
            assert!(SessionScope::new(p, n, s).is_err(), "{p:?} {n:?} {s:?}");
        }
    }
}
