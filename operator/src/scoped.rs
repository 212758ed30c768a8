//! Scoped archive credentials: the operator holds the bucket's admin key pair (its own mounted
//! Secret, never an agent's), and for each session calls STS `AssumeRole` with an inline
//! session policy that allows only that session's prefix — `Get`/`Put`/`DeleteObject` under
//! `<prefix>/<namespace>/<session>/` and `ListBucket` with an `s3:prefix` condition on it. The
//! temporary credentials go into the session's own Secret (owned by the AgentSession), which
//! the pod mounts as a volume; the operator rewrites it before the credentials expire, and the
//! rotation never rolls the pod (the Secret is not part of the restart hash).
//!
//! The pure part (the policy, the Secret, when to refresh) is separate from the two edges:
//! the STS call and the Secret's get/apply by name (no list, no watch).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use aws_sdk_sts::config::timeout::TimeoutConfig;
use aws_sdk_sts::config::{BehaviorVersion, Credentials, Region};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{EnvVar, Secret, SecretVolumeSource, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use sha2::{Digest, Sha256};

use cairn_crds::session::{S3_EXPIRATION_KEY, S3_SESSION_TOKEN_KEY};
use cairn_crds::time::rfc3339;

use crate::config::ScopedArchive;
use crate::objects::{FIELD_MANAGER, labels};
use crate::purge::S3Keys;
use crate::validate::Plan;

/// Where the pod mounts its scoped credentials (the agent reads them from there, see
/// `CAIRN_S3_CREDENTIALS_DIR`).
pub const MOUNT_DIR: &str = "/var/run/cairn/archive-credentials";
/// The agent's variable naming [`MOUNT_DIR`].
pub const DIR_ENV: &str = "CAIRN_S3_CREDENTIALS_DIR";
const VOLUME: &str = "archive-credentials";
/// `s3://<bucket>/<root>` the Secret's credentials are scoped to: a changed bucket or
/// prefix mints anew instead of keeping credentials for the old place.
pub const SCOPE_ANNOTATION: &str = "cairn.dev/archive-scope";
/// When the operator refreshes the Secret (RFC 3339).
pub const REFRESH_AT_ANNOTATION: &str = "cairn.dev/refresh-at";
const ACCESS_KEY_ID_KEY: &str = "AWS_ACCESS_KEY_ID";
const SECRET_ACCESS_KEY_KEY: &str = "AWS_SECRET_ACCESS_KEY";

/// Name of the session's scoped credentials Secret.
pub fn secret_name(session: &str) -> String {
    format!("cairn-{session}-archive-credentials")
}

/// Why scoped credentials could not be minted or stored.
#[derive(Debug, thiserror::Error)]
pub enum ScopedError {
    #[error("reading the operator's archive admin credentials from {path}: {message}")]
    AdminCredentials { path: String, message: String },
    #[error("the archive prefix {0:?} holds a policy wildcard or variable ('*', '?', '$')")]
    UnsafePrefix(String),
    #[error("STS AssumeRole at {endpoint}: {message}")]
    Sts { endpoint: String, message: String },
    #[error("STS AssumeRole at {endpoint} answered without credentials or expiry")]
    NoCredentials { endpoint: String },
    #[error("Kubernetes API ({what} Secret {name}): {source}")]
    Kube {
        what: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl ScopedError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::AdminCredentials { .. } => "ScopedAdminCredentials",
            Self::UnsafePrefix(_) => "ScopedUnsafePrefix",
            Self::Sts { .. } | Self::NoCredentials { .. } => "ScopedCredentialsFailed",
            Self::Kube { .. } => "ScopedSecretFailed",
        }
    }
}

/// The session policy: objects under `root` (which ends in `/`), and listing only with a
/// prefix inside it.
pub fn session_policy(bucket: &str, root: &str) -> Result<String, ScopedError> {
    if root.contains(['*', '?', '$']) || !root.ends_with('/') {
        return Err(ScopedError::UnsafePrefix(root.to_string()));
    }
    let policy = serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "SessionObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": [format!("arn:aws:s3:::{bucket}/{root}*")],
            },
            {
                "Sid": "ListSessionPrefix",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [format!("arn:aws:s3:::{bucket}")],
                "Condition": {"StringLike": {"s3:prefix": [format!("{root}*")]}},
            },
        ],
    });
    Ok(policy.to_string())
}

