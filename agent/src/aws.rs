//! The AWS identities of the agent's two AWS clients, the S3 archive and Bedrock. Each has its
//! own: static keys from the environment, a mounted directory that is re-read as its contents
//! change or near their expiry (a Kubernetes Secret volume, swapped atomically through its
//! `..data` link), or the SDK's default chain (environment, shared config, web identity token
//! file (IRSA), container credentials endpoint (EKS Pod Identity), IMDS).
//!
//! The S3 client caches and refreshes its identity in the SDK's identity cache; Bedrock's
//! signer keeps a [`CachedCredentials`] that refreshes the same way.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::provider_config::ProviderConfig;
use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider, future};
use aws_sdk_s3::config::{Region, SharedHttpClient};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use cairn_crds::time::rfc3339_micros;

/// Key (file) names of a credentials directory, the names of the Secret's keys: the access
/// key id and secret access key are required, the session token and expiration optional.
pub const ACCESS_KEY_ID_KEY: &str = "AWS_ACCESS_KEY_ID";
pub const SECRET_ACCESS_KEY_KEY: &str = "AWS_SECRET_ACCESS_KEY";
pub const SESSION_TOKEN_KEY: &str = "AWS_SESSION_TOKEN";
/// RFC 3339 (`2026-12-01T18:00:00Z`); after it the keys are not used.
pub const EXPIRATION_KEY: &str = "AWS_CREDENTIAL_EXPIRATION";

/// How often a credentials directory is looked at again when nothing expires sooner: the
/// identity handed to a cache expires this long after it was read (Kubernetes itself takes
/// about a minute to propagate a changed Secret into a volume).
pub const DIRECTORY_RECHECK: Duration = Duration::from_secs(60);

/// Cached credentials are renewed this long before they expire (as the SDK's cache does).
pub const REFRESH_BUFFER: Duration = Duration::from_secs(10);

/// Where one client's AWS identity comes from.
#[derive(Clone, Debug)]
pub enum AwsIdentity {
    /// Keys fixed at start.
    Static(Credentials),
    /// A mounted directory, re-read as it changes.
    Directory(DirectoryCredentials),
    /// The SDK's default chain.
    Chain,
    /// Any other provider (embedders, tests).
    Provider(SharedCredentialsProvider),
}

impl AwsIdentity {
    pub fn fixed(
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
        session_token: Option<String>,
    ) -> Self {
        Self::Static(Credentials::new(
            access_key_id,
            secret_access_key,
            session_token,
            None,
            "cairn-static",
        ))
    }

    /// From `<PREFIX>_CREDENTIALS_DIR` (a directory), else `<PREFIX>_ACCESS_KEY_ID` and
    /// `<PREFIX>_SECRET_ACCESS_KEY` (+ `<PREFIX>_SESSION_TOKEN`), else the default chain.
    /// One key of the pair without the other is an error.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>, prefix: &str) -> Result<Self, String> {
        let var = |k: &str| get(&format!("{prefix}_{k}")).filter(|v| !v.trim().is_empty());
        if let Some(dir) = var("CREDENTIALS_DIR") {
            return Ok(Self::Directory(DirectoryCredentials::new(dir)));
        }
        match (var("ACCESS_KEY_ID"), var("SECRET_ACCESS_KEY")) {
            (Some(id), Some(secret)) => Ok(Self::fixed(id, secret, var("SESSION_TOKEN"))),
            (None, None) => Ok(Self::Chain),
            (Some(_), None) => Err(format!(
                "{prefix}_ACCESS_KEY_ID is set but {prefix}_SECRET_ACCESS_KEY is not"
            )),
            (None, Some(_)) => Err(format!(
                "{prefix}_SECRET_ACCESS_KEY is set but {prefix}_ACCESS_KEY_ID is not"
            )),
        }
    }

    /// What the identity is, for logs and status (never a key).
    pub fn describe(&self) -> String {
        match self {
            Self::Static(_) => "static keys".into(),
            Self::Directory(d) => format!("directory {}", d.dir().display()),
            Self::Chain => {
                let members = chain_members(|k| std::env::var(k).ok());
                format!("default chain ({members})")
            }
            Self::Provider(_) => "custom provider".into(),
        }
    }

    /// A provider for a client in `region` that reaches AWS over `http` (the chain's STS,
    /// container endpoint and IMDS calls take the same network path). `client` names the
    /// user in logs; the first identity it resolves, and any failure, are logged.
    pub fn provider(
        &self,
        client: &'static str,
        region: &str,
        http: SharedHttpClient,
    ) -> SharedCredentialsProvider {
        let inner = match self {
            Self::Static(c) => SharedCredentialsProvider::new(c.clone()),
            Self::Directory(d) => SharedCredentialsProvider::new(d.clone()),
            Self::Chain => SharedCredentialsProvider::new(LazyChain {
                region: Region::new(region.to_owned()),
                http,
                chain: tokio::sync::OnceCell::new(),
            }),
            Self::Provider(p) => p.clone(),
        };
        tracing::info!(client, source = %self.describe(), "AWS credentials");
        SharedCredentialsProvider::new(Reporting {
            client,
            inner,
            resolved: AtomicBool::new(false),
        })
    }
}

