//! The agent against a real Kubernetes API server with the cairn CRDs (the cluster in
//! `$KUBECONFIG`, else the local control plane of `tests/harness`): the Lease and status, and
//! `serve --session` waiting for its Lease and its archive.

#[path = "../support/mod.rs"]
mod support;

mod api_server;
mod events;
mod serve_lease;
