//! A real S3-compatible server for tests: moto's standalone server (`pip install
//! 'moto[server]'`, done by `.ci/install.sh`), started on a free port and killed on drop.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use cairn_agent::ccr::{S3Config, S3Credentials, S3Timeouts};

pub const BUCKET: &str = "cairn-test";

pub struct Moto {
    child: Child,
    pub endpoint: String,
    pub port: u16,
}

impl Moto {
    /// Starts moto, waits until it answers and creates [`BUCKET`].
    pub async fn start() -> Self {
        let port = free_port();
        let child = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m moto.server (run .ci/install.sh to install moto[server])");
        let moto = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
        };
        moto.wait_ready(Duration::from_secs(60));
        let client = moto.config().client().expect("client");
        client
            .create_bucket()
            .bucket(BUCKET)
            .send()
            .await
            .expect("create bucket");
        moto
    }

    fn wait_ready(&self, limit: Duration) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let req = "GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
                let mut buf = [0u8; 12];
                if s.write_all(req.as_bytes()).is_ok()
                    && s.read_exact(&mut buf).is_ok()
                    && buf.starts_with(b"HTTP/")
                {
                    return;
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("moto did not become ready on port {}", self.port);
    }

    /// Settings pointing at this server, with short timeouts.
    pub fn config(&self) -> S3Config {
        config_for(&self.endpoint, fast_timeouts())
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn config_for(endpoint: &str, timeouts: S3Timeouts) -> S3Config {
    S3Config {
        bucket: BUCKET.into(),
        endpoint: Some(endpoint.into()),
        region: "us-east-1".into(),
        force_path_style: true,
        credentials: S3Credentials {
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
            session_token: None,
        },
        timeouts,
    }
}

pub fn fast_timeouts() -> S3Timeouts {
    S3Timeouts {
        connect: Duration::from_secs(1),
        attempt: Duration::from_secs(2),
        operation: Duration::from_secs(5),
        max_attempts: 2,
        initial_backoff: Duration::from_millis(50),
    }
}

/// A port nothing listens on (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A server that accepts connections and never answers: a store that hangs. Connections are
/// held open until the test process exits.
pub struct Stalled {
    pub endpoint: String,
}

impl Stalled {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                match conn {
                    Ok(c) => held.push(c),
                    Err(_) => break,
                }
            }
        });
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }
}
