//! The journal and the archive under S3 faults: a real S3 server (moto, one per test binary)
//! behind a fault-injecting proxy, sessions in process with cairn-sim as the provider, and
//! every check made by a restart (a new session opened over the same storage, straight to
//! moto and with a fresh local cache).

mod support;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cairn_agent::ccr::{LocalLimits, S3Timeouts};
use cairn_agent::config::{ConfigFile, Live, Storage, StorageSettings};
use cairn_agent::history::{self, Message, Role};
use cairn_agent::metrics::Metrics;
use cairn_agent::provider::{ClientOptions, Credentials, Provider, RetryPolicy, build};
use cairn_agent::session::{Session, SessionParts, TurnError};
use cairn_sim::{ScriptedReply, Sim};
use cairn_tests::harness::S3Server;
use support::faults::{Fault, FaultProxy, Op};
use support::moto::{BUCKET, config_for};
use tokio::sync::watch;

/// One moto for the whole binary; every case works under its own session name.
fn moto() -> &'static S3Server {
    static MOTO: OnceLock<(S3Server, tempfile::TempDir)> = OnceLock::new();
    &MOTO
        .get_or_init(|| {
            let logs = tempfile::tempdir().expect("log dir");
            let server = S3Server::start(logs.path(), &[BUCKET])
                .unwrap_or_else(|e| panic!("{e} (run .ci/install.sh to install moto[server])"));
            (server, logs)
        })
        .0
}

fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Short timeouts for the faulty path: a stalled request costs a fraction of a second.
fn faulty_timeouts() -> S3Timeouts {
    S3Timeouts {
        connect: Duration::from_millis(500),
        attempt: Duration::from_millis(400),
        operation: Duration::from_millis(1_500),
        max_attempts: 2,
        initial_backoff: Duration::from_millis(20),
    }
}

/// Generous timeouts for the checks, which talk to moto directly.
fn check_timeouts() -> S3Timeouts {
    S3Timeouts {
        connect: Duration::from_secs(2),
        attempt: Duration::from_secs(10),
        operation: Duration::from_secs(20),
        max_attempts: 3,
        initial_backoff: Duration::from_millis(50),
    }
}

/// A session config for `name` on cairn-sim; no system prompt, so a compaction rewrites
/// message 0.
fn yaml(name: &str, sim: &Sim, window: u64) -> String {
    format!(
        "name: {name}\nnamespace: faults\nprovider:\n  kind: openai-compatible\n  model: m-1\n  baseUrl: {}/v1\ncontextWindow: {window}\nmaxOutputTokens: 1000\ncompaction:\n  minKeepRecent: 4\n",
        sim.url()
    )
}

struct Opened {
    session: Session,
    storage: Storage,
    _live: watch::Sender<Arc<Live>>,
}

async fn open(
    yaml: &str,
    endpoint: &str,
    timeouts: S3Timeouts,
    cache: &std::path::Path,
    holder: &str,
) -> Result<Opened, cairn_agent::journal::JournalError> {
    let cfg = ConfigFile::parse(yaml, "test").expect("config");
    let live = Live::resolve(&cfg.spec, cfg.policy.as_ref(), None).expect("live");
    let settings = StorageSettings {
        s3: Some(config_for(endpoint, timeouts)),
        prefix: "cairn".into(),
        cache_dir: cache.to_path_buf(),
        data_dir: cache.join("data"),
        cache_limits: LocalLimits::from_spec(None, None).expect("limits"),
    };
    let storage = Storage::open(&settings, &cfg.namespace, &cfg.name).expect("storage");
    let options = ClientOptions {
        retry: RetryPolicy::none(),
        ..ClientOptions::default()
    };
    let provider: Arc<dyn Provider> = Arc::from(
        build(&cfg.spec.provider, Credentials::api_key("sk-sim"), options).expect("provider"),
    );
    let (live_tx, rx) = watch::channel(Arc::new(live));
    let session = Session::open(SessionParts {
        namespace: cfg.namespace.clone(),
        name: cfg.name.clone(),
        holder: holder.into(),
        live: rx,
        provider,
        store: Arc::clone(&storage.store),
        journal: Arc::clone(&storage.journal),
        archive_counters: Arc::clone(&storage.counters),
        metrics: Arc::new(Metrics::new()),
    })
    .await?;
    Ok(Opened {
        session,
        storage,
        _live: live_tx,
    })
}

/// A restart: a new session over the same journal, straight to moto, with an empty cache.
async fn restart(yaml: &str, holder: &str) -> Opened {
    let cache = tempfile::tempdir().expect("cache");
    let opened = open(
        yaml,
        &moto().endpoint,
        check_timeouts(),
        cache.path(),
        holder,
    )
    .await
    .unwrap_or_else(|e| panic!("the agent must open a journal it wrote: {e}"));
    // The cache directory may go: the restarted session reads through to S3.
    std::mem::forget(cache);
    opened
}

