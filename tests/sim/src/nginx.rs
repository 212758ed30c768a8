//! A real nginx in front of an upstream (usually cairn-sim), the middlebox of payload tests.
//!
//! It runs unprivileged paths only: its own prefix, config, pid file, logs and temp
//! directories live in a temp dir, it listens on a free loopback port and stops when the
//! [`Middlebox`] is dropped. Locations (each proxies to the upstream with the prefix
//! stripped):
//! - `/limit/`: `client_max_body_size` as configured, so bigger bodies get nginx's genuine
//!   413 HTML page;
//! - `/waf/`: bodies of `block_at` bytes or more get a 403 HTML block page, WAF-style;
//! - `/reset/`: bodies of `block_at` bytes or more get the connection closed with no answer
//!   (`return 444`);
//! - `/throttle/` and `/unavailable/`: every request gets nginx's own 429 or 503 page with
//!   `Retry-After: 7`, as a gateway's rate limit or maintenance answers
//!   ([`MIDDLEBOX_RETRY_AFTER`]);
//! - `/portal/`: every request gets 200 with an HTML login page ([`PORTAL_PAGE`]), as a
//!   captive portal answers in the upstream's place;
//! - `/`: plain proxy.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The HTML page the `/waf/` location answers with.
pub const BLOCK_PAGE: &str = "<!DOCTYPE html><html><head><title>Request Rejected</title></head>\
<body><h1>Request Rejected</h1><p>The requested URL was rejected. Please consult with your \
administrator.</p><p>Your support ID is: 7265739281726</p></body></html>";

/// The HTML page the `/portal/` location answers with, status 200.
pub const PORTAL_PAGE: &str = "<!DOCTYPE html><html><head><title>Wi-Fi Login</title></head>\
<body><h1>Welcome</h1><p>Please accept the terms of use to continue.</p>\
<form method=\"post\" action=\"/login\"><button>Accept</button></form></body></html>";

/// The `Retry-After` seconds of `/throttle/` and `/unavailable/`.
pub const MIDDLEBOX_RETRY_AFTER: u64 = 7;

#[derive(Debug, thiserror::Error)]
pub enum NginxError {
    #[error(
        "nginx is not installed and installing it failed ({0}); install it with \
         `apt-get install -y nginx-light` (or run .ci/install.sh), or set NGINX to its path"
    )]
    NotInstalled(String),
    #[error("nginx could not start: {0}")]
    Start(String),
    #[error("nginx temp dir: {0}")]
    Io(#[from] std::io::Error),
}

/// What the middlebox enforces.
#[derive(Clone, Debug)]
pub struct MiddleboxConfig {
    /// `client_max_body_size` of `/limit/`, in nginx syntax (`64k`, `1m`).
    pub limit: String,
    /// Body size in bytes from which `/waf/` answers 403 and `/reset/` drops the connection.
    pub block_at: u64,
}

impl Default for MiddleboxConfig {
    fn default() -> Self {
        Self {
            limit: "64k".into(),
            block_at: 100_000,
        }
    }
}

/// A running nginx; dropping it stops the process.
pub struct Middlebox {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Middlebox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

static INSTALL: Mutex<()> = Mutex::new(());

/// Finds nginx (`$NGINX`, `PATH`, `/usr/sbin/nginx`), installing `nginx-light` with apt when
/// it is missing.
pub fn nginx_binary() -> Result<PathBuf, NginxError> {
    if let Some(p) = find_nginx() {
        return Ok(p);
    }
    let _guard = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = find_nginx() {
        return Ok(p);
    }
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
    };
    let installed = apt(&[
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "nginx-light",
    ]);
    let ok = match installed {
        Ok(o) if o.status.success() => true,
        _ => {
            let _ = apt(&["update", "-qq"]);
            matches!(
                apt(&["install", "-y", "-qq", "--no-install-recommends", "nginx-light"]),
                Ok(o) if o.status.success()
            )
        }
    };
    match (ok, find_nginx()) {
        (true, Some(p)) => Ok(p),
        (true, None) => Err(NginxError::NotInstalled(
            "apt-get succeeded but no nginx binary was found".into(),
        )),
        (false, _) => Err(NginxError::NotInstalled(
            "apt-get install nginx-light failed".into(),
        )),
    }
}

