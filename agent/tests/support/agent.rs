//! Fixtures of the agent tests: sessions wired to cairn-sim, an in-process API server, the
//! real `cairn-agent` binary as a child process, and a small HTTP client.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cairn_agent::config::{ConfigFile, Live, Storage, StorageSettings};
use cairn_agent::metrics::Metrics;
use cairn_agent::provider::{
    ClientOptions, Credentials, LiveProvider, Provider, RetryPolicy, build,
};
use cairn_agent::server::{AppState, router};
use cairn_agent::session::{Session, SessionParts};
use cairn_crds::ProviderSpec;
use serde_json::{Value, json};
use tokio::sync::watch;

pub const TOKEN: &str = "test-token-1234";
pub const MODEL: &str = "m-1";

/// A config file body for a session talking to `base_url` (an OpenAI-compatible endpoint
/// ending in `/v1`), with `extra` YAML appended.
pub fn config_yaml(name: &str, base_url: &str, window: u64, extra: &str) -> String {
    format!(
        "name: {name}\nnamespace: tests\nprovider:\n  kind: openai-compatible\n  model: {MODEL}\n  baseUrl: {base_url}\ncontextWindow: {window}\nmaxOutputTokens: 1000\nsystemPrompt: You are a test agent.\n{extra}"
    )
}

/// Storage settings: S3 at `s3_endpoint` (moto) or a local directory under `data`.
pub fn storage_env(data: &Path, s3_endpoint: Option<&str>) -> Vec<(String, String)> {
    let mut v = vec![
        ("XDG_DATA_HOME".to_string(), data.display().to_string()),
        (
            "CAIRN_CACHE_DIR".to_string(),
            data.join("cache").display().to_string(),
        ),
        ("HOME".to_string(), data.display().to_string()),
    ];
    if let Some(ep) = s3_endpoint {
        for (k, val) in [
            ("CAIRN_S3_ENDPOINT", ep),
            ("CAIRN_S3_BUCKET", "cairn-test"),
            ("CAIRN_S3_PREFIX", "cairn"),
            ("CAIRN_S3_REGION", "us-east-1"),
            ("CAIRN_S3_FORCE_PATH_STYLE", "true"),
            ("CAIRN_S3_TIMEOUT_SECS", "4"),
            // The archive's own names, as the operator sets them.
            ("CAIRN_S3_ACCESS_KEY_ID", "testing"),
            ("CAIRN_S3_SECRET_ACCESS_KEY", "testing"),
        ] {
            v.push((k.to_string(), val.to_string()));
        }
    }
    v
}

/// A session built in-process from a config body and a storage environment.
pub struct Built {
    pub session: Session,
    pub live_tx: watch::Sender<Arc<Live>>,
    pub storage: Storage,
}

pub async fn build_session(yaml: &str, env: &[(String, String)], holder: &str) -> Built {
    build_session_with(yaml, env, holder, false, RetryPolicy::none()).await
}

/// Like [`build_session`], with the provider client retrying as `retry` says (the others
/// never retry, so a scripted fault reaches the session at once).
pub async fn build_retrying_session(
    yaml: &str,
    env: &[(String, String)],
    holder: &str,
    retry: RetryPolicy,
) -> Built {
    build_session_with(yaml, env, holder, false, retry).await
}

/// Like [`build_session`], with a provider that follows `spec.provider` edits sent on
/// `live_tx` (as `serve` does).
pub async fn build_following_session(yaml: &str, env: &[(String, String)], holder: &str) -> Built {
    build_session_with(yaml, env, holder, true, RetryPolicy::none()).await
}

