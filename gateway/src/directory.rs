//! Where sessions are and whether they can take a request: a pure reading of an AgentSession
//! ([`view`]), and the [`Directory`] that holds them — a reflector over the API server in a
//! cluster ([`KubeDirectory`]), or a fixed table ([`StaticDirectory`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use cairn_crds::names::{TOKEN_KEY, service_url, token_secret_name};
use cairn_crds::{AgentSession, Phase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

/// Annotation by which the gateway asks the operator to wake an idle-suspended session
/// (RFC 3339 UTC time of the request): the CRD crate's, which the operator reads.
pub use cairn_crds::session::WAKE_ANNOTATION;
/// Condition the operator sets while a session sleeps for being idle.
pub const IDLE_CONDITION: &str = "Idle";
/// Condition saying the session's pod answers.
pub const READY_CONDITION: &str = "Ready";
/// Field manager of the gateway's writes.
pub const FIELD_MANAGER: &str = "cairn-gateway";

/// Whether a session can take a request now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// `Running` and `Ready`: forward.
    Ready,
    /// `spec.suspend: true`: never woken by traffic.
    Suspended,
    /// Suspended by the operator for being idle: wake it, then forward.
    Idle,
    /// On its way (a new session, a restart, a wake in progress): wait, bounded.
    Starting,
    /// Broken until its spec changes: answer at once.
    Failed(String),
}

/// What the gateway needs of one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionView {
    /// Base URL of the session's API (no trailing slash).
    pub url: String,
    pub readiness: Readiness,
    /// The salted digest of the session's API token the operator publishes
    /// (`status.apiTokenHash`, [`cairn_crds::session::api_token_hash`]); `None` until it has.
    pub token_hash: Option<String>,
}

fn condition_true(s: &AgentSession, kind: &str) -> bool {
    s.status.as_ref().is_some_and(|st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == kind && c.status == "True")
    })
}

/// Reads a session. Pure.
pub fn view(s: &AgentSession) -> SessionView {
    let name = s.metadata.name.clone().unwrap_or_default();
    let namespace = s.metadata.namespace.clone().unwrap_or_default();
    let url = s
        .status
        .as_ref()
        .and_then(|st| st.service_url.clone())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| service_url(&name, &namespace));
    let url = url.trim_end_matches('/').to_string();
    let phase = s.status.as_ref().and_then(|st| st.phase);
    let readiness = if s.spec.suspend {
        Readiness::Suspended
    } else if condition_true(s, IDLE_CONDITION) {
        Readiness::Idle
    } else {
        match phase {
            Some(Phase::Running) if condition_true(s, READY_CONDITION) => Readiness::Ready,
            Some(Phase::Failed) => Readiness::Failed(
                s.status
                    .as_ref()
                    .and_then(|st| {
                        st.conditions
                            .iter()
                            .find(|c| c.type_ == READY_CONDITION)
                            .map(|c| c.message.clone())
                    })
                    .unwrap_or_else(|| "the session failed".into()),
            ),
            // Suspended without the Idle condition and without spec.suspend: the operator has
            // not caught up yet; treat as starting.
            _ => Readiness::Starting,
        }
    };
    let token_hash = s
        .status
        .as_ref()
        .and_then(|st| st.api_token_hash.clone())
        .filter(|h| !h.is_empty());
    SessionView {
        url,
        readiness,
        token_hash,
    }
}

/// An API call of the directory failed.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Other(String),
}

/// The sessions the gateway serves.
#[async_trait]
pub trait Directory: Send + Sync + 'static {
    /// The session as last seen (from memory: no API call).
    fn lookup(&self, namespace: &str, name: &str) -> Option<SessionView>;
    /// A receiver that changes whenever any session changed.
    fn changes(&self) -> watch::Receiver<u64>;
    /// Whether the directory has its first full list.
    fn synced(&self) -> bool;
    /// The session's own API token, read from its Secret (`None`: no such Secret or key).
    /// Only a caller authenticated by a JWT needs it (a session-token caller presents it, and
    /// is checked against [`SessionView::token_hash`]); the gateway may read it only in the
    /// namespaces a Role grants it (chart value `gateway.oidc.tokenSecretNamespaces`).
    async fn fetch_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<String>, DirectoryError>;
    /// Asks the operator to wake the session (`at`: RFC 3339 UTC).
    async fn request_wake(
        &self,
        namespace: &str,
        name: &str,
        at: &str,
    ) -> Result<(), DirectoryError>;
}

