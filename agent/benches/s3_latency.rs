//! The archive and the journal on S3 across a network: a real S3-compatible server behind
//! a proxy that delays every request by 20 ms. Two servers: moto (Python, the test suite's
//! S3) and SeaweedFS (Go, a production S3 server), because on this two-core machine moto's
//! own time per request is a large part of what is measured.
//!
//! - `s3_20ms/first_compaction/4MB` (moto) and `s3_20ms_seaweedfs/first_compaction/4MB` — the first compaction of a never-compacted 4 MiB
//!   coding-session history (the engine bench's pipeline) on the store a session runs with
//!   in a cluster: S3 written through, a local cache directory in front.
//! - `s3_20ms{,_seaweedfs}/journal_write/4MB` — one turn's journal entry (the two new messages of a turn
//!   on a journaled 4 MiB history): the entry's PUT and the fencing check's LIST.
//!
//! Each sample uses its own session prefix and a fresh cache directory, so every original
//! really goes to S3. Before measuring, the same compaction is timed once with one request
//! in flight (`archive.maxInFlight: 1`: the writes one after another), with 16, 32, 64, 128
//! and 256, and at the default bound with no added latency (what the server itself takes).
//!
//! `cargo bench -p cairn-agent --bench s3_latency`

use cairn_engine::testing as core_support;
#[allow(dead_code)]
#[path = "../tests/support/faults.rs"]
mod faults;
#[allow(dead_code)]
#[path = "../tests/support/moto.rs"]
mod moto;
#[path = "support/pipeline.rs"]
mod pipeline;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

use cairn_agent::aws::AwsIdentity;
use cairn_agent::ccr::S3Config;
use cairn_agent::ccr::s3::journal_objects;
use cairn_agent::ccr::{
    DEFAULT_IN_FLIGHT, LayeredStore, LocalLimits, LocalStore, S3Store, S3Timeouts, SessionScope,
};
use cairn_agent::history::Message;
use cairn_agent::journal::{Change, Journal, ObjectStore};
use cairn_crds::EffectivePolicy;
use cairn_tests::harness::seaweedfs::{
    ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY, SeaweedFs, SeaweedOptions,
};
use pipeline::{pipeline, window_for};

#[global_allocator]
static ALLOCATOR: cairn_agent::allocator::Allocator = mimalloc::MiMalloc;

const MB: usize = 1024 * 1024;
const LATENCY: Duration = Duration::from_millis(20);

fn timeouts() -> S3Timeouts {
    S3Timeouts {
        connect: Duration::from_secs(2),
        attempt: Duration::from_secs(10),
        operation: Duration::from_secs(30),
        max_attempts: 2,
        initial_backoff: Duration::from_millis(50),
    }
}

struct Remote {
    client: aws_sdk_s3::Client,
    bucket: &'static str,
    sessions: AtomicU64,
}

impl Remote {
    fn scope(&self) -> SessionScope {
        let n = self.sessions.fetch_add(1, Ordering::Relaxed);
        SessionScope::new("bench", "ns", &format!("s{n}")).expect("scope")
    }

    fn store(&self, in_flight: usize) -> (LayeredStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let limits = LocalLimits::from_spec(None, None).expect("limits");
        let local = LocalStore::open_cache(dir.path(), limits).expect("cache");
        let remote = S3Store::with_client(self.client.clone(), self.bucket, self.scope())
            .with_in_flight(in_flight);
        (LayeredStore::new(local, remote), dir)
    }

