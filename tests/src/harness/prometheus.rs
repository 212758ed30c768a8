//! A real Prometheus (Debian's `prometheus` package, which `.ci/install.sh` installs) on
//! loopback, scraping a fixed list of targets every second, and its query API.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::HarnessError;
use super::proc::{Proc, free_port, wait_until};

/// One scrape target: where Prometheus reaches it and the labels its series get (what
/// Prometheus Operator would attach: `job`, `namespace`, `pod`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct ScrapeTarget {
    pub job: String,
    pub addr: SocketAddr,
    pub path: String,
    pub labels: BTreeMap<String, String>,
}

pub struct Prometheus {
    pub addr: SocketAddr,
    proc: Proc,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` every second (one scrape job per `job`; the
    /// targets of a job share its path).
    pub fn start(dir: &Path, targets: &[ScrapeTarget]) -> Result<Self, HarnessError> {
        let dir = dir.join("prometheus");
        std::fs::create_dir_all(dir.join("data"))
            .map_err(|e| HarnessError::io(format!("creating {}", dir.display()), e))?;
        let mut jobs: BTreeMap<&str, Vec<&ScrapeTarget>> = BTreeMap::new();
        for t in targets {
            jobs.entry(&t.job).or_default().push(t);
        }
        let scrape_configs: Vec<serde_json::Value> = jobs
            .iter()
            .map(|(job, ts)| {
                serde_json::json!({
                    "job_name": job,
                    "metrics_path": ts[0].path,
                    "static_configs": ts.iter().map(|t| serde_json::json!({
                        "targets": [t.addr.to_string()],
                        "labels": t.labels,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let config = serde_json::json!({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": scrape_configs,
        });
        let path = dir.join("prometheus.yml");
        let text = serde_yaml::to_string(&config)
            .map_err(|e| HarnessError::Setup(format!("prometheus.yml: {e}")))?;
        std::fs::write(&path, text)
            .map_err(|e| HarnessError::io(format!("writing {}", path.display()), e))?;
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut cmd = Command::new(super::prometheus_tool("prometheus")?);
        cmd.arg(format!("--config.file={}", path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"));
        let log = dir.join("prometheus.log");
        let mut proc = Proc::spawn("prometheus", cmd, &log)?;
        wait_until(
            "Prometheus to be ready",
            Duration::from_secs(60),
            &mut [&mut proc],
            || get(addr, "/-/ready").is_ok_and(|(status, _)| status == 200),
        )?;
        Ok(Self { addr, proc })
    }

    /// The result of an instant query: its series (`[]` when it returned none).
    pub fn query(&mut self, expr: &str) -> Result<Vec<serde_json::Value>, HarnessError> {
        self.proc.check_alive()?;
        let url = reqwest::Url::parse_with_params(
            &format!("http://{}/api/v1/query", self.addr),
            &[("query", expr)],
        )
        .map_err(|e| HarnessError::Setup(format!("query URL: {e}")))?;
        let target = format!("{}?{}", url.path(), url.query().unwrap_or_default());
        let (status, body) = get(self.addr, &target)?;
        let answer: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| HarnessError::Setup(format!("{expr}: not JSON ({e}): {body}")))?;
        if status != 200 || answer["status"] != "success" {
            return Err(HarnessError::Setup(format!(
                "{expr}: HTTP {status}: {body}"
            )));
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

/// One HTTP/1.0 GET: the status and the body.
fn get(addr: SocketAddr, target: &str) -> Result<(u16, String), HarnessError> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| HarnessError::io("connecting to prometheus", e))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| HarnessError::io("prometheus socket", e))?;
    write!(s, "GET {target} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        .map_err(|e| HarnessError::io("writing to prometheus", e))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| HarnessError::io("reading from prometheus", e))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| HarnessError::Setup(format!("bad HTTP answer from prometheus: {head}")))?;
    Ok((status, body.to_string()))
}