/// The cluster's AgentSessions through a reflector; token Secrets read by name (JWT callers
/// only).
pub struct KubeDirectory {
    client: kube::Client,
    store: Store<AgentSession>,
    changes: watch::Receiver<u64>,
    synced: Arc<std::sync::atomic::AtomicBool>,
}

impl KubeDirectory {
    /// Starts watching AgentSessions (of `namespace`, or all). The watch runs on its own task
    /// until the process ends.
    pub fn start(client: kube::Client, namespace: Option<&str>) -> Arc<Self> {
        let api: Api<AgentSession> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let (store, writer) = reflector::store();
        let (tx, changes) = watch::channel(0u64);
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(_) => tx.send_modify(|n| *n = n.wrapping_add(1)),
                    Err(e) => tracing::warn!(error = %e, "watching AgentSessions"),
                }
            }
        });
        let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ready, flag) = (store.clone(), Arc::clone(&synced));
        tokio::spawn(async move {
            if ready.wait_until_ready().await.is_ok() {
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
        Arc::new(Self {
            client,
            store,
            changes,
            synced,
        })
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }
}

#[async_trait]
impl Directory for KubeDirectory {
    fn lookup(&self, namespace: &str, name: &str) -> Option<SessionView> {
        self.store
            .get(&ObjectRef::new(name).within(namespace))
            .map(|s| view(&s))
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    fn synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn fetch_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<String>, DirectoryError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret = api.get_opt(&token_secret_name(name)).await?;
        Ok(secret
            .and_then(|s| s.data)
            .and_then(|d| d.get(TOKEN_KEY).cloned())
            .and_then(|b| String::from_utf8(b.0).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty()))
    }

    async fn request_wake(
        &self,
        namespace: &str,
        name: &str,
        at: &str,
    ) -> Result<(), DirectoryError> {
        let api: Api<AgentSession> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({"metadata": {"annotations": {WAKE_ANNOTATION: at}}});
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(&patch),
        )
        .await?;
        Ok(())
    }
}

/// A fixed table of sessions, always ready: the gateway in front of known upstreams (and its
/// benchmark).
pub struct StaticDirectory {
    sessions: HashMap<(String, String), (String, String)>,
    changes: watch::Receiver<u64>,
    _tx: watch::Sender<u64>,
    wakes: Mutex<Vec<(String, String)>>,
}

impl StaticDirectory {
    /// `sessions`: (namespace, name, base URL, token).
    pub fn new(sessions: impl IntoIterator<Item = (String, String, String, String)>) -> Self {
        let (tx, changes) = watch::channel(0);
        Self {
            sessions: sessions
                .into_iter()
                .map(|(ns, name, url, token)| ((ns, name), (url, token)))
                .collect(),
            changes,
            _tx: tx,
            wakes: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl Directory for StaticDirectory {
    fn lookup(&self, namespace: &str, name: &str) -> Option<SessionView> {
        self.sessions
            .get(&(namespace.to_string(), name.to_string()))
            .map(|(url, token)| SessionView {
                url: url.trim_end_matches('/').to_string(),
                readiness: Readiness::Ready,
                token_hash: Some(cairn_crds::session::api_token_hash(namespace, name, token)),
            })
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    fn synced(&self) -> bool {
        true
    }

    async fn fetch_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<String>, DirectoryError> {
        Ok(self
            .sessions
            .get(&(namespace.to_string(), name.to_string()))
            .map(|(_, t)| t.clone()))
    }

    async fn request_wake(
        &self,
        namespace: &str,
        name: &str,
        _at: &str,
    ) -> Result<(), DirectoryError> {
        if let Ok(mut w) = self.wakes.lock() {
            w.push((namespace.to_string(), name.to_string()));
        }
        Ok(())
    }
}
