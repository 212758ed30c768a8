//! Client-side evaluation of every CEL rule in the CRDs (kube's `cel` feature): each rule
//! rejects a bad object with its own message, and good objects (the examples, the minimal
//! session, a policy holding exactly the built-in defaults) pass.

use cairn_crds::{AgentSession, CompactionPolicy, EffectivePolicy};
use kube::CustomResourceExt;
use kube::core::cel::Validator;
use serde_json::{Value, json};

fn schema_of<K: CustomResourceExt>() -> Value {
    let crd = K::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("the CRD has a schema");
    serde_json::to_value(schema).expect("schema serializes")
}

fn yaml(s: &str) -> Value {
    serde_yaml::from_str(s).expect("test YAML parses")
}

fn minimal_session() -> Value {
    cairn_crds::testing::minimal_session("s")
}

fn policy(spec: Value) -> Value {
    let mut p = cairn_crds::testing::minimal_policy("p");
    p["spec"] = spec;
    p
}

fn with(mut obj: Value, path: &str, value: Value) -> Value {
    cairn_crds::testing::set_path(&mut obj, path, value);
    obj
}

fn messages(schema: &Value, obj: &Value) -> Vec<String> {
    match Validator::new().validate(schema, obj, None) {
        Ok(()) => vec![],
        Err(errs) => errs.as_slice().iter().map(|e| e.message.clone()).collect(),
    }
}

#[track_caller]
fn assert_rejected(schema: &Value, obj: Value, want: &str) {
    let msgs = messages(schema, &obj);
    assert!(
        msgs.iter().any(|m| m.contains(want)),
        "expected a rejection containing {want:?}, got {msgs:?} for {obj}"
    );
}

#[track_caller]
fn assert_accepted(schema: &Value, obj: Value) {
    let msgs = messages(schema, &obj);
    assert!(
        msgs.is_empty(),
        "expected acceptance, got {msgs:?} for {obj}"
    );
}

#[test]
fn examples_and_minimal_objects_pass() {
    let session = schema_of::<AgentSession>();
    let cpol = schema_of::<CompactionPolicy>();
    assert_accepted(&session, minimal_session());
    assert_accepted(
        &session,
        yaml(include_str!(
            "../../charts/cairn/examples/agentsession.yaml"
        )),
    );
    assert_accepted(
        &cpol,
        yaml(include_str!(
            "../../charts/cairn/examples/compactionpolicy.yaml"
        )),
    );
    assert_accepted(&cpol, policy(json!({})));
    assert_accepted(
        &session,
        with(
            minimal_session(),
            "spec.template",
            json!({
                "labels": {"team": "a", "app.kubernetes.io/part-of": "review"},
                "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/{session}"},
                "imagePullSecrets": [{"name": "pull"}],
                "priorityClassName": "agents",
                "runtimeClassName": "gvisor",
            }),
        ),
    );
}

#[test]
fn the_built_in_defaults_pass_as_a_policy() {
    let cpol = schema_of::<CompactionPolicy>();
    let defaults = serde_json::to_value(EffectivePolicy::default()).expect("serializes");
    // `summarizer.provider/model/...` are null in the effective policy (= the session's
    // own), and so are the provider engine's optional numbers (= the server's rule).
    let mut spec = defaults;
    spec["summarizer"] = json!({"enabled": true});
    if let Some(e) = spec["providerEngine"].as_object_mut() {
        e.retain(|_, v| !v.is_null());
    }
    // Left out of the canonical form at its default.
    spec["dedup"] = serde_json::to_value(EffectivePolicy::default().dedup).expect("serializes");
    assert_accepted(&cpol, policy(spec));
}

#[test]
fn every_rule_rejects_its_breaking_case_with_its_message() {
    let session = schema_of::<AgentSession>();
    let cpol = schema_of::<CompactionPolicy>();
    let cases = cairn_crds::testing::cel_cases();
    assert!(cases.len() > 50, "the fixture covers every rule");
    for case in cases {
        let schema = if case.kind == "AgentSession" {
            &session
        } else {
            &cpol
        };
        assert_rejected(schema, case.object, &case.message);
    }
}

