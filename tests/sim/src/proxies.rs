//! The corporate network path's real middleboxes, each run on a free loopback port from a
//! temp dir and stopped when dropped:
//! - [`Squid`], a forward proxy (Debian's squid): plain `http://` requests are forwarded and
//!   refused with its own 413 page above `request_body_max_size`; `https://` goes through
//!   CONNECT tunnels. Its access log shows what passed.
//! - [`Mitm`], mitmproxy's `mitmdump` in reverse mode: TLS terminated with a certificate of
//!   mitmproxy's own CA (a TLS-inspecting proxy's view), forwarded to a plain-HTTP upstream.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0} is not installed ({1}); run .ci/install.sh")]
    NotInstalled(&'static str, String),
    #[error("{0} could not start: {1}")]
    Start(&'static str, String),
    #[error("temp dir: {0}")]
    Io(#[from] std::io::Error),
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_listening(
    child: &mut Child,
    port: u16,
    what: &'static str,
    log: &Path,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "{what} exited with {status}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            ));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "{what} not listening after 30s: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    ))
}

/// A running squid.
pub struct Squid {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Squid {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn squid_binary() -> Result<PathBuf, ProxyError> {
    std::env::var_os("SQUID")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            PathBuf::from("/usr/sbin/squid"),
            PathBuf::from("/usr/local/sbin/squid"),
        ])
        .find(|p| p.is_file())
        .ok_or_else(|| ProxyError::NotInstalled("squid", "apt-get install -y squid".into()))
}

impl Squid {
    /// Starts squid; request bodies over `max_body` bytes get its 413.
    pub fn start(max_body: u64) -> Result<Self, ProxyError> {
        let squid = squid_binary()?;
        let dir = tempfile::tempdir()?;
        // squid drops to its own user even when started as root: its files must be
        // writable by that user.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )?;
        let port = free_port()?;
        let d = dir.path().display();
        let conf = dir.path().join("squid.conf");
        std::fs::write(
            &conf,
            format!(
                "http_port 127.0.0.1:{port}\n\
                 acl local src 127.0.0.1/32\n\
                 http_access allow local\n\
                 http_access deny all\n\
                 request_body_max_size {max_body} bytes\n\
                 cache deny all\n\
                 cache_mem 8 MB\n\
                 pid_filename {d}/squid.pid\n\
                 access_log stdio:{d}/access.log\n\
                 cache_log {d}/cache.log\n\
                 cache_store_log none\n\
                 coredump_dir {d}\n\
                 netdb_filename none\n\
                 dns_nameservers 127.0.0.1\n\
                 shutdown_lifetime 0 seconds\n\
                 forwarded_for delete\n\
                 via off\n"
            ),
        )?;
        let log = dir.path().join("cache.log");
        let mut child = Command::new(&squid)
            .arg("-N")
            .arg("-f")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| ProxyError::Start("squid", format!("{}: {e}", squid.display())))?;
        wait_listening(&mut child, port, "squid", &log)
            .map_err(|e| ProxyError::Start("squid", e))?;
        Ok(Self { child, port, dir })
    }

    /// `http://127.0.0.1:PORT`, for `HTTP_PROXY` / `HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One line per request squid finished (a CONNECT tunnel is logged when it closes).
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    /// Squid's cache-manager report of the connections open now (`uri`, `logType` such as
    /// `TCP_TUNNEL` for a CONNECT tunnel).
    pub fn active_requests(&self) -> String {
        use std::io::{Read, Write};
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = write!(
            s,
            "GET /squid-internal-mgr/active_requests HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            self.port
        );
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }
}

/// A running mitmdump.
pub struct Mitm {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Mitm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `$MITMDUMP`, or the one `tests/harness/install-mitmproxy.sh` installs.
fn mitmdump_binary() -> Result<PathBuf, ProxyError> {
    if let Some(p) = std::env::var_os("MITMDUMP").map(PathBuf::from)
        && p.is_file()
    {
        return Ok(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../harness/install-mitmproxy.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| ProxyError::NotInstalled("mitmproxy", e.to_string()))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && path.is_file() {
        Ok(path)
    } else {
        Err(ProxyError::NotInstalled(
            "mitmproxy",
            format!("{} failed", script.display()),
        ))
    }
}

impl Mitm {
    /// Starts mitmdump terminating TLS for `https://localhost:PORT` and forwarding to
    /// `upstream` over plain HTTP.
    pub fn reverse(upstream: SocketAddr) -> Result<Self, ProxyError> {
        let mitmdump = mitmdump_binary()?;
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let log = dir.path().join("mitmdump.log");
        let out = std::fs::File::create(&log)?;
        let mut child = Command::new(&mitmdump)
            .arg("--mode")
            .arg(format!("reverse:http://{upstream}@127.0.0.1:{port}"))
            .arg("--set")
            .arg(format!("confdir={}", dir.path().display()))
            .arg("--set")
            .arg("connection_strategy=lazy")
            .arg("-q")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .map_err(|e| ProxyError::Start("mitmdump", format!("{}: {e}", mitmdump.display())))?;
        wait_listening(&mut child, port, "mitmdump", &log)
            .map_err(|e| ProxyError::Start("mitmdump", e))?;
        Ok(Self { child, port, dir })
    }

    /// `https://localhost:PORT` (the name mitmproxy's certificate is made for).
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// mitmproxy's CA certificate (PEM): the bundle a client needs to trust it.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("mitmproxy-ca-cert.pem")
    }
}