/// `RoleSessionName` (2-64 of `[\w+=,.@-]`): `<namespace>.<session>`, shortened with a digest
/// when too long, so the store's audit log names the session.
pub fn role_session_name(namespace: &str, session: &str) -> String {
    let full = format!("{namespace}.{session}");
    if full.len() <= 64 {
        return full;
    }
    let digest = hex::encode(&Sha256::digest(full.as_bytes())[..8]);
    format!("{}-{digest}", &full[..47])
}

/// Temporary credentials from STS.
#[derive(Clone, PartialEq, Eq)]
pub struct TempCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: String,
    pub expiration: SystemTime,
}

impl fmt::Debug for TempCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TempCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("expiration", &rfc3339(self.expiration))
            .finish_non_exhaustive()
    }
}

/// When to refresh credentials that expire at `expiration`, minted at `now`: `refresh_before`
/// ahead of the expiry, or at half the lifetime when it is unset or not shorter than the
/// lifetime (a store may grant less than was asked for).
pub fn refresh_at(
    now: SystemTime,
    expiration: SystemTime,
    refresh_before: Option<Duration>,
) -> SystemTime {
    let lifetime = expiration.duration_since(now).unwrap_or_default();
    let ahead = refresh_before
        .filter(|rb| *rb < lifetime)
        .unwrap_or(lifetime / 2);
    expiration - ahead
}

/// What the session's Secret holds, as far as the refresh decision goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub scope: Option<String>,
    pub refresh_at: Option<SystemTime>,
    pub expiration: Option<SystemTime>,
}

impl Stored {
    pub fn read(secret: &Secret) -> Self {
        let annotation = |k: &str| {
            secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(k).cloned())
        };
        let expiration = secret
            .data
            .as_ref()
            .and_then(|d| d.get(S3_EXPIRATION_KEY))
            .and_then(|v| std::str::from_utf8(&v.0).ok().and_then(parse_time));
        let complete = secret.data.as_ref().is_some_and(|d| {
            [
                ACCESS_KEY_ID_KEY,
                SECRET_ACCESS_KEY_KEY,
                S3_SESSION_TOKEN_KEY,
            ]
            .iter()
            .all(|k| d.get(*k).is_some_and(|v| !v.0.is_empty()))
        });
        Self {
            scope: annotation(SCOPE_ANNOTATION),
            refresh_at: annotation(REFRESH_AT_ANNOTATION).and_then(|v| parse_time(&v)),
            expiration: expiration.filter(|_| complete),
        }
    }
}

/// Whether to mint now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The stored credentials serve until `refresh_at`.
    Fresh { refresh_at: SystemTime },
    /// Mint now; `usable` says whether the stored credentials still work meanwhile.
    Due { usable: bool },
}

pub fn decide(stored: Option<&Stored>, scope: &str, now: SystemTime) -> Decision {
    let Some(s) = stored else {
        return Decision::Due { usable: false };
    };
    let usable = s.scope.as_deref() == Some(scope) && s.expiration.is_some_and(|e| now < e);
    match s.refresh_at {
        Some(at) if usable && now < at => Decision::Fresh { refresh_at: at },
        _ => Decision::Due { usable },
    }
}

/// The session's credentials Secret: the key pair under the usual names, the session token
/// and the expiry beside them, owned by the session so it goes with it.
pub fn credentials_secret(
    plan: &Plan,
    creds: &TempCredentials,
    scope: &str,
    refresh_at: SystemTime,
) -> Secret {
    let data: BTreeMap<String, ByteString> = [
        (ACCESS_KEY_ID_KEY, creds.access_key_id.clone()),
        (SECRET_ACCESS_KEY_KEY, creds.secret_access_key.clone()),
        (S3_SESSION_TOKEN_KEY, creds.session_token.clone()),
        (S3_EXPIRATION_KEY, rfc3339(creds.expiration)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&plan.name)),
            namespace: Some(plan.namespace.clone()),
            labels: Some(labels(&plan.name)),
            annotations: Some(
                [
                    (SCOPE_ANNOTATION.to_string(), scope.to_string()),
                    (REFRESH_AT_ANNOTATION.to_string(), rfc3339(refresh_at)),
                ]
                .into(),
            ),
            owner_references: Some(vec![plan.owner.clone()]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    }
}

