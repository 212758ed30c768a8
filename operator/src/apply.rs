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

use crate::cache::{self, Accepted, Key, Packed, Stores};
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

/// Applies `object` (stamped with its digest) unless the cached copy is current or the
/// operator's own accepted write of it has not reached the cache yet; returns the object as
/// the API server has it (as far as the operator knows).
async fn ensure<K>(
    client: &Client,
    object: &K,
    store: Option<&Store<Packed<K>>>,
    accepted: &Accepted,
) -> Result<K, kube::Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug
        + 'static,
{
    let digest = cache::digest(&serde_json::to_value(object).unwrap_or_default());
    let stamped = cache::stamped(object, digest.clone());
    let Some(store) = store else {
        return apply(client, &stamped).await;
    };
    if let Some(cached) = cache::current(store, &stamped) {
        return Ok(cached);
    }
    let key = Key::of(&stamped);
    if accepted.pending(&key, &digest) {
        // The cache lags behind the operator's own write: the object is as built.
        return Ok(cache::cached(store, &stamped).unwrap_or(stamped));
    }
    let applied = apply(client, &stamped).await?;
    accepted.record(key, digest, applied.meta().resource_version.clone(), || {
        cache::cached_version(store, &stamped)
    });
    Ok(applied)
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
    /// The plan for `secret` (as built, not stamped) given the caches, if any, and the
    /// writes the API server accepted.
    pub fn plan(secret: &Secret, stores: Option<&Stores>, accepted: &Accepted) -> Self {
        let Some(stores) = stores else {
            return Self::Apply;
        };
        let digest = cache::secret_digest(secret);
        let stamped = cache::stamped(secret, digest.clone());
        if cache::secret_current(&stores.secrets, &stamped)
            || accepted.pending(&Key::of(&stamped), &digest)
        {
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
    stores: Option<&Stores>,
    accepted: &Accepted,
) -> Result<(), kube::Error> {
    let digest = cache::secret_digest(secret);
    let stamped = cache::stamped(secret, digest.clone());
    let written = match plan {
        TokenSecret::Current => return Ok(()),
        TokenSecret::Apply => apply(client, &stamped).await?,
        TokenSecret::Create => create_token_secret(client, &stamped).await?,
    };
    if let Some(stores) = stores {
        let (namespace, name) = (stamped.namespace().unwrap_or_default(), stamped.name_any());
        accepted.record(
            Key::of(&stamped),
            digest,
            written.metadata.resource_version.clone(),
            || cache::secret_version(&stores.secrets, &namespace, &name),
        );
    }
    Ok(())
}

/// Creates the token Secret; if it exists after all, applies it with the token it holds.
async fn create_token_secret(client: &Client, stamped: &Secret) -> Result<Secret, kube::Error> {
    let api: Api<Secret> =
        Api::namespaced(client.clone(), &stamped.namespace().unwrap_or_default());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.create(&params, stamped).await {
        Ok(created) => Ok(created),
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
            apply(client, &kept).await
        }
        Err(e) => Err(e),
    }
}

/// Applies every object that is not current (identity and permissions before the pod) and
/// returns the StatefulSet as the API server has it, status included.
pub async fn apply_all(
    client: &Client,
    objects: &SessionObjects,
    stores: Option<&Stores>,
    token: TokenSecret,
    accepted: &Accepted,
) -> Result<StatefulSet, kube::Error> {
    ensure(
        client,
        &objects.service_account,
        stores.map(|s| &s.service_accounts),
        accepted,
    )
    .await?;
    ensure(client, &objects.role, stores.map(|s| &s.roles), accepted).await?;
    ensure(
        client,
        &objects.role_binding,
        stores.map(|s| &s.role_bindings),
        accepted,
    )
    .await?;
    ensure_token_secret(client, &objects.token_secret, token, stores, accepted).await?;
    ensure(
        client,
        &objects.service,
        stores.map(|s| &s.services),
        accepted,
    )
    .await?;
    ensure(
        client,
        &objects.network_policy,
        stores.map(|s| &s.network_policies),
        accepted,
    )
    .await?;
    ensure(
        client,
        &objects.stateful_set,
        stores.map(|s| &s.stateful_sets),
        accepted,
    )
    .await
}
