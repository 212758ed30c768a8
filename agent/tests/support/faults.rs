//! A fault-injecting HTTP proxy in front of a real S3 server (moto), for the journal and
//! archive fault tests.
//!
//! Every request the agent's S3 client sends is numbered in arrival order and classified
//! ([`Op`]); a fault planned for that number (or for the next requests of one kind) changes
//! what happens to it: refused before it reaches the store, forwarded and then answered
//! with an error, forwarded and then the connection dropped, forwarded and then never
//! answered, held and forwarded only after the client gave up, or (a listing) answered with
//! its entries reordered. Each request uses its own upstream connection and the client's
//! connection is closed after every answer, so a fault never leaks into the next request.
//! A fixed latency can be added to every request, for benchmarks of a distant store.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a request does to the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get,
    Put,
    List,
    Delete,
    Head,
    Other,
}

/// What the proxy does to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// 503 without forwarding: the store never sees the request.
    Refuse,
    /// Forwarded (it lands), then answered 500 instead of the store's answer.
    FailAfter,
    /// Forwarded (it lands), then the connection is closed without an answer.
    Drop,
    /// Forwarded (it lands), then no answer until the client times out.
    Stall,
    /// Not answered; forwarded only after the client has given up on it.
    Late,
    /// A listing forwarded with its `<Contents>` in reverse and rotated order.
    Shuffle,
}

impl Fault {
    pub const ALL: [Fault; 6] = [
        Fault::Refuse,
        Fault::FailAfter,
        Fault::Drop,
        Fault::Stall,
        Fault::Late,
        Fault::Shuffle,
    ];
}

/// One request as the proxy saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub n: u64,
    pub op: Op,
    /// Path and query.
    pub target: String,
    pub fault: Option<Fault>,
}

#[derive(Default)]
struct Plan {
    /// Faults by request number.
    at: BTreeMap<u64, Fault>,
    /// Faults for requests of a kind whose target contains a text: (kind, text, fault,
    /// matching requests to let pass first, requests to fault).
    next: VecDeque<(Op, String, Fault, usize, usize)>,
    /// Every request of a kind whose target contains a text, until cleared.
    always: Vec<(Op, String, Fault)>,
    seen: Vec<Seen>,
    count: u64,
    /// Added to every request before it is forwarded (a distant store).
    latency: Duration,
}