/// The pod's volume of its scoped credentials Secret (only in scoped mode).
pub fn volume(plan: &Plan) -> Option<Volume> {
    plan.archive.scoped.then(|| Volume {
        name: VOLUME.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name(&plan.name)),
            // Readable by the agent's group only (the pod's fsGroup).
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Its mount: the whole directory (no `subPath`), so the kubelet swaps in refreshed keys.
pub fn volume_mount(plan: &Plan) -> Option<VolumeMount> {
    plan.archive.scoped.then(|| VolumeMount {
        name: VOLUME.into(),
        mount_path: MOUNT_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    })
}

/// The variable telling the agent where the credentials are.
pub fn env(plan: &Plan) -> Option<EnvVar> {
    plan.archive.scoped.then(|| EnvVar {
        name: DIR_ENV.into(),
        value: Some(MOUNT_DIR.into()),
        ..Default::default()
    })
}

fn parse_time(s: &str) -> Option<SystemTime> {
    s.trim().parse::<Timestamp>().ok().map(SystemTime::from)
}

/// The operator's admin key pair, from its mounted Secret (read each time: a rotated Secret
/// is picked up without a restart).
pub fn admin_keys(dir: &Path) -> Result<S3Keys, ScopedError> {
    let read = |key: &str| {
        let path = dir.join(key);
        std::fs::read_to_string(&path)
            .map_err(|e| ScopedError::AdminCredentials {
                path: path.display().to_string(),
                message: e.to_string(),
            })
            .and_then(|v| {
                let v = v.trim().to_string();
                if v.is_empty() {
                    Err(ScopedError::AdminCredentials {
                        path: path.display().to_string(),
                        message: "empty".into(),
                    })
                } else {
                    Ok(v)
                }
            })
    };
    Ok(S3Keys {
        access_key_id: read(ACCESS_KEY_ID_KEY)?,
        secret_access_key: read(SECRET_ACCESS_KEY_KEY)?,
    })
}

/// Where the credentials are minted for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MintTarget {
    pub bucket: String,
    /// The session's root, `<prefix>/<namespace>/<session>/`.
    pub root: String,
    pub region: String,
    /// The archive endpoint, the STS endpoint's default.
    pub endpoint: Option<String>,
    pub role_session_name: String,
}

impl MintTarget {
    pub fn for_plan(plan: &Plan) -> Option<Self> {
        let bucket = plan.archive.bucket.clone()?;
        Some(Self {
            root: plan.archive.session_prefix(&plan.namespace, &plan.name),
            bucket,
            region: plan.archive.region.clone(),
            endpoint: plan.archive.endpoint.clone(),
            role_session_name: role_session_name(&plan.namespace, &plan.name),
        })
    }

    /// What the Secret's [`SCOPE_ANNOTATION`] records.
    pub fn scope(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.root)
    }
}

