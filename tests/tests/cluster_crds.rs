//! The CRDs against a real API server (the local control plane of `tests/harness`): they
//! install, `kubectl explain` teaches every field, every CEL rule rejects its breaking case
//! server-side with its message, defaults are applied, the status subresource and the
//! printer columns work.

use cairn_tests::harness::{ControlPlane, shared_cluster};
use serde_json::{Value, json};

fn cluster_with_crds() -> &'static ControlPlane {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let cp = shared_cluster();
    ONCE.call_once(|| {
        cp.install_crds()
            .expect("the CRDs install and are established");
    });
    cp
}

fn namespace(cp: &ControlPlane, name: &str) -> String {
    let _ = cp.kubectl(&["create", "namespace", name]);
    name.to_string()
}

fn with_ns(mut obj: Value, ns: &str) -> String {
    obj["metadata"]["namespace"] = json!(ns);
    serde_json::to_string(&obj).expect("serializes")
}

/// `kubectl explain` reads the OpenAPI document, which the API server publishes (and then
/// completes) a moment after the CRD is established: poll until `want` shows up.
fn explain(cp: &ControlPlane, path: &str, want: &str) -> String {
    let mut last = String::new();
    for _ in 0..60 {
        match cp.kubectl_ok(&["explain", path]) {
            Ok(out) if out.contains(want) => return out,
            Ok(out) => last = out,
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    panic!("kubectl explain {path} never showed {want:?}; last output:\n{last}");
}

#[test]
fn kubectl_explain_teaches_the_fields() {
    let cp = cluster_with_crds();
    let out = explain(
        cp,
        "agentsession.spec.compaction.microcompact",
        "Cheap, LLM-free shrinking of old tool results",
    );
    assert!(out.contains("truncateAfterTurns"), "{out}");
    explain(
        cp,
        "agentsession.spec.compaction.microcompact.truncateAfterTurns",
        "Default: 2",
    );
    explain(cp, "agentsession.spec.payloadCap", "binary units");
    explain(
        cp,
        "agentsession.spec.archive",
        "Unset fields take the operator's configured defaults",
    );
    explain(
        cp,
        "agentsession.spec.compaction",
        "Precedence: built-in defaults",
    );
    explain(cp, "compactionpolicy.spec.budgetRatio", "Default: 0.6");
    explain(
        cp,
        "agentsession.spec.tools.mcpServers",
        "MCP (Model Context Protocol) servers the agent connects to",
    );
    explain(
        cp,
        "agentsession.spec.tools.mcpServers.headersFrom",
        "keys become HTTP headers",
    );
    explain(
        cp,
        "compactionpolicy.spec.engineTimeoutSeconds",
        "Default: 180",
    );
    explain(
        cp,
        "agentsession.status.session.learnedPayloadCap",
        "learned from a payload rejection",
    );
}

#[test]
fn every_cel_rule_rejects_server_side_with_its_message() {
    let cp = cluster_with_crds();
    let ns = namespace(cp, "cel");
    let mut failures = vec![];
    for case in cairn_crds::testing::cel_cases() {
        let out = cp
            .kubectl_with_stdin(
                &["create", "--dry-run=server", "-f", "-"],
                &with_ns(case.object.clone(), &ns),
            )
            .expect("kubectl runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !stderr.contains(&case.message) {
            failures.push(format!(
                "{} {}: want {:?}, got: {stderr}",
                case.kind, case.object["spec"], case.message
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases not rejected as expected:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn valid_objects_are_accepted_and_defaults_applied() {
    let cp = cluster_with_crds();
    let ns = namespace(cp, "defaults");
    let policy = std::fs::read_to_string(
        cairn_tests::repo_root().join("charts/cairn/examples/compactionpolicy.yaml"),
    )
    .expect("example exists");
    cp.kubectl_with_stdin(&["apply", "-n", &ns, "-f", "-"], &policy)
        .expect("kubectl runs");
    let mut session = cairn_crds::testing::minimal_session("minimal");
    session["spec"]["provider"]["credentials"] = json!({"secretName": "anthropic"});
    session["spec"]["payloadCap"] = json!(5);
    cp.apply_yaml(&with_ns(session, &ns))
        .expect("a minimal session is accepted");
    let got: Value = serde_json::from_str(
        &cp.kubectl_ok(&["get", "asess", "minimal", "-n", &ns, "-o", "json"])
            .expect("get"),
    )
    .expect("json");
    assert_eq!(
        got["spec"]["suspend"],
        json!(false),
        "suspend defaults to false: {got}"
    );
    assert_eq!(
        got["spec"]["provider"]["credentials"]["key"],
        json!("api-key"),
        "credentials.key defaults: {got}"
    );
    assert_eq!(
        got["spec"]["payloadCap"],
        json!(5),
        "an integer payloadCap is kept: {got}"
    );

    let example = std::fs::read_to_string(
        cairn_tests::repo_root().join("charts/cairn/examples/agentsession.yaml"),
    )
    .expect("example exists");
    let out = cp
        .kubectl_with_stdin(&["apply", "-n", &ns, "-f", "-"], &example)
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "the example session is accepted: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn status_subresource_and_printer_columns() {
    let cp = cluster_with_crds();
    let ns = namespace(cp, "status");
    cp.apply_yaml(&with_ns(cairn_crds::testing::minimal_session("s1"), &ns))
        .expect("created");
    let status = json!({"status": {"phase": "Running", "policyHash": "abc", "session": {"utilization": 0.42, "recoveries": 3, "compactions": 7, "learnedPayloadCap": 3932160}}});
    cp.kubectl_ok(&[
        "patch",
        "asess",
        "s1",
        "-n",
        &ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ])
    .expect("status patch through the subresource");
    // A status change through the main resource is ignored (status is a subresource).
    cp.kubectl_ok(&[
        "patch",
        "asess",
        "s1",
        "-n",
        &ns,
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Failed"}}"#,
    ])
    .expect("patch accepted");
    let table = cp
        .kubectl_ok(&["get", "asess", "s1", "-n", &ns])
        .expect("get");
    let header = table.lines().next().unwrap_or_default();
    for col in [
        "NAME",
        "PHASE",
        "PROVIDER",
        "MODEL",
        "UTILIZATION",
        "RECOVERIES",
        "AGE",
    ] {
        assert!(header.contains(col), "missing column {col}: {table}");
    }
    let row = table.lines().nth(1).unwrap_or_default();
    for cell in [
        "s1",
        "Running",
        "anthropic",
        "claude-sonnet-4-5",
        "0.42",
        "3",
    ] {
        assert!(
            row.split_whitespace().any(|c| c == cell),
            "missing {cell}: {table}"
        );
    }
    let wide = cp
        .kubectl_ok(&["get", "asess", "s1", "-n", &ns, "-o", "wide"])
        .expect("get wide");
    assert!(
        wide.contains("COMPACTIONS") && wide.contains("3932160"),
        "{wide}"
    );
    cp.kubectl_ok(&["get", "cpol", "-A"])
        .expect("the short name cpol works");
}