fn summary_text() -> String {
    let mut s = String::new();
    for (n, sec) in cairn_agent::compact::summarize::SECTIONS.iter().enumerate() {
        s.push_str(&format!(
            "{}. {sec}\nThe user went through numbered questions; all were answered ok.\n",
            n + 1
        ));
    }
    s
}

fn question(t: usize) -> String {
    format!(
        "question {t}: {}",
        "please look at this and answer ok. ".repeat(30)
    )
}

/// The messages of `history` as (role, text) pairs, for readable assertions.
fn texts(history: &[Message]) -> Vec<String> {
    history
        .iter()
        .map(|m| format!("{}: {:.40}", m.role.as_str(), m.content))
        .collect()
}

fn is_unsettled_or_not_persisted(e: &TurnError) -> bool {
    matches!(e.label(), "journal" | "journal_unknown")
}

/// Issue 13: a compaction that rewrites message 0 is written, but the claims listing after
/// it fails; the client is told it failed. A turn after the fault is acknowledged. A restart
/// must open the journal and hold that turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_fence_listing_after_a_compaction_keeps_the_journal_openable() {
    let name = unique("fence-compact");
    let sim = Sim::start().await.expect("sim");
    let proxy = FaultProxy::start(moto().port, Duration::from_millis(600)).await;
    let cache = tempfile::tempdir().expect("cache");
    let yaml = yaml(&name, &sim, 200_000);
    let mut a = open(&yaml, &proxy.endpoint, check_timeouts(), cache.path(), "a")
        .await
        .expect("open");
    for t in 0..12 {
        a.session
            .turn(vec![Message::user(question(t))])
            .await
            .unwrap_or_else(|e| panic!("turn {t}: {e}"));
    }
    let first = a.session.history()[0].clone();
    proxy.always(Op::List, "claims", Fault::Refuse);
    sim.push_reply(ScriptedReply::text(summary_text()));
    let compacted = a.session.compact_now(None).await;
    proxy.clear();
    match &compacted {
        Ok(out) => panic!("the compaction cannot be confirmed without the claims: {out:?}"),
        Err(e) => assert!(is_unsettled_or_not_persisted(e), "{e}"),
    }
    let out = a
        .session
        .turn(vec![Message::user("the acknowledged turn")])
        .await
        .expect("a turn once the store is back");
    assert_eq!(out.text, "ok");
    let in_memory = history::to_jsonl(a.session.history());
    drop(a);

    let b = restart(&yaml, "b").await;
    let rebuilt = b.session.history();
    assert_eq!(
        history::to_jsonl(rebuilt),
        in_memory,
        "the restart rebuilds what the agent had"
    );
    let n = rebuilt.len();
    assert!(n >= 2, "{:?}", texts(rebuilt));
    assert_eq!(rebuilt[n - 2].content, "the acknowledged turn");
    assert_eq!(rebuilt[n - 1].role, Role::Assistant);
    // The compaction did rewrite message 0 (the case that used to corrupt the journal).
    assert_ne!(first, rebuilt[0], "{:?}", texts(rebuilt));
}

/// Issue 13: a turn whose reply entry landed but whose claims check failed was answered
/// "not persisted", and a restart showed it. The answer must not deny a persisted turn, and
/// the history in memory must be what a restart rebuilds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landed_entry_with_a_failed_fence_check_is_not_denied() {
    let name = unique("fence-turn");
    let sim = Sim::start().await.expect("sim");
    let proxy = FaultProxy::start(moto().port, Duration::from_millis(600)).await;
    let cache = tempfile::tempdir().expect("cache");
    let yaml = yaml(&name, &sim, 200_000);
    let mut a = open(&yaml, &proxy.endpoint, check_timeouts(), cache.path(), "a")
        .await
        .expect("open");
    for t in 0..3 {
        a.session
            .turn(vec![Message::user(question(t))])
            .await
            .expect("turn");
    }
    // The input entry's claims check passes; every attempt of the reply entry's fails.
    proxy.next_after(Op::List, "claims", 1, Fault::Refuse, 8);
    let result = a
        .session
        .turn(vec![Message::user("the doubtful turn")])
        .await;
    proxy.clear();
    let in_memory = history::to_jsonl(a.session.history());
    drop(a);

    let b = restart(&yaml, "b").await;
    let rebuilt = b.session.history();
    let present = rebuilt
        .iter()
        .any(|m| m.role == Role::Assistant && m.content == "ok")
        && rebuilt.iter().any(|m| m.content == "the doubtful turn")
        && rebuilt.last().is_some_and(|m| m.role == Role::Assistant);
    match &result {
        Ok(_) => assert!(present, "acknowledged but lost: {:?}", texts(rebuilt)),
        Err(e) => {
            assert!(is_unsettled_or_not_persisted(e), "{e}");
            if present {
                assert!(
                    !e.to_string().contains("not persisted"),
                    "the client was told the turn was not persisted, and a restart has it: {e}"
                );
            }
        }
    }
    assert_eq!(
        history::to_jsonl(rebuilt),
        in_memory,
        "the history in memory is what a restart rebuilds"
    );
}
