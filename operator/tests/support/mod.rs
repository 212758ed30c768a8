//! Helpers the operator's cluster tests share.

use std::future::Future;
use std::time::Duration;

use cairn_crds::AgentSession;

/// Polls `probe` every 250 ms until it gives a value; fails the test after `wait`.
pub async fn eventually<T, F, Fut>(wait: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Status and reason of the session's condition `kind`.
pub fn condition(s: &AgentSession, kind: &str) -> Option<(String, String)> {
    s.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status.clone(), c.reason.clone()))
}
