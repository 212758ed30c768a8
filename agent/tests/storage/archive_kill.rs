//! A process killed in the middle of an archive batch leaves no marker without its
//! bytes: whatever history a restart rebuilds from the journal, every archive key it refers
//! to is in the durable local store, intact.
//!
//! The test binary re-runs itself as the worker: a session loop over the durable local
//! directory (archive and journal, as `cairn-agent` runs without S3) that journals a fresh
//! history, compacts it (hundreds of originals, each pass's written as one batch) and journals
//! the result, again and again. The parent kills it with SIGKILL — as soon as a batch's
//! records land in a segment, or after a random delay — then rebuilds and checks.

use cairn_engine::testing as core_support;
#[path = "../../benches/support/pipeline.rs"]
mod pipeline;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_agent::ccr::{LocalLimits, LocalStore, Store};
use cairn_agent::compact::archive::referenced_keys;
use cairn_agent::journal::{Change, Journal, rebuild};
use cairn_agent::storage::DirObjects;
use cairn_crds::EffectivePolicy;

const WORKER_DIR: &str = "CAIRN_ARCHIVE_KILL_WORKER";
/// How long the worker waits after it journaled a compacted history.
const PAUSE: Duration = Duration::from_millis(300);
const TEST_NAME: &str = "killed_mid_batch_leaves_no_marker_without_its_bytes";

fn limits() -> LocalLimits {
    LocalLimits {
        max_bytes: u64::MAX / 2,
        ttl: Duration::from_secs(100 * 365 * 24 * 3600),
    }
}

/// The worker: loops until killed.
fn work(root: &Path) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = LocalStore::open(root.join("ccr"), limits()).expect("store");
        let objects = Arc::new(DirObjects::open(root.join("journal")).expect("journal"));
        let (mut journal, _) = Journal::open(objects, "worker").await.expect("open");
        let policy = EffectivePolicy::default();
        for round in 0u64.. {
            // New content every round, so every round archives new originals.
            let mut h = core_support::session(1 << 20);
            for m in h.iter_mut().filter(|m| m.content.len() > 3000) {
                m.content
                    .push_str(&format!("\n[round {round} of {}]", std::process::id()));
            }
            journal.write(&h, Change::default()).await.expect("journal");
            let window = pipeline::window_for(&h);
            pipeline::pipeline(&mut h, &policy, &store, window).await;
            journal.write(&h, Change::default()).await.expect("journal");
            // Ready once a compacted history is journaled: the parent's kill times then fall
            // in a running loop however slow the machine is (the test shares its process and
            // the CPU with the other storage tests).
            if round == 0 {
                std::fs::write(root.join("ready"), b"").expect("ready");
            }
            // A moment with a compacted history as the journal's newest entry, the parent's
            // kill moment in some rounds: on a slow machine a random kill nearly always lands
            // in the compaction, whose rebuilt history (the fresh one) has no marker to check.
            std::fs::write(root.join("compacted"), round.to_string()).expect("compacted");
            tokio::time::sleep(PAUSE).await;
        }
    });
}

/// Bytes in the worker's segment files: they grow the moment a batch's records land, before
/// its flush returns.
fn segment_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("seg-"))
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    })
}

/// Every key the rebuilt history refers to, fetched from a freshly opened store.
fn check(root: &Path) -> (usize, usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let objects = DirObjects::open(root.join("journal")).expect("journal");
        let rebuilt = rebuild(&objects).await.expect("rebuild");
        let store = LocalStore::open(root.join("ccr"), limits()).expect("store");
        let keys = referenced_keys(&rebuilt.history);
        for key in &keys {
            let found = store.fetch(key).await;
            assert!(
                matches!(found, Ok(Some(_))),
                "the rebuilt history refers to {key}, which the archive does not hold: {found:?}"
            );
        }
        (rebuilt.history.len(), keys.len())
    })
}

#[test]
fn killed_mid_batch_leaves_no_marker_without_its_bytes() {
    if let Some(dir) = std::env::var_os(WORKER_DIR) {
        work(&PathBuf::from(dir));
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    let test_name = crate::support::test_name(module_path!(), TEST_NAME);
    let mut mid_batch = 0;
    let mut checked_keys = 0;
    for round in 0..12u64 {
        let root = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(&exe)
            .args(["--exact", &test_name, "--nocapture", "--test-threads", "1"])
            .env(WORKER_DIR, root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("worker");
        let started = Instant::now();
        while !root.path().join("ready").exists() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "worker never got ready"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Even rounds: killed the moment a batch's records are in a segment (its flush under
        // way). Rounds 1, 5, 9: in the pause after a compacted history was journaled, so its
        // markers are checked. The others: at a random moment of the loop (mid-journal,
        // between passes).
        let ccr = root.path().join("ccr");
        let deadline = Instant::now() + Duration::from_secs(20);
        if round % 4 == 1 {
            while !root.path().join("compacted").exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        } else if round % 2 == 0 {
            // Let some rounds complete first, so the journal has markers to check.
            std::thread::sleep(Duration::from_millis(150 + fastrand::u64(..300)));
            let before = segment_bytes(&ccr);
            while segment_bytes(&ccr) == before && Instant::now() < deadline {
                std::hint::spin_loop();
            }
            if segment_bytes(&ccr) != before {
                mid_batch += 1;
            }
        } else {
            std::thread::sleep(Duration::from_millis(100 + fastrand::u64(..600)));
        }
        child.kill().expect("kill");
        child.wait().expect("reap");
        let (_, keys) = check(root.path());
        checked_keys += keys;
    }
    eprintln!("{mid_batch} kills inside a batch; {checked_keys} keys checked");
    assert!(
        mid_batch >= 3,
        "only {mid_batch} kills landed inside a batch"
    );
    assert!(checked_keys > 0, "no rebuilt history carried a marker");
}
