//! `kubectl cairn`: a session's agent API from a platform engineer's own kubeconfig.
//!
//! Each command finds the AgentSession, reads its API token from the Secret the operator
//! made (`cairn-<session>-api-token`, key `token`) with the caller's own credentials,
//! port-forwards to the session's pod through the API server (the `pods/portforward`
//! subresource, no local port) and makes one HTTP request to the agent over that stream.
//! What a caller needs in the session's namespace, nothing cluster-wide: `get` on
//! `agentsessions.cairn.dev`, `get` on that Secret, `get` and `create` on `pods/portforward`
//! (the API server authorizes the WebSocket upgrade, a GET, as `get`; the SPDY one of
//! `kubectl port-forward` as `create`).
//!
//! The pure parts ([`Command::request`], [`pod_of`], [`Error::from_kube`],
//! [`Error::from_agent`]) decide; [`Cluster`] does the I/O.

pub mod open;

use std::time::Duration;

use bytes::Bytes;
use cairn_crds::{AgentSession, Phase};
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use cairn_crds::names::{AGENT_PORT, TOKEN_KEY, pod_name, token_secret_name};

/// What the plugin does, in the agent's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `GET /v1/session/context`: the next request by part, or (`request`) its exact body.
    Context {
        request: bool,
        input: Option<String>,
        stream: bool,
    },
    /// `GET /v1/session/context?why=TEXT`: where a text went.
    Why { text: String },
    /// `GET /v1/recall/{key}`: an archived original.
    Recall { key: String },
    /// `POST /v1/session/compact`.
    Compact { instruction: Option<String> },
    /// `POST /v1/session/rewind`: undo the last compaction.
    Rewind,
}

/// One request to the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentRequest {
    pub method: http::Method,
    /// Path and query.
    pub path: String,
    pub body: Option<Value>,
}

/// Characters escaped in a path segment or a query value (everything but unreserved).
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

impl Command {
    /// The agent's endpoint for this command, with its parameters.
    pub fn request(&self) -> AgentRequest {
        let get = |path: String| AgentRequest {
            method: http::Method::GET,
            path,
            body: None,
        };
        match self {
            Self::Context {
                request,
                input,
                stream,
            } => {
                let mut query = Vec::new();
                if *request {
                    query.push("view=request".to_string());
                }
                if let Some(text) = input {
                    query.push(format!("input={}", utf8_percent_encode(text, ESCAPED)));
                }
                if *stream {
                    query.push("stream=true".to_string());
                }
                let mut path = "/v1/session/context".to_string();
                if !query.is_empty() {
                    path.push('?');
                    path.push_str(&query.join("&"));
                }
                get(path)
            }
            Self::Why { text } => get(format!(
                "/v1/session/context?why={}",
                utf8_percent_encode(text, ESCAPED)
            )),
            Self::Recall { key } => {
                get(format!("/v1/recall/{}", utf8_percent_encode(key, ESCAPED)))
            }
            Self::Compact { instruction } => AgentRequest {
                method: http::Method::POST,
                path: "/v1/session/compact".into(),
                body: Some(match instruction {
                    Some(text) => serde_json::json!({ "instruction": text }),
                    None => serde_json::json!({}),
                }),
            },
            Self::Rewind => AgentRequest {
                method: http::Method::POST,
                path: "/v1/session/rewind".into(),
                body: None,
            },
        }
    }
}

/// What went wrong, worded for the person at the terminal.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no AgentSession {name:?} in namespace {namespace:?}")]
    SessionNotFound { namespace: String, name: String },
    #[error(
        "AgentSession {namespace}/{name} is {phase}, not Running: its agent cannot be reached{detail}"
    )]
    NotRunning {
        namespace: String,
        name: String,
        phase: String,
        detail: String,
    },
    #[error("{what} {name:?} does not exist in namespace {namespace:?}{hint}")]
    Missing {
        what: &'static str,
        namespace: String,
        name: String,
        hint: &'static str,
    },
    #[error(
        "RBAC denied: you cannot {verb} {resource} {name:?} in namespace {namespace:?} ({message}). \
         kubectl cairn needs, in the session's namespace: get on agentsessions.cairn.dev, \
         get on the Secret cairn-<session>-api-token, get and create on pods/portforward"
    )]
    Forbidden {
        verb: &'static str,
        resource: &'static str,
        namespace: String,
        name: String,
        message: String,
    },
    #[error("the cluster refused your credentials: {0}")]
    Unauthenticated(String),
    #[error("the session's token Secret {namespace}/{name} has no \"token\" key")]
    NoToken { namespace: String, name: String },
    #[error("the agent answered {status} ({code}): {message}")]
    Agent {
        status: u16,
        code: String,
        message: String,
    },
    #[error("the port-forward to pod {namespace}/{pod} failed: {message}")]
    PortForward {
        namespace: String,
        pod: String,
        message: String,
    },
    #[error("the agent did not answer within {0:?}")]
    Timeout(Duration),
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("kubeconfig: {0}")]
    Config(String),
}