/// The chain members the environment points at, in the chain's order (a hint for logs: the
/// chain itself decides).
pub fn chain_members(get: impl Fn(&str) -> Option<String>) -> String {
    let set = |k: &str| get(k).is_some_and(|v| !v.is_empty());
    let mut m = Vec::new();
    if set("AWS_ACCESS_KEY_ID") {
        m.push("environment");
    }
    if set("AWS_WEB_IDENTITY_TOKEN_FILE") && set("AWS_ROLE_ARN") {
        m.push("web identity token");
    }
    if set("AWS_CONTAINER_CREDENTIALS_FULL_URI") || set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
        m.push("container credentials endpoint");
    }
    if m.is_empty() {
        "shared config or IMDS".into()
    } else {
        m.join(", ")
    }
}

/// The HTTP client of the agent's AWS calls (S3, STS, IMDS): rustls with ring, with the
/// trusted authorities and proxies of `net`.
pub fn http_client(net: &crate::net::NetPath) -> SharedHttpClient {
    match (net.s3_tls(), net.s3_proxy()) {
        (None, None) => aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https(),
        (tls_context, proxy) => aws_smithy_http_client::Builder::new().build_with_connector_fn(
            move |settings, components| {
                let mut b = aws_smithy_http_client::Connector::builder();
                b.set_connector_settings(settings.cloned());
                if let Some(c) = components {
                    b.set_sleep_impl(c.sleep_impl());
                }
                let mut b = b.tls_provider(tls::Provider::Rustls(CryptoMode::Ring));
                if let Some(ctx) = &tls_context {
                    b = b.tls_context(ctx.clone());
                }
                if let Some(p) = &proxy {
                    b = b.proxy_config(p.clone());
                }
                b.build()
            },
        ),
    }
}

/// The default chain, built on first use (building it reads the environment and profile).
struct LazyChain {
    region: Region,
    http: SharedHttpClient,
    chain: tokio::sync::OnceCell<DefaultCredentialsChain>,
}

impl fmt::Debug for LazyChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyChain")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl ProvideCredentials for LazyChain {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(async move {
            let chain = self
                .chain
                .get_or_init(|| async {
                    let conf = ProviderConfig::default()
                        .with_http_client(self.http.clone())
                        .with_region(Some(self.region.clone()));
                    DefaultCredentialsChain::builder()
                        .region(self.region.clone())
                        .configure(conf)
                        .build()
                        .await
                })
                .await;
            chain.provide_credentials().await
        })
    }
}

/// Logs the first identity a client resolves (the kind of key, never the key) and every
/// failure.
#[derive(Debug)]
struct Reporting {
    client: &'static str,
    inner: SharedCredentialsProvider,
    resolved: AtomicBool,
}

impl ProvideCredentials for Reporting {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(async move {
            let result = self.inner.provide_credentials().await;
            match &result {
                Ok(c) => {
                    let first = !self.resolved.swap(true, Ordering::Relaxed);
                    let kind = key_kind(c.access_key_id());
                    let expires = c.expiry().map(rfc3339_micros);
                    if first {
                        tracing::info!(
                            client = self.client,
                            kind,
                            ?expires,
                            "AWS credentials resolved"
                        );
                    } else {
                        tracing::debug!(
                            client = self.client,
                            kind,
                            ?expires,
                            "AWS credentials refreshed"
                        );
                    }
                }
                Err(e) => tracing::warn!(
                    client = self.client,
                    error = %aws_sdk_s3::error::DisplayErrorContext(e),
                    "AWS credentials unavailable"
                ),
            }
            result
        })
    }
}

