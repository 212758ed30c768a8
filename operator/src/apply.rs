//! `apply`: server-side apply of a session's objects, forced, under one field manager. The
//! API server turns an unchanged apply into a no-op (no new resourceVersion, no watch event),
//! which is what keeps an idle operator from looping.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::objects::{FIELD_MANAGER, SessionObjects};

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

/// Applies every object (identity and permissions before the pod) and returns the
/// StatefulSet as the API server now has it, status included.
pub async fn apply_all(
    client: &Client,
    objects: &SessionObjects,
) -> Result<StatefulSet, kube::Error> {
    apply(client, &objects.service_account).await?;
    apply(client, &objects.role).await?;
    apply(client, &objects.role_binding).await?;
    apply(client, &objects.token_secret).await?;
    apply(client, &objects.service).await?;
    apply(client, &objects.network_policy).await?;
    apply(client, &objects.stateful_set).await
}