/// One request's target object, for wording a failure of it.
#[derive(Clone, Copy, Debug)]
pub struct Attempt<'a> {
    pub verb: &'static str,
    pub resource: &'static str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl Error {
    /// A failed API call, by its status: not found, denied, unauthenticated, or as it came.
    pub fn from_kube(e: kube::Error, at: Attempt<'_>) -> Self {
        if let kube::Error::Api(status) = &e {
            match status.code {
                401 => return Self::Unauthenticated(status.message.clone()),
                403 => {
                    return Self::Forbidden {
                        verb: at.verb,
                        resource: at.resource,
                        namespace: at.namespace.into(),
                        name: at.name.into(),
                        message: status.message.clone(),
                    };
                }
                404 if at.resource == "agentsessions.cairn.dev" => {
                    return Self::SessionNotFound {
                        namespace: at.namespace.into(),
                        name: at.name.into(),
                    };
                }
                404 => {
                    let (what, hint) = match at.resource {
                        "secrets" => (
                            "the session's token Secret",
                            " (the operator creates it when it reconciles the session)",
                        ),
                        _ => ("the session's pod", " (is the session's pod running?)"),
                    };
                    return Self::Missing {
                        what,
                        namespace: at.namespace.into(),
                        name: at.name.into(),
                        hint,
                    };
                }
                _ => {}
            }
        }
        Self::Kube {
            action: format!("{} {} {}/{}", at.verb, at.resource, at.namespace, at.name),
            source: e,
        }
    }

    /// An error answer of the agent: its JSON `{"error": {"message", "code"}}`, or the body.
    pub fn from_agent(status: u16, body: &[u8]) -> Self {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let error = parsed.as_ref().and_then(|v| v.get("error"));
        let field = |k: &str| {
            error
                .and_then(|e| e.get(k))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        Self::Agent {
            status,
            code: field("code").unwrap_or_else(|| "unknown".into()),
            message: field("message")
                .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned()),
        }
    }

    /// The process exit code: 2 for what the caller can fix (names, RBAC, phase), 3 for an
    /// error answer of the agent, 1 for the rest.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::SessionNotFound { .. }
            | Self::NotRunning { .. }
            | Self::Missing { .. }
            | Self::Forbidden { .. }
            | Self::Unauthenticated(_)
            | Self::NoToken { .. }
            | Self::Config(_) => 2,
            Self::Agent { .. } => 3,
            _ => 1,
        }
    }
}

/// The pod that serves `session`, if its phase says it runs one.
pub fn pod_of(session: &AgentSession) -> Result<String, Error> {
    let name = session.metadata.name.clone().unwrap_or_default();
    let namespace = session.metadata.namespace.clone().unwrap_or_default();
    let status = session.status.as_ref();
    let phase = status.and_then(|s| s.phase);
    match phase {
        Some(Phase::Running | Phase::Degraded) => Ok(status
            .and_then(|s| s.pod.clone())
            .unwrap_or_else(|| pod_name(&name))),
        other => {
            let ready = status
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                .map(|c| format!(" (Ready: {} {}: {})", c.status, c.reason, c.message))
                .unwrap_or_default();
            Err(Error::NotRunning {
                namespace,
                name,
                phase: other
                    .map_or("not yet reconciled (no phase)", Phase::as_str)
                    .into(),
                detail: ready,
            })
        }
    }
}