#[test]
fn payload_cap_forms_accepted_by_cel_match_the_parser() {
    let session = schema_of::<AgentSession>();
    for good in [
        "5MB", "512KB", "2.5MB", "1048576B", "5Mi", "1Gi", "5", "10 mb",
    ] {
        assert_accepted(
            &session,
            with(minimal_session(), "spec.payloadCap", json!(good)),
        );
        assert!(cairn_crds::parse_payload_size(good).is_ok(), "{good}");
    }
    assert_accepted(
        &session,
        with(minimal_session(), "spec.payloadCap", json!(5)),
    );
    for bad in ["5TB", "MB", "0", "0.0MB", "-1MB", "five"] {
        assert!(
            !messages(
                &session,
                &with(minimal_session(), "spec.payloadCap", json!(bad))
            )
            .is_empty(),
            "{bad}"
        );
        assert!(cairn_crds::parse_payload_size(bad).is_err(), "{bad}");
    }
}

#[test]
fn idle_durations_accepted_by_cel_match_the_parser() {
    let session = schema_of::<AgentSession>();
    for (good, secs) in [("30s", 30), ("15m", 900), ("1h30m", 5400), ("2h", 7200)] {
        assert_accepted(
            &session,
            with(minimal_session(), "spec.idle.suspendAfter", json!(good)),
        );
        assert_eq!(
            cairn_crds::session::parse_duration(good),
            Some(std::time::Duration::from_secs(secs)),
            "{good}"
        );
    }
    for bad in ["30", "s", "1d", "-5s", "5 s", ""] {
        assert!(
            !messages(
                &session,
                &with(minimal_session(), "spec.idle.suspendAfter", json!(bad))
            )
            .is_empty(),
            "{bad}"
        );
        assert_eq!(cairn_crds::session::parse_duration(bad), None, "{bad}");
    }
}

#[test]
fn provider_kind_is_an_enum() {
    let crd = serde_json::to_string(&AgentSession::crd()).expect("serializes");
    for kind in cairn_crds::ProviderKind::ALL {
        assert!(crd.contains(&format!("\"{}\"", kind.as_str())), "{kind}");
    }
    let session = schema_of::<AgentSession>();
    let bad = with(minimal_session(), "spec.provider.kind", json!("cohere"));
    assert!(
        !messages(&session, &bad).is_empty()
            || serde_json::from_value::<AgentSession>(bad).is_err()
    );
}

#[test]
fn examples_deserialize_into_the_types() {
    let s: AgentSession = serde_yaml::from_str(include_str!(
        "../../charts/cairn/examples/agentsession.yaml"
    ))
    .expect("parses");
    assert_eq!(
        s.spec.payload_cap().expect("parses").map(|p| p.bytes()),
        Some(5 * 1024 * 1024)
    );
    let p: CompactionPolicy = serde_yaml::from_str(include_str!(
        "../../charts/cairn/examples/compactionpolicy.yaml"
    ))
    .expect("parses");
    let effective = cairn_crds::resolve(Some(&p.spec), s.spec.compaction.as_ref()).expect("valid");
    assert_eq!(effective.budget_ratio, 0.5);
    assert_eq!(effective.min_keep_recent, 12);
}

#[test]
fn every_field_has_a_description() {
    fn walk(path: &str, schema: &Value, missing: &mut Vec<String>) {
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                let p = format!("{path}.{name}");
                // metadata/apiVersion/kind are Kubernetes' own.
                let ours = !matches!(name.as_str(), "apiVersion" | "kind" | "metadata")
                    || path.contains("spec");
                if ours && sub.get("description").is_none() {
                    missing.push(p.clone());
                }
                walk(&p, sub, missing);
            }
        }
        if let Some(items) = schema.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
    }
    for (name, schema) in [
        ("agentsession", schema_of::<AgentSession>()),
        ("compactionpolicy", schema_of::<CompactionPolicy>()),
    ] {
        let mut missing = vec![];
        walk(name, &schema, &mut missing);
        assert!(
            missing.is_empty(),
            "fields without a description: {missing:?}"
        );
    }
}
