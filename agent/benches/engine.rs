//! The no-LLM engine on synthetic sessions of realistic tool outputs (logs, diffs, JSON,
//! source): each cheap pass, level 1, level 3, and the whole pipeline.
//!
//! `cargo bench -p cairn-agent --bench engine`

use cairn_engine::testing as core_support;
#[path = "support/pipeline.rs"]
mod pipeline;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

use cairn_agent::ccr::{ArchiveError, Hashed, Key, LocalLimits, LocalStore, MemoryStore, Store};
use cairn_agent::compact::{
    SessionState, Trigger, budget, dedup, emergency, microcompact, pairing, trim,
};
use cairn_agent::history::{self, Message};
use cairn_crds::EffectivePolicy;
use pipeline::{pipeline, window_for};

/// The allocator of the `cairn-agent` binary, configured as it is at start-up, so the figures
/// are the binary's.
#[global_allocator]
static ALLOCATOR: cairn_agent::allocator::Allocator = mimalloc::MiMalloc;

const MB: usize = 1024 * 1024;
const SIZES: [usize; 3] = [MB, 4 * MB, 16 * MB];

fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(e) => panic!("tokio runtime: {e}"),
    }
}

/// CPU time of the benchmarking thread. The machine these numbers come from is shared, so
/// wall time mostly measures the neighbours; the passes run on the calling thread (a
/// current-thread runtime), so its CPU time is their cost.
struct ThreadCpuTime;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, started: u64) -> u64 {
        thread_cpu_ns().saturating_sub(started)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (div, unit) = if typical >= 1e6 {
            (1e6, "ms cpu")
        } else if typical >= 1e3 {
            (1e3, "µs cpu")
        } else {
            (1.0, "ns cpu")
        };
        values.iter_mut().for_each(|v| *v /= div);
        unit
    }
    fn scale_throughputs(
        &self,
        _typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        if let Throughput::Bytes(b) = throughput {
            // ns per iteration → MiB per CPU second.
            values
                .iter_mut()
                .for_each(|v| *v = *b as f64 / (*v / 1e9) / (1024.0 * 1024.0));
            "MiB/cpu-s"
        } else {
            "elements"
        }
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn wall(c: &mut Criterion) {
    benches(c, "engine");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    benches(c, "engine_cpu");
}

fn benches<M: Measurement>(c: &mut Criterion<M>, group: &str) {
    cairn_agent::allocator::configure();
    let rt = runtime();
    let policy = EffectivePolicy::default();
    let sessions: Vec<(usize, Vec<Message>)> = SIZES
        .iter()
        .map(|&s| (s, core_support::session(s)))
        .collect();

    let mut g = c.benchmark_group(group);
    g.sample_size(10);
    for (size, h) in &sessions {
        let label = format!("{}MB", size / MB);
        let window = window_for(h);
        g.throughput(Throughput::Bytes(history::weight(h) as u64));
        g.bench_with_input(BenchmarkId::new("pairing_check", &label), h, |b, h| {
            b.iter(|| pairing::is_valid(h))
        });
        // One defect: a result whose call is gone, in the middle of the history. The repair
        // archives it and rebuilds the history around it.
        let mut defect = h.clone();
        defect.insert(
            defect.len() / 2,
            Message::tool("gone", "an orphaned result"),
        );
        g.bench_with_input(
            BenchmarkId::new("pairing_repair_one_defect", &label),
            &defect,
            |b, h| {
                b.iter_batched(
                    || (h.clone(), MemoryStore::new()),
                    |(mut h, store)| {
                        rt.block_on(pairing::repair_archived(&mut h, &store, Trigger::Turn));
                        (h, store)
                    },
                    BatchSize::LargeInput,
                )
            },
        );
        g.bench_with_input(BenchmarkId::new("microcompact", &label), h, |b, h| {
            b.iter_batched(
                || (h.clone(), MemoryStore::new()),
                |(mut h, store)| {
                    rt.block_on(microcompact::microcompact(&mut h, &policy, None, &store));
                    (h, store)
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_with_input(BenchmarkId::new("dedup_reads", &label), h, |b, h| {
            b.iter_batched(
                || (h.clone(), MemoryStore::new()),
                |(mut h, store)| {
                    rt.block_on(dedup::dedup_reads(&mut h, &policy, &store));
                    (h, store)
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_with_input(BenchmarkId::new("tool_result_budget", &label), h, |b, h| {
            let limits = SessionState::new().tool_result_limits(&policy);
            b.iter_batched(
                || (h.clone(), MemoryStore::new()),
                |(mut h, store)| {
                    let (cuts, report) = rt.block_on(budget::cut(&mut h, limits, &store));
                    cuts.restore(&mut h);
                    (h, report, store)
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_with_input(BenchmarkId::new("level1_trim", &label), h, |b, h| {
            b.iter_batched(
                || (h.clone(), MemoryStore::new()),
                |(mut h, store)| {
                    rt.block_on(trim::trim(&mut h, &policy, Trigger::Auto, &store));
                    (h, store)
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_with_input(BenchmarkId::new("level3_emergency", &label), h, |b, h| {
            let target = history::weight(h) / 8;
            b.iter_batched(
                || (h.clone(), MemoryStore::new()),
                |(mut h, store)| {
                    rt.block_on(emergency::emergency(
                        &mut h,
                        &policy,
                        target,
                        Trigger::Auto,
                        &store,
                    ));
                    (h, store)
                },
                BatchSize::LargeInput,
            )
        });
        g.bench_with_input(BenchmarkId::new("pipeline", &label), h, |b, h| {
            b.iter_batched(
                || (h.clone(), MemoryStore::new()),
                |(mut h, store)| {
                    rt.block_on(pipeline(&mut h, &policy, &store, window));
                    (h, store)
                },
                BatchSize::LargeInput,
            )
        });
        // Steady state: the next turn's pipeline over a history the previous turn already
        // compacted (originals are in the store; most work is recognising its own stubs).
        let mut settled = h.clone();
        let settled_store = MemoryStore::new();
        rt.block_on(pipeline(&mut settled, &policy, &settled_store, window));
        g.bench_with_input(
            BenchmarkId::new("pipeline_next_turn", &label),
            &settled,
            |b, h| {
                b.iter_batched(
                    || h.clone(),
                    |mut h| {
                        rt.block_on(pipeline(&mut h, &policy, &settled_store, window));
                        h
                    },
                    BatchSize::LargeInput,
                )
            },
        );
    }
    g.finish();
}

/// A store that keeps nothing and notes what a pipeline archives: the batches and their
/// bytes, for the flush floor.
#[derive(Default)]
struct Recorder {
    batches: std::sync::Mutex<Vec<Vec<u8>>>,
}

#[async_trait::async_trait]
impl Store for Recorder {
    async fn put_hashed(&self, original: Hashed<'_>) -> Result<(), ArchiveError> {
        self.put_batch(&[original]).await
    }

    async fn put_batch(&self, originals: &[Hashed<'_>]) -> Result<(), ArchiveError> {
        let bytes = originals
            .iter()
            .flat_map(|o| o.bytes().iter().copied())
            .collect();
        if let Ok(mut batches) = self.batches.lock() {
            batches.push(bytes);
        }
        Ok(())
    }

    async fn fetch(&self, _key: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        Ok(None)
    }
}

/// The disk's floor for making `batches` durable one after another: one new file, then per
/// batch one write and one `fdatasync` (with a single batch: the floor for those bytes at all).
fn flush_floor(dir: &std::path::Path, batches: &[&[u8]]) {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.join("floor")).expect("create");
    for batch in batches {
        file.write_all(batch).expect("write");
        file.sync_data().expect("fdatasync");
    }
}

/// The first compaction of a never-compacted 4 MiB history on each store a session runs
/// with, in one run so the ratios hold even on a busy machine: in memory, the durable local
/// directory (the embedded default without S3: every batch flushed before any marker), and
/// the disk's flush floor for the same originals (all their bytes as one new file with one
/// `fdatasync`, and with one `fdatasync` per batch), so the durable figure reads as a ratio
/// to what the disk can do at all.
fn stores(c: &mut Criterion) {
    cairn_agent::allocator::configure();
    // The agent's runtime: multi-thread, so the local store writes each batch in place.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("tokio runtime: {e}"),
    };
    let policy = EffectivePolicy::default();
    let h = core_support::session(4 * MB);
    let window = window_for(&h);
    let limits = LocalLimits {
        max_bytes: u64::MAX / 2,
        ttl: std::time::Duration::from_secs(100 * 365 * 24 * 3600),
    };
    let batches: Vec<Vec<u8>> = {
        let mut probe = h.clone();
        let store = MemoryStore::new();
        rt.block_on(pipeline(&mut probe, &policy, &store, window));
        let recorder = Recorder::default();
        let mut probe = h.clone();
        rt.block_on(pipeline(&mut probe, &policy, &recorder, window));
        let batches = recorder.batches.into_inner().unwrap_or_default();
        eprintln!(
            "first compaction of 4MB archives {} originals, {} bytes, in {} batches",
            store.len(),
            batches.iter().map(Vec::len).sum::<usize>(),
            batches.len()
        );
        batches
    };
    let all = batches.concat();
    let per_batch: Vec<&[u8]> = batches.iter().map(Vec::as_slice).collect();
    let mut g = c.benchmark_group("engine_store");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(history::weight(&h) as u64));
    g.bench_function("first_compaction/memory/4MB", |b| {
        b.iter_batched(
            || (h.clone(), MemoryStore::new()),
            |(mut h, store)| {
                rt.block_on(pipeline(&mut h, &policy, &store, window));
                (h, store)
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("first_compaction/local_durable/4MB", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().expect("tempdir");
                let store = LocalStore::open(dir.path(), limits).expect("open");
                (h.clone(), store, dir)
            },
            |(mut h, store, dir)| {
                rt.block_on(pipeline(&mut h, &policy, &store, window));
                (h, store, dir)
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("first_compaction/flush_floor/4MB", |b| {
        b.iter_batched(
            || tempfile::tempdir().expect("tempdir"),
            |dir| {
                flush_floor(dir.path(), &[&all]);
                dir
            },
            BatchSize::LargeInput,
        )
    });
    // The floor under the store's contract: each pass's originals durable before its
    // markers exist, so one flush per batch.
    g.bench_function("first_compaction/flush_floor_per_batch/4MB", |b| {
        b.iter_batched(
            || tempfile::tempdir().expect("tempdir"),
            |dir| {
                flush_floor(dir.path(), &per_batch);
                dir
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(engine, wall);
criterion_group!(engine_store, stores);
criterion_group! {
    name = engine_cpu;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_main!(engine, engine_cpu, engine_store);
