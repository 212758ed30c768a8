//! An S3 server that enforces IAM and session policies: SeaweedFS (`weed mini`, Apache-2.0,
//! built by `tests/harness/build-seaweedfs.sh`) with its STS endpoint and IAM policy engine
//! on. moto accepts any credentials and ignores an `AssumeRole` session policy, so tests of
//! what scoped credentials may reach run here.
//!
//! The server has one static admin identity (the key pair an operator holds), one role
//! (`ROLE_ARN`) the admin may assume, whose attached policy allows every S3 action on every
//! bucket, and the buckets asked for. Everything listens on loopback; the data lives in a
//! directory of the run.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::HarnessError;
use super::proc::{Proc, free_port, wait_until};

/// The admin identity's key pair (a static identity of the server, allowed everything).
pub const ADMIN_ACCESS_KEY_ID: &str = "cairnadmin";
pub const ADMIN_SECRET_ACCESS_KEY: &str = "cairn-admin-secret-key";
/// The role the admin assumes for scoped credentials.
pub const ROLE_ARN: &str = "arn:aws:iam::000000000000:role/cairn-archive";
pub const REGION: &str = "us-east-1";
/// The account SeaweedFS gives every static identity.
const ACCOUNT: &str = "000000000000";
const ADMIN_NAME: &str = "cairn-admin";

/// How to configure the server.
#[derive(Clone, Debug, Default)]
pub struct SeaweedOptions {
    /// Caps every STS session at this lifetime (whatever `DurationSeconds` asks; STS refuses
    /// less than 900), so a test can watch credentials expire.
    pub max_session: Option<Duration>,
}

pub struct SeaweedFs {
    /// The S3 (and STS) endpoint.
    pub endpoint: String,
    pub port: u16,
    pub dir: PathBuf,
    proc: Proc,
}

impl SeaweedFs {
    /// Starts `weed mini` on free loopback ports with `buckets` created. Ready once the S3
    /// gateway of this process logged its port, answers on it, and the filer holds every
    /// bucket.
    pub fn start(
        log_dir: &Path,
        buckets: &[&str],
        options: &SeaweedOptions,
    ) -> Result<Self, HarnessError> {
        let weed = super::built_paths("build-seaweedfs.sh")?.get("weed")?;
        let dir = log_dir.join("seaweedfs");
        std::fs::create_dir_all(dir.join("data"))
            .map_err(|e| HarnessError::io(format!("creating {}", dir.display()), e))?;
        let write = |name: &str, value: serde_json::Value| {
            let path = dir.join(name);
            std::fs::write(&path, value.to_string())
                .map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))
                .map(|()| path)
        };
        let s3_config = write("s3.json", identities())?;
        let iam_config = write("iam.json", iam(options))?;

        // Every listener on a port of its own: the defaults are fixed ports, which two
        // servers of parallel tests would share.
        let mut ports = Vec::new();
        for _ in 0..10 {
            ports.push(free_port()?);
        }
        let [
            master,
            master_grpc,
            volume,
            volume_grpc,
            filer,
            filer_grpc,
            s3,
            s3_grpc,
            admin,
            admin_grpc,
        ] = ports[..]
        else {
            return Err(HarnessError::Setup("free ports".into()));
        };
        let mut cmd = Command::new(&weed);
        cmd.arg("mini").args([
            format!("-dir={}", dir.join("data").display()),
            // A fixed number of volumes: left to itself, `mini` sizes them from the free disk
            // space and, with less than one volume's worth free, has none to write to (every
            // PUT then waits for capacity until it times out).
            "-volume.max=32".into(),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-master.port={master}"),
            format!("-master.port.grpc={master_grpc}"),
            "-master.telemetry=false".into(),
            format!("-volume.port={volume}"),
            format!("-volume.port.grpc={volume_grpc}"),
            format!("-filer.port={filer}"),
            format!("-filer.port.grpc={filer_grpc}"),
            format!("-filer.localSocket={}", dir.join("filer.sock").display()),
            format!("-s3.port={s3}"),
            format!("-s3.port.grpc={s3_grpc}"),
            format!("-s3.localSocket={}", dir.join("s3.sock").display()),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            format!("-s3.config={}", s3_config.display()),
            format!("-s3.iam.config={}", iam_config.display()),
            format!("-bucket={}", buckets.join(",")),
            "-webdav=false".into(),
            "-admin.ui=false".into(),
            format!("-admin.port={admin}"),
            format!("-admin.port.grpc={admin_grpc}"),
            "-admin.port.legacy=0".into(),
            format!("-admin.dataDir={}", dir.join("admin").display()),
        ]);
        // Its own working directory: nothing lands in the caller's.
        cmd.current_dir(&dir);
        let log = log_dir.join("seaweedfs.log");
        let mut proc = Proc::spawn("s3 (seaweedfs)", cmd, &log)?;
        wait_until(
            "the S3 server (seaweedfs)",
            Duration::from_secs(90),
            &mut [&mut proc],
            || {
                // This process says everything runs and names its S3 port (another test's
                // server that took a probed port first must not count), the port gives an
                // S3 answer (an anonymous request is refused), and every bucket is present
                // in this server's filer.
                std::fs::read_to_string(&log).is_ok_and(|l| {
                    l.contains("All enabled components are running")
                        && l.contains(&format!("http://127.0.0.1:{s3}"))
                }) && status(s3, "GET", "/").is_ok_and(|c| c == 403)
                    && buckets.iter().all(|b| {
                        status(filer, "GET", &format!("/buckets/{b}/")).is_ok_and(|c| c == 200)
                    })
            },
        )?;
        Ok(Self {
            endpoint: format!("http://127.0.0.1:{s3}"),
            port: s3,
            dir,
            proc,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }
}

