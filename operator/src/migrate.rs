//! Storage-version migration of cairn's custom resources (the pattern of Kubernetes'
//! storage-version migrator): a CRD whose `status.storedVersions` still lists a version other
//! than its storage version has objects in etcd encoded in that version. Each object is
//! written back unchanged (a `PUT` of what was read, with its `resourceVersion`): the API
//! server encodes every write in the storage version. Once every object has been written,
//! `status.storedVersions` is trimmed to the storage version, which lets a later release stop
//! serving the old one. Idempotent: a CRD that lists only its storage version costs one `GET`.
//!
//! [`plan`] decides from a CRD alone; [`migrate`] performs it; [`run`] retries it until it
//! succeeds, logging each failure, without ever stopping the operator.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::TypeMeta;
use kube::{Api, Client};
use serde_json::json;

/// Objects per list page.
const PAGE: u32 = 200;
/// Attempts at writing one object back when it keeps changing under the migration.
const CONFLICT_ATTEMPTS: usize = 5;
/// First and longest wait before [`run`] tries a failed migration again.
const RETRY_FIRST: Duration = Duration::from_secs(10);
const RETRY_MAX: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("reading CRD {crd}: {source}")]
    ReadCrd {
        crd: String,
        #[source]
        source: kube::Error,
    },
    #[error("CRD {0} has no storage version")]
    NoStorageVersion(String),
    #[error("CRD {crd} changed its storage version from {was} during the migration")]
    StorageChanged { crd: String, was: String },
    #[error("listing {resource}: {source}")]
    List {
        resource: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing back {resource} {object}: {source}")]
    Rewrite {
        resource: String,
        object: String,
        #[source]
        source: kube::Error,
    },
    #[error("{resource} {object} changed {CONFLICT_ATTEMPTS} times while being written back")]
    KeepsChanging { resource: String, object: String },
    #[error("trimming status.storedVersions of CRD {crd}: {source}")]
    Trim {
        crd: String,
        #[source]
        source: kube::Error,
    },
}

/// What one CRD needs: its objects written back in `storage`, then `storedVersions` trimmed
/// from `stored` to `[storage]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub crd: String,
    /// The kind at its storage version (what objects are listed and written back as).
    pub resource: ApiResource,
    pub namespaced: bool,
    pub storage: String,
    /// `status.storedVersions` as read.
    pub stored: Vec<String>,
}

/// What a migration did for one CRD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    pub crd: String,
    /// The versions objects were stored under (the storage version included).
    pub from: Vec<String>,
    pub to: String,
    pub objects: usize,
}

/// The migration `crd` needs, or `None` when `status.storedVersions` lists only its storage
/// version (or nothing yet). Pure.
pub fn plan(crd: &CustomResourceDefinition) -> Result<Option<Plan>, MigrateError> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let storage = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone())
        .ok_or_else(|| MigrateError::NoStorageVersion(name.clone()))?;
    let stored = crd
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default();
    if stored.iter().all(|v| *v == storage) {
        return Ok(None);
    }
    let group = crd.spec.group.clone();
    Ok(Some(Plan {
        crd: name,
        resource: ApiResource {
            api_version: format!("{group}/{storage}"),
            group,
            version: storage.clone(),
            kind: crd.spec.names.kind.clone(),
            plural: crd.spec.names.plural.clone(),
        },
        namespaced: crd.spec.scope == "Namespaced",
        storage,
        stored,
    }))
}

/// Migrates every cairn CRD that needs it; returns what was done (nothing when nothing was
/// needed). A CRD that is not installed is skipped.
pub async fn migrate(client: &Client) -> Result<Vec<Migrated>, MigrateError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut done = Vec::new();
    for name in cairn_crds::crd_names() {
        let crd = match crds.get_opt(&name).await {
            Ok(Some(crd)) => crd,
            Ok(None) => {
                tracing::warn!(crd = %name, "CRD not installed; nothing to migrate");
                continue;
            }
            Err(source) => return Err(MigrateError::ReadCrd { crd: name, source }),
        };
        let Some(plan) = plan(&crd)? else {
            tracing::debug!(crd = %name, "objects stored in the storage version only");
            continue;
        };
        tracing::info!(crd = %plan.crd, stored = ?plan.stored, to = %plan.storage,
            "migrating stored objects to the storage version");
        let objects = rewrite_all(client, &plan).await?;
        trim(&crds, &plan).await?;
        tracing::info!(crd = %plan.crd, objects, to = %plan.storage,
            "storage-version migration done; status.storedVersions trimmed");
        done.push(Migrated {
            crd: plan.crd,
            from: plan.stored,
            to: plan.storage,
            objects,
        });
    }
    Ok(done)
}

/// Runs [`migrate`] until it succeeds or `stop` resolves. A failure (RBAC, an API server
/// error, an object that keeps changing) is logged as an error and tried again after a
/// growing delay; it never stops the operator, whose controllers run meanwhile.
pub async fn run(client: Client, stop: impl std::future::Future<Output = ()>) {
    tokio::pin!(stop);
    let mut delay = RETRY_FIRST;
    loop {
        // Stopping mid-way is safe: what was written back stays, the rest waits for the next
        // start.
        let outcome = tokio::select! {
            _ = &mut stop => return,
            outcome = migrate(&client) => outcome,
        };
        match outcome {
            Ok(_) => return,
            Err(e) => tracing::error!(error = %e, retry_in_seconds = delay.as_secs(),
                "storage-version migration failed; objects stay readable, retrying"),
        }
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(RETRY_MAX);
    }
}

