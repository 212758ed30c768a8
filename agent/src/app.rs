//! What the `cairn-agent` subcommands do: build a session from a config file or from the
//! cluster, run one turn, serve the HTTP API, recall an original.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::ccr::{RecallError, recall};
use crate::config::{ConfigError, ConfigFile, Live, Storage, StorageSettings};
use crate::history::{self, Message};
use crate::metrics::Metrics;
use crate::provider::{ClientOptions, Credentials, LiveProvider, Provider, build};
use crate::server::{AppState, DEFAULT_MAX_REQUEST_BYTES, Gate, Limits, router, serve_limited};
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
            TurnError::Provider { .. } | TurnError::Deadline(_) => exit::PROVIDER,
            TurnError::Floor(_) | TurnError::ContextFull(_) => exit::FLOOR,
            _ => exit::FAILURE,
        };
        Self::new(code, e.to_string())
    }
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// Who writes the journal and holds the Lease: this process, unique per incarnation. A
/// session's replacement pod has the same name and, in a container, the same pid (1),
/// so `HOSTNAME/pid` would name every incarnation alike and the Lease would take a new pod
/// for the old holder. `pod/uid/incarnation`: the pod name (or host), the pod UID the
/// operator passes through the downward API (`CAIRN_POD_UID`, first 8 characters; `-`
/// outside a pod), and a random id drawn once per process (a container restarted in the
/// same pod keeps its UID).
pub fn holder_identity() -> String {
    static HOLDER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOLDER
        .get_or_init(|| {
            let host = env("HOSTNAME")
                .filter(|h| !h.is_empty())
                .or_else(|| {
                    std::fs::read_to_string("/etc/hostname")
                        .ok()
                        .map(|h| h.trim().to_owned())
                })
                .unwrap_or_else(|| "cairn-agent".into());
            holder_of(&host, env("CAIRN_POD_UID").as_deref(), fastrand::u64(..))
        })
        .clone()
}

fn holder_of(host: &str, pod_uid: Option<&str>, incarnation: u64) -> String {
    let uid: String = pod_uid
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map_or_else(|| "-".into(), |u| u.chars().take(8).collect());
    format!("{host}/{uid}/{incarnation:016x}")
}