/// `temporary` for STS-issued keys (`ASIA…`), `long-term` for IAM user keys (`AKIA…`).
pub fn key_kind(access_key_id: &str) -> &'static str {
    if access_key_id.starts_with("ASIA") {
        "temporary"
    } else if access_key_id.starts_with("AKIA") {
        "long-term"
    } else {
        "other"
    }
}

/// Credentials in a directory, one file per key ([`ACCESS_KEY_ID_KEY`],
/// [`SECRET_ACCESS_KEY_KEY`], optionally [`SESSION_TOKEN_KEY`] and [`EXPIRATION_KEY`]).
///
/// Each call looks at the files (the `..data` link and each file's inode, size and mtime) and
/// reads them again only when they changed; the identity it returns expires at the file's
/// expiration or [`DIRECTORY_RECHECK`] from now, whichever is sooner, so a cache in front asks
/// again in time. Keys past their own expiration are an error, not a request bound to fail.
#[derive(Clone)]
pub struct DirectoryCredentials {
    inner: Arc<DirInner>,
}

struct DirInner {
    dir: PathBuf,
    access_key_id: String,
    secret_access_key: String,
    recheck: Duration,
    loaded: Mutex<Option<Loaded>>,
}

#[derive(Clone)]
struct Loaded {
    stamp: Stamp,
    credentials: Credentials,
    expires: Option<SystemTime>,
}

type Stamp = (Option<PathBuf>, Vec<Option<(u64, u64, SystemTime)>>);

impl fmt::Debug for DirectoryCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectoryCredentials")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

/// Why a credentials directory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} is empty")]
    Empty(String),
    #[error("{path} is not an RFC 3339 time: {value:?}")]
    Expiration { path: String, value: String },
    #[error("the credentials in {dir} expired at {at} and were not renewed")]
    Expired { dir: String, at: String },
    #[error("{0} kept changing while it was read")]
    Unstable(String),
}

