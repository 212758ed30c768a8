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
    json!({
        "apiVersion": "cairn.dev/v1alpha1",
        "kind": "AgentSession",
        "metadata": {"name": "s", "namespace": "default"},
        "spec": {"provider": {"kind": "anthropic", "model": "claude-sonnet-4-5"}}
    })
}

fn policy(spec: Value) -> Value {
    json!({
        "apiVersion": "cairn.dev/v1alpha1",
        "kind": "CompactionPolicy",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": spec
    })
}

/// Sets `value` at a dotted path under the object, creating objects on the way.
fn with(mut obj: Value, path: &str, value: Value) -> Value {
    let mut cur = &mut obj;
    let parts: Vec<&str> = path.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        cur = cur
            .as_object_mut()
            .expect("object on the path")
            .entry(part.to_string())
            .or_insert_with(|| json!({}));
    }
    cur.as_object_mut()
        .expect("object at the end of the path")
        .insert(parts[parts.len() - 1].to_string(), value);
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
}

#[test]
fn the_built_in_defaults_pass_as_a_policy() {
    let cpol = schema_of::<CompactionPolicy>();
    let defaults = serde_json::to_value(EffectivePolicy::default()).expect("serializes");
    // `summarizer.provider/model` are null in the effective policy (= the session's own).
    let mut spec = defaults;
    spec["summarizer"] = json!({"enabled": true});
    assert_accepted(&cpol, policy(spec));
}

#[test]
fn every_policy_rule_rejects_with_its_message() {
    let cpol = schema_of::<CompactionPolicy>();
    let cases: &[(&str, Value, &str)] = &[
        (
            "spec.budgetRatio",
            json!(0.0),
            "budgetRatio must be greater than 0 and at most 1",
        ),
        (
            "spec.budgetRatio",
            json!(1.5),
            "budgetRatio must be greater than 0 and at most 1",
        ),
        (
            "spec.budgetRatio",
            json!(-0.1),
            "budgetRatio must be greater than 0 and at most 1",
        ),
        (
            "spec.minKeepRecent",
            json!(0),
            "minKeepRecent must be between 1 and 1000",
        ),
        (
            "spec.autoCompact.bufferTokens",
            json!(0),
            "bufferTokens must be positive",
        ),
        (
            "spec.autoCompact.warningBufferTokens",
            json!(0),
            "warningBufferTokens must be positive",
        ),
        (
            "spec.autoCompact.blockingBufferTokens",
            json!(0),
            "blockingBufferTokens must be positive",
        ),
        (
            "spec.microcompact.truncateAfterTurns",
            json!(0),
            "truncateAfterTurns must be at least 1",
        ),
        (
            "spec.microcompact.summarizeAfterTurns",
            json!(1),
            "summarizeAfterTurns must be at least 2",
        ),
        (
            "spec.microcompact.headChars",
            json!(0),
            "headChars must be positive",
        ),
        (
            "spec.microcompact.tailChars",
            json!(-1),
            "tailChars must not be negative",
        ),
        (
            "spec.microcompact.minContentChars",
            json!(0),
            "minContentChars must be positive",
        ),
        (
            "spec.microcompact.idleMinutes",
            json!(-5),
            "idleMinutes must not be negative",
        ),
        (
            "spec.toolResults.perTurnChars",
            json!(0),
            "perTurnChars must be positive",
        ),
        (
            "spec.toolResults.perResultChars",
            json!(0),
            "perResultChars must be positive",
        ),
        (
            "spec.recovery.maxAttempts",
            json!(4),
            "maxAttempts must be between 0 and 3",
        ),
        (
            "spec.recovery.emergencyKeepMessages",
            json!(0),
            "emergencyKeepMessages must be at least 1",
        ),
        (
            "spec.recovery.nuclearKeepMessages",
            json!(0),
            "nuclearKeepMessages must be at least 1",
        ),
        (
            "spec.recovery.nuclearMessageChars",
            json!(100),
            "nuclearMessageChars must be at least 400",
        ),
        (
            "spec.recovery.maxTokenEscalations",
            json!(6),
            "maxTokenEscalations must be between 0 and 5",
        ),
        (
            "spec.summarizer.model",
            json!(""),
            "summarizer.model must be 1 to 256 characters",
        ),
        (
            "spec.compression.thresholdBytes",
            json!(0),
            "thresholdBytes must be positive",
        ),
    ];
    for (path, value, msg) in cases {
        assert_rejected(&cpol, with(policy(json!({})), path, value.clone()), msg);
    }
    // Cross-field rules, each with its message.
    let cross: &[(Value, &str)] = &[
        (
            json!({"microcompact": {"truncateAfterTurns": 4, "summarizeAfterTurns": 4}}),
            "truncateAfterTurns must be smaller than summarizeAfterTurns",
        ),
        (
            json!({"autoCompact": {"bufferTokens": 3000, "blockingBufferTokens": 3000}}),
            "blockingBufferTokens must be smaller than bufferTokens",
        ),
        (
            json!({"autoCompact": {"bufferTokens": 30000, "warningBufferTokens": 20000}}),
            "bufferTokens must not exceed warningBufferTokens",
        ),
        (
            json!({"toolResults": {"perTurnChars": 1000, "perResultChars": 2000}}),
            "perResultChars must not exceed perTurnChars",
        ),
        (
            json!({"recovery": {"emergencyKeepMessages": 3, "nuclearKeepMessages": 4}}),
            "nuclearKeepMessages must not exceed emergencyKeepMessages",
        ),
    ];
    for (spec, msg) in cross {
        assert_rejected(&cpol, policy(spec.clone()), msg);
    }
}

