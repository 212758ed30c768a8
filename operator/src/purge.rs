//! Deleting a session's archive and journal: everything under `<prefix>/<ns>/<session>/`.
//! Behind a trait so the finalizer does not care which store it talks to.

use async_trait::async_trait;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::types::{Delete, ObjectIdentifier};

/// Where the session's objects live and how to reach them.
#[derive(Clone, PartialEq, Eq)]
pub struct PurgeTarget {
    pub endpoint: Option<String>,
    pub bucket: String,
    pub region: String,
    pub force_path_style: bool,
    /// Key prefix to delete; always ends in `/`, so a session never purges a sibling whose name
    /// it prefixes.
    pub prefix: String,
    pub credentials: Option<S3Keys>,
}

/// An S3 access key pair (read from the session's S3 Secret).
#[derive(Clone, PartialEq, Eq)]
pub struct S3Keys {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for PurgeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PurgeTarget")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PurgeError {
    #[error("refusing to purge {0:?}: the prefix must name one session (ns/session/)")]
    UnsafePrefix(String),
    #[error("listing s3://{bucket}/{prefix}: {message}")]
    List {
        bucket: String,
        prefix: String,
        message: String,
    },
    #[error("deleting from s3://{bucket}: {message}")]
    Delete { bucket: String, message: String },
}

impl PurgeError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::UnsafePrefix(_) => "PurgeUnsafePrefix",
            Self::List { .. } => "PurgeListFailed",
            Self::Delete { .. } => "PurgeDeleteFailed",
        }
    }
}

/// Removes every object under a prefix. Idempotent: an empty prefix is a success.
#[async_trait]
pub trait ArchivePurger: Send + Sync {
    /// Returns how many objects were deleted.
    async fn purge(&self, target: &PurgeTarget) -> Result<u64, PurgeError>;
}

/// [`ArchivePurger`] over any S3-compatible store.
#[derive(Clone, Debug, Default)]
pub struct S3Purger;

/// The HTTP client of every S3 client the operator makes: rustls with ring, like the agent's
/// store, so each binary links exactly one crypto provider.
pub fn s3_http_client() -> aws_sdk_s3::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// DeleteObjects takes at most this many keys per request.
const DELETE_BATCH: usize = 1000;

impl S3Purger {
    fn client(target: &PurgeTarget) -> aws_sdk_s3::Client {
        let mut config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .http_client(s3_http_client())
            .region(Region::new(target.region.clone()))
            .force_path_style(target.force_path_style);
        if let Some(endpoint) = &target.endpoint {
            config = config.endpoint_url(endpoint);
        }
        if let Some(keys) = &target.credentials {
            config = config.credentials_provider(Credentials::new(
                keys.access_key_id.clone(),
                keys.secret_access_key.clone(),
                None,
                None,
                "cairn-session-secret",
            ));
        }
        aws_sdk_s3::Client::from_conf(config.build())
    }
}

#[async_trait]
impl ArchivePurger for S3Purger {
    async fn purge(&self, target: &PurgeTarget) -> Result<u64, PurgeError> {
        // `ns/session/` at the very least: never a bucket-wide or namespace-wide delete.
        let depth = target
            .prefix
            .split('/')
            .filter(|part| !part.is_empty())
            .count();
        if !target.prefix.ends_with('/') || depth < 2 {
            return Err(PurgeError::UnsafePrefix(target.prefix.clone()));
        }
        let client = Self::client(target);
        let mut deleted = 0u64;
        // List-then-delete from the start each round: deleting while paginating with a
        // continuation token can skip keys on some stores.
        loop {
            let page = client
                .list_objects_v2()
                .bucket(&target.bucket)
                .prefix(&target.prefix)
                .max_keys(DELETE_BATCH as i32)
                .send()
                .await
                .map_err(|e| PurgeError::List {
                    bucket: target.bucket.clone(),
                    prefix: target.prefix.clone(),
                    message: aws_sdk_s3::error::DisplayErrorContext(e).to_string(),
                })?;
            let keys: Vec<ObjectIdentifier> = page
                .contents()
                .iter()
                .filter_map(|o| o.key())
                .filter_map(|k| ObjectIdentifier::builder().key(k).build().ok())
                .collect();
            if keys.is_empty() {
                return Ok(deleted);
            }
            let count = keys.len() as u64;
            let delete = Delete::builder()
                .set_objects(Some(keys))
                .quiet(true)
                .build()
                .map_err(|e| PurgeError::Delete {
                    bucket: target.bucket.clone(),
                    message: e.to_string(),
                })?;
            let out = client
                .delete_objects()
                .bucket(&target.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| PurgeError::Delete {
                    bucket: target.bucket.clone(),
                    message: aws_sdk_s3::error::DisplayErrorContext(e).to_string(),
                })?;
            if let Some(first) = out.errors().first() {
                return Err(PurgeError::Delete {
                    bucket: target.bucket.clone(),
                    message: format!(
                        "{} of {count} keys failed, first {:?}: {}",
                        out.errors().len(),
                        first.key().unwrap_or_default(),
                        first.message().unwrap_or_default()
                    ),
                });
            }
            deleted += count;
        }
    }
}
