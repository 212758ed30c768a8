//! What the `cairn-agent` subcommands do: build a session from a config file or from the
//! cluster, run one turn, serve the HTTP API, recall an original.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::ccr::{RecallError, recall};
use crate::config::{ConfigError, ConfigFile, Live, Storage, StorageSettings};
use crate::history::{self, Message};
use crate::metrics::Metrics;
use crate::provider::{ClientOptions, Credentials, LiveProvider, Provider, build};
use crate::server::{AppState, DEFAULT_MAX_REQUEST_BYTES, Gate, router};
use crate::session::{Session, SessionParts, TurnError};

/// Exit codes of `run` (and of `recall`).
pub mod exit {
    pub const OK: u8 = 0;
    /// Anything else: the journal or archive failed, the session was taken over.
    pub const FAILURE: u8 = 1;
    pub const BAD_INPUT: u8 = 2;
    pub const PROVIDER: u8 = 3;
    pub const FLOOR: u8 = 4;
}

/// A start-up failure with its exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct AppError {
    pub code: u8,
    pub message: String,
}

impl AppError {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<ConfigError> for AppError {
    fn from(e: ConfigError) -> Self {
        Self::new(exit::BAD_INPUT, e.to_string())
    }
}

impl From<TurnError> for AppError {
    fn from(e: TurnError) -> Self {
        let code = match &e {
            TurnError::BadInput(_) => exit::BAD_INPUT,
            TurnError::Provider { .. } => exit::PROVIDER,
            TurnError::Floor(_) => exit::FLOOR,
            _ => exit::FAILURE,
        };
        Self::new(code, e.to_string())
    }
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// Who writes the journal: the pod name (or host) and the process id.
pub fn holder_identity() -> String {
    let host = env("HOSTNAME")
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "cairn-agent".into());
    format!("{host}/{}", std::process::id())
}

/// The session's provider: follows `spec.provider` edits (model, base URL, API family) from
/// one call to the next, with the API key from the environment.
fn provider_for(live: watch::Receiver<Arc<Live>>) -> Result<Arc<dyn Provider>, AppError> {
    let build = |spec: &cairn_crds::ProviderSpec| {
        build(
            spec,
            Credentials::from_env(spec.kind),
            ClientOptions::default(),
        )
        .map(Arc::from)
        .map_err(|e| e.to_string())
    };
    LiveProvider::new(live, Box::new(build))
        .map(|p| Arc::new(p) as Arc<dyn Provider>)
        .map_err(|e| AppError::new(exit::BAD_INPUT, e))
}

async fn open_session(
    namespace: &str,
    name: &str,
    live_rx: watch::Receiver<Arc<Live>>,
    storage: &Storage,
    metrics: Arc<Metrics>,
) -> Result<Session, AppError> {
    let provider = provider_for(live_rx.clone())?;
    Session::open(SessionParts {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        holder: holder_identity(),
        live: live_rx,
        provider,
        store: Arc::clone(&storage.store),
        journal: Arc::clone(&storage.journal),
        archive_counters: Arc::clone(&storage.counters),
        metrics,
    })
    .await
    .map_err(|e| AppError::new(exit::FAILURE, format!("opening the session journal: {e}")))
}

fn load_config(path: &Path) -> Result<(ConfigFile, Live, Storage), AppError> {
    let cfg = ConfigFile::load(path)?;
    let live = Live::resolve(
        &cfg.spec,
        cfg.policy.as_ref(),
        crate::config::system_prompt_override(),
    )?;
    let settings = StorageSettings::from_spec(&cfg.spec, env)?;
    let storage = Storage::open(&settings, &cfg.namespace, &cfg.name)?;
    Ok((cfg, live, storage))
}

/// Where the prompt of `run` comes from.
pub enum Prompt {
    Text(String),
    File(PathBuf),
}

/// `cairn-agent run`: one turn; the answer on stdout, notices on stderr.
pub async fn run(
    config: &Path,
    history_file: Option<&Path>,
    prompt: Prompt,
) -> Result<(), AppError> {
    let prompt = match prompt {
        Prompt::Text(t) => t,
        Prompt::File(p) => std::fs::read_to_string(&p).map_err(|e| {
            AppError::new(exit::BAD_INPUT, format!("cannot read {}: {e}", p.display()))
        })?,
    };
    if prompt.trim().is_empty() {
        return Err(AppError::new(exit::BAD_INPUT, "the prompt is empty"));
    }
    let seed = match history_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                AppError::new(exit::BAD_INPUT, format!("cannot read {}: {e}", p.display()))
            })?;
            Some(
                history::parse_jsonl(&text)
                    .map_err(|e| AppError::new(exit::BAD_INPUT, format!("{}: {e}", p.display())))?,
            )
        }
        None => None,
    };
    let (cfg, live, storage) = load_config(config)?;
    if storage.kind == "local" {
        eprintln!("cairn: archive and journal in a local directory (no S3 configured)");
    }
    let (_tx, rx) = watch::channel(Arc::new(live));
    let mut session = open_session(
        &cfg.namespace,
        &cfg.name,
        rx,
        &storage,
        Arc::new(Metrics::new()),
    )
    .await?;
    if let Some(seed) = seed {
        session.replace_history(seed).await?;
    }
    let out = session.turn(vec![Message::user(prompt)]).await?;
    for n in &out.notices {
        eprintln!("cairn: [{}] {}", n.kind, n.message);
    }
    println!("{}", out.text);
    Ok(())
}