    fn journal(&self) -> Arc<dyn ObjectStore> {
        Arc::new(journal_objects(
            self.client.clone(),
            self.bucket,
            &self.scope(),
        ))
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn moto_bench(c: &mut Criterion) {
    cairn_agent::allocator::configure();
    let rt = runtime();
    let server = rt.block_on(moto::Moto::start());
    let proxy = rt.block_on(faults::FaultProxy::start(
        server.port,
        Duration::from_secs(5),
    ));
    let cfg = moto::config_for(&proxy.endpoint, timeouts());
    let remote = Remote {
        client: cfg.client().expect("client"),
        bucket: moto::BUCKET,
        sessions: AtomicU64::new(0),
    };
    benches(c, "s3_20ms", &rt, &proxy, &remote);
}

fn seaweedfs_bench(c: &mut Criterion) {
    cairn_agent::allocator::configure();
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = SeaweedFs::start(dir.path(), &["cairn"], &SeaweedOptions::default())
        .expect("seaweedfs starts (built by tests/harness/build-seaweedfs.sh)");
    let proxy = rt.block_on(faults::FaultProxy::start(
        server.port,
        Duration::from_secs(5),
    ));
    let cfg = S3Config {
        bucket: "cairn".into(),
        endpoint: Some(proxy.endpoint.clone()),
        region: "us-east-1".into(),
        force_path_style: true,
        net: Default::default(),
        credentials: AwsIdentity::fixed(ADMIN_ACCESS_KEY_ID, ADMIN_SECRET_ACCESS_KEY, None),
        timeouts: timeouts(),
    };
    let remote = Remote {
        client: cfg.client().expect("client"),
        bucket: "cairn",
        sessions: AtomicU64::new(0),
    };
    benches(c, "s3_20ms_seaweedfs", &rt, &proxy, &remote);
}

fn benches(
    c: &mut Criterion,
    group: &str,
    rt: &tokio::runtime::Runtime,
    proxy: &faults::FaultProxy,
    remote: &Remote,
) {
    proxy.set_latency(LATENCY);
    let policy = EffectivePolicy::default();
    let h = core_support::session(4 * MB);
    let window = window_for(&h);

    // One run per bound, for comparison (1: the archive's writes one after another).
    for in_flight in [1, 16, 32, 64, 128, 256] {
        let (store, _dir) = remote.store(in_flight);
        let mut run = h.clone();
        let before = proxy.count();
        let started = Instant::now();
        rt.block_on(pipeline(&mut run, &policy, &store, window));
        eprintln!(
            "{group} first compaction of 4MB, {in_flight} in flight: {:.0} ms, {} requests",
            started.elapsed().as_secs_f64() * 1e3,
            proxy.count() - before
        );
    }

    proxy.set_latency(Duration::ZERO);
    {
        let (store, _dir) = remote.store(DEFAULT_IN_FLIGHT);
        let mut run = h.clone();
        let started = Instant::now();
        rt.block_on(pipeline(&mut run, &policy, &store, window));
        eprintln!(
            "{group} with no added latency, first compaction of 4MB, {DEFAULT_IN_FLIGHT} in flight: {:.0} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    proxy.set_latency(LATENCY);

    let mut g = c.benchmark_group(group);
    g.sample_size(10);
    g.bench_function("first_compaction/4MB", |b| {
        b.iter_batched(
            || (h.clone(), remote.store(DEFAULT_IN_FLIGHT)),
            |(mut h, store)| {
                rt.block_on(pipeline(&mut h, &policy, &store.0, window));
                (h, store)
            },
            BatchSize::LargeInput,
        )
    });

    // A journaled 4 MiB history; each sample writes the next turn's two messages.
    let (journal, seeded) = rt.block_on(async {
        let (mut journal, _) = Journal::open(remote.journal(), "bench")
            .await
            .expect("open");
        journal
            .write(&h, Change::default())
            .await
            .expect("checkpoint");
        (journal, h.clone())
    });
    let journal = std::sync::Mutex::new(journal);
    let turn = std::sync::Mutex::new(seeded);
    g.bench_function("journal_write/4MB", |b| {
        b.iter_batched(
            || {
                let mut t = turn.lock().expect("lock");
                t.push(Message::user("next step"));
                t.push(Message::assistant("done"));
                t.clone()
            },
            |next| {
                let mut j = journal.lock().expect("lock");
                rt.block_on(j.write(&next, Change::default()))
                    .expect("journal write");
                next
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(s3, moto_bench, seaweedfs_bench);
criterion_main!(s3);