/// A successful answer of the agent.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// Any answer of the agent, with its headers.
#[derive(Clone, Debug)]
pub struct Exchanged {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// Where a session's agent is reached, and with what.
#[derive(Clone)]
pub struct Target {
    pub namespace: String,
    pub pod: String,
    token: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("namespace", &self.namespace)
            .field("pod", &self.pod)
            .finish_non_exhaustive()
    }
}

/// The cluster, with the caller's credentials.
pub struct Cluster {
    pub client: kube::Client,
    /// How long one agent call may take (a compaction may wait for its summarizer).
    pub timeout: Duration,
}

impl Cluster {
    /// The client of the kubeconfig (`KUBECONFIG`, `~/.kube/config`, or in-cluster), with
    /// `context` picked when given; and its default namespace.
    pub async fn from_kubeconfig(
        context: Option<String>,
        timeout: Duration,
    ) -> Result<(Self, String), Error> {
        let options = kube::config::KubeConfigOptions {
            context,
            ..Default::default()
        };
        let config = match kube::Config::from_kubeconfig(&options).await {
            Ok(c) => c,
            Err(kubeconfig) if options.context.is_none() => {
                kube::Config::incluster().map_err(|_| Error::Config(kubeconfig.to_string()))?
            }
            Err(e) => return Err(Error::Config(e.to_string())),
        };
        let namespace = config.default_namespace.clone();
        let client = kube::Client::try_from(config).map_err(|e| Error::Config(e.to_string()))?;
        Ok((Self { client, timeout }, namespace))
    }

    /// The session's pod and its API token, read with the caller's credentials.
    pub async fn target(&self, namespace: &str, session: &str) -> Result<Target, Error> {
        let sessions: Api<AgentSession> = Api::namespaced(self.client.clone(), namespace);
        let found = sessions.get(session).await.map_err(|e| {
            Error::from_kube(
                e,
                Attempt {
                    verb: "get",
                    resource: "agentsessions.cairn.dev",
                    namespace,
                    name: session,
                },
            )
        })?;
        let pod = pod_of(&found)?;
        let token = self.token(namespace, session).await?;
        Ok(Target {
            namespace: namespace.to_owned(),
            pod,
            token,
        })
    }

    /// Runs `command` against the agent of `namespace/session`.
    pub async fn run(
        &self,
        namespace: &str,
        session: &str,
        command: &Command,
    ) -> Result<Answer, Error> {
        let target = self.target(namespace, session).await?;
        let answer = self.exchange(&target, &command.request()).await?;
        if !(200..300).contains(&answer.status) {
            return Err(Error::from_agent(answer.status, &answer.body));
        }
        Ok(Answer {
            status: answer.status,
            body: answer.body,
        })
    }