#[test]
fn every_session_rule_rejects_with_its_message() {
    let session = schema_of::<AgentSession>();
    let cases: &[(&str, Value, &str)] = &[
        (
            "spec.contextWindow",
            json!(0),
            "contextWindow must be between 1024 and 100000000 tokens",
        ),
        (
            "spec.contextWindow",
            json!(100),
            "contextWindow must be between 1024 and 100000000 tokens",
        ),
        (
            "spec.maxOutputTokens",
            json!(0),
            "maxOutputTokens must be positive",
        ),
        (
            "spec.payloadCap",
            json!("five megabytes"),
            "payloadCap must be a positive size",
        ),
        (
            "spec.payloadCap",
            json!("5TB"),
            "payloadCap must be a positive size",
        ),
        (
            "spec.payloadCap",
            json!("0MB"),
            "payloadCap must be a positive size",
        ),
        (
            "spec.payloadCap",
            json!(0),
            "payloadCap must be a positive size",
        ),
        (
            "spec.payloadCap",
            json!(-3),
            "payloadCap must be a positive size",
        ),
        (
            "spec.provider.model",
            json!(""),
            "provider.model must be 1 to 256 characters",
        ),
        (
            "spec.provider.baseUrl",
            json!("ftp://x"),
            "provider.baseUrl must be an http:// or https:// URL",
        ),
        (
            "spec.provider.region",
            json!("US EAST"),
            "provider.region must look like us-east-1",
        ),
        (
            "spec.provider.credentials",
            json!({"secretName": "Bad_Name"}),
            "secretName must be a valid Secret name",
        ),
        (
            "spec.systemPromptFrom",
            json!({"configMapName": "UPPER", "key": "k"}),
            "configMapName must be a valid ConfigMap name",
        ),
        (
            "spec.systemPromptFrom",
            json!({"configMapName": "cm", "key": ""}),
            "key must be 1 to 253 characters",
        ),
        (
            "spec.policyRef",
            json!({"name": "-bad"}),
            "policyRef.name must be a valid object name",
        ),
        (
            "spec.archive.bucket",
            json!("B"),
            "archive.bucket must be a valid S3 bucket name",
        ),
        (
            "spec.archive.prefix",
            json!("/abs"),
            "archive.prefix must be at most 512 characters",
        ),
        (
            "spec.archive.prefix",
            json!("a/../b"),
            "archive.prefix must be at most 512 characters",
        ),
        (
            "spec.archive.endpoint",
            json!("s3.local"),
            "archive.endpoint must be an http:// or https:// URL",
        ),
        (
            "spec.archive.region",
            json!(""),
            "archive.region must be 1 to 64 characters",
        ),
        (
            "spec.archive.localCacheSize",
            json!("lots"),
            "archive.localCacheSize must be a quantity like 256Mi",
        ),
        (
            "spec.archive.ttl",
            json!("a week"),
            "archive.ttl must be a duration like 168h",
        ),
        (
            "spec.archive.credentials",
            json!({"secretName": "NO"}),
            "credentials.secretName must be a valid Secret name",
        ),
        (
            "spec.template.image",
            json!(""),
            "template.image must be 1 to 1024 characters",
        ),
        (
            "spec.compaction.budgetRatio",
            json!(2.0),
            "budgetRatio must be greater than 0 and at most 1",
        ),
        (
            "spec.compaction.microcompact",
            json!({"truncateAfterTurns": 5, "summarizeAfterTurns": 3}),
            "truncateAfterTurns must be smaller than summarizeAfterTurns",
        ),
    ];
    for (path, value, msg) in cases {
        assert_rejected(&session, with(minimal_session(), path, value.clone()), msg);
    }
    let both_prompts = with(
        with(minimal_session(), "spec.systemPrompt", json!("hi")),
        "spec.systemPromptFrom",
        json!({"configMapName": "cm", "key": "k"}),
    );
    assert_rejected(
        &session,
        both_prompts,
        "set systemPrompt or systemPromptFrom, not both",
    );
    let window = with(
        with(minimal_session(), "spec.contextWindow", json!(8192)),
        "spec.maxOutputTokens",
        json!(8192),
    );
    assert_rejected(
        &session,
        window,
        "maxOutputTokens must be smaller than contextWindow",
    );
    assert_rejected(
        &session,
        with(
            minimal_session(),
            "spec.provider",
            json!({"kind": "bedrock", "model": "anthropic.claude-sonnet-4-5"}),
        ),
        "provider.region is required when provider.kind is bedrock",
    );
    assert_rejected(
        &session,
        with(
            minimal_session(),
            "spec.provider",
            json!({"kind": "openai-compatible", "model": "llama"}),
        ),
        "provider.baseUrl is required when provider.kind is openai-compatible",
    );
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
