//! Test doubles and fixtures shared by the engine's tests, the agent's tests and the benchmarks:
//! a store that always fails, journal objects in memory with injected faults, a scripted
//! summarizer, realistic synthetic sessions, and the recoverability check.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::ccr::{ArchiveError, Hashed, Key, Store};
use crate::compact::archive::{parse_segment, referenced_keys};
use crate::compact::summarize::{SECTIONS, SummaryRequest};
use crate::compact::{SummarizeError, Summarizer};
use crate::history::{Message, ToolCall};
use crate::storage::{ObjectError, ObjectStore};
use async_trait::async_trait;

/// A store whose durable tier is unreachable.
pub struct FailingStore;

#[async_trait]
impl Store for FailingStore {
    async fn put_hashed(&self, _original: Hashed<'_>) -> Result<(), ArchiveError> {
        Err(ArchiveError::Unavailable("bucket unreachable".into()))
    }
    async fn fetch(&self, _key: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        Err(ArchiveError::Unavailable("bucket unreachable".into()))
    }
}

/// A memory store that writes concurrently: each write of a batch yields a random number of
/// times first, so the writes of one batch (up to 8 in flight) finish out of order.
#[derive(Default)]
pub struct ConcurrentStore {
    inner: crate::ccr::MemoryStore,
}

#[async_trait]
impl Store for ConcurrentStore {
    async fn put_hashed(&self, original: Hashed<'_>) -> Result<(), ArchiveError> {
        for _ in 0..fastrand::usize(..4) {
            yield_now().await;
        }
        self.inner.put_hashed(original).await
    }
    async fn fetch(&self, key: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        self.inner.fetch(key).await
    }
    fn in_flight(&self) -> usize {
        8
    }
}

/// Hands control back to the executor once (the runtime-free `yield_now`).
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}

/// What the next object store call of a kind does ([`MemObjects::fail`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ObjectFault {
    /// Fails without acting.
    Refuse,
    /// Acts, then fails.
    Lose,
}

/// Named objects in memory (the storage port), with faults queued per call kind: `put`, `get`, `list` (of
/// entries), `list-claims` and `delete`. A listing comes newest first, so a reader that
/// depends on the order of a listing fails.
#[derive(Default)]
pub struct MemObjects {
    pub objects: Mutex<BTreeMap<String, Vec<u8>>>,
    faults: Mutex<BTreeMap<&'static str, VecDeque<ObjectFault>>>,
}

impl MemObjects {
    /// The next call of `kind` fails as `fault` says (faults of a kind queue up).
    pub fn fail(&self, kind: &'static str, fault: ObjectFault) {
        lock(&self.faults).entry(kind).or_default().push_back(fault);
    }

    fn next(&self, kind: &'static str) -> Option<ObjectFault> {
        lock(&self.faults).get_mut(kind)?.pop_front()
    }

    /// Every name held, in order.
    pub fn names(&self) -> Vec<String> {
        lock(&self.objects).keys().cloned().collect()
    }

    /// Stores `body` under `name`, bypassing the faults.
    pub fn raw_put(&self, name: &str, body: Vec<u8>) {
        lock(&self.objects).insert(name.to_owned(), body);
    }
}

/// A test double's lock: a panic of another test thread does not hide its state.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn injected() -> ObjectError {
    ObjectError::Unavailable("injected".into())
}

