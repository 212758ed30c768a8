//! The archive against a real S3-compatible server (moto), started by the tests.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cairn_agent::ccr::{
    ArchiveError, Key, LayeredStore, LocalLimits, S3Store, SessionScope, Store, recall,
};

use crate::support::moto::{self, BUCKET, Moto, Stalled};

fn limits() -> LocalLimits {
    LocalLimits {
        max_bytes: 64 << 20,
        ttl: Duration::from_secs(3600),
    }
}

fn scope(session: &str) -> SessionScope {
    SessionScope::new("cairn", "team-a", session).expect("scope")
}

fn layered(config: &cairn_agent::ccr::S3Config, cache: &Path, session: &str) -> LayeredStore {
    let remote = S3Store::new(config, scope(session)).expect("s3 store");
    LayeredStore::open(cache, limits(), remote).expect("layered")
}

fn samples() -> Vec<Vec<u8>> {
    vec![
        Vec::new(),
        b"plain text\n".to_vec(),
        vec![0xff, 0xfe, 0x00, 0x80, 0xc3],
        (0..300_000u32).map(|i| (i % 251) as u8).collect(),
    ]
}

#[tokio::test]
async fn round_trip_writes_through_to_the_session_prefix() {
    let moto = Moto::start().await;
    let cache = tempfile::tempdir().expect("cache");
    let store = layered(&moto.config(), cache.path(), "s1");
    for content in samples() {
        let key = store.archive(&content).await.expect("archive");
        assert_eq!(key, Key::of(&content));
        assert_eq!(
            store.fetch(&key).await.expect("fetch"),
            Some(content.clone())
        );
        // The object is in S3 under the documented name, not only in the local cache.
        let object = store
            .remote()
            .client()
            .get_object()
            .bucket(BUCKET)
            .key(format!("cairn/team-a/s1/ccr/{key}"))
            .send()
            .await
            .expect("object exists");
        let body = object.body.collect().await.expect("body").into_bytes();
        assert_eq!(body.as_ref(), content.as_slice());
    }
    let again = store.archive(b"plain text\n").await.expect("dedupe");
    assert_eq!(again, Key::of(b"plain text\n"));
    let snap = store.counters().snapshot();
    assert_eq!((snap.puts, snap.dedupes, snap.hits), (4, 1, 4));
    let marked = format!("already {}", again.marker());
    assert!(matches!(
        store.archive(marked.as_bytes()).await,
        Err(ArchiveError::AlreadyArchived)
    ));
}

#[tokio::test]
async fn a_new_instance_with_an_empty_cache_recalls_identical_bytes_and_fills_its_cache() {
    let moto = Moto::start().await;
    let first_cache = tempfile::tempdir().expect("cache");
    let keys: Vec<(Key, Vec<u8>)> = {
        let store = layered(&moto.config(), first_cache.path(), "s1");
        let mut keys = Vec::new();
        for content in samples() {
            keys.push((store.archive(&content).await.expect("archive"), content));
        }
        keys
    };
    // Another pod on another node: same session, nothing cached.
    let second_cache = tempfile::tempdir().expect("cache");
    let store = layered(&moto.config(), second_cache.path(), "s1");
    for (key, content) in &keys {
        let text = format!("please recall <<CCR:{}>>", key.as_str().to_uppercase());
        let got = recall(&store, &text).await.expect("recall");
        assert_eq!(&got.output, content);
    }
    let report = store.report().await.expect("report");
    assert_eq!(report.local.entries, keys.len() as u64);
    assert_eq!(
        report.local.bytes,
        keys.iter().map(|(_, c)| c.len() as u64).sum::<u64>()
    );
    assert_eq!(
        (report.counters.hits, report.counters.puts),
        (keys.len() as u64, 0)
    );
}

/// Run only by `a_new_process_recalls_identical_bytes`, which sets its inputs.
#[tokio::test]
#[ignore = "child half of a_new_process_recalls_identical_bytes"]
async fn child_process_recall() {
    let endpoint = std::env::var("CCR_CHILD_ENDPOINT").expect("endpoint");
    let cache = std::env::var("CCR_CHILD_CACHE").expect("cache");
    let key = std::env::var("CCR_CHILD_KEY").expect("key");
    let out = std::env::var("CCR_CHILD_OUT").expect("out");
    let config = moto::config_for(&endpoint, moto::fast_timeouts());
    let store = layered(&config, Path::new(&cache), "s1");
    let got = recall(&store, &key).await.expect("recall");
    std::fs::write(out, got.output).expect("write");
}

#[tokio::test]
async fn a_new_process_recalls_identical_bytes() {
    let moto = Moto::start().await;
    let cache = tempfile::tempdir().expect("cache");
    let content: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let key = {
        let store = layered(&moto.config(), cache.path(), "s1");
        store.archive(&content).await.expect("archive")
    };
    let out = cache.path().join("recalled.bin");
    let fresh_cache = tempfile::tempdir().expect("cache");
    let status = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            &crate::support::test_name(module_path!(), "child_process_recall"),
            "--test-threads=1",
        ])
        .env("CCR_CHILD_ENDPOINT", &moto.endpoint)
        .env("CCR_CHILD_CACHE", fresh_cache.path())
        .env("CCR_CHILD_KEY", key.marker())
        .env("CCR_CHILD_OUT", &out)
        .status()
        .expect("spawn child");
    assert!(status.success());
    assert_eq!(std::fs::read(&out).expect("child output"), content);
}