/// A running proxy; dropping it stops accepting connections.
pub struct FaultProxy {
    pub endpoint: String,
    plan: Arc<Mutex<Plan>>,
    /// How long a stalled request is kept (longer than the client's attempt timeout); a held
    /// one is kept 2.5 times as long.
    pub hold: Duration,
    /// Held requests not forwarded yet.
    held: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(p: &Mutex<Plan>) -> MutexGuard<'_, Plan> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream_port` on loopback.
    pub async fn start(upstream_port: u16, hold: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let plan = Arc::new(Mutex::new(Plan::default()));
        let held = Arc::new(AtomicUsize::new(0));
        let shared = Arc::clone(&plan);
        let counter = Arc::clone(&held);
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    break;
                };
                let plan = Arc::clone(&shared);
                let held = Arc::clone(&counter);
                tokio::spawn(async move {
                    let _ = handle(conn, upstream_port, plan, hold, held).await;
                });
            }
        });
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            plan,
            hold,
            held,
            task,
        }
    }

    /// Requests seen so far.
    pub fn count(&self) -> u64 {
        lock(&self.plan).count
    }

    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.plan).seen.clone()
    }

    /// Applies `fault` to the request numbered `n` (counting from 0 since the proxy started).
    pub fn at(&self, n: u64, fault: Fault) {
        lock(&self.plan).at.insert(n, fault);
    }

    /// Applies `fault` to the next `times` requests of kind `op` whose target contains
    /// `needle`.
    pub fn next(&self, op: Op, needle: &str, fault: Fault, times: usize) {
        self.next_after(op, needle, 0, fault, times);
    }

    /// Like [`FaultProxy::next`], after letting `skip` matching requests pass.
    pub fn next_after(&self, op: Op, needle: &str, skip: usize, fault: Fault, times: usize) {
        lock(&self.plan)
            .next
            .push_back((op, needle.to_owned(), fault, skip, times));
    }

    /// Applies `fault` to every request of kind `op` whose target contains `needle` until
    /// [`FaultProxy::clear`].
    pub fn always(&self, op: Op, needle: &str, fault: Fault) {
        lock(&self.plan).always.push((op, needle.to_owned(), fault));
    }

    /// Delays every request by `latency` before it is forwarded, as a store across a
    /// network would answer; faults still apply.
    pub fn set_latency(&self, latency: Duration) {
        lock(&self.plan).latency = latency;
    }

    /// No more faults.
    pub fn clear(&self) {
        let mut p = lock(&self.plan);
        p.at.clear();
        p.next.clear();
        p.always.clear();
    }

    /// Waits until every held request has been forwarded (and has landed).
    pub async fn settle(&self) {
        while self.held.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn classify(method: &str, target: &str) -> Op {
    let path = target.split('?').next().unwrap_or("");
    // Path style: `/bucket` (bucket operations) or `/bucket/key...`.
    let has_key = path.trim_start_matches('/').contains('/');
    match method {
        "GET" if target.contains("list-type=2") || !has_key => Op::List,
        "GET" => Op::Get,
        "PUT" => Op::Put,
        "DELETE" => Op::Delete,
        "HEAD" => Op::Head,
        _ => Op::Other,
    }
}

fn decide(plan: &Mutex<Plan>, op: Op, target: &str) -> Option<Fault> {
    // Listings carry their prefix percent-encoded; matching is on the plain text.
    let target = &target.replace("%2F", "/").replace("%2f", "/");
    let mut p = lock(plan);
    let n = p.count;
    p.count += 1;
    let mut fault = p.at.remove(&n);
    if fault.is_none() {
        fault = p
            .always
            .iter()
            .find(|(o, needle, _)| *o == op && target.contains(needle.as_str()))
            .map(|(_, _, f)| *f);
    }
    // Every planned fault counts its own matches.
    let mut done = Vec::new();
    for (i, entry) in p.next.iter_mut().enumerate() {
        if entry.0 != op || !target.contains(entry.1.as_str()) {
            continue;
        }
        if entry.3 > 0 {
            entry.3 -= 1;
        } else if fault.is_none() {
            fault = Some(entry.2);
            entry.4 = entry.4.saturating_sub(1);
            if entry.4 == 0 {
                done.push(i);
            }
        }
    }
    for i in done.into_iter().rev() {
        p.next.remove(i);
    }
    // Reordering means nothing for anything but a listing.
    if fault == Some(Fault::Shuffle) && op != Op::List {
        fault = None;
    }
    p.seen.push(Seen {
        n,
        op,
        target: target.to_owned(),
        fault,
    });
    fault
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads one request (head and a `Content-Length` body); `None` on a closed connection.
async fn read_request(conn: &mut TcpStream) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut length = 0usize;
    let mut expect = false;
    for line in head.lines().skip(1) {
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
            if k.eq_ignore_ascii_case("expect") {
                expect = true;
            }
        }
    }
    if expect {
        conn.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        body.extend_from_slice(&chunk[..n]);
    }
    // The head is re-sent with `Connection: close` and without `Expect`.
    let mut rewritten = String::new();
    for (i, line) in head.trim_end().lines().enumerate() {
        let lower = line.to_ascii_lowercase();
        if i > 0 && (lower.starts_with("connection:") || lower.starts_with("expect:")) {
            continue;
        }
        rewritten.push_str(line);
        rewritten.push_str("\r\n");
    }
    rewritten.push_str("Connection: close\r\n\r\n");
    Ok(Some((rewritten, body)))
}