/// The session's provider: follows `spec.provider` edits (model, base URL, API family) from
/// one call to the next, with the API key from the environment.
fn provider_for(
    live: watch::Receiver<Arc<Live>>,
    net: crate::net::NetPath,
) -> Result<Arc<dyn Provider>, AppError> {
    let build = move |spec: &cairn_crds::ProviderSpec| {
        build(
            spec,
            Credentials::from_env(spec.kind),
            ClientOptions {
                net: net.clone(),
                ..ClientOptions::default()
            },
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
    open_session_on(
        namespace,
        name,
        live_rx,
        (Arc::clone(&storage.store), Arc::clone(&storage.journal)),
        storage,
        metrics,
    )
    .await
}

/// [`open_session`] on the given archive and journal stores (`storage` gives the counters).
async fn open_session_on(
    namespace: &str,
    name: &str,
    live_rx: watch::Receiver<Arc<Live>>,
    (store, journal): (
        Arc<dyn crate::ccr::Store>,
        Arc<dyn crate::journal::ObjectStore>,
    ),
    storage: &Storage,
    metrics: Arc<Metrics>,
) -> Result<Session, AppError> {
    let net = crate::net::NetPath::from_env(env)
        .map_err(|e| AppError::new(exit::BAD_INPUT, e.to_string()))?;
    let provider = provider_for(live_rx.clone(), net.clone())?;
    let summarizer = crate::provider::summarizer_provider(
        live_rx.clone(),
        Arc::new(|n: &str| std::env::var(n).ok()),
        ClientOptions {
            net: net.clone(),
            ..ClientOptions::default()
        },
    );
    Session::open(SessionParts {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        holder: holder_identity(),
        live: live_rx,
        provider,
        summarizer_provider: Some(Arc::new(summarizer)),
        store,
        journal,
        archive_counters: Arc::clone(&storage.counters),
        metrics,
        net,
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

/// `cairn-agent reset-payload-cap`: forgets the session's learned payload cap, journaled.
/// It opens the session's journal as `run` does (so a `serve` of the same session is
/// fenced); against a running agent use `POST /v1/session/reset-payload-cap`.
pub async fn reset_payload_cap_cmd(config: &Path) -> Result<Option<u64>, AppError> {
    let (cfg, live, storage) = load_config(config)?;
    let (_tx, rx) = watch::channel(Arc::new(live));
    let mut session = open_session(
        &cfg.namespace,
        &cfg.name,
        rx,
        &storage,
        Arc::new(Metrics::new()),
    )
    .await?;
    Ok(session.reset_payload_cap().await?)
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

/// `cairn-agent context`: the session's next request, by part, as `GET /v1/session/context`
/// reports it, from the config file and the session's journal and archive. The session is
/// opened the way a starting agent opens it, on [`crate::peek`] overlays: nothing is sent
/// to the provider and nothing is written, so an agent serving the session is not fenced.
/// The client's part of a turn (its tools, instructions) lives only in the serving process:
/// the report assumes none.
pub async fn context_cmd(
    config: &Path,
    options: crate::session::InspectOptions,
) -> Result<crate::session::ContextReport, AppError> {
    use crate::peek::PeekObjects;
    let (cfg, live, storage) = load_config(config)?;
    let (_tx, rx) = watch::channel(Arc::new(live));
    // The archive straight from its durable tier: a local cache in front of it is neither
    // read nor filled.
    let originals = PeekObjects::new(Arc::clone(&storage.originals));
    let store: Arc<dyn crate::ccr::Store> = Arc::new(
        crate::ccr::ObjectArchive::new(originals).with_in_flight(storage.store.in_flight()),
    );
    let journal: Arc<dyn crate::journal::ObjectStore> =
        Arc::new(PeekObjects::new(Arc::clone(&storage.journal)));
    let mut session = open_session_on(
        &cfg.namespace,
        &cfg.name,
        rx,
        (store, journal),
        &storage,
        Arc::new(Metrics::new()),
    )
    .await?;
    session.inspect(options).await.map_err(|e| {
        AppError::new(
            exit::FAILURE,
            format!("the next request cannot be shown: {e}"),
        )
    })
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
/// The pod's grace period when `CAIRN_TERMINATION_GRACE_SECONDS` is unset (Kubernetes'
/// default `terminationGracePeriodSeconds`).
const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// What the agent keeps of the grace period for itself after aborting a turn: the journal
/// flush, the Lease release and the last spans.
const SHUTDOWN_MARGIN: Duration = Duration::from_secs(5);
/// How often `serve` checks again that the archive answers.
const ARCHIVE_CHECK_INTERVAL: Duration = Duration::from_secs(300);
/// How long a cluster agent whose archive does not answer waits before checking again.
const ARCHIVE_RETRY: Duration = Duration::from_secs(10);

/// `CAIRN_TERMINATION_GRACE_SECONDS`: the pod's grace period (the operator sets it to the
/// pod's `terminationGracePeriodSeconds`).
fn grace_period() -> Result<Duration, AppError> {
    match env("CAIRN_TERMINATION_GRACE_SECONDS").filter(|v| !v.trim().is_empty()) {
        None => Ok(DEFAULT_GRACE),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| {
                AppError::new(
                    exit::BAD_INPUT,
                    format!(
                        "CAIRN_TERMINATION_GRACE_SECONDS must be a number of seconds, not {v:?}"
                    ),
                )
            }),
    }
}

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
    let limits =
        Limits::from_env(env).map_err(|e| AppError::new(exit::BAD_INPUT, e.to_string()))?;
    let grace = grace_period()?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| AppError::new(exit::FAILURE, format!("cannot listen on {listen}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| AppError::new(exit::FAILURE, e.to_string()))?;
    eprintln!("cairn-agent starting on {bound}");
    let gate = Gate::new("opening the session");
    let stopping = CancellationToken::new();
    tokio::spawn({
        let stopping = stopping.clone();
        async move {
            shutdown_signal().await;
            tracing::info!("stopping: no new connections; the requests in flight finish");
            stopping.cancel();
        }
    });
    let mut server = tokio::spawn(serve_limited(
        listener,
        gate.router(),
        limits,
        stopping.clone().cancelled_owned(),
    ));
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
    // After SIGTERM a turn in flight may finish, but not past the grace period: it is
    // aborted with time left for the journal flush and the Lease release.
    let abort = state.session.lock().await.abort_handle();
    tokio::spawn({
        let stopping = stopping.clone();
        async move {
            stopping.cancelled().await;
            tokio::time::sleep(grace.saturating_sub(SHUTDOWN_MARGIN)).await;
            tracing::warn!(
                grace_secs = grace.as_secs(),
                "the grace period is nearly over: aborting the turn in flight, if any"
            );
            abort.cancel();
        }
    });
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
    lease: Option<Arc<crate::cluster::LeaseHold>>,
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
            let client = kube::Client::try_default()
                .await
                .map_err(|e| AppError::new(exit::FAILURE, format!("kubernetes client: {e}")))?;
            let (obj, live) = crate::cluster::load(&client, &ns, &name)
                .await
                .map_err(|e| AppError::new(exit::FAILURE, e.to_string()))?;
            let settings = StorageSettings::from_spec(&obj.spec, env)?;
            let storage = Storage::open(&settings, &ns, &name)?;
            // The operator's ArchiveReady follows this report: until the archive answers,
            // say why (in status.session and /readyz) and check again, rather than exit and
            // leave a crash loop with no reason on the session.
            loop {
                let check = storage.check().await;
                let ok = check.ok;
                if !ok {
                    let why = check.message.clone().unwrap_or_default();
                    tracing::error!(location = %check.location, error = %why, "the archive does not answer");
                    gate.waiting(format!(
                        "the archive {} does not answer: {why}",
                        check.location
                    ));
                }
                crate::cluster::report_archive_check(&client, &ns, &name, &check).await;
                if ok {
                    break;
                }
                tokio::time::sleep(ARCHIVE_RETRY).await;
            }
            gate.waiting(format!(
                "waiting for the journal Lease {} of {ns}/{name}",
                cairn_crds::names::lease_name(&name)
            ));
            let lease =
                crate::cluster::LeaseHold::acquire(client.clone(), &ns, &name, &holder_identity())
                    .await
                    .map_err(|e| AppError::new(exit::FAILURE, e.to_string()))?;
            cluster = Some((client, lease, obj));
            (ns, name, live, storage)
        }
    };
    gate.waiting("rebuilding the history from the journal");
    let (live_tx, live_rx) = watch::channel(Arc::new(live));
    let mut session = open_session(&namespace, &name, live_rx, &storage, metrics).await?;
    if let Some((client, _, obj)) = &cluster {
        session.set_events(crate::events::EventSink::start(
            client.clone(),
            obj,
            holder_identity(),
        ));
    }
    let epoch = session.journal_epoch();
    let check_slot = session.archive_check_slot();
    let check = storage.check().await;
    if let Ok(mut slot) = check_slot.write() {
        *slot = Some(check);
    }
    let state = AppState::new(session, token);
    tokio::spawn(recheck_archive(storage, check_slot, state.clone()));
    let live_tx = Arc::new(live_tx);
    let mut lease = None;
    match source {
        Source::File(path) => {
            tokio::spawn(watch_file(path.clone(), Arc::clone(&live_tx)));
        }
        Source::Cluster(_) => {
            if let Some((client, hold, _)) = cluster {
                let hold = Arc::new(hold);
                tokio::spawn(crate::cluster::follow(
                    client.clone(),
                    namespace.clone(),
                    name.clone(),
                    (*live_tx).clone(),
                ));
                tokio::spawn(crate::cluster::write_status(
                    client,
                    namespace.clone(),
                    name.clone(),
                    state.stats(),
                    crate::cluster::status_interval(
                        std::env::var(crate::cluster::STATUS_INTERVAL_ENV)
                            .ok()
                            .as_deref(),
                    ),
                    Some(crate::cluster::IdleFeeds {
                        in_flight: state.in_flight(),
                        live: live_tx.subscribe(),
                    }),
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

/// Checks every [`ARCHIVE_CHECK_INTERVAL`] that the archive still answers; the result
/// reaches `status.session` with the next status write.
async fn recheck_archive(
    storage: Storage,
    slot: Arc<std::sync::RwLock<Option<cairn_crds::session::ArchiveCheck>>>,
    state: AppState,
) {
    loop {
        tokio::time::sleep(ARCHIVE_CHECK_INTERVAL).await;
        let check = storage.check().await;
        if !check.ok {
            tracing::error!(location = %check.location, error = ?check.message, "the archive does not answer");
        }
        // Only a changed outcome is news: an idle session writes no status for a check
        // that says what the last one said (`at` is then when that outcome was first seen).
        if let Ok(mut s) = slot.write() {
            let same = s.as_ref().is_some_and(|c| {
                c.ok == check.ok && c.location == check.location && c.message == check.message
            });
            if !same {
                *s = Some(check);
            }
        }
        // A turn in flight publishes it when it ends.
        if let Ok(session) = state.session.try_lock() {
            state.refresh(&session);
        }
    }
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

#[cfg(test)]
mod holder_tests {
    #[test]
    fn holder_names_pod_uid_and_incarnation() {
        let a = super::holder_of("cairn-x-0", Some("3f1c9a52-0000-4000"), 1);
        assert_eq!(a, "cairn-x-0/3f1c9a52/0000000000000001");
        assert_ne!(
            a,
            super::holder_of("cairn-x-0", Some("3f1c9a52-0000-4000"), 2)
        );
        assert_eq!(super::holder_of("h", None, 0), "h/-/0000000000000000");
        assert_eq!(super::holder_identity(), super::holder_identity());
    }
}
