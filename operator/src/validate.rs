//! `validate`: checks a session (with its dereferenced policy and the operator's defaults) and
//! turns it into a [`Plan`], every setting resolved. Pure: no API calls.
//!
//! The API server's CEL rules already refuse most bad specs; this repeats the checks that
//! matter for building objects, because objects stored before a rule existed (or written with
//! validation off) still reach the operator.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

use cairn_crds::session::{ArchiveSpec, S3CredentialsRef};
use cairn_crds::{
    AgentSession, AgentSessionSpec, CompactionPolicySpec, EffectivePolicy, PayloadSize,
    PayloadSizeError, PolicyError, ProviderKind,
};
use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::config::{Defaults, OtlpExport};

/// Longest session name: every object name built from it (`cairn-<name>-api-token` the
/// longest) fits in a 63-character DNS label.
pub const MAX_SESSION_NAME: usize = 46;

/// Why a session cannot be built. Waiting for a spec change is the only cure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error(
        "session name {0:?} must be a DNS label (lower-case letters, digits, '-') of at most {MAX_SESSION_NAME} characters"
    )]
    InvalidName(String),
    #[error("the session has no {0} yet (not stored by the API server)")]
    NotStored(&'static str),
    #[error("spec.provider.model must not be empty")]
    MissingModel,
    #[error("spec.provider.region is required when provider.kind is bedrock")]
    MissingRegion,
    #[error("spec.provider.baseUrl is required when provider.kind is openai-compatible")]
    MissingBaseUrl,
    #[error("spec.payloadCap is invalid: {0}")]
    PayloadCap(#[from] PayloadSizeError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("spec.archive.prefix {0:?} must be relative and must not contain '..'")]
    ArchivePrefix(String),
    #[error(
        "spec.archive.prefix {given:?} cannot be set on an AgentSession: every session's objects live under the operator's archive prefix {root:?} as {root}/<namespace>/<session>/, so a session's prefix could alias another's"
    )]
    ArchivePrefixNotSettable { given: String, root: String },
    #[error(
        "spec.archive.{field} {given:?} differs from the operator's {configured:?}: the operator mints scoped credentials for its own archive only; name a credentials Secret of your own (spec.archive.credentials) to use another store"
    )]
    ScopedArchiveOverride {
        field: &'static str,
        given: String,
        configured: String,
    },
    #[error("spec.maxOutputTokens must be smaller than spec.contextWindow")]
    OutputExceedsWindow,
    #[error(
        "the archive bucket {bucket:?} is configured but no S3 identity is: set spec.archive.credentials.secretName, or the operator's --archive-credentials-secret (chart value archive.credentialsSecret), to a Secret of this namespace holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; or turn on the operator's scoped credentials (chart archive.scoped); or give the pods an identity of their own (an eks.amazonaws.com/role-arn ServiceAccount annotation, or --archive-ambient-credentials, chart archive.ambientCredentials); or configure no bucket, and archive and journal stay on the pod's scratch volume"
    )]
    ArchiveCredentialsMissing { bucket: String },
}

impl ValidationError {
    /// Stable short label for metrics and Event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidName(_) => "InvalidName",
            Self::NotStored(_) => "NotStored",
            Self::MissingModel => "MissingModel",
            Self::MissingRegion => "MissingRegion",
            Self::MissingBaseUrl => "MissingBaseUrl",
            Self::PayloadCap(_) => "InvalidPayloadCap",
            Self::Policy(_) => "InvalidPolicy",
            Self::ArchivePrefix(_) | Self::ArchivePrefixNotSettable { .. } => {
                "InvalidArchivePrefix"
            }
            Self::ScopedArchiveOverride { .. } => "ScopedArchiveOverride",
            Self::OutputExceedsWindow => "OutputExceedsWindow",
            Self::ArchiveCredentialsMissing { .. } => "ArchiveCredentialsMissing",
        }
    }
}

/// Everything `build` needs, resolved against the operator's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub name: String,
    pub namespace: String,
    pub owner: OwnerReference,
    pub spec: AgentSessionSpec,
    pub policy: EffectivePolicy,
    pub policy_hash: String,
    pub payload_cap: Option<PayloadSize>,
    pub image: String,
    pub resources: ResourceRequirements,
    pub archive: ArchivePlan,
    /// Namespace whose pods may reach the agent besides the session's own.
    pub operator_namespace: String,
    /// Span export of the agent (the operator's setting; sessions do not override it).
    pub otlp: Option<OtlpExport>,
    /// The fleet's model price table (YAML), for the agent's cost accounting.
    pub price_table: Option<String>,
    /// The fleet-wide proxies and CAs (the session's `template.proxy` and
    /// `provider.caBundle` add to them).
    pub network: crate::config::AgentNetwork,
    /// The fleet-wide pod settings (the session's `template` overrides them).
    pub pod: crate::config::PodDefaults,
    /// The fleet-wide parts of the session's NetworkPolicy.
    pub network_policy: crate::config::NetworkPolicyDefaults,
}

