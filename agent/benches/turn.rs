//! Per-turn overhead of the agent: everything a turn does except waiting for the model —
//! journal the input, cheap passes, pre-flight, budget, building and serializing the request
//! body, journal the reply — on a 1 MB and a 4 MB history.
//!
//! The provider answers at once, so what is measured is the agent's own work: `loop` is the
//! session loop with an in-memory journal; `loop+body` adds building and serializing the
//! request body as the Anthropic client does; `full` adds the journal in a local directory
//! (`fsync` on every entry, two entries per turn).
//!
//! `cargo bench -p cairn-agent --bench turn`

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cairn_agent::ccr::{LocalLimits, LocalStore};
use cairn_agent::config::{ConfigFile, Live};
use cairn_agent::history::Message;
use cairn_agent::metrics::Metrics;
use cairn_agent::provider::{
    Anthropic, ChatRequest, ChatResponse, Provider, ProviderError, StopReason, Usage, WireCache,
};
use cairn_agent::session::{Session, SessionParts};
use cairn_agent::storage::{DirObjects, ObjectError, ObjectStore};
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::sync::watch;

#[path = "support/history.rs"]
mod fixture;
use fixture::history;

/// The allocator of the `cairn-agent` binary, configured as it is at start-up, so the figures
/// are the binary's.
#[global_allocator]
static ALLOCATOR: cairn_agent::allocator::Allocator = mimalloc::MiMalloc;

/// Answers immediately; with `serialize`, the request body is still built and serialized
/// exactly as the Anthropic client does before sending (`Anthropic::body` straight to bytes,
/// through the client's cache of escaped texts).
struct Immediate {
    serialize: bool,
    wire: WireCache,
}

#[async_trait]
impl Provider for Immediate {
    fn name(&self) -> &str {
        "instant"
    }

    async fn send(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        let request_bytes = if self.serialize {
            self.wire
                .to_vec(&Anthropic::body(request))
                .map_or(0, |b| b.len() as u64)
        } else {
            cairn_agent::history::weight(&request.messages) as u64
        };
        Ok(ChatResponse {
            message: Message::assistant("ok"),
            stop: StopReason::End,
            usage: Usage::default(),
            request_bytes,
            context: None,
        })
    }
}

/// A journal that only keeps objects in memory: isolates the journal's I/O from the rest.
#[derive(Default)]
struct MemObjects(std::sync::Mutex<std::collections::BTreeMap<String, Vec<u8>>>);

#[async_trait]
impl ObjectStore for MemObjects {
    async fn put(&self, name: &str, body: Vec<u8>) -> Result<(), ObjectError> {
        if let Ok(mut m) = self.0.lock() {
            m.insert(name.to_owned(), body);
        }
        Ok(())
    }
    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, ObjectError> {
        Ok(self.0.lock().ok().and_then(|m| m.get(name).cloned()))
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, ObjectError> {
        Ok(self
            .0
            .lock()
            .map(|m| {
                m.keys()
                    .filter(|k| k.starts_with(prefix))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }
    async fn delete(&self, name: &str) -> Result<(), ObjectError> {
        if let Ok(mut m) = self.0.lock() {
            m.remove(name);
        }
        Ok(())
    }
}

fn session(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    bytes: usize,
    serialize: bool,
    on_disk: bool,
) -> Session {
    // A window large enough that the history never needs compacting: the steady state.
    let yaml = "name: bench\nprovider: {kind: anthropic, model: claude-sonnet-4-5}\ncontextWindow: 4000000\nmaxOutputTokens: 8000\n";
    let cfg = ConfigFile::parse(yaml, "bench").expect("config");
    let live = Live::resolve(&cfg.spec, None, None).expect("live");
    let (_tx, rx) = watch::channel(Arc::new(live));
    std::mem::forget(_tx);
    let store = LocalStore::open(
        dir.join("ccr"),
        LocalLimits {
            max_bytes: 1 << 40,
            ttl: Duration::from_secs(1 << 30),
        },
    )
    .expect("store");
    let counters = Arc::clone(store.counters());
    rt.block_on(async {
        let mut s = Session::open(SessionParts {
            namespace: "bench".into(),
            name: "bench".into(),
            holder: "bench".into(),
            live: rx,
            provider: Arc::new(Immediate {
                serialize,
                wire: WireCache::new(),
            }),
            summarizer_provider: None,
            store: Arc::new(store),
            journal: if on_disk {
                Arc::new(DirObjects::open(dir.join("journal")).expect("journal"))
            } else {
                Arc::new(MemObjects::default())
            },
            archive_counters: counters,
            metrics: Arc::new(Metrics::new()),
            net: Default::default(),
        })
        .await
        .expect("session");
        s.replace_history(history(bytes)).await.expect("seed");
        // One turn first, so one-time work (first journal entries, archive lookups) is not
        // measured; the history must still be as large as claimed afterwards.
        s.turn(vec![Message::user("start")]).await.expect("turn");
        let weight = cairn_agent::history::weight(s.history());
        assert!(weight >= bytes, "the history shrank to {weight} bytes");
        s
    })
}

fn bench(c: &mut Criterion) {
    cairn_agent::allocator::configure();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("turn_overhead");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(10));
    // `loop`: the session loop alone (journal in memory, no request serialization);
    // `loop+body`: plus building and serializing the request body;
    // `full`: plus the journal in a local directory with fsync.
    for (label, bytes, serialize, on_disk) in [
        ("1MB/loop", 1 << 20, false, false),
        ("4MB/loop", 4 << 20, false, false),
        ("1MB/loop+body", 1 << 20, true, false),
        ("4MB/loop+body", 4 << 20, true, false),
        ("1MB/full", 1 << 20, true, true),
        ("4MB/full", 4 << 20, true, true),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = session(&rt, dir.path(), bytes, serialize, on_disk);
        // Each turn adds two messages; thousands of iterations would grow the history far
        // past its size, so it is reset (untimed) before every measured turn.
        let base = s.history().to_vec();
        group.bench_function(label, |b| {
            b.iter_custom(|iters| {
                let mut measured = Duration::ZERO;
                for _ in 0..iters {
                    rt.block_on(s.replace_history(base.clone())).expect("reset");
                    let started = std::time::Instant::now();
                    rt.block_on(s.turn(vec![Message::user("next step")]))
                        .expect("turn");
                    measured += started.elapsed();
                }
                measured
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
