//! Without the chart, the operator installs and upgrades its own CRDs at start-up (server-side
//! apply). The chart owns the CRDs itself (as templates) and runs the operator with
//! `--skip-crd-install`, so exactly one mechanism writes them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};

/// Field manager of the operator's CRD writes.
pub const CRD_MANAGER: &str = "cairn-operator-crds";

/// Applies every cairn CRD with server-side apply (forced: the operator owns them).
pub async fn apply_crds(client: kube::Client) -> Result<(), kube::Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let params = PatchParams::apply(CRD_MANAGER).force();
    for crd in cairn_crds::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        tracing::info!(crd = %name, "applied CRD");
    }
    Ok(())
}
