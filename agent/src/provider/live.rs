//! A provider that follows the session's `spec.provider` while the agent runs.
//!
//! The agent watches its AgentSession; a `kubectl patch` of the model, the base URL or even
//! the API family reaches the next provider call, which is sent through a client rebuilt from
//! the new settings. The API key is not part of this: it comes from the pod's environment,
//! and a new Secret reference or a rotated key makes the operator replace the pod.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use cairn_crds::{ProviderKind, ProviderSpec};
use tokio::sync::watch;

use super::{ChatRequest, ChatResponse, DeltaSink, Provider, ProviderError};
use crate::config::Live;

/// Builds a client for provider settings (credentials and options are the builder's).
pub type Builder = Box<dyn Fn(&ProviderSpec) -> Result<Arc<dyn Provider>, String> + Send + Sync>;

pub struct LiveProvider {
    live: watch::Receiver<Arc<Live>>,
    build: Builder,
    current: Mutex<Current>,
}

struct Current {
    spec: ProviderSpec,
    client: Arc<dyn Provider>,
}

impl LiveProvider {
    /// A provider for the settings `live` holds now and later; fails when the current ones
    /// cannot be built.
    pub fn new(live: watch::Receiver<Arc<Live>>, build: Builder) -> Result<Self, String> {
        let spec = live.borrow().spec.provider.clone();
        let client = build(&spec)?;
        Ok(Self {
            live,
            build,
            current: Mutex::new(Current { spec, client }),
        })
    }

    /// The client for the settings of this moment, rebuilt when they changed. Settings that
    /// cannot be built fail the call with a clear message; the previous client is not used
    /// behind the user's back.
    fn client(&self) -> Result<Arc<dyn Provider>, Box<ProviderError>> {
        let spec = self.live.borrow().spec.provider.clone();
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.spec != spec {
            let client = (self.build)(&spec).map_err(|e| {
                Box::new(ProviderError::transport(
                    spec.kind.as_str(),
                    format!("the changed provider settings cannot be used: {e}"),
                    0,
                ))
            })?;
            tracing::info!(
                from_kind = current.spec.kind.as_str(),
                to_kind = spec.kind.as_str(),
                from_model = %current.spec.model,
                to_model = %spec.model,
                "provider settings changed; client rebuilt"
            );
            *current = Current { spec, client };
        }
        Ok(Arc::clone(&current.client))
    }

    fn kind(&self) -> ProviderKind {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .spec
            .kind
    }
}

#[async_trait]
impl Provider for LiveProvider {
    fn name(&self) -> &str {
        self.kind().as_str()
    }

    async fn send(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        let client = self.client().map_err(|e| *e)?;
        client.send(request).await
    }

    async fn send_streaming(
        &self,
        request: &ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let client = self.client().map_err(|e| *e)?;
        client.send_streaming(request, on_delta).await
    }
}
