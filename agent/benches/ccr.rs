//! CCR throughput on the local tier and the cost of routing large tool outputs.
//!
//! `cargo bench -p cairn-agent --bench ccr`; results are recorded in docs/benchmarks.md.

use std::hint::black_box;
use std::time::Duration;

use cairn_agent::ccr::{CompressionCounters, LocalLimits, LocalStore, MemoryStore, Store, recall};
use cairn_agent::compress::{self, detect};
use cairn_agent::history::Message;
use cairn_crds::policy::{Compression, CompressionMode, CompressionProfile};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

fn limits() -> LocalLimits {
    LocalLimits {
        max_bytes: 256 << 20,
        ttl: Duration::from_secs(3600),
    }
}

/// The local tier as the durable store (standalone sessions): every entry is flushed.
fn store(dir: &std::path::Path) -> LocalStore {
    LocalStore::open(dir, limits()).expect("open")
}

/// Deterministic, incompressible-looking bytes.
fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A 4.5 MB build-and-test log with a few failures in the middle.
fn big_log() -> String {
    let mut s = String::with_capacity(4_700_000);
    let mut i = 0u64;
    while s.len() < 4_500_000 {
        s.push_str(&format!(
            "2026-01-01T10:{:02}:{:02}.{:03}Z INFO  worker-{} step {i} finished in {} ms\n",
            i / 60 % 60,
            i % 60,
            i % 1000,
            i % 8,
            i % 97
        ));
        if i % 20_000 == 10_000 {
            s.push_str("2026-01-01T10:00:00.000Z ERROR test ladder::recovers_413 failed\n");
            s.push_str("    at cairn_agent::ladder::run (src/ladder.rs:120)\n");
        }
        i += 1;
    }
    s
}

fn archive_and_recall(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("ccr_local");
    for size in [64 << 10, 1 << 20] {
        let base = payload(size, 1);
        group.throughput(Throughput::Bytes(size as u64));
        let cache_dir = tempfile::tempdir().expect("tempdir");
        let cache = LocalStore::open_cache(cache_dir.path(), limits()).expect("open");
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path());
        for (name, tier) in [("archive_cache", &cache), ("archive_durable", &s)] {
            let mut seq = 0u64;
            group.bench_with_input(BenchmarkId::new(name, size), &size, |b, _| {
                b.iter(|| {
                    seq += 1;
                    let mut content = base.clone();
                    content[..8].copy_from_slice(&seq.to_le_bytes());
                    rt.block_on(tier.archive(black_box(&content)))
                        .expect("archive")
                })
            });
        }
        let key = rt.block_on(s.archive(&base)).expect("archive");
        let marker = key.marker();
        group.bench_with_input(BenchmarkId::new("recall", size), &size, |b, _| {
            b.iter(|| {
                let out = rt.block_on(recall(&s, black_box(&marker))).expect("recall");
                assert_eq!(out.output.len(), size);
                out
            })
        });
    }
    group.finish();
}

fn routing(c: &mut Criterion) {
    let log = big_log();
    let mut group = c.benchmark_group("compress");
    group.bench_function("detect_4.5MB_log", |b| {
        b.iter(|| detect(black_box(None), black_box(&log)))
    });
    let policy = Compression {
        mode: CompressionMode::Lossy,
        threshold_bytes: 4_000,
        profile: CompressionProfile::Default,
        max_result_bytes: 256 * 1024,
    };
    group.throughput(Throughput::Bytes(log.len() as u64));
    group.sample_size(10);
    group.bench_function("plan_4.5MB_log", |b| {
        b.iter(|| compress::plan(black_box(log.as_bytes()), Some("bash"), &policy))
    });
    // What a tool result of that size costs as it enters the history with the default
    // policy: detection, compression, the marker scan, SHA-256 and the archive write (an
    // in-memory store: the durable tier's own cost is measured by `ccr_local` above).
    let rt = runtime();
    let store = MemoryStore::new();
    let counters = CompressionCounters::default();
    let default_policy = cairn_crds::EffectivePolicy::default().compression;
    group.bench_function("admit_4.5MB_log", |b| {
        b.iter_batched(
            || {
                let mut m = Message::tool("c1", log.clone());
                m.name = Some("bash".into());
                m
            },
            |mut m| {
                rt.block_on(compress::admit_tool_result(
                    &mut m,
                    compress::ToolOrigin { is_error: false },
                    &default_policy,
                    &store,
                    &counters,
                ));
                m
            },
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, archive_and_recall, routing);
criterion_main!(benches);