async fn forward(port: u16, head: &str, body: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut up = TcpStream::connect(("127.0.0.1", port)).await?;
    up.write_all(head.as_bytes()).await?;
    up.write_all(body).await?;
    let mut out = Vec::new();
    up.read_to_end(&mut out).await?;
    Ok(out)
}

/// The answer with `Connection: close`, so the client opens a new connection next time.
fn close_after(resp: &[u8]) -> Vec<u8> {
    let Some(end) = find(resp, b"\r\n\r\n") else {
        return resp.to_vec();
    };
    let head = String::from_utf8_lossy(&resp[..end]);
    let mut out = String::new();
    for (i, line) in head.lines().enumerate() {
        if i > 0 && line.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&resp[end + 4..]);
    bytes
}

fn error_answer(status: u16, reason: &str) -> Vec<u8> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{}</Code><Message>injected fault</Message></Error>",
        if status == 503 {
            "ServiceUnavailable"
        } else {
            "InternalError"
        }
    );
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The listing with its `<Contents>` blocks reversed and rotated by one; the rest as is.
fn reorder(resp: &[u8]) -> Vec<u8> {
    let Some(end) = find(resp, b"\r\n\r\n") else {
        return resp.to_vec();
    };
    let body = String::from_utf8_lossy(&resp[end + 4..]).into_owned();
    let (Some(first), Some(last)) = (body.find("<Contents>"), body.rfind("</Contents>")) else {
        return resp.to_vec();
    };
    let last = last + "</Contents>".len();
    let mut blocks: Vec<String> = body[first..last]
        .split_inclusive("</Contents>")
        .map(str::to_owned)
        .collect();
    blocks.reverse();
    if blocks.len() > 2 {
        blocks.rotate_left(1);
    }
    let new_body = format!("{}{}{}", &body[..first], blocks.concat(), &body[last..]);
    let head = String::from_utf8_lossy(&resp[..end]);
    let mut out = String::new();
    for line in head.lines() {
        if line.to_ascii_lowercase().starts_with("content-length:") {
            out.push_str(&format!("Content-Length: {}\r\n", new_body.len()));
        } else {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("\r\n");
    out.push_str(&new_body);
    out.into_bytes()
}

async fn handle(
    mut conn: TcpStream,
    upstream: u16,
    plan: Arc<Mutex<Plan>>,
    hold: Duration,
    held: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let Some((head, body)) = read_request(&mut conn).await? else {
        return Ok(());
    };
    let mut parts = head.split_whitespace();
    let method = parts.next().unwrap_or("").to_owned();
    let target = parts.next().unwrap_or("").to_owned();
    let op = classify(&method, &target);
    let latency = lock(&plan).latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    match decide(&plan, op, &target) {
        None => {
            let resp = forward(upstream, &head, &body).await?;
            conn.write_all(&close_after(&resp)).await?;
        }
        Some(Fault::Refuse) => {
            conn.write_all(&error_answer(503, "Service Unavailable"))
                .await?;
        }
        Some(Fault::FailAfter) => {
            forward(upstream, &head, &body).await?;
            conn.write_all(&error_answer(500, "Internal Server Error"))
                .await?;
        }
        Some(Fault::Drop) => {
            forward(upstream, &head, &body).await?;
            // Closing with unread data pending makes the client see a reset, not an answer.
            drop(conn);
        }
        Some(Fault::Stall) => {
            forward(upstream, &head, &body).await?;
            tokio::time::sleep(hold).await;
        }
        Some(Fault::Late) => {
            // The client gives up while the request is held (and has its retry and a
            // read-back answered meanwhile); it lands afterwards.
            held.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(hold * 5 / 2).await;
            drop(conn);
            let landed = forward(upstream, &head, &body).await;
            held.fetch_sub(1, Ordering::SeqCst);
            landed?;
        }
        Some(Fault::Shuffle) => {
            let resp = forward(upstream, &head, &body).await?;
            conn.write_all(&close_after(&reorder(&resp))).await?;
        }
    }
    Ok(())
}
