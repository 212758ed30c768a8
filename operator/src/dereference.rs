//! `dereference`: reads what a session points at (its CompactionPolicy, its Secrets) so that
//! `validate` and `build` can stay pure.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use cairn_crds::{AgentSession, CompactionPolicy, CompactionPolicySpec};

use crate::error::Error;
use cairn_crds::names::{TOKEN_KEY, token_secret_name};

use crate::objects::{ApiToken, BuildInputs, secret_digest};
use crate::purge::S3Keys;
use crate::status::Problem;
use crate::validate::{ArchivePlan, Plan};

/// The session's policyRef target: `Ok(None)` without a policyRef, `Err` with the condition
/// to report when it does not exist.
pub async fn policy(
    client: &Client,
    namespace: &str,
    session: &AgentSession,
) -> Result<Result<Option<CompactionPolicySpec>, Problem>, Error> {
    let Some(policy_ref) = &session.spec.policy_ref else {
        return Ok(Ok(None));
    };
    let api: Api<CompactionPolicy> = Api::namespaced(client.clone(), namespace);
    Ok(match api.get_opt(&policy_ref.name).await? {
        Some(policy) => Ok(Some(policy.spec)),
        None => Err(Problem::new(
            "PolicyNotFound",
            format!(
                "CompactionPolicy {namespace}/{} (spec.policyRef) does not exist",
                policy_ref.name
            ),
        )),
    })
}

/// Values of `keys` in a Secret of the session's namespace.
async fn secret_values(
    api: &Api<Secret>,
    namespace: &str,
    name: &str,
    keys: &[&str],
) -> Result<Vec<Vec<u8>>, Error> {
    let secret = api
        .get_opt(name)
        .await?
        .ok_or_else(|| Error::SecretNotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })?;
    let data = secret.data.unwrap_or_default();
    let string_data = secret.string_data.unwrap_or_default();
    keys.iter()
        .map(|key| {
            data.get(*key)
                .map(|v| v.0.clone())
                .or_else(|| string_data.get(*key).map(|v| v.as_bytes().to_vec()))
                .ok_or_else(|| Error::SecretKeyMissing {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    key: key.to_string(),
                })
        })
        .collect()
}

/// The existing API token (never regenerated: clients hold it), or a fresh one, and the digests
/// of the credentials the pod will see. With `read_token` false the token Secret is not read
/// (the caller does not apply it, or only creates it) and the token is a fresh one.
pub async fn build_inputs(
    client: &Client,
    plan: &Plan,
    read_token: bool,
) -> Result<BuildInputs, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &plan.namespace);
    let existing = if read_token {
        api.get_opt(&token_secret_name(&plan.name))
            .await?
            .and_then(|s| s.data)
            .and_then(|d| d.get(TOKEN_KEY).cloned())
            .and_then(|v| String::from_utf8(v.0).ok())
            .filter(|t| !t.is_empty())
    } else {
        None
    };
    let api_token = match existing {
        Some(token) => ApiToken::from_existing(token),
        None => ApiToken::generate(),
    };

    let provider_secret_digest = match &plan.spec.provider.credentials {
        Some(creds) => {
            let values =
                secret_values(&api, &plan.namespace, &creds.secret_name, &[&creds.key]).await?;
            Some(secret_digest(
                [creds.key.as_str()]
                    .into_iter()
                    .zip(values.iter().map(Vec::as_slice)),
            ))
        }
        None => None,
    };
    let s3_secret_digest = match s3_keys(&api, &plan.namespace, &plan.archive).await? {
        Some(keys) => Some(secret_digest([
            ("access", keys.access_key_id.as_bytes()),
            ("secret", keys.secret_access_key.as_bytes()),
        ])),
        None => None,
    };
    let otlp_headers_digest = match plan.otlp.as_ref().and_then(|o| o.headers_secret.as_ref()) {
        Some(name) => otlp_headers_digest(&api, name).await?,
        None => None,
    };
    Ok(BuildInputs {
        api_token,
        provider_secret_digest,
        s3_secret_digest,
        otlp_headers_digest,
    })
}

/// Digest of the OTLP export headers Secret, `None` when it is missing: span export never
/// keeps a session from starting (the pod's reference to it is optional). Read as metadata
/// only: its uid and resourceVersion change whenever it is recreated or edited, so the
/// operator never reads the header values themselves.
async fn otlp_headers_digest(api: &Api<Secret>, name: &str) -> Result<Option<String>, Error> {
    let Some(meta) = api.get_metadata_opt(name).await? else {
        return Ok(None);
    };
    let uid = meta.metadata.uid.unwrap_or_default();
    let version = meta.metadata.resource_version.unwrap_or_default();
    Ok(Some(secret_digest([
        ("uid", uid.as_bytes()),
        ("resourceVersion", version.as_bytes()),
    ])))
}

/// The S3 key pair of the session's archive, if it has a credentials Secret.
pub async fn s3_keys(
    api: &Api<Secret>,
    namespace: &str,
    archive: &ArchivePlan,
) -> Result<Option<S3Keys>, Error> {
    let Some(creds) = &archive.credentials else {
        return Ok(None);
    };
    let values = secret_values(
        api,
        namespace,
        &creds.secret_name,
        &[&creds.access_key_id_key, &creds.secret_access_key_key],
    )
    .await?;
    let text = |v: &[u8]| String::from_utf8_lossy(v).trim().to_string();
    let [access, secret] = values.as_slice() else {
        return Ok(None);
    };
    Ok(Some(S3Keys {
        access_key_id: text(access),
        secret_access_key: text(secret),
    }))
}