/// Writes back every object of the plan's kind; returns how many.
async fn rewrite_all(client: &Client, plan: &Plan) -> Result<usize, MigrateError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &plan.resource);
    let mut params = ListParams::default().limit(PAGE);
    let mut count = 0;
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|source| MigrateError::List {
                resource: plan.crd.clone(),
                source,
            })?;
        for object in page.items {
            rewrite(client, plan, object).await?;
            count += 1;
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(count),
        }
    }
}

/// A `PUT` of `object` as read: no field changes, so the API server writes the same object
/// encoded in the storage version. A conflict (the object changed since it was read) reads
/// it again and retries; an object deleted meanwhile needs nothing.
async fn rewrite(
    client: &Client,
    plan: &Plan,
    mut object: DynamicObject,
) -> Result<(), MigrateError> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let namespace = object.metadata.namespace.clone();
    let label = match &namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.clone(),
    };
    let api: Api<DynamicObject> = match (&namespace, plan.namespaced) {
        (Some(ns), true) => Api::namespaced_with(client.clone(), ns, &plan.resource),
        _ => Api::all_with(client.clone(), &plan.resource),
    };
    let failed = |source| MigrateError::Rewrite {
        resource: plan.crd.clone(),
        object: label.clone(),
        source,
    };
    for _ in 0..CONFLICT_ATTEMPTS {
        object.types = Some(TypeMeta {
            api_version: plan.resource.api_version.clone(),
            kind: plan.resource.kind.clone(),
        });
        match api.replace(&name, &PostParams::default(), &object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => match api.get_opt(&name).await {
                Ok(Some(fresh)) => object = fresh,
                Ok(None) => return Ok(()),
                Err(source) => return Err(failed(source)),
            },
            Err(source) => return Err(failed(source)),
        }
    }
    Err(MigrateError::KeepsChanging {
        resource: plan.crd.clone(),
        object: label,
    })
}

/// Sets `status.storedVersions` to the storage version alone, guarded by the CRD's
/// `resourceVersion`, and only if the storage version is still the one the objects were
/// written in (a CRD upgraded meanwhile is migrated again on the next attempt).
async fn trim(crds: &Api<CustomResourceDefinition>, plan: &Plan) -> Result<(), MigrateError> {
    let read_failed = |source| MigrateError::ReadCrd {
        crd: plan.crd.clone(),
        source,
    };
    let current = crds.get(&plan.crd).await.map_err(read_failed)?;
    let storage_now = current.spec.versions.iter().find(|v| v.storage);
    if storage_now.is_none_or(|v| v.name != plan.storage) {
        return Err(MigrateError::StorageChanged {
            crd: plan.crd.clone(),
            was: plan.storage.clone(),
        });
    }
    let patch = json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "status": {"storedVersions": [plan.storage]},
    });
    crds.patch_status(&plan.crd, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| MigrateError::Trim {
            crd: plan.crd.clone(),
            source,
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(stored: Option<&[&str]>) -> CustomResourceDefinition {
        let mut crd = cairn_crds::crds().remove(0);
        crd.status =
            stored.map(|s| serde_json::from_value(json!({"storedVersions": s})).expect("status"));
        crd
    }

    #[test]
    fn nothing_to_do_when_only_the_storage_version_is_stored() {
        assert_eq!(plan(&crd(Some(&["v1beta1"]))).expect("plan"), None);
        // A CRD the API server has not reported on yet.
        assert_eq!(plan(&crd(None)).expect("plan"), None);
        assert_eq!(plan(&crd(Some(&[]))).expect("plan"), None);
    }

    #[test]
    fn an_older_stored_version_plans_a_rewrite_at_the_storage_version() {
        let plan = plan(&crd(Some(&["v1alpha1", "v1beta1"])))
            .expect("plan")
            .expect("something to do");
        assert_eq!(plan.crd, "agentsessions.cairn.dev");
        assert_eq!(plan.storage, "v1beta1");
        assert_eq!(plan.stored, ["v1alpha1", "v1beta1"]);
        assert!(plan.namespaced);
        assert_eq!(plan.resource.api_version, "cairn.dev/v1beta1");
        assert_eq!(plan.resource.plural, "agentsessions");
        assert_eq!(plan.resource.kind, "AgentSession");
        // Objects of the old CRD alone (storedVersions not yet updated by the API server).
        assert!(
            super::plan(&crd(Some(&["v1alpha1"])))
                .expect("plan")
                .is_some()
        );
    }

    #[test]
    fn a_crd_without_a_storage_version_is_an_error() {
        let mut crd = crd(Some(&["v1alpha1"]));
        for v in &mut crd.spec.versions {
            v.storage = false;
        }
        assert!(matches!(plan(&crd), Err(MigrateError::NoStorageVersion(_))));
    }
}