    /// One request to the agent within the call timeout, whatever its status.
    pub async fn exchange(
        &self,
        target: &Target,
        request: &AgentRequest,
    ) -> Result<Exchanged, Error> {
        let call = self.call(&target.namespace, &target.pod, &target.token, request);
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| Error::Timeout(self.timeout))?
    }

    async fn token(&self, namespace: &str, session: &str) -> Result<String, Error> {
        let name = token_secret_name(session);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret = secrets.get(&name).await.map_err(|e| {
            Error::from_kube(
                e,
                Attempt {
                    verb: "get",
                    resource: "secrets",
                    namespace,
                    name: &name,
                },
            )
        })?;
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(TOKEN_KEY))
            .and_then(|t| String::from_utf8(t.0.clone()).ok())
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .ok_or(Error::NoToken {
                namespace: namespace.into(),
                name,
            })
    }

    /// One HTTP/1.1 exchange with the agent over a port-forward stream to its pod.
    async fn call(
        &self,
        namespace: &str,
        pod: &str,
        token: &str,
        request: &AgentRequest,
    ) -> Result<Exchanged, Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let mut forward = pods.portforward(pod, &[AGENT_PORT]).await.map_err(|e| {
            Error::from_kube(
                e,
                Attempt {
                    verb: "get",
                    resource: "pods/portforward",
                    namespace,
                    name: pod,
                },
            )
        })?;
        let failed = |message: String| Error::PortForward {
            namespace: namespace.into(),
            pod: pod.into(),
            message,
        };
        let stream = forward
            .take_stream(AGENT_PORT)
            .ok_or_else(|| failed("no stream for the agent's port".into()))?;
        let forward_error = forward.take_error(AGENT_PORT);
        let exchange = async {
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|e| e.to_string())?;
            let driver = tokio::spawn(connection);
            let body = request
                .body
                .as_ref()
                .map(|b| Bytes::from(b.to_string()))
                .unwrap_or_default();
            let mut builder = http::Request::builder()
                .method(request.method.clone())
                .uri(&request.path)
                .header(http::header::HOST, "localhost")
                .header(http::header::AUTHORIZATION, format!("Bearer {token}"));
            if request.body.is_some() {
                builder = builder.header(http::header::CONTENT_TYPE, "application/json");
            }
            let req = builder.body(Full::new(body)).map_err(|e| e.to_string())?;
            let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            drop(sender);
            driver.abort();
            Ok::<_, String>(Exchanged {
                status,
                headers,
                body,
            })
        };
        let result = exchange.await;
        let result = match result {
            Ok(answer) => Ok(answer),
            // The kubelet names why the stream ended (nothing listening, pod gone) on the
            // port's error channel; the HTTP error says only that it ended.
            Err(transport) => {
                let told = match forward_error {
                    Some(told) => tokio::time::timeout(Duration::from_secs(2), told)
                        .await
                        .ok()
                        .flatten(),
                    None => None,
                };
                Err(failed(told.unwrap_or(transport)))
            }
        };
        forward.abort();
        result
    }
}

/// `compact`'s answer, for a person.
pub fn describe_compaction(answer: &Value) -> String {
    let n = |k: &str| answer.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut out = format!(
        "compacted ({}, level {}): {} → {} bytes, {} messages",
        answer.get("trigger").and_then(Value::as_str).unwrap_or("-"),
        n("level"),
        n("bytesBefore"),
        n("bytesAfter"),
        n("messages"),
    );
    if answer.get("met").and_then(Value::as_bool) == Some(false) {
        out.push_str("; the budget is still not met");
    }
    // Agents before the compaction score do not send it.
    if let Some(score) = answer.pointer("/quality/score").and_then(Value::as_f64) {
        out.push_str(&format!("; score {score:.2}"));
    }
    if let Some(min) = answer.get("belowMinScore").and_then(Value::as_f64) {
        out.push_str(&format!(", below quality.minScore {min}"));
    }
    out
}