impl DirectoryCredentials {
    /// The directory with the default key names.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_keys(dir, ACCESS_KEY_ID_KEY, SECRET_ACCESS_KEY_KEY)
    }

    /// The directory with the access key id and secret access key under other names.
    pub fn with_keys(
        dir: impl Into<PathBuf>,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        Self {
            inner: Arc::new(DirInner {
                dir: dir.into(),
                access_key_id: access_key_id.into(),
                secret_access_key: secret_access_key.into(),
                recheck: DIRECTORY_RECHECK,
                loaded: Mutex::new(None),
            }),
        }
    }

    /// Overrides [`DIRECTORY_RECHECK`] (before the first use).
    pub fn with_recheck(self, recheck: Duration) -> Self {
        let i = &self.inner;
        Self::from_inner(DirInner {
            dir: i.dir.clone(),
            access_key_id: i.access_key_id.clone(),
            secret_access_key: i.secret_access_key.clone(),
            recheck,
            loaded: Mutex::new(None),
        })
    }

    fn from_inner(inner: DirInner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The current keys, read again if the files changed since the last call.
    pub fn load(&self) -> Result<Credentials, DirectoryError> {
        self.load_at(SystemTime::now())
    }

    fn load_at(&self, now: SystemTime) -> Result<Credentials, DirectoryError> {
        let i = &self.inner;
        let stamp = self.stamp();
        let cached = i
            .loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .filter(|l| l.stamp == stamp);
        let loaded = match cached {
            Some(l) => l,
            None => {
                let l = self.read()?;
                *i.loaded.lock().unwrap_or_else(|p| p.into_inner()) = Some(l.clone());
                l
            }
        };
        if let Some(at) = loaded.expires
            && at <= now
        {
            return Err(DirectoryError::Expired {
                dir: i.dir.display().to_string(),
                at: rfc3339_micros(at),
            });
        }
        let recheck = now + i.recheck;
        let mut c = loaded.credentials;
        *c.expiry_mut() = Some(loaded.expires.map_or(recheck, |e| e.min(recheck)));
        Ok(c)
    }

    fn files(&self) -> [&str; 4] {
        [
            &self.inner.access_key_id,
            &self.inner.secret_access_key,
            SESSION_TOKEN_KEY,
            EXPIRATION_KEY,
        ]
    }

    fn stamp(&self) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        let dir = &self.inner.dir;
        let link = std::fs::read_link(dir.join("..data")).ok();
        let files = self
            .files()
            .iter()
            .map(|f| {
                std::fs::metadata(dir.join(f)).ok().map(|m| {
                    (
                        m.ino(),
                        m.len(),
                        m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    )
                })
            })
            .collect();
        (link, files)
    }

    /// Reads all files, again if they changed meanwhile (a half-swapped directory would
    /// pair one key's id with another's secret).
    fn read(&self) -> Result<Loaded, DirectoryError> {
        for _ in 0..3 {
            let before = self.stamp();
            let loaded = self.read_once(before.clone())?;
            if self.stamp() == before {
                return Ok(loaded);
            }
        }
        Err(DirectoryError::Unstable(
            self.inner.dir.display().to_string(),
        ))
    }

    fn read_once(&self, stamp: Stamp) -> Result<Loaded, DirectoryError> {
        let dir = &self.inner.dir;
        let read = |name: &str, required: bool| -> Result<Option<String>, DirectoryError> {
            let path = dir.join(name);
            let shown = || path.display().to_string();
            match std::fs::read_to_string(&path) {
                Ok(v) => {
                    let v = v.trim_end_matches(['\r', '\n']).to_owned();
                    match (v.is_empty(), required) {
                        (true, true) => Err(DirectoryError::Empty(shown())),
                        (true, false) => Ok(None),
                        (false, _) => Ok(Some(v)),
                    }
                }
                Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(DirectoryError::Read {
                    path: shown(),
                    source,
                }),
            }
        };
        let id = read(&self.inner.access_key_id, true)?.unwrap_or_default();
        let secret = read(&self.inner.secret_access_key, true)?.unwrap_or_default();
        let token = read(SESSION_TOKEN_KEY, false)?;
        let expires = match read(EXPIRATION_KEY, false)? {
            None => None,
            Some(v) => Some(
                parse_rfc3339(v.trim()).ok_or_else(|| DirectoryError::Expiration {
                    path: dir.join(EXPIRATION_KEY).display().to_string(),
                    value: v.clone(),
                })?,
            ),
        };
        Ok(Loaded {
            stamp,
            credentials: Credentials::new(id, secret, token, expires, "cairn-directory"),
            expires,
        })
    }
}

impl ProvideCredentials for DirectoryCredentials {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::ready(self.load().map_err(CredentialsError::provider_error))
    }
}

fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    aws_smithy_types::DateTime::from_str(s, aws_smithy_types::date_time::Format::DateTime)
        .ok()
        .and_then(|t| SystemTime::try_from(t).ok())
}

/// A provider's identity, kept until [`REFRESH_BUFFER`] before it expires (identities
/// without an expiry are kept for good).
#[derive(Debug)]
pub struct CachedCredentials {
    provider: SharedCredentialsProvider,
    cached: tokio::sync::Mutex<Option<Credentials>>,
}

impl CachedCredentials {
    pub fn new(provider: SharedCredentialsProvider) -> Self {
        Self {
            provider,
            cached: tokio::sync::Mutex::new(None),
        }
    }

    pub async fn get(&self) -> Result<Credentials, CredentialsError> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref()
            && c.expiry()
                .is_none_or(|e| e > SystemTime::now() + REFRESH_BUFFER)
        {
            return Ok(c.clone());
        }
        let fresh = self.provider.provide_credentials().await?;
        *cached = Some(fresh.clone());
        Ok(fresh)
    }
}