#[async_trait]
impl ObjectStore for MemObjects {
    async fn put(&self, name: &str, body: Vec<u8>) -> Result<(), ObjectError> {
        match self.next("put") {
            Some(ObjectFault::Refuse) => return Err(injected()),
            Some(ObjectFault::Lose) => {
                self.raw_put(name, body);
                return Err(injected());
            }
            None => self.raw_put(name, body),
        }
        Ok(())
    }
    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, ObjectError> {
        if self.next("get").is_some() {
            return Err(injected());
        }
        Ok(lock(&self.objects).get(name).cloned())
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, ObjectError> {
        let fault = self.next(if prefix.starts_with("claims") {
            "list-claims"
        } else {
            "list"
        });
        if fault.is_some() {
            return Err(injected());
        }
        let mut names: Vec<String> = self
            .names()
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .collect();
        names.reverse();
        Ok(names)
    }
    async fn delete(&self, name: &str) -> Result<(), ObjectError> {
        if self.next("delete").is_some() {
            return Err(injected());
        }
        lock(&self.objects).remove(name);
        Ok(())
    }
}

/// Replies from a script; when the script runs out, writes a well-formed summary sized to
/// the transcript.
pub struct ScriptedSummarizer {
    pub script: Mutex<VecDeque<Result<String, SummarizeError>>>,
    pub requests: Mutex<Vec<SummaryRequest>>,
    pub window: usize,
}

impl ScriptedSummarizer {
    pub fn new(script: Vec<Result<String, SummarizeError>>) -> Self {
        Self {
            script: Mutex::new(script.into()),
            requests: Mutex::new(Vec::new()),
            window: 400_000,
        }
    }

    pub fn good() -> Self {
        Self::new(Vec::new())
    }

    pub fn calls(&self) -> usize {
        self.requests.lock().map(|r| r.len()).unwrap_or(0)
    }
}

/// A summary with the nine sections, about `len` bytes.
pub fn well_formed_summary(len: usize) -> String {
    let mut s = String::new();
    for (n, sec) in SECTIONS.iter().enumerate() {
        s.push_str(&format!(
            "{}. {sec}\nThe user asked to fix the build; see src/lib.rs.\n",
            n + 1
        ));
    }
    while s.len() < len {
        s.push_str("Details: the failing test was parse_config; fixed by trimming input.\n");
    }
    s
}

#[async_trait]
impl Summarizer for ScriptedSummarizer {
    fn window_chars(&self) -> usize {
        self.window
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        if let Ok(mut r) = self.requests.lock() {
            r.push(request.clone());
        }
        let next = self.script.lock().ok().and_then(|mut s| s.pop_front());
        match next {
            Some(r) => r,
            None => Ok(well_formed_summary(
                (request.transcript.len() / 40).clamp(2_100, 6_000),
            )),
        }
    }
}

pub fn call(id: &str, name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: args.into(),
    }
}

/// A turn whose one call's arguments weigh about `bytes`: no pass cuts arguments (only
/// content), so a kept tail that holds it cannot shrink below them. Ends with the user's
/// next request, so level 3 can keep a tail without it.
pub fn heavy_call_turn(bytes: usize) -> Vec<Message> {
    let args = serde_json::json!({"path": "data/blob.txt", "content": "x".repeat(bytes)});
    vec![
        Message::assistant_calls("", vec![call("heavy", "write_file", &args.to_string())]),
        Message::tool("heavy", "wrote data/blob.txt"),
        Message::assistant("Written."),
        Message::user("Now check it."),
        Message::assistant("Checked."),
    ]
}

/// Realistic tool outputs, deterministic in `seed`.
pub fn tool_output(kind: usize, seed: usize, size: usize) -> String {
    let mut s = String::with_capacity(size + 128);
    let mut i = 0usize;
    while s.len() < size {
        let n = seed.wrapping_mul(31).wrapping_add(i);
        match kind % 4 {
            0 => s.push_str(&format!(
                "2026-11-30T08:{:02}:{:02}.{:03}Z INFO  request_id={n:08x} path=/v1/items/{} status=200 latency_ms={}\n",
                (n / 60) % 60,
                n % 60,
                n % 1000,
                n % 977,
                n % 311
            )),
            1 => s.push_str(&format!(
                "@@ -{n},7 +{n},8 @@ fn handler_{n}()\n-    let v = old_value({n});\n+    let v = new_value({n}).unwrap_or_default();\n+    tracing::debug!(v, \"computed\");\n     v\n"
            )),
            2 => s.push_str(&format!(
                "{{\"id\":{n},\"name\":\"item-{n}\",\"tags\":[\"a\",\"b\"],\"price\":{}.{:02},\"active\":{}}}\n",
                n % 500,
                n % 100,
                n.is_multiple_of(2)
            )),
            _ => s.push_str(&format!(
                "pub fn function_{n}(input: &str) -> Result<usize, Error> {{\n    let trimmed = input.trim();\n    Ok(trimmed.len() + {n})\n}}\n\n"
            )),
        }
        i += 1;
    }
    s
}

