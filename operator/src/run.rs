//! The operator process: CRD install, the HTTP endpoints, leader election, the
//! storage-version migration and the controllers, with a graceful shutdown on SIGTERM/SIGINT.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;

use crate::config::OperatorArgs;
use crate::controller::Context;
use crate::metrics::Metrics;
use crate::purge::S3Purger;

/// Seconds a leader holds the Lease without renewing it.
const LEASE_SECONDS: u64 = 15;
/// Seconds before expiry at which the leader renews.
const LEASE_GRACE_SECONDS: u64 = 5;

/// Resolves once `rx` carries `true` (or its sender is gone).
async fn stopped(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

async fn termination_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops the operator");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs one controller per watched namespace (or one for all) until `stop` says so, and,
/// beside them, the storage-version migration of cairn's CRDs (the leader's job: it runs
/// where the controllers run, retried until it succeeds; see `migrate`).
async fn run_controllers(ctx: Arc<Context>, args: &OperatorArgs, stop: watch::Receiver<bool>) {
    let migration = crate::migrate::run(ctx.client.clone(), stopped(stop.clone()));
    let namespaces = args.namespaces();
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.into_iter().map(Some).collect()
    };
    tracing::info!(?scopes, "starting controllers");
    let controllers = futures::future::join_all(scopes.into_iter().map(|scope| {
        crate::watches::run(ctx.clone(), scope, args.concurrency, stopped(stop.clone()))
    }));
    futures::future::join(controllers, migration).await;
}

/// The whole operator.
pub async fn run(args: OperatorArgs) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::default());
    let config = kube::Config::infer()
        .await
        .context("reading the Kubernetes client configuration")?;
    let client = crate::client::counting_client(config, metrics.clone())
        .context("connecting to the Kubernetes API")?;
    let ready = Arc::new(AtomicBool::new(false));

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::spawn(async move {
        termination_signal().await;
        tracing::info!("shutting down");
        let _ = shutdown_tx.send(true);
    });
    let http = tokio::spawn(crate::http::serve(
        args.metrics_listen,
        metrics.clone(),
        ready.clone(),
        stopped(shutdown_rx.clone()),
    ));

    if !args.skip_crd_install {
        crate::crds::apply_crds(client.clone())
            .await
            .context("installing the CRDs")?;
    }
    ready.store(true, Ordering::Relaxed);

    let ctx = Arc::new(
        Context::new(
            client.clone(),
            args.defaults(),
            metrics,
            Arc::new(S3Purger),
            Duration::from_secs(args.resync_seconds),
        )
        .with_secret_watch(
            args.secret_watch_namespaces(),
            Duration::from_secs(args.secret_wait_requeue_seconds),
        ),
    );

    let lost_leadership = if args.leader_election {
        lead(client, &args, ctx, shutdown_rx).await?
    } else {
        run_controllers(ctx, &args, shutdown_rx).await;
        false
    };
    if let Ok(Err(e)) = http.await {
        tracing::warn!(error = %e, "HTTP server failed");
    }
    if lost_leadership {
        // Another replica may already reconcile: exit and let the pod restart as a follower.
        anyhow::bail!("lost the leader Lease");
    }
    Ok(())
}

/// Waits for the leader Lease, runs the controllers while holding it, and releases it on
/// shutdown. Returns whether leadership was lost (rather than given up).
async fn lead(
    client: Client,
    args: &OperatorArgs,
    ctx: Arc<Context>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<bool> {
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("cairn-operator-{}", hex::encode(rand::random::<[u8; 4]>())));
    let namespace = args
        .leader_election_namespace
        .clone()
        .unwrap_or_else(|| args.operator_namespace.clone());
    // The field manager must differ per replica: the Lease is taken with a non-forced
    // server-side apply, and only a different manager makes a concurrent take a conflict. The
    // crate's default (`kube-lease-manager-<identity>`) is unique; a shared one lets two
    // replicas both believe they lead.
    let manager = LeaseManagerBuilder::new(client, &args.leader_election_lease)
        .with_namespace(&namespace)
        .with_identity(&identity)
        .with_duration(LEASE_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .build()
        .await
        .context("preparing leader election")?;
    let (mut leader, task) = manager.watch().await;
    tracing::info!(%identity, lease = %args.leader_election_lease, %namespace, "waiting for leadership");

    let mut waiting = Box::pin(stopped(shutdown.clone()));
    while !*leader.borrow_and_update() {
        tokio::select! {
            changed = leader.changed() => changed.context("leader election stopped")?,
            _ = &mut waiting => {
                drop(leader);
                let _ = task.await;
                return Ok(false);
            }
        }
    }
    tracing::info!(%identity, "leading");

    let (stop_tx, stop_rx) = watch::channel(false);
    let controllers = run_controllers(ctx, args, stop_rx);
    tokio::pin!(controllers);
    let lost = tokio::select! {
        _ = &mut controllers => false,
        _ = &mut waiting => {
            let _ = stop_tx.send(true);
            controllers.await;
            false
        }
        _ = async {
            while *leader.borrow_and_update() {
                if leader.changed().await.is_err() {
                    return;
                }
            }
        } => {
            tracing::error!(%identity, "lost leadership; stopping the controllers");
            let _ = stop_tx.send(true);
            controllers.await;
            true
        }
    };
    // Closing the channel makes the manager release the Lease, so a follower takes over at
    // once instead of after the Lease expires.
    drop(leader);
    let _ = task.await;
    Ok(lost)
}