/// The session's archive settings after defaulting.
#[derive(Clone, Debug, PartialEq)]
pub struct ArchivePlan {
    pub endpoint: Option<String>,
    pub bucket: Option<String>,
    pub prefix: String,
    pub region: String,
    pub force_path_style: bool,
    pub credentials: Option<S3CredentialsRef>,
    /// `credentials` is the operator's default Secret (`--archive-credentials-secret`), which
    /// every session of the namespace without credentials of its own gets too.
    pub default_credentials: bool,
    /// A static key pair shared with other sessions is accepted, by the session
    /// (`spec.archive.sharedCredentials`) or the operator (`--archive-allow-shared-credentials`):
    /// the status says so without a Warning.
    pub shared_credentials_accepted: bool,
    /// The operator mints the session's credentials (`Defaults::archive.scoped`) into the
    /// session's own Secret; `credentials` is then `None`.
    pub scoped: bool,
    /// The pod has an S3 identity of its own (IRSA and friends), which the agent takes
    /// through the AWS default chain; `credentials` is then `None`.
    pub ambient: bool,
    pub retain_on_delete: bool,
    pub local_cache_size: String,
    pub ttl: String,
}

impl ArchivePlan {
    /// Key prefix of everything the session stores: `<prefix>/<namespace>/<session>/`.
    pub fn session_prefix(&self, namespace: &str, name: &str) -> String {
        cairn_crds::session::archive_root(&self.prefix, namespace, name)
    }
}

/// Checks `session` and resolves it; `policy` is the dereferenced `policyRef` target.
pub fn validate(
    session: &AgentSession,
    policy: Option<&CompactionPolicySpec>,
    defaults: &Defaults,
) -> Result<Plan, ValidationError> {
    let name = session.name_any();
    if !is_dns_label(&name) || name.len() > MAX_SESSION_NAME {
        return Err(ValidationError::InvalidName(name));
    }
    let namespace = session
        .namespace()
        .ok_or(ValidationError::NotStored("namespace"))?;
    let owner = session
        .controller_owner_ref(&())
        .ok_or(ValidationError::NotStored("uid"))?;
    let spec = &session.spec;

    let provider = &spec.provider;
    if provider.model.trim().is_empty() {
        return Err(ValidationError::MissingModel);
    }
    if provider.kind == ProviderKind::Bedrock && provider.region.is_none() {
        return Err(ValidationError::MissingRegion);
    }
    if provider.kind == ProviderKind::OpenaiCompatible && provider.base_url.is_none() {
        return Err(ValidationError::MissingBaseUrl);
    }
    if let (Some(out), Some(window)) = (spec.max_output_tokens, spec.context_window)
        && out >= window
    {
        return Err(ValidationError::OutputExceedsWindow);
    }
    let payload_cap = spec.payload_cap()?;
    let effective = cairn_crds::resolve(policy, spec.compaction.as_ref())?;
    let mut archive = archive_plan(spec.archive.as_ref(), defaults)?;
    // A session's own IRSA role is an identity of its own too.
    let own_role = spec
        .template
        .as_ref()
        .and_then(|t| t.service_account_annotations.as_ref())
        .is_some_and(|a| a.contains_key(IRSA_ROLE_ANNOTATION));
    if own_role && archive.credentials.is_none() && !archive.scoped {
        archive.ambient = true;
    }
    archive_usable(&archive)?;

    let template = spec.template.as_ref();
    Ok(Plan {
        policy_hash: effective.hash(),
        policy: effective,
        payload_cap,
        image: template
            .and_then(|t| t.image.clone())
            .unwrap_or_else(|| defaults.image.clone()),
        resources: template
            .and_then(|t| t.resources.clone())
            .unwrap_or_else(|| defaults.resources.clone()),
        archive,
        operator_namespace: defaults.operator_namespace.clone(),
        otlp: defaults.otlp.clone(),
        price_table: defaults.price_table.clone(),
        network: defaults.network.clone(),
        pod: defaults.pod.clone(),
        network_policy: defaults.network_policy.clone(),
        name,
        namespace,
        owner,
        spec: spec.clone(),
    })
}