/// A synthetic coding session of about `bytes` bytes: system prompt, user turns, assistant
/// tool calls (reads of the same files again and again, shell commands), realistic results.
pub fn session(bytes: usize) -> Vec<Message> {
    let mut h = vec![Message::system(
        "You are a careful coding agent. Use tools to read and edit files.".repeat(20),
    )];
    let mut turn = 0usize;
    while crate::history::weight(&h) < bytes {
        h.push(Message::user(format!(
            "Step {turn}: please look at module {} and fix the failing test.",
            turn % 7
        )));
        let file = format!("src/module_{}.rs", turn % 5);
        let calls = vec![
            call(
                &format!("r{turn}"),
                "read_file",
                &format!("{{\"path\":\"{file}\"}}"),
            ),
            call(
                &format!("b{turn}"),
                "bash",
                "{\"command\":\"cargo test 2>&1 | tail -200\"}",
            ),
        ];
        let mut a =
            Message::assistant_calls(format!("Reading {file} and running the tests."), calls);
        a.reasoning =
            Some(format!("The failure in step {turn} is probably in {file}. ").repeat(10));
        h.push(a);
        let size = 2_000 + (turn * 7_919) % 30_000;
        let mut read = Message::tool(format!("r{turn}"), tool_output(3, turn, size));
        read.name = Some("read_file".into());
        h.push(read);
        let mut run = Message::tool(
            format!("b{turn}"),
            tool_output(turn % 3, turn, size / 2 + 500),
        );
        run.name = Some("bash".into());
        h.push(run);
        h.push(Message::assistant(format!(
            "The test fails because of an off-by-one in {file}; I will fix it next. {}",
            "Explanation. ".repeat(turn % 40)
        )));
        turn += 1;
    }
    h
}

/// Every text recoverable from `history` through its markers: the archived originals and,
/// for archived segments, the messages inside (recursively).
pub async fn recoverable(history: &[Message], store: &dyn Store) -> HashSet<String> {
    let mut out = HashSet::new();
    let mut seen: HashSet<Key> = HashSet::new();
    let mut queue: Vec<Key> = referenced_keys(history);
    while let Some(k) = queue.pop() {
        if !seen.insert(k) {
            continue;
        }
        let Ok(Some(bytes)) = store.fetch(&k).await else {
            continue;
        };
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        if let Ok(msgs) = parse_segment(&text)
            && !msgs.is_empty()
            && text.starts_with('{')
        {
            for m in &msgs {
                out.insert(m.content.clone());
                if let Some(r) = &m.reasoning {
                    out.insert(r.clone());
                }
            }
            queue.extend(referenced_keys(&msgs));
        }
        out.insert(text);
    }
    out
}

/// Texts of `before` that are neither still in `after` nor recoverable through its markers.
pub async fn lost_texts(before: &[Message], after: &[Message], store: &dyn Store) -> Vec<String> {
    let rec = recoverable(after, store).await;
    let mut lost = Vec::new();
    for m in before {
        for t in std::iter::once(&m.content).chain(m.reasoning.iter()) {
            if t.is_empty() || rec.contains(t) {
                continue;
            }
            let present = after.iter().any(|a| {
                a.content.contains(t.as_str()) || a.reasoning.as_deref() == Some(t.as_str())
            });
            if !present {
                lost.push(t.clone());
            }
        }
    }
    lost
}

/// nginx's own 413 page for a `bytes`-byte request body.
pub fn nginx_413(bytes: u64) -> crate::provider::ProviderError {
    crate::provider::ProviderError::http(
        "openai",
        413,
        Some("text/html".into()),
        "<html><head><title>413 Request Entity Too Large</title></head></html>",
        bytes,
    )
}
