//! Running the gateway: the Kubernetes client, the session watch, the two listeners, and a
//! graceful shutdown (SIGTERM: not ready at once, requests in flight drain, bounded).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::auth::Oidc;
use crate::config::GatewayArgs;
use crate::directory::{Directory, KubeDirectory};
use crate::server::{Gateway, metrics_router, router};

pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let settings = args.settings()?;
    let config = kube::Config::infer()
        .await
        .context("reading the Kubernetes client configuration")?;
    let client =
        kube::Client::try_from(config.clone()).context("building the Kubernetes client")?;
    let dir = KubeDirectory::start(client.clone(), args.namespace.as_deref());
    let oidc = match settings.oidc.clone() {
        Some(o) => Some(Oidc::load(o).await?),
        None => None,
    };
    let dir: Arc<dyn Directory> = dir;
    let gw = Gateway::new(dir, settings, oidc, Some(config))?;
    let api = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let metrics = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding {}", args.metrics_listen))?;
    serve(gw, api, metrics, shutdown_signal()).await
}

/// Serves until `shutdown` resolves, then drains within the drain timeout.
pub async fn serve(
    gw: Arc<Gateway>,
    api: TcpListener,
    metrics: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tracing::info!(api = %api.local_addr()?, metrics = %metrics.local_addr()?, "cairn-gateway listening");
    let mut api_rx = stop_rx.clone();
    let api_server = axum::serve(api, router(Arc::clone(&gw))).with_graceful_shutdown(async move {
        let _ = api_rx.wait_for(|s| *s).await;
    });
    let mut m_rx = stop_rx;
    let metrics_server = axum::serve(metrics, metrics_router(Arc::clone(&gw)))
        .with_graceful_shutdown(async move {
            let _ = m_rx.wait_for(|s| *s).await;
        });
    let api_task = tokio::spawn(async move { api_server.await });
    let metrics_task = tokio::spawn(async move { metrics_server.await });
    shutdown.await;
    gw.shutting_down.store(true, Ordering::Relaxed);
    tracing::info!(
        drain_seconds = gw.settings.drain_timeout.as_secs(),
        "shutting down: draining requests in flight"
    );
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(gw.settings.drain_timeout, async {
        let _ = api_task.await;
        let _ = metrics_task.await;
    })
    .await;
    if drained.is_err() {
        tracing::warn!("requests were still in flight at the end of the drain timeout");
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