/// Calls STS `AssumeRole` with the admin credentials and the session policy of `target`.
pub async fn mint(
    config: &ScopedArchive,
    target: &MintTarget,
) -> Result<TempCredentials, ScopedError> {
    let policy = session_policy(&target.bucket, &target.root)?;
    let admin = admin_keys(&config.admin_credentials_dir)?;
    let endpoint = config
        .sts_endpoint
        .clone()
        .or_else(|| target.endpoint.clone());
    let shown = endpoint.clone().unwrap_or_else(|| "AWS STS".into());
    let mut sts = aws_sdk_sts::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(crate::purge::s3_http_client())
        .region(Region::new(target.region.clone()))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(Duration::from_secs(10))
                .operation_timeout(Duration::from_secs(30))
                .build(),
        )
        .credentials_provider(Credentials::new(
            admin.access_key_id,
            admin.secret_access_key,
            None,
            None,
            "cairn-operator-archive-admin",
        ));
    if let Some(endpoint) = &endpoint {
        sts = sts.endpoint_url(endpoint);
    }
    let client = aws_sdk_sts::Client::from_conf(sts.build());
    let mut request = client
        .assume_role()
        .role_session_name(&target.role_session_name)
        .policy(policy)
        .duration_seconds(i32::try_from(config.duration.as_secs()).unwrap_or(i32::MAX));
    if let Some(role) = &config.role_arn {
        request = request.role_arn(role);
    }
    let out = request.send().await.map_err(|e| ScopedError::Sts {
        endpoint: shown.clone(),
        message: aws_sdk_sts::error::DisplayErrorContext(e).to_string(),
    })?;
    let creds = out
        .credentials()
        .ok_or_else(|| ScopedError::NoCredentials {
            endpoint: shown.clone(),
        })?;
    let expiration = SystemTime::try_from(*creds.expiration())
        .map_err(|_| ScopedError::NoCredentials { endpoint: shown })?;
    Ok(TempCredentials {
        access_key_id: creds.access_key_id().to_string(),
        secret_access_key: creds.secret_access_key().to_string(),
        session_token: creds.session_token().to_string(),
        expiration,
    })
}

/// The outcome of [`ensure`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ensured {
    pub refresh_at: SystemTime,
    /// Expiry of freshly minted credentials (`None`: the stored ones are still fresh).
    pub minted: Option<SystemTime>,
}

/// A failed [`ensure`], and whether the stored credentials keep the session going meanwhile.
#[derive(Debug)]
pub struct Failure {
    pub error: ScopedError,
    pub usable: bool,
}