/// The session's archive settings after defaulting (also used on delete, where the rest of the
/// spec need not be valid).
pub fn archive_plan(
    spec: Option<&ArchiveSpec>,
    defaults: &Defaults,
) -> Result<ArchivePlan, ValidationError> {
    let empty = ArchiveSpec::default();
    let spec = spec.unwrap_or(&empty);
    let d = &defaults.archive;
    // The root is the operator's: a session naming another (`cairn/Y` for a session `ccr`
    // in namespace `X` is the `ccr/` of session `X` in namespace `Y`) would read, write and
    // purge that session's objects. Sessions stored before the API server refused the
    // field are refused here (and never purged on a guess).
    let prefix = d.prefix.clone();
    if let Some(given) = &spec.prefix
        && given.trim_end_matches('/') != prefix.trim_end_matches('/')
    {
        return Err(ValidationError::ArchivePrefixNotSettable {
            given: given.clone(),
            root: prefix,
        });
    }
    if prefix.starts_with('/') || prefix.split('/').any(|part| part == "..") {
        return Err(ValidationError::ArchivePrefix(prefix));
    }
    let endpoint = spec.endpoint.clone().or_else(|| d.endpoint.clone());
    let force_path_style = spec
        .force_path_style
        .or(d.force_path_style)
        .unwrap_or(endpoint.is_some());
    let bucket = spec.bucket.clone().or_else(|| d.bucket.clone());
    // Scoped credentials serve the operator's own archive: a session that names no
    // credentials of its own cannot point them at another bucket or store.
    let scoped = spec.credentials.is_none() && d.scoped.is_some() && bucket.is_some();
    if scoped {
        for (field, given, configured) in [
            ("bucket", &spec.bucket, &d.bucket),
            ("endpoint", &spec.endpoint, &d.endpoint),
        ] {
            if let Some(given) = given
                && Some(given) != configured.as_ref()
            {
                return Err(ValidationError::ScopedArchiveOverride {
                    field,
                    given: given.clone(),
                    configured: configured.clone().unwrap_or_else(|| "(AWS)".into()),
                });
            }
        }
    }
    let credentials = spec.credentials.clone().or_else(|| {
        if d.scoped.is_some() {
            return None;
        }
        d.credentials_secret.as_ref().map(|name| S3CredentialsRef {
            secret_name: name.clone(),
            access_key_id_key: "AWS_ACCESS_KEY_ID".into(),
            secret_access_key_key: "AWS_SECRET_ACCESS_KEY".into(),
        })
    });
    let default_credentials = spec.credentials.is_none() && credentials.is_some();
    let ambient = d.ambient_credentials
        || defaults
            .pod
            .service_account_annotations
            .contains_key(IRSA_ROLE_ANNOTATION);
    Ok(ArchivePlan {
        ambient: credentials.is_none() && !scoped && ambient,
        bucket,
        scoped,
        region: spec.region.clone().unwrap_or_else(|| d.region.clone()),
        retain_on_delete: spec.retain_on_delete.unwrap_or(true),
        local_cache_size: spec
            .local_cache_size
            .clone()
            .unwrap_or_else(|| d.local_cache_size.clone()),
        ttl: spec.ttl.clone().unwrap_or_else(|| d.ttl.clone()),
        endpoint,
        force_path_style,
        credentials,
        default_credentials,
        shared_credentials_accepted: spec.shared_credentials.unwrap_or(false)
            || d.allow_shared_credentials,
        prefix,
    })
}

/// The ServiceAccount annotation that gives a pod an IAM role on EKS (IRSA).
pub const IRSA_ROLE_ANNOTATION: &str = "eks.amazonaws.com/role-arn";

/// Whether the agent can use the archive as planned. A bucket needs an identity: a
/// credentials Secret, the operator's scoped credentials, or one the pod has of its own
/// (declared by `--archive-ambient-credentials` or an IRSA role on its ServiceAccount).
/// Without any, the agent's credential chain would find nothing and every archive write
/// would fail; the operator refuses it here, with what to set.
pub fn archive_usable(archive: &ArchivePlan) -> Result<(), ValidationError> {
    match (&archive.bucket, &archive.credentials) {
        (Some(bucket), None) if !archive.scoped && !archive.ambient => {
            Err(ValidationError::ArchiveCredentialsMissing {
                bucket: bucket.clone(),
            })
        }
        _ => Ok(()),
    }
}

/// RFC 1123 label; every object name is `cairn-<name>`, so it also starts with a letter as
/// Service names must.
fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}