async fn build_session_with(
    yaml: &str,
    env: &[(String, String)],
    holder: &str,
    follow: bool,
    retry: RetryPolicy,
) -> Built {
    let cfg = ConfigFile::parse(yaml, "test").expect("config");
    let live = Live::resolve(&cfg.spec, cfg.policy.as_ref(), None).expect("live");
    let lookup = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let settings = StorageSettings::from_spec(&cfg.spec, lookup).expect("storage settings");
    let storage = Storage::open(&settings, &cfg.namespace, &cfg.name).expect("storage");
    let options = ClientOptions {
        retry,
        net: settings.net.clone(),
        ..ClientOptions::default()
    };
    let (live_tx, rx) = watch::channel(Arc::new(live));
    let provider: Arc<dyn Provider> = if follow {
        let build = move |spec: &ProviderSpec| {
            build(spec, Credentials::api_key("sk-sim"), options.clone())
                .map(Arc::from)
                .map_err(|e| e.to_string())
        };
        Arc::new(LiveProvider::new(rx.clone(), Box::new(build)).expect("provider"))
    } else {
        Arc::from(
            build(&cfg.spec.provider, Credentials::api_key("sk-sim"), options).expect("provider"),
        )
    };
    // The summarizer's own client, wired as `serve` wires it, with the simulator's key.
    let summarizer = cairn_agent::provider::summarizer_provider(
        rx.clone(),
        Arc::new(|n: &str| (n == "CAIRN_SUMMARIZER_API_KEY").then(|| "sk-sim".to_owned())),
        ClientOptions {
            retry: RetryPolicy::none(),
            ..ClientOptions::default()
        },
    );
    let session = Session::open(SessionParts {
        namespace: cfg.namespace.clone(),
        name: cfg.name.clone(),
        holder: holder.into(),
        live: rx,
        provider,
        summarizer_provider: Some(Arc::new(summarizer)),
        store: Arc::clone(&storage.store),
        journal: Arc::clone(&storage.journal),
        archive_counters: Arc::clone(&storage.counters),
        metrics: Arc::new(Metrics::new()),
        net: settings.net.clone(),
    })
    .await
    .expect("session opens");
    Built {
        session,
        live_tx,
        storage,
    }
}

/// Serves `state` on a free local port; returns the base URL.
pub async fn serve(state: AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router(state, 1024 * 1024)).await;
    });
    format!("http://{addr}")
}

/// A small client of the agent's API.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(base: impl Into<String>) -> Self {
        Self {
            base: base.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
        }
    }

    /// One non-streamed turn: (status, body).
    pub async fn turn(&self, input: &str) -> (u16, Value) {
        self.post("/v1/responses", json!({"model": MODEL, "input": input}))
            .await
    }

    /// The raw answer to an authenticated POST of `body` (headers and body unread).
    pub async fn send(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self.send(path, &body).await;
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Vec<u8>) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        (
            status,
            r.bytes().await.map(|b| b.to_vec()).unwrap_or_default(),
        )
    }

    pub async fn session(&self) -> Value {
        let (s, body) = self.get("/v1/session").await;
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).expect("session json")
    }
}

/// A history of `n` 5-KB exchanges (user question, assistant answer).
pub fn padded_history(n: usize) -> Vec<cairn_agent::history::Message> {
    use cairn_agent::history::Message;
    (0..n)
        .flat_map(|i| {
            [
                Message::user(format!("question {i}: {}", "q".repeat(5_000))),
                Message::assistant(format!("answer {i}: {}", "a".repeat(5_000))),
            ]
        })
        .collect()
}

/// The text of a non-streamed Response object.
pub fn output_text(v: &Value) -> String {
    v["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The real `cairn-agent serve` as a child process.
pub struct AgentProcess {
    pub child: Child,
    pub url: String,
    pub stderr_log: PathBuf,
}

impl AgentProcess {
    pub fn start(config: &Path, env: &[(String, String)], log: &Path) -> Self {
        Self::start_wrapped(config, env, log, &[])
    }

    /// Like [`AgentProcess::start`], run through `wrap` (a command that ends by executing
    /// its arguments, e.g. `bash -c 'ulimit -n 1024 && exec "$0" "$@"'`).
    pub fn start_wrapped(
        config: &Path,
        env: &[(String, String)],
        log: &Path,
        wrap: &[&str],
    ) -> Self {
        let stderr = std::fs::File::create(log).expect("log file");
        let bin = env!("CARGO_BIN_EXE_cairn-agent");
        let mut command = match wrap.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let mut child = command
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CAIRN_API_TOKEN", TOKEN)
            .env("OPENAI_API_KEY", "sk-sim")
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn cairn-agent");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            // Whole lines only: stderr is unbuffered, and the line may be read half written
            // ("... on 127.0.0.1" before ":PORT\n").
            if let Some(addr) = text
                .split_inclusive('\n')
                .filter(|l| l.ends_with('\n'))
                .find_map(|l| l.strip_prefix("cairn-agent listening on "))
            {
                let addr = addr.trim();
                return Self {
                    child,
                    url: format!("http://{addr}"),
                    stderr_log: log.to_path_buf(),
                };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("cairn-agent exited with {status}: {text}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "cairn-agent did not start: {text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn api(&self) -> Api {
        Api::new(self.url.clone())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().expect("wait")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lines of a file, for log checks.
pub fn read_lines(path: &Path) -> Vec<String> {
    std::fs::File::open(path)
        .map(|f| BufReader::new(f).lines().map_while(Result::ok).collect())
        .unwrap_or_default()
}
