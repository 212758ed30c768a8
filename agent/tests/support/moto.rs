//! A real S3-compatible server for tests: the harness's moto server
//! (`cairn_tests::harness::S3Server`; `pip install 'moto[server]'`, done by `.ci/install.sh`),
//! started on a free port with [`BUCKET`] and stopped on drop — also when the test process
//! dies, like every harness process.

use std::net::TcpListener;
use std::thread;
use std::time::Duration;

use cairn_agent::aws::AwsIdentity;
use cairn_agent::ccr::{S3Config, S3Timeouts};
use cairn_tests::harness::S3Server;

pub const BUCKET: &str = "cairn-test";

pub struct Moto {
    pub endpoint: String,
    pub port: u16,
    _server: S3Server,
    _logs: tempfile::TempDir,
}

impl Moto {
    /// Starts moto, waits until it answers and creates [`BUCKET`].
    pub async fn start() -> Self {
        let logs = tempfile::tempdir().expect("log dir");
        let server = S3Server::start(logs.path(), &[BUCKET])
            .unwrap_or_else(|e| panic!("{e} (run .ci/install.sh to install moto[server])"));
        Self {
            endpoint: server.endpoint.clone(),
            port: server.port,
            _server: server,
            _logs: logs,
        }
    }

    /// Settings pointing at this server, with short timeouts.
    pub fn config(&self) -> S3Config {
        config_for(&self.endpoint, fast_timeouts())
    }
}

pub fn config_for(endpoint: &str, timeouts: S3Timeouts) -> S3Config {
    S3Config {
        bucket: BUCKET.into(),
        endpoint: Some(endpoint.into()),
        region: "us-east-1".into(),
        force_path_style: true,
        net: Default::default(),
        credentials: AwsIdentity::fixed("testing", "testing", None),
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