/// `cairn-agent recall`: the archived original, byte for byte, on stdout.
pub async fn recall_cmd(key: &str, config: &Path) -> Result<Vec<u8>, AppError> {
    let cfg = ConfigFile::load(config)?;
    let settings = StorageSettings::from_spec(&cfg.spec, env)?;
    let storage = Storage::open(&settings, &cfg.namespace, &cfg.name)?;
    match recall(storage.store.as_ref(), key).await {
        Ok(r) if r.missing.is_empty() => Ok(r.output),
        Ok(r) => Err(AppError::new(
            exit::FAILURE,
            format!(
                "not in this session's archive: {}",
                r.missing
                    .iter()
                    .map(|k| k.marker())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
        Err(RecallError::NoKey) => Err(AppError::new(
            exit::BAD_INPUT,
            RecallError::NoKey.to_string(),
        )),
        Err(e) => Err(AppError::new(exit::FAILURE, e.to_string())),
    }
}

/// Where `serve` gets its session from.
pub enum Source {
    /// `--session NS/NAME`: the cluster.
    Cluster(String),
    /// `--config FILE`: standalone; the file is re-read when it changes.
    File(PathBuf),
}

/// How often a standalone config file is checked for changes.
const CONFIG_POLL: Duration = Duration::from_secs(1);

/// `cairn-agent serve`. The socket is bound first: `/healthz` answers while the session
/// is still opening (in a pod that can mean waiting for the journal Lease), `/readyz` once
/// it is open.
pub async fn serve(source: Source, listen: SocketAddr) -> Result<(), AppError> {
    let token = env("CAIRN_API_TOKEN")
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| {
            AppError::new(
                exit::BAD_INPUT,
                "CAIRN_API_TOKEN must be set: every API call needs it as a bearer token",
            )
        })?;
    let max_body = env("CAIRN_MAX_REQUEST_BYTES")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MAX_REQUEST_BYTES);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| AppError::new(exit::FAILURE, format!("cannot listen on {listen}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| AppError::new(exit::FAILURE, e.to_string()))?;
    eprintln!("cairn-agent starting on {bound}");
    let gate = Gate::new("opening the session");
    let mut server = tokio::spawn(
        axum::serve(listener, gate.router())
            .with_graceful_shutdown(shutdown_signal())
            .into_future(),
    );
    let opened = tokio::select! {
        opened = open_served(&source, token, &gate) => opened?,
        done = &mut server => {
            tracing::info!("stopped before the session was open");
            return match done {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(AppError::new(exit::FAILURE, e.to_string())),
                Err(e) => Err(AppError::new(exit::FAILURE, e.to_string())),
            };
        }
    };
    let Served { state, lease } = opened;
    gate.open(router(state.clone(), max_body));
    eprintln!("cairn-agent listening on {bound}");
    tracing::info!(%bound, "serving");
    let done = server
        .await
        .map_err(|e| AppError::new(exit::FAILURE, e.to_string()))?;
    done.map_err(|e| AppError::new(exit::FAILURE, e.to_string()))?;
    // Graceful shutdown: whatever is in memory reaches the journal before the lease goes.
    let mut session = state.session.lock().await;
    if let Err(e) = session.flush().await {
        tracing::error!(error = %e, "flushing the journal at shutdown");
    }
    if let Some(hold) = lease {
        hold.release().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// An open session being served.
struct Served {
    state: AppState,
    lease: Option<Arc<crate::kube::LeaseHold>>,
}

/// Opens the session `serve` serves and starts what follows it: the config file or the
/// AgentSession, the Lease, `status.session`.
async fn open_served(source: &Source, token: String, gate: &Gate) -> Result<Served, AppError> {
    let metrics = Arc::new(Metrics::new());
    let mut cluster = None;
    let (namespace, name, live, storage) = match source {
        Source::File(path) => {
            let (cfg, live, storage) = load_config(path)?;
            (cfg.namespace, cfg.name, live, storage)
        }
        Source::Cluster(r) => {
            let (ns, name) = crate::config::parse_session_ref(r)?;
            let client = ::kube::Client::try_default()
                .await
                .map_err(|e| AppError::new(exit::FAILURE, format!("kubernetes client: {e}")))?;
            let (obj, live) = crate::kube::load(&client, &ns, &name)
                .await
                .map_err(|e| AppError::new(exit::FAILURE, e.to_string()))?;
            let settings = StorageSettings::from_spec(&obj.spec, env)?;
            let storage = Storage::open(&settings, &ns, &name)?;
            gate.waiting(format!(
                "waiting for the journal Lease {} of {ns}/{name}",
                crate::kube::lease_name(&name)
            ));
            let lease =
                crate::kube::LeaseHold::acquire(client.clone(), &ns, &name, &holder_identity())
                    .await
                    .map_err(|e| AppError::new(exit::FAILURE, e.to_string()))?;
            cluster = Some((client, lease));
            (ns, name, live, storage)
        }
    };
    gate.waiting("rebuilding the history from the journal");
    let (live_tx, live_rx) = watch::channel(Arc::new(live));
    let session = open_session(&namespace, &name, live_rx, &storage, metrics).await?;
    let epoch = session.journal_epoch();
    let state = AppState::new(session, token);
    let live_tx = Arc::new(live_tx);
    let mut lease = None;
    match source {
        Source::File(path) => {
            tokio::spawn(watch_file(path.clone(), Arc::clone(&live_tx)));
        }
        Source::Cluster(_) => {
            if let Some((client, hold)) = cluster {
                let hold = Arc::new(hold);
                tokio::spawn(crate::kube::follow(
                    client.clone(),
                    namespace.clone(),
                    name.clone(),
                    (*live_tx).clone(),
                ));
                tokio::spawn(crate::kube::write_status(
                    client,
                    namespace.clone(),
                    name.clone(),
                    state.stats(),
                ));
                let keeper = Arc::clone(&hold);
                let st = state.clone();
                tokio::spawn(async move {
                    let why = keeper.keep(epoch).await;
                    tracing::error!(reason = %why, "lost the session lease: this agent stops writing");
                    st.fence(why);
                });
                lease = Some(hold);
            }
        }
    }
    tracing::info!(session = %format!("{namespace}/{name}"), epoch, "session open");
    Ok(Served { state, lease })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = ctrl_c.await;
}

/// Re-reads a standalone config file when it changes; a file that does not resolve keeps
/// the previous settings.
async fn watch_file(path: PathBuf, tx: Arc<watch::Sender<Arc<Live>>>) {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut last: Option<SystemTime> = modified(&path);
    loop {
        tokio::time::sleep(CONFIG_POLL).await;
        let now = modified(&path);
        if now == last {
            continue;
        }
        last = now;
        let next = ConfigFile::load(&path).and_then(|c| {
            Live::resolve(
                &c.spec,
                c.policy.as_ref(),
                crate::config::system_prompt_override(),
            )
        });
        match next {
            Ok(live) => {
                if *tx.borrow().as_ref() != live {
                    tracing::info!(policy = %live.policy_hash, "config changed; applied from the next turn");
                    tx.send_replace(Arc::new(live));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the changed config does not resolve; keeping the previous settings")
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}

/// The namespace and name of the session a command works on, for the exported spans'
/// resource; `None` when the config file does not load (the command reports why).
pub fn session_name(source: &Source) -> Option<(String, String)> {
    match source {
        Source::Cluster(r) => crate::config::parse_session_ref(r).ok(),
        Source::File(path) => ConfigFile::load(path).ok().map(|c| (c.namespace, c.name)),
    }
}