#[tokio::test]
async fn s3_down_fails_fast_and_nothing_is_dropped() {
    let cache = tempfile::tempdir().expect("cache");
    let mut moto = Some(Moto::start().await);
    let config = moto.as_ref().map(Moto::config).expect("config");
    let store = layered(&config, cache.path(), "s1");
    let kept = store.archive(b"archived while up").await.expect("archive");
    moto.take();

    let content = b"tool output that must not be lost".to_vec();
    let start = Instant::now();
    let err = store.archive(&content).await.expect_err("S3 is down");
    let elapsed = start.elapsed();
    assert_eq!(err.label(), "unavailable");
    assert!(elapsed < config.timeouts.operation, "took {elapsed:?}");
    // No local entry pretends the bytes are stored, so no marker can resolve to them.
    let key = Key::of(&content);
    assert_eq!(store.local().get(key).await.expect("local"), None);
    assert!(
        store.fetch(&key).await.is_err(),
        "a miss is not reported as absent while S3 is down"
    );
    assert_eq!(store.counters().snapshot().failures, 1);
    // What was archived before the outage still comes back from the local tier.
    assert_eq!(
        store.fetch(&kept).await.expect("cached"),
        Some(b"archived while up".to_vec())
    );
}

#[tokio::test]
async fn nothing_listening_fails_fast() {
    let config = moto::config_for(
        &format!("http://127.0.0.1:{}", moto::free_port()),
        moto::fast_timeouts(),
    );
    let cache = tempfile::tempdir().expect("cache");
    let store = layered(&config, cache.path(), "s1");
    let start = Instant::now();
    assert!(store.archive(b"x").await.is_err());
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(store.local_usage().await.expect("usage").entries, 0);
}

#[tokio::test]
async fn stalled_s3_is_bounded_by_the_timeouts() {
    let stalled = Stalled::start();
    let config = moto::config_for(&stalled.endpoint, moto::fast_timeouts());
    let cache = tempfile::tempdir().expect("cache");
    let store = layered(&config, cache.path(), "s1");
    let start = Instant::now();
    let err = store
        .archive(b"never acknowledged")
        .await
        .expect_err("stalled");
    let elapsed = start.elapsed();
    assert_eq!(err.label(), "unavailable");
    // It waited for the attempt timeout, and gave up by the operation timeout.
    assert!(elapsed >= config.timeouts.attempt, "{elapsed:?}");
    assert!(
        elapsed < config.timeouts.operation + Duration::from_secs(1),
        "{elapsed:?}"
    );
    assert_eq!(store.local_usage().await.expect("usage").entries, 0);
    let start = Instant::now();
    assert!(store.fetch(&Key::of(b"anything")).await.is_err());
    assert!(start.elapsed() < config.timeouts.operation + Duration::from_secs(1));
}

#[tokio::test]
async fn another_sessions_key_is_a_miss_although_the_bytes_exist() {
    let moto = Moto::start().await;
    let cache = tempfile::tempdir().expect("cache");
    let alice = layered(&moto.config(), cache.path(), "alice");
    // Same bucket, same prefix, same cache root: only the session differs.
    let bob = layered(&moto.config(), cache.path(), "bob");
    let secret = b"alice's tool output".to_vec();
    let key = alice.archive(&secret).await.expect("archive");
    assert_eq!(bob.fetch(&key).await.expect("fetch"), None);
    let got = recall(&bob, &key.marker()).await.expect("recall");
    assert_eq!(got.missing, vec![key]);
    assert!(!got.output.windows(secret.len()).any(|w| w == secret));
    assert_eq!(alice.fetch(&key).await.expect("fetch"), Some(secret));
    assert_eq!(bob.counters().snapshot().misses, 2);
}

#[tokio::test]
async fn tampered_object_is_corrupt_and_session_prefix_deletion_is_scoped() {
    let moto = Moto::start().await;
    let config = moto.config();
    let s1 = S3Store::new(&config, scope("s1")).expect("store");
    let s2 = S3Store::new(&config, scope("s2")).expect("store");
    let a = s1.archive(b"a").await.expect("a");
    let b = s1.archive(b"b").await.expect("b");
    let other = s2.archive(b"other").await.expect("other");
    s1.client()
        .put_object()
        .bucket(BUCKET)
        .key(s1.scope().object_key(&b))
        .body(b"not b".to_vec().into())
        .send()
        .await
        .expect("tamper");
    assert!(matches!(s1.fetch(&b).await, Err(ArchiveError::Corrupt(k)) if k == b));
    assert_eq!(s1.delete_session_prefix().await.expect("delete"), 2);
    assert_eq!(s1.fetch(&a).await.expect("fetch"), None);
    assert_eq!(
        s2.fetch(&other).await.expect("fetch"),
        Some(b"other".to_vec())
    );
}

#[test]
fn recall_of_archive_through_s3_is_identical_for_arbitrary_bytes() {
    use proptest::prelude::*;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let moto = rt.block_on(Moto::start());
    let writer_cache = tempfile::tempdir().expect("cache");
    let reader_cache = tempfile::tempdir().expect("cache");
    let writer = layered(&moto.config(), writer_cache.path(), "s1");
    let config = ProptestConfig::with_cases(24);
    proptest!(config, |(content in prop::collection::vec(any::<u8>(), 0..50_000))| {
        prop_assume!(cairn_agent::ccr::Archivable::check(&content).is_ok());
        let back = rt.block_on(async {
            let key = writer.archive(&content).await.expect("archive");
            // Read through an empty cache, so the bytes come from S3.
            let reader = layered(&moto.config(), reader_cache.path(), "s1");
            recall(&reader, &key.to_string()).await.expect("recall").output
        });
        prop_assert_eq!(back, content);
    });
}