/// `rewind`'s answer, for a person.
pub fn describe_rewind(answer: &Value) -> String {
    let n = |k: &str| answer.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut out = format!(
        "rewound the last compaction: {} messages, {} bytes of history",
        n("messages"),
        n("historyBytes")
    );
    // Agents before multi-level rewind do not say how many levels are left.
    if let Some(left) = answer.get("levelsLeft").and_then(Value::as_u64) {
        out += &match left {
            0 => "; nothing more to rewind".to_owned(),
            1 => "; 1 more compaction can be rewound".to_owned(),
            n => format!("; {n} more compactions can be rewound"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewind_says_how_many_levels_are_left() {
        let answer = |left: Option<u64>| {
            let mut v = serde_json::json!({"messages": 4, "historyBytes": 900});
            if let Some(l) = left {
                v["levelsLeft"] = l.into();
            }
            describe_rewind(&v)
        };
        assert_eq!(
            answer(Some(2)),
            "rewound the last compaction: 4 messages, 900 bytes of history; 2 more compactions can be rewound"
        );
        assert!(answer(Some(0)).ends_with("; nothing more to rewind"));
        assert!(answer(Some(1)).ends_with("; 1 more compaction can be rewound"));
        // An agent that does not say: as before.
        assert_eq!(
            answer(None),
            "rewound the last compaction: 4 messages, 900 bytes of history"
        );
    }

    #[test]
    fn commands_map_to_the_agents_endpoints_with_their_parameters() {
        let ctx = Command::Context {
            request: true,
            input: Some("what's next? a&b".into()),
            stream: true,
        };
        assert_eq!(
            ctx.request().path,
            "/v1/session/context?view=request&input=what%27s%20next%3F%20a%26b&stream=true"
        );
        let plain = Command::Context {
            request: false,
            input: None,
            stream: false,
        };
        assert_eq!(plain.request().path, "/v1/session/context");
        let answer = serde_json::json!({
            "trigger": "manual", "level": 3, "bytesBefore": 9000, "bytesAfter": 4000,
            "messages": 7, "met": true, "quality": {"score": 0.8125}, "belowMinScore": 0.9
        });
        assert_eq!(
            describe_compaction(&answer),
            "compacted (manual, level 3): 9000 → 4000 bytes, 7 messages; score 0.81, below quality.minScore 0.9"
        );
        let why = Command::Why {
            text: "src/a b&c.rs".into(),
        };
        assert_eq!(
            why.request().path,
            "/v1/session/context?why=src%2Fa%20b%26c.rs"
        );
        let recall = Command::Recall {
            key: "<<ccr:0123abcd>>".into(),
        }
        .request();
        assert_eq!(recall.path, "/v1/recall/%3C%3Cccr%3A0123abcd%3E%3E");
        assert_eq!(recall.method, http::Method::GET);
        let compact = Command::Compact {
            instruction: Some("keep the errors".into()),
        }
        .request();
        assert_eq!(compact.method, http::Method::POST);
        assert_eq!(
            compact.body,
            Some(serde_json::json!({"instruction": "keep the errors"}))
        );
        assert_eq!(Command::Rewind.request().path, "/v1/session/rewind");
    }

    #[test]
    fn a_session_that_is_not_running_names_its_phase_and_ready_condition() {
        let mut s: AgentSession = serde_json::from_value(serde_json::json!({
            "apiVersion": "cairn.dev/v1beta1", "kind": "AgentSession",
            "metadata": {"name": "w", "namespace": "ns"},
            "spec": {"provider": {"kind": "openai-compatible", "model": "m"}},
            "status": {"phase": "Suspended", "conditions": [{
                "type": "Ready", "status": "False", "reason": "Suspended",
                "message": "spec.suspend is true", "lastTransitionTime": "2026-01-01T00:00:00Z"
            }]}
        }))
        .expect("a session");
        let e = pod_of(&s).expect_err("suspended");
        let text = e.to_string();
        assert!(text.contains("is Suspended, not Running"), "{text}");
        assert!(text.contains("spec.suspend is true"), "{text}");
        assert_eq!(e.exit_code(), 2);
        s.status = None;
        assert!(
            pod_of(&s)
                .expect_err("no status")
                .to_string()
                .contains("not yet reconciled")
        );
        s.status =
            Some(serde_json::from_value(serde_json::json!({"phase": "Running"})).expect("status"));
        assert_eq!(pod_of(&s).expect("running"), "cairn-w-0");
    }

    #[test]
    fn api_failures_are_worded_by_status() {
        let status = |code: u16, message: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: message.into(),
                ..Default::default()
            }))
        };
        let at = Attempt {
            verb: "get",
            resource: "secrets",
            namespace: "team",
            name: "cairn-w-api-token",
        };
        let denied = Error::from_kube(status(403, "secrets is forbidden"), at).to_string();
        assert!(
            denied.contains(
                "RBAC denied: you cannot get secrets \"cairn-w-api-token\" in namespace \"team\""
            ),
            "{denied}"
        );
        let missing = Error::from_kube(status(404, "not found"), at).to_string();
        assert!(missing.contains("token Secret"), "{missing}");
        let session = Error::from_kube(
            status(404, "not found"),
            Attempt {
                resource: "agentsessions.cairn.dev",
                name: "w",
                ..at
            },
        );
        assert!(
            matches!(session, Error::SessionNotFound { .. }),
            "{session}"
        );
        let agent = Error::from_agent(
            409,
            br#"{"error":{"message":"nothing to rewind","type":"conflict_error","code":"nothing_to_rewind"}}"#,
        );
        assert_eq!(
            agent.to_string(),
            "the agent answered 409 (nothing_to_rewind): nothing to rewind"
        );
        assert_eq!(agent.exit_code(), 3);
        let plain = Error::from_agent(502, b"bad gateway\n").to_string();
        assert!(plain.ends_with("(unknown): bad gateway"), "{plain}");
    }
}
