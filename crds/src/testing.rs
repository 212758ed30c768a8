//! Fixtures shared by the client-side CEL tests and the tests against a real API server:
//! minimal valid objects and every CEL rule's breaking case (`tests/fixtures/cel-cases.yaml`).

use serde::Deserialize;
use serde_json::{Value, json};

/// A minimal valid AgentSession.
pub fn minimal_session(name: &str) -> Value {
    json!({
        "apiVersion": "cairn.dev/v1beta1",
        "kind": "AgentSession",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"provider": {"kind": "anthropic", "model": "claude-sonnet-4-5"}}
    })
}

/// A minimal valid (empty) CompactionPolicy.
pub fn minimal_policy(name: &str) -> Value {
    json!({
        "apiVersion": "cairn.dev/v1beta1",
        "kind": "CompactionPolicy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {}
    })
}

/// An object that breaks one CEL rule, and the message the rule must give.
#[derive(Debug, Clone)]
pub struct CelCase {
    /// `AgentSession` or `CompactionPolicy`.
    pub kind: &'static str,
    pub object: Value,
    pub message: String,
}

#[derive(Deserialize)]
struct RawCase {
    set: Option<String>,
    value: Option<Value>,
    spec: Option<Value>,
    message: String,
}

#[derive(Deserialize)]
struct RawCases {
    compactionpolicy: Vec<RawCase>,
    agentsession: Vec<RawCase>,
}

/// Every breaking case, each on its own object named `cel-<n>`.
pub fn cel_cases() -> Vec<CelCase> {
    let raw: RawCases = match serde_yaml::from_str(include_str!("../tests/fixtures/cel-cases.yaml"))
    {
        Ok(r) => r,
        Err(e) => panic!("tests/fixtures/cel-cases.yaml does not parse: {e}"),
    };
    let mut out = Vec::new();
    let groups = [
        ("CompactionPolicy", raw.compactionpolicy),
        ("AgentSession", raw.agentsession),
    ];
    for (kind, cases) in groups {
        for c in cases {
            let name = format!("cel-{}", out.len());
            let mut object = if kind == "AgentSession" {
                minimal_session(&name)
            } else {
                minimal_policy(&name)
            };
            if let (Some(path), Some(value)) = (&c.set, c.value) {
                set_path(&mut object, path, value);
            }
            if let Some(spec) = c.spec {
                merge(&mut object["spec"], spec);
            }
            out.push(CelCase {
                kind,
                object,
                message: c.message,
            });
        }
    }
    out
}

/// Sets `value` at a dotted path, creating objects on the way.
pub fn set_path(obj: &mut Value, path: &str, value: Value) {
    let mut cur = obj;
    let mut parts = path.split('.').peekable();
    while let Some(part) = parts.next() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let map = match cur.as_object_mut() {
            Some(m) => m,
            None => return,
        };
        if parts.peek().is_none() {
            map.insert(part.to_string(), value);
            return;
        }
        cur = map.entry(part.to_string()).or_insert_with(|| json!({}));
    }
}

/// Deep-merges `patch` into `target` (objects merge, everything else replaces).
pub fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p,
    }
}
