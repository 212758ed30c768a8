//! A real S3-compatible server for the archive and journal: moto's server mode (PyPI
//! `moto[server]`, installed by `.ci/install.sh`). It honours `If-None-Match`, unlike some
//! self-hosted stores; cairn's fencing does not rely on that either way.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::HarnessError;
use super::proc::{Proc, free_port, wait_until};

/// Credentials moto accepts (it accepts any; these are what the harness hands out).
pub const ACCESS_KEY_ID: &str = "cairn-harness";
pub const SECRET_ACCESS_KEY: &str = "cairn-harness-secret";
pub const REGION: &str = "us-east-1";

pub struct S3Server {
    pub endpoint: String,
    pub port: u16,
    proc: Proc,
}

impl S3Server {
    /// Starts moto on a free loopback port and creates `buckets`.
    pub fn start(log_dir: &Path, buckets: &[&str]) -> Result<Self, HarnessError> {
        let port = free_port()?;
        let mut cmd = Command::new("python3");
        cmd.args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ]);
        let log = log_dir.join("s3.log");
        let mut proc = Proc::spawn("s3 (moto)", cmd, &log)?;
        // Ready when this moto says it listens on the port and the port answers: a free port
        // can be taken by another test's server between probing and binding, and that
        // server answering must not count as this one (it would vanish with its test).
        let running = format!("Running on http://127.0.0.1:{port}");
        wait_until(
            "the S3 server (moto)",
            Duration::from_secs(60),
            &mut [&mut proc],
            || {
                std::fs::read_to_string(&log).is_ok_and(|l| l.contains(&running))
                    && http(port, "GET", "/").is_ok()
            },
        )?;
        let server = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            proc,
        };
        for b in buckets {
            server.create_bucket(b)?;
        }
        Ok(server)
    }

    pub fn create_bucket(&self, bucket: &str) -> Result<(), HarnessError> {
        let status = http(self.port, "PUT", &format!("/{bucket}"))?;
        if status != 200 {
            return Err(HarnessError::Setup(format!(
                "creating bucket {bucket}: HTTP {status}"
            )));
        }
        Ok(())
    }

    /// Object keys under `prefix` in `bucket` (first 1000), for assertions.
    pub fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, HarnessError> {
        let body = http_body(
            self.port,
            "GET",
            &format!("/{bucket}?list-type=2&prefix={prefix}"),
        )?;
        Ok(body
            .split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next())
            .map(str::to_string)
            .collect())
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }
}

fn request(port: u16, method: &str, path: &str) -> Result<String, HarnessError> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .map_err(|e| HarnessError::io("connecting to S3", e))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| HarnessError::io("S3 socket", e))?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .map_err(|e| HarnessError::io("writing to S3", e))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| HarnessError::io("reading from S3", e))?;
    Ok(out)
}

fn http(port: u16, method: &str, path: &str) -> Result<u16, HarnessError> {
    let resp = request(port, method, path)?;
    resp.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| HarnessError::Setup(format!("bad HTTP answer from S3: {resp:.200}")))
}

fn http_body(port: u16, method: &str, path: &str) -> Result<String, HarnessError> {
    let resp = request(port, method, path)?;
    Ok(resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}
