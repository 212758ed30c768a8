//! The operator's Kubernetes client: the default kube stack plus a layer that counts every
//! request by method, so "API requests per session" and "no writes when idle" are measurable,
//! and every write by method and resource, so a write that should not happen can be traced.

use std::sync::Arc;

use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use tower::util::MapRequestLayer;

use crate::metrics::Metrics;

pub fn counting_client(config: Config, metrics: Arc<Metrics>) -> Result<Client, kube::Error> {
    let count = MapRequestLayer::new(move |request: http::Request<Body>| {
        metrics.api_request(request.method());
        if request.method() != http::Method::GET {
            metrics.api_write(request.method(), &resource_of(request.uri().path()));
        }
        request
    });
    Ok(ClientBuilder::try_from(config)?.with_layer(&count).build())
}

/// The resource (and subresource) a request path names: `statefulsets`,
/// `agentsessions/status`, `events`; `other` for a path that is not a resource.
pub fn resource_of(path: &str) -> String {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return "other".into(),
    };
    let rest = match rest {
        ["namespaces", _namespace, tail @ ..] if !tail.is_empty() => tail,
        _ => rest,
    };
    match rest {
        [] => "other".into(),
        [resource, _name, sub, ..] => format!("{resource}/{sub}"),
        [resource, ..] => (*resource).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::resource_of;

    #[test]
    fn paths_name_their_resource() {
        for (path, resource) in [
            (
                "/apis/apps/v1/namespaces/a/statefulsets/cairn-x",
                "statefulsets",
            ),
            (
                "/apis/cairn.dev/v1beta1/namespaces/a/agentsessions/x/status",
                "agentsessions/status",
            ),
            ("/api/v1/namespaces/a/secrets", "secrets"),
            ("/apis/events.k8s.io/v1/namespaces/a/events/e.1", "events"),
            ("/api/v1/namespaces/a", "namespaces"),
            (
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x",
                "customresourcedefinitions",
            ),
            ("/version", "other"),
        ] {
            assert_eq!(resource_of(path), resource, "{path}");
        }
    }
}