impl ProvideCredentials for CachedCredentials {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (k, v) in files {
            std::fs::write(dir.join(k), v).expect("write");
        }
    }

    #[test]
    fn a_directory_is_read_again_only_when_it_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            &[
                (ACCESS_KEY_ID_KEY, "AKID1\n"),
                (SECRET_ACCESS_KEY_KEY, "s1"),
            ],
        );
        let d = DirectoryCredentials::new(dir.path());
        let now = SystemTime::now();
        let c = d.load_at(now).expect("load");
        assert_eq!((c.access_key_id(), c.secret_access_key()), ("AKID1", "s1"));
        assert_eq!(c.session_token(), None);
        assert_eq!(c.expiry(), Some(now + DIRECTORY_RECHECK));
        // A new file (new inode) is seen on the next call.
        let staged = dir.path().join("staged");
        std::fs::write(&staged, "AKID2").expect("write");
        std::fs::rename(&staged, dir.path().join(ACCESS_KEY_ID_KEY)).expect("rename");
        write(
            dir.path(),
            &[
                (SESSION_TOKEN_KEY, "tok"),
                (EXPIRATION_KEY, "2100-01-01T00:00:00Z"),
            ],
        );
        let c = d.load_at(now).expect("load");
        assert_eq!(c.access_key_id(), "AKID2");
        assert_eq!(c.session_token(), Some("tok"));
        assert_eq!(
            c.expiry(),
            Some(now + DIRECTORY_RECHECK),
            "the recheck is sooner"
        );
        let soon = now + Duration::from_secs(5);
        write(dir.path(), &[(EXPIRATION_KEY, &rfc3339_micros(soon))]);
        let c = d.load_at(now).expect("load");
        assert_eq!(c.expiry().map(rfc3339_micros), Some(rfc3339_micros(soon)));
        let late = d.load_at(now + Duration::from_secs(6));
        assert!(
            matches!(late, Err(DirectoryError::Expired { .. })),
            "{late:?}"
        );
    }

    #[test]
    fn bad_directories_are_clear_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = DirectoryCredentials::new(dir.path());
        assert!(matches!(d.load(), Err(DirectoryError::Read { .. })));
        write(
            dir.path(),
            &[(ACCESS_KEY_ID_KEY, "AKID"), (SECRET_ACCESS_KEY_KEY, "\n")],
        );
        assert!(matches!(d.load(), Err(DirectoryError::Empty(_))));
        write(
            dir.path(),
            &[(SECRET_ACCESS_KEY_KEY, "s"), (EXPIRATION_KEY, "tomorrow")],
        );
        let e = d.load().expect_err("bad expiration");
        assert!(e.to_string().contains("tomorrow"), "{e}");
        // Other key names, as a Secret's keys may be named.
        write(dir.path(), &[("id", "AKID9"), ("secret", "s9")]);
        std::fs::remove_file(dir.path().join(EXPIRATION_KEY)).expect("rm");
        let c = DirectoryCredentials::with_keys(dir.path(), "id", "secret")
            .load()
            .expect("load");
        assert_eq!(c.access_key_id(), "AKID9");
        assert!(!format!("{d:?} {c:?}").contains("s9"));
    }

    #[test]
    fn identities_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let d = AwsIdentity::from_lookup(env(&[("CAIRN_S3_CREDENTIALS_DIR", "/c")]), "CAIRN_S3");
        assert!(matches!(d, Ok(AwsIdentity::Directory(_))));
        let s = AwsIdentity::from_lookup(
            env(&[
                ("CAIRN_S3_ACCESS_KEY_ID", "a"),
                ("CAIRN_S3_SECRET_ACCESS_KEY", "b"),
            ]),
            "CAIRN_S3",
        );
        assert!(matches!(s, Ok(AwsIdentity::Static(_))));
        let half = AwsIdentity::from_lookup(env(&[("CAIRN_S3_ACCESS_KEY_ID", "a")]), "CAIRN_S3");
        assert!(half.is_err());
        let chain = AwsIdentity::from_lookup(env(&[("AWS_ACCESS_KEY_ID", "a")]), "CAIRN_S3");
        assert!(matches!(chain, Ok(AwsIdentity::Chain)));
        assert_eq!(
            chain_members(env(&[
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t"),
                ("AWS_ROLE_ARN", "arn")
            ])),
            "web identity token"
        );
        assert_eq!(chain_members(env(&[])), "shared config or IMDS");
        assert_eq!(key_kind("ASIAXYZ"), "temporary");
    }
}
