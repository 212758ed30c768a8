//! The recording: what real tools printed for the fixture project, kept whole.

use std::time::Instant;

use cairn_corpus::record::{cache_dir, load_or_record};
use cairn_corpus::{Topic, script};
use cairn_tests::harness::controlplane::Binaries;

use super::corpus;

/// The output of the run of exactly `command` (the first, when it ran twice).
fn output(command: &str) -> &'static str {
    match corpus().run(command) {
        Some(r) => &r.output,
        None => panic!("no run of {command:?}"),
    }
}

fn assert_holds(command: &str, wanted: &[&str]) {
    let out = output(command);
    for w in wanted {
        assert!(out.contains(w), "{command}: no {w:?} in\n{out}");
    }
}

#[test]
fn every_scripted_command_and_edit_is_recorded_with_every_tool_version() {
    let c = corpus();
    let scripted: Vec<&str> = [script::LOCAL, script::KUBE, script::AFTER_EDITS]
        .concat()
        .iter()
        .map(|s| s.command)
        .collect();
    let recorded: Vec<&str> = c.runs.iter().map(|r| r.command.as_str()).collect();
    assert_eq!(recorded, scripted);
    assert_eq!(c.edits.len(), script::EDITS.len());
    for e in &c.edits {
        assert!(
            e.diff
                .starts_with(&format!("diff --git a/{0} b/{0}", e.path)),
            "{}",
            e.diff
        );
    }
    for tool in script::TOOLS.iter().map(|(t, _)| *t).chain(["kubectl"]) {
        assert!(
            c.tools.iter().any(|v| v.starts_with(&format!("{tool}: "))),
            "{tool} in {:?}",
            c.tools
        );
    }
    for topic in Topic::ALL {
        assert!(c.files_of(topic).count() > 0, "{topic:?}");
        assert!(c.runs_of(topic).count() > 0, "{topic:?}");
    }
    assert!(c.files.len() >= 40, "{}", c.files.len());
}

#[test]
fn cargo_reports_compile_errors_and_failing_tests() {
    assert_holds(
        "cd rust && cargo build --bin report",
        &["error[E0308]: mismatched types", "src/bin/report.rs"],
    );
    assert_holds(
        "cd rust && cargo test --offline --lib",
        &[
            "parses_one_decimal_as_tenths",
            "test result: FAILED",
            "error: test failed, to rerun pass `--lib`",
        ],
    );
    assert_holds("cd rust && cargo test --doc", &["error: doctest failed"]);
    assert_holds(
        "cd rust && cargo clippy --lib -- -D warnings",
        &["clippy::needless_return"],
    );
}

#[test]
fn pytest_go_and_npm_report_their_failures() {
    assert_holds(
        "cd python && python3 -m pytest",
        &[
            "FAILED tests/test_pricing.py::test_discount_rounds_half_up",
            "KeyError",
        ],
    );
    assert_holds(
        "cd python && python3 -m inventory.cli data/missing.json",
        &["Traceback (most recent call last):", "FileNotFoundError"],
    );
    assert_holds(
        "cd go && go test ./...",
        &[
            "--- FAIL: TestLabelLines",
            "panic: runtime error: index out of range",
        ],
    );
    assert_holds(
        "cd go && go test -run TestRate -v ./...",
        &["--- FAIL: TestRateAtTheLimitUsesTheLowerBand"],
    );
    assert_holds("cd go && go vet ./...", &["unreachable code"]);
    assert_holds("cd node && npm run lint", &["Missing script: \"lint\""]);
    assert_holds("cd node && npm ci", &["package-lock.json"]);
    assert_holds(
        "cd node && npm test",
        &["tax is rounded to the nearest cent"],
    );
}

#[test]
fn the_api_server_answers_kubectl_with_its_own_errors_and_json() {
    assert_holds(
        "kubectl get pod web-0 -n shop",
        &["Error from server (NotFound): pods \"web-0\" not found"],
    );
    assert_holds(
        "kubectl get secrets -n shop --as=system:serviceaccount:shop:reader",
        &[
            "Error from server (Forbidden)",
            "cannot list resource \"secrets\"",
        ],
    );
    assert_holds(
        "kubectl create configmap Web_Config -n shop --from-literal=MODE=live",
        &["is invalid", "metadata.name: Invalid value: \"Web_Config\""],
    );
    assert_holds(
        "kubectl apply -f deploy/api.yaml",
        &["strict decoding error: unknown field \"spec.replica\""],
    );
    assert_holds(
        "kubectl rollout status deployment/web -n shop --timeout=5s",
        &["error: timed out waiting for the condition"],
    );
    let openapi = output("kubectl get --raw /openapi/v2 | head -c 40000");
    assert!(openapi.starts_with("{") && openapi.contains("\"swagger\""));
    assert_eq!(openapi.len(), 40_000);
}

#[test]
fn git_shows_the_recorded_history_and_its_conflicts() {
    assert_holds(
        "git log --oneline",
        &[
            "Reject negative fractions",
            "Add the cart and the manifests",
            "Add the shipping service",
            "Import the ledger and inventory services",
        ],
    );
    assert_holds(
        "git stash -q && git cherry-pick feature/rounding",
        &[
            "CONFLICT (content): Merge conflict in rust/src/money.rs",
            "error: could not apply",
        ],
    );
    assert_holds(
        "git apply --check -v patches/parse-rounding.patch",
        &["error: patch failed: rust/src/parse.rs"],
    );
    assert_holds(
        "grep -rn TODO --exclude-dir=.git .",
        &["python/inventory/pricing.py", "node/lib/tax.js"],
    );
}

/// A second load reads the cache: no tool but the version checks runs again, and no
/// cluster starts (the starter here fails).
#[test]
fn a_second_load_reads_the_cache() {
    let first = corpus();
    let kubectl = Binaries::ensure()
        .unwrap_or_else(|e| panic!("the control plane's binaries: {e}"))
        .kubectl;
    let started = Instant::now();
    let again = load_or_record(&cache_dir(), &kubectl, || {
        Err("a cached corpus starts no cluster".into())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let took = started.elapsed();
    assert_eq!(&again, first);
    eprintln!("the cached corpus loaded in {took:?}");
    assert!(took.as_secs() < 60, "{took:?}");
}