fn find_nginx() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NGINX").map(PathBuf::from)
        && p.is_file()
    {
        return Some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// A regex matching decimal integers (no leading zeros) `>= n`: nginx's `map` has no
/// numeric comparison.
pub fn at_least_regex(n: u64) -> String {
    let digits: Vec<u8> = n.to_string().bytes().map(|b| b - b'0').collect();
    let len = digits.len();
    let mut alts = vec![format!("[1-9][0-9]{{{len},}}")];
    for i in 0..len {
        let d = digits[i];
        let low = d + 1;
        if low <= 9 {
            let prefix: String = digits[..i].iter().map(|d| char::from(b'0' + d)).collect();
            let rest = len - i - 1;
            alts.push(format!("{prefix}[{low}-9][0-9]{{{rest}}}"));
        }
    }
    alts.push(n.to_string());
    format!("^({})$", alts.join("|"))
}

fn config(dir: &Path, port: u16, upstream: SocketAddr, cfg: &MiddleboxConfig) -> String {
    let d = dir.display();
    let big = at_least_regex(cfg.block_at);
    let limit = &cfg.limit;
    let page = BLOCK_PAGE.replace('\'', "\\'");
    let portal = PORTAL_PAGE.replace('\'', "\\'");
    let wait = MIDDLEBOX_RETRY_AFTER;
    format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    default_type application/octet-stream;
    proxy_http_version 1.1;
    proxy_buffering off;
    proxy_read_timeout 300s;
    map $content_length $cairn_big {{
        default 0;
        "~{big}" 1;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 1024m;
        location /limit/ {{
            client_max_body_size {limit};
            proxy_pass http://{upstream}/;
        }}
        location /waf/ {{
            default_type text/html;
            if ($cairn_big) {{
                return 403 '{page}';
            }}
            proxy_pass http://{upstream}/;
        }}
        location /reset/ {{
            if ($cairn_big) {{
                return 444;
            }}
            proxy_pass http://{upstream}/;
        }}
        location /throttle/ {{
            add_header Retry-After {wait} always;
            return 429;
        }}
        location /unavailable/ {{
            add_header Retry-After {wait} always;
            return 503;
        }}
        location /portal/ {{
            default_type text/html;
            return 200 '{portal}';
        }}
        location / {{
            proxy_pass http://{upstream};
        }}
    }}
}}
"#
    )
}

fn free_port() -> Result<u16, NginxError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Middlebox {
    /// Starts nginx in front of `upstream`.
    pub fn start(upstream: SocketAddr, cfg: &MiddleboxConfig) -> Result<Self, NginxError> {
        let nginx = nginx_binary()?;
        let mut last = String::new();
        // A free port can be taken between probing and nginx binding it; try a few.
        for _ in 0..3 {
            let dir = tempfile::tempdir()?;
            let port = free_port()?;
            let conf = dir.path().join("nginx.conf");
            std::fs::write(&conf, config(dir.path(), port, upstream, cfg))?;
            let errlog = dir.path().join("error.log");
            let child = Command::new(&nginx)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(&errlog)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| NginxError::Start(format!("{}: {e}", nginx.display())))?;
            let mut mb = Self { child, port, dir };
            match mb.wait_ready() {
                Ok(()) => return Ok(mb),
                Err(e) => last = e,
            }
        }
        Err(NginxError::Start(last))
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited with {status}: {}", self.error_log()));
            }
            // The pid file appears only once this nginx has bound its port; checking it rules
            // out a connection answered by another process that took the port first.
            let ours = std::fs::read_to_string(self.dir.path().join("nginx.pid"))
                .is_ok_and(|pid| pid.trim() == self.child.id().to_string());
            if ours && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("not listening after 10s: {}", self.error_log()))
    }

    /// The error log so far (for failure messages).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// The access log so far, one line per request nginx answered.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT` followed by `location` (`/limit`, `/waf`, `/reset` or ``).
    pub fn url(&self, location: &str) -> String {
        format!("http://127.0.0.1:{}{location}", self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_regex_matches_exactly_the_sizes_at_or_above() {
        for n in [
            1u64, 9, 10, 99, 100, 1000, 65_536, 100_000, 123_456, 999_999,
        ] {
            let re = at_least_regex(n);
            for v in [n.saturating_sub(1), n, n + 1, n * 10, n / 2, 0] {
                let s = v.to_string();
                let hit = matches_simple(&re, &s);
                assert_eq!(hit, v >= n && v > 0, "n={n} v={v} re={re}");
            }
        }
    }

    /// Evaluates the alternation of simple `prefix[a-9][0-9]{k}` patterns this module
    /// generates, without a regex engine.
    fn matches_simple(re: &str, s: &str) -> bool {
        let inner = &re[2..re.len() - 2];
        inner.split('|').any(|alt| {
            if let Some(rest) = alt.strip_prefix("[1-9][0-9]{") {
                let min: usize = rest.trim_end_matches(",}").parse().unwrap();
                return s.len() > min && !s.starts_with('0');
            }
            match alt.find('[') {
                None => alt == s,
                Some(i) => {
                    let prefix = &alt[..i];
                    let low = alt.as_bytes()[i + 1];
                    let rest: usize = alt[alt.rfind('{').unwrap() + 1..alt.len() - 1]
                        .parse()
                        .unwrap();
                    s.len() == prefix.len() + 1 + rest
                        && s.starts_with(prefix)
                        && s.as_bytes()[prefix.len()] >= low
                }
            }
        })
    }
}
