//! A total deadline for every call of a provider.
//!
//! The HTTP clients bound the wait for the response headers and each silence between two
//! chunks; a provider that keeps a call alive (a byte at a time, SSE comments, a body that
//! never ends) passes both. [`Deadlined`] bounds the whole call, retries of the client
//! included, the same for every provider and wire format, streamed or not.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{ChatRequest, ChatResponse, DeltaSink, Provider, ProviderError};
use crate::history;

/// The deadline of the next call, read when the call starts (it follows policy edits).
pub type DeadlineFn = Box<dyn Fn() -> Duration + Send + Sync>;

/// `inner`, with every call bounded by `deadline()`.
pub struct Deadlined {
    inner: Arc<dyn Provider>,
    deadline: DeadlineFn,
}

impl Deadlined {
    pub fn new(inner: Arc<dyn Provider>, deadline: DeadlineFn) -> Self {
        Self { inner, deadline }
    }

    /// A call past its deadline fails like a stalled transfer: a transport timeout (which
    /// the classifier takes as a timeout, never as a payload signal).
    fn expired(&self, request: &ChatRequest, deadline: Duration) -> ProviderError {
        let tools: usize = request.tools.iter().map(|t| t.weight()).sum();
        ProviderError::transport(
            self.inner.name(),
            format!(
                "the provider call did not finish within its deadline of {}s (timeouts.providerCallSeconds): timeout",
                deadline.as_secs()
            ),
            (history::weight(&request.messages) + tools) as u64,
        )
    }
}

#[async_trait]
impl Provider for Deadlined {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn send(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        let deadline = (self.deadline)();
        match tokio::time::timeout(deadline, self.inner.send(request)).await {
            Ok(r) => r,
            Err(_) => Err(self.expired(request, deadline)),
        }
    }

    fn render(&self, request: &ChatRequest) -> Result<super::Rendered, Box<ProviderError>> {
        self.inner.render(request)
    }

    async fn send_streaming(
        &self,
        request: &ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let deadline = (self.deadline)();
        match tokio::time::timeout(deadline, self.inner.send_streaming(request, on_delta)).await {
            Ok(r) => r,
            Err(_) => Err(self.expired(request, deadline)),
        }
    }
}
