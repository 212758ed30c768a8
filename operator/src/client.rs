//! The operator's Kubernetes client: the default kube stack plus a layer that counts every
//! request by method, so "API requests per session" and "no writes when idle" are measurable.

use std::sync::Arc;

use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use tower::util::MapRequestLayer;

use crate::metrics::Metrics;

pub fn counting_client(config: Config, metrics: Arc<Metrics>) -> Result<Client, kube::Error> {
    let count = MapRequestLayer::new(move |request: http::Request<Body>| {
        metrics.api_request(request.method());
        request
    });
    Ok(ClientBuilder::try_from(config)?.with_layer(&count).build())
}