/// The static identity of the admin.
fn identities() -> serde_json::Value {
    serde_json::json!({
        "identities": [{
            "name": ADMIN_NAME,
            "credentials": [{"accessKey": ADMIN_ACCESS_KEY_ID, "secretKey": ADMIN_SECRET_ACCESS_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]
    })
}

/// STS, a deny-by-default policy engine, the role and its policy.
fn iam(options: &SeaweedOptions) -> serde_json::Value {
    use base64::Engine as _;
    let key: [u8; 32] = std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(11));
    let mut sts = serde_json::json!({
        "tokenDuration": "1h",
        "maxSessionLength": "12h",
        "issuer": "cairn-harness-sts",
        "accountId": ACCOUNT,
        "signingKey": base64::engine::general_purpose::STANDARD.encode(key),
    });
    if let Some(max) = options.max_session {
        sts["maxSessionLength"] = format!("{}s", max.as_secs().max(1)).into();
    }
    serde_json::json!({
        "sts": sts,
        "policy": {"defaultEffect": "Deny"},
        "policies": [{
            "name": "cairn-archive-full",
            "document": {
                "Version": "2012-10-17",
                "Statement": [{
                    "Effect": "Allow",
                    "Action": ["s3:*"],
                    "Resource": ["arn:aws:s3:::*", "arn:aws:s3:::*/*"],
                }],
            },
        }],
        "roles": [{
            "roleName": "cairn-archive",
            "roleArn": ROLE_ARN,
            "attachedPolicies": ["cairn-archive-full"],
            "trustPolicy": {
                "Version": "2012-10-17",
                "Statement": [{
                    "Effect": "Allow",
                    "Principal": {"AWS": format!("arn:aws:iam::{ACCOUNT}:user/{ADMIN_NAME}")},
                    "Action": ["sts:AssumeRole"],
                }],
            },
        }],
    })
}

fn status(port: u16, method: &str, path: &str) -> Result<u16, HarnessError> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .map_err(|e| HarnessError::io("connecting to seaweedfs", e))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| HarnessError::io("seaweedfs socket", e))?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .map_err(|e| HarnessError::io("writing to seaweedfs", e))?;
    let mut head = [0u8; 64];
    let n = s
        .read(&mut head)
        .map_err(|e| HarnessError::io("reading from seaweedfs", e))?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| HarnessError::Setup(format!("bad HTTP answer from seaweedfs: {line}")))
}
