//! `apply`: server-side apply of a session's objects, forced, under one field manager. The
//! API server turns an unchanged apply into a no-op (no new resourceVersion, no watch event),
//! which is what keeps an idle operator from looping; with the controller's caches
//! ([`crate::cache`]) an object that is already current is not sent at all.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cache::{self, Stores};
use crate::objects::{FIELD_MANAGER, SessionObjects, TOKEN_KEY};

async fn apply<K>(client: &Client, object: &K) -> Result<K, kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
{
    let namespace = object.namespace().unwrap_or_default();
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    // k8s-openapi types serialize their apiVersion and kind, which SSA requires.
    api.patch(
        &object.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
}

/// Applies `object` (stamped with its digest) unless the cached copy is current; returns
/// the object as the API server has it.
async fn ensure<K>(client: &Client, object: &K, store: Option<&Store<K>>) -> Result<K, kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug
        + 'static,
{
    let digest = cache::digest(&serde_json::to_value(object).unwrap_or_default());
    let stamped = cache::stamped(object, digest);
    if let Some(cached) = store.and_then(|s| cache::current(s, &stamped)) {
        return Ok(cached.as_ref().clone());
    }
    apply(client, &stamped).await
}

/// What to do with the session's token Secret, decided before its token is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSecret {
    /// The cached metadata is current: nothing is read or sent (the token is never
    /// regenerated, so it needs no rewrite).
    Current,
    /// The cache (synced) has no such Secret: create it with a fresh token; if it exists
    /// after all, its token is read and kept.
    Create,
    /// Read the existing token (done by `dereference::build_inputs`) and apply.
    Apply,
}

impl TokenSecret {
    /// The plan for `secret` (as built, not stamped) given the caches, if any.
    pub fn plan(secret: &Secret, stores: Option<&Stores>) -> Self {
        let Some(stores) = stores else {
            return Self::Apply;
        };
        let stamped = cache::stamped(secret, cache::secret_digest(secret));
        if cache::secret_current(&stores.secrets, &stamped) {
            Self::Current
        } else if cache::secret_cached(
            &stores.secrets,
            secret.metadata.namespace.as_deref().unwrap_or_default(),
            secret.metadata.name.as_deref().unwrap_or_default(),
        ) {
            Self::Apply
        } else {
            Self::Create
        }
    }

    /// Whether the existing token must be read before building.
    pub fn reads_token(self) -> bool {
        self == Self::Apply
    }
}

async fn ensure_token_secret(
    client: &Client,
    secret: &Secret,
    plan: TokenSecret,
) -> Result<(), kube::Error> {
    let stamped = cache::stamped(secret, cache::secret_digest(secret));
    match plan {
        TokenSecret::Current => Ok(()),
        TokenSecret::Apply => apply(client, &stamped).await.map(|_| ()),
        TokenSecret::Create => {
            let api: Api<Secret> =
                Api::namespaced(client.clone(), &stamped.namespace().unwrap_or_default());
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            match api.create(&params, &stamped).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    // Created meanwhile (or the cache lags): keep the token it holds.
                    let mut kept = stamped.clone();
                    if let Some(token) = api
                        .get_opt(&stamped.name_any())
                        .await?
                        .and_then(|s| s.data)
                        .and_then(|d| d.get(TOKEN_KEY).cloned())
                        .filter(|t| !t.0.is_empty())
                    {
                        kept.data = Some([(TOKEN_KEY.to_string(), token)].into());
                    }
                    apply(client, &kept).await.map(|_| ())
                }
                Err(e) => Err(e),
            }
        }
    }
}

/// Applies every object that is not current (identity and permissions before the pod) and
/// returns the StatefulSet as the API server has it, status included.
pub async fn apply_all(
    client: &Client,
    objects: &SessionObjects,
    stores: Option<&Stores>,
    token: TokenSecret,
) -> Result<StatefulSet, kube::Error> {
    ensure(
        client,
        &objects.service_account,
        stores.map(|s| &s.service_accounts),
    )
    .await?;
    ensure(client, &objects.role, stores.map(|s| &s.roles)).await?;
    ensure(
        client,
        &objects.role_binding,
        stores.map(|s| &s.role_bindings),
    )
    .await?;
    ensure_token_secret(client, &objects.token_secret, token).await?;
    ensure(client, &objects.service, stores.map(|s| &s.services)).await?;
    ensure(
        client,
        &objects.network_policy,
        stores.map(|s| &s.network_policies),
    )
    .await?;
    ensure(
        client,
        &objects.stateful_set,
        stores.map(|s| &s.stateful_sets),
    )
    .await
}
