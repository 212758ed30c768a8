//! End to end, as `make demo` runs it: chart-installed operator, agent pod run by the harness
//! with its own ServiceAccount, real nginx 413, compaction, status written back.

use cairn_tests::demo::{self, DemoOptions};

#[test]
fn the_demo_compacts_recovers_from_a_413_and_reports_it() {
    let opts = DemoOptions {
        bin_dir: demo::default_bin_dir(),
        ..DemoOptions::default()
    };
    let mut log = |m: &str| eprintln!("demo: {m}");
    let d = demo::start(&opts, &mut log).unwrap_or_else(|e| panic!("{e}"));
    let report = d.drive(&opts, &mut log).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", report.table);
    let s = &report.session["status"];
    assert_eq!(report.answered, opts.turns, "every turn answers: {s}");
    assert!(report.proxy_413s >= 1, "nginx rejected a request");
    assert_eq!(s["phase"], "Running", "{s}");
    let session = &s["session"];
    assert!(session["recoveries"].as_u64().unwrap_or(0) >= 1, "{s}");
    assert!(session["compactions"].as_u64().unwrap_or(0) >= 1, "{s}");
    assert!(
        session["learnedPayloadCap"]
            .as_u64()
            .is_some_and(|c| c < 20 * 1024),
        "{s}"
    );
    assert!(report.table.contains("Running"), "{}", report.table);
}
