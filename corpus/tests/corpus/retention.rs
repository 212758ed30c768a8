//! What compaction keeps in sight of corpus sessions, at three windows and three ladder
//! levels, with a careless summarizer. `-- --nocapture` prints the table of
//! docs/benchmarks.md.

use cairn_corpus::retention::{LEVELS, Measure, WINDOWS, header, measure, row};
use cairn_corpus::session::session;
use cairn_engine::artifacts::Category;

use super::corpus;

/// The seed of the benchmark's sessions.
const SEED: u64 = 2026;

/// Every (size, window, level) measured, printed as it goes.
async fn table(sizes: &[usize]) -> Vec<Measure> {
    let c = corpus();
    eprintln!("{}", header());
    let mut out = Vec::new();
    for &bytes in sizes {
        let before = session(c, SEED, bytes);
        for window in WINDOWS {
            for level in LEVELS {
                let m = measure(&before, window, level).await;
                eprintln!("{}", row(&m));
                out.push(m);
            }
        }
    }
    out
}

/// What the thresholds ask of one measure, and where it falls short of them.
fn shortfalls(m: &Measure) -> Vec<String> {
    let mut out = Vec::new();
    let mut need = |what: &str, got: f64, want: f64| {
        if got < want {
            out.push(format!(
                "{} KB, {}k tokens, level {}: {what} {got:.2} < {want}",
                m.session / 1000,
                m.window / 1000,
                m.level
            ));
        }
    };
    let concrete = [Category::Files, Category::Commands, Category::Errors];
    for c in Category::ALL {
        let got = m.reachable(c);
        need(&format!("{} in sight or reachable", c.label()), got, 1.0);
    }
    if m.window >= 32_000 {
        let want = if m.level == 3 { 0.8 } else { 0.95 };
        for c in concrete {
            need(&format!("{} in sight", c.label()), m.in_sight(c), want);
        }
        if m.level == 2 {
            need("requests in sight", m.in_sight(Category::Requests), 0.9);
        }
    } else if m.level == 2 {
        for c in concrete {
            need(&format!("{} in sight", c.label()), m.in_sight(c), 0.9);
        }
        need("requests in sight", m.in_sight(Category::Requests), 0.5);
    }
    out
}

/// At 32k and 128k tokens files, commands and errors stay ≥ 95 % in sight after levels 1
/// and 2 and ≥ 80 % after level 3, requests ≥ 90 % after level 2; at 8k tokens files,
/// commands and errors ≥ 90 % after level 2, requests ≥ 50 %; everything stays in sight or
/// within recall everywhere.
#[tokio::test]
async fn the_corpus_keeps_artifacts_in_sight() {
    let measures = table(&[200_000, 1_000_000]).await;
    let short: Vec<String> = measures.iter().flat_map(shortfalls).collect();
    assert!(
        short.is_empty(),
        "{} thresholds missed over {} compactions:\n{}",
        short.len(),
        measures.len(),
        short.join("\n")
    );
}

/// The full table of docs/benchmarks.md, 4 MB sessions included
/// (`cargo test -p cairn-corpus --test corpus retention_table -- --nocapture`);
/// it asserts only that every artifact stays within recall.
#[tokio::test]
async fn retention_table() {
    for m in table(&[200_000, 1_000_000, 4_000_000]).await {
        for c in Category::ALL {
            assert_eq!(m.reachable(c), 1.0, "{}", row(&m));
        }
    }
}
