//! A real browser: Debian's Chromium, headless, driven over WebDriver by its own
//! `chromedriver` (packages `chromium` and `chromium-driver`, which `.ci/install.sh`
//! installs). The session page's tests load it from real agents and read what it rendered.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use serde_json::json;

use super::HarnessError;
use super::proc::{Proc, free_port};

/// A headless Chromium behind its chromedriver; both stop when this is dropped.
pub struct Browser {
    pub client: Client,
    _driver: Proc,
}

/// The Chromium binary Debian installs.
const CHROMIUM: &str = "/usr/bin/chromium";

impl Browser {
    /// Starts chromedriver (log in `dir`) and one headless Chromium session, 1280×1000.
    pub async fn start(dir: &Path) -> Result<Self, HarnessError> {
        if !Path::new(CHROMIUM).exists() {
            return Err(HarnessError::Setup(format!(
                "{CHROMIUM} is missing: apt-get install chromium chromium-driver (.ci/install.sh does)"
            )));
        }
        let port = free_port()?;
        let mut cmd = Command::new("chromedriver");
        cmd.arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1");
        let mut driver = Proc::spawn("chromedriver", cmd, &dir.join("chromedriver.log"))?;
        let url = format!("http://127.0.0.1:{port}");
        let profile = dir.join("chromium-profile");
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    // Root in a container has no user namespace for Chromium's sandbox.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--window-size=1280,1000",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        let client = loop {
            driver.check_alive()?;
            match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                // chromedriver or Chromium is still starting.
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    return Err(HarnessError::Timeout {
                        what: format!("a Chromium session from chromedriver at {url}: {e}"),
                        after: Duration::from_secs(60),
                        logs: super::proc::tail(&dir.join("chromedriver.log")),
                    });
                }
            }
        };
        Ok(Self {
            client,
            _driver: driver,
        })
    }

    /// What `script` (a JavaScript function body) returns in the page.
    pub async fn eval(&self, script: &str) -> Result<serde_json::Value, HarnessError> {
        self.client
            .execute(script, vec![])
            .await
            .map_err(|e| HarnessError::Setup(format!("{script}: {e}")))
    }

    /// Waits until `script` returns something truthy in the page (for at most `within`) and
    /// returns it; on time-out, the error shows what the page says.
    pub async fn until(
        &self,
        what: &str,
        script: &str,
        within: Duration,
    ) -> Result<serde_json::Value, HarnessError> {
        let deadline = Instant::now() + within;
        loop {
            let v = self.eval(script).await?;
            let falsy = v.is_null()
                || v == json!(false)
                || v == json!(0)
                || v == json!("")
                || v.as_array().is_some_and(Vec::is_empty);
            if !falsy {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                let text = self.eval("return document.body.innerText").await?;
                return Err(HarnessError::Timeout {
                    what: what.to_owned(),
                    after: within,
                    logs: format!("the page shows: {text}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A PNG of the window as it is now.
    pub async fn screenshot(&self) -> Result<Vec<u8>, HarnessError> {
        self.client
            .screenshot()
            .await
            .map_err(|e| HarnessError::Setup(format!("screenshot: {e}")))
    }
}