/// Keeps the session's Secret holding fresh credentials for `target`: reads it by name,
/// mints when it is missing, scoped elsewhere, or due, and applies it by name.
pub async fn ensure(
    secrets: &Api<Secret>,
    plan: &Plan,
    config: &ScopedArchive,
    target: &MintTarget,
) -> Result<Ensured, Failure> {
    let name = secret_name(&plan.name);
    let kube_err = |what, source| Failure {
        error: ScopedError::Kube {
            what,
            name: name.clone(),
            source,
        },
        usable: false,
    };
    let stored = secrets
        .get_opt(&name)
        .await
        .map_err(|e| kube_err("reading", e))?
        .map(|s| Stored::read(&s));
    let scope = target.scope();
    let usable = match decide(stored.as_ref(), &scope, SystemTime::now()) {
        Decision::Fresh { refresh_at } => {
            return Ok(Ensured {
                refresh_at,
                minted: None,
            });
        }
        Decision::Due { usable } => usable,
    };
    let creds = mint(config, target)
        .await
        .map_err(|error| Failure { error, usable })?;
    let at = refresh_at(SystemTime::now(), creds.expiration, config.refresh_before);
    let secret = credentials_secret(plan, &creds, &scope, at);
    secrets
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(|e| Failure {
            usable,
            ..kube_err("writing", e)
        })?;
    Ok(Ensured {
        refresh_at: at,
        minted: Some(creds.expiration),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_plan(name: &str) -> Plan {
        let spec = serde_json::from_value(serde_json::json!({
            "provider": {"kind": "openai", "model": "m"}
        }))
        .unwrap();
        let mut s = cairn_crds::AgentSession::new(name, spec);
        s.metadata.namespace = Some("ns".into());
        s.metadata.uid = Some("uid-1".into());
        let mut defaults = crate::Defaults::default();
        defaults.archive.bucket = Some("b".into());
        defaults.archive.credentials_secret = Some("s3".into());
        crate::validate(&s, None, &defaults).unwrap()
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn the_policy_names_only_the_session_root() {
        let p: serde_json::Value =
            serde_json::from_str(&session_policy("b", "cairn/ns/s/").unwrap()).unwrap();
        assert_eq!(
            p["Statement"][0]["Resource"][0],
            "arn:aws:s3:::b/cairn/ns/s/*"
        );
        assert_eq!(
            p["Statement"][0]["Action"],
            serde_json::json!(["s3:GetObject", "s3:PutObject", "s3:DeleteObject"])
        );
        assert_eq!(p["Statement"][1]["Resource"][0], "arn:aws:s3:::b");
        assert_eq!(
            p["Statement"][1]["Condition"]["StringLike"]["s3:prefix"][0],
            "cairn/ns/s/*"
        );
        for bad in ["cairn/*/s/", "cairn/ns/s", "${aws:username}/", "a?/ns/s/"] {
            assert!(session_policy("b", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn role_session_names_fit_and_stay_distinct() {
        assert_eq!(role_session_name("team-a", "s1"), "team-a.s1");
        let ns = "n".repeat(63);
        let a = role_session_name(&ns, &"a".repeat(46));
        let b = role_session_name(&ns, &"b".repeat(46));
        assert!(a.len() <= 64 && b.len() <= 64);
        assert_ne!(a, b);
    }

    #[test]
    fn refresh_comes_before_expiry() {
        // Half the lifetime by default.
        assert_eq!(refresh_at(at(0), at(3600), None), at(1800));
        assert_eq!(
            refresh_at(at(0), at(3600), Some(Duration::from_secs(600))),
            at(3000)
        );
        // A store granting less than asked: the configured lead does not fit, half does.
        assert_eq!(
            refresh_at(at(0), at(30), Some(Duration::from_secs(600))),
            at(15)
        );
        // Already expired: refresh now.
        assert_eq!(refresh_at(at(10), at(5), None), at(5));
    }

    #[test]
    fn decisions() {
        let scope = "s3://b/cairn/ns/s/";
        let fresh = Stored {
            scope: Some(scope.into()),
            refresh_at: Some(at(100)),
            expiration: Some(at(200)),
        };
        assert_eq!(decide(None, scope, at(0)), Decision::Due { usable: false });
        assert_eq!(
            decide(Some(&fresh), scope, at(0)),
            Decision::Fresh {
                refresh_at: at(100)
            }
        );
        assert_eq!(
            decide(Some(&fresh), scope, at(150)),
            Decision::Due { usable: true }
        );
        assert_eq!(
            decide(Some(&fresh), scope, at(250)),
            Decision::Due { usable: false }
        );
        // Scoped elsewhere (a changed prefix or bucket): mint, do not keep using.
        assert_eq!(
            decide(Some(&fresh), "s3://b/cairn/ns/t/", at(0)),
            Decision::Due { usable: false }
        );
        // Unreadable annotations: mint.
        let broken = Stored {
            refresh_at: None,
            ..fresh.clone()
        };
        assert_eq!(
            decide(Some(&broken), scope, at(0)),
            Decision::Due { usable: true }
        );
    }

    #[test]
    fn a_written_secret_reads_back() {
        let plan = test_plan("s");
        let creds = TempCredentials {
            access_key_id: "AK".into(),
            secret_access_key: "SK".into(),
            session_token: "TOK".into(),
            expiration: at(200),
        };
        let secret = credentials_secret(&plan, &creds, "s3://b/x/", at(100));
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("cairn-s-archive-credentials")
        );
        assert_eq!(
            secret.metadata.owner_references.as_ref().map(Vec::len),
            Some(1)
        );
        let stored = Stored::read(&secret);
        assert_eq!(
            stored,
            Stored {
                scope: Some("s3://b/x/".into()),
                refresh_at: Some(at(100)),
                expiration: Some(at(200)),
            }
        );
        let data = secret.data.unwrap();
        assert_eq!(data["AWS_SESSION_TOKEN"].0, b"TOK");
        assert_eq!(
            String::from_utf8(data["AWS_CREDENTIAL_EXPIRATION"].0.clone()).unwrap(),
            rfc3339(at(200))
        );
        assert!(!format!("{creds:?}").contains("SK"));
    }

    #[test]
    fn admin_keys_come_from_the_mounted_secret() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            admin_keys(dir.path()).err().map(|e| e.label()),
            Some("ScopedAdminCredentials")
        );
        std::fs::write(dir.path().join("AWS_ACCESS_KEY_ID"), "AK\n").unwrap();
        std::fs::write(dir.path().join("AWS_SECRET_ACCESS_KEY"), "SK\n").unwrap();
        let k = admin_keys(dir.path()).unwrap();
        assert_eq!(
            (k.access_key_id.as_str(), k.secret_access_key.as_str()),
            ("AK", "SK")
        );
    }
}
