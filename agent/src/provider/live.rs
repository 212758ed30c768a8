//! A provider that follows the session's `spec.provider` (or the summarizer's own provider,
//! [`summarizer_spec`]) while the agent runs.
//!
//! The agent watches its AgentSession; a `kubectl patch` of the model, the base URL or even
//! the API family reaches the next provider call, which is sent through a client rebuilt from
//! the new settings. The API key is not part of this: it comes from the pod's environment,
//! and a new Secret reference or a rotated key makes the operator replace the pod.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use cairn_crds::{ProviderKind, ProviderSpec};
use tokio::sync::watch;

use super::config::{ClientOptions, Credentials, Secret};
use super::factory::build;
use super::{ChatRequest, ChatResponse, DeltaSink, Provider, ProviderError};
use crate::config::{Live, summarizer_spec};

/// The environment variable the operator fills from `summarizer.credentials`.
pub const SUMMARIZER_KEY_ENV: &str = "CAIRN_SUMMARIZER_API_KEY";

/// Looks up an environment variable (injected, so tests need not touch the process's).
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The client of the level-2 summarizer's own provider ([`summarizer_spec`]), built at its
/// first call and following policy edits. Its API key is [`SUMMARIZER_KEY_ENV`] when set,
/// else the conventional variable of its kind (the session's own key when the kinds match).
pub fn summarizer_provider(
    live: watch::Receiver<Arc<Live>>,
    env: EnvLookup,
    options: ClientOptions,
) -> LiveProvider {
    let build = move |spec: &ProviderSpec| {
        let mut credentials = Credentials::from_lookup(spec.kind, |n| env(n));
        if let Some(key) = env(SUMMARIZER_KEY_ENV).filter(|k| !k.is_empty()) {
            credentials.api_key = Some(Secret::new(key));
        }
        build(spec, credentials, options.clone())
            .map(Arc::from)
            .map_err(|e| format!("summarizer.provider: {e}"))
    };
    LiveProvider::lazy(live, summarizer_spec, Box::new(build))
}

/// Builds a client for provider settings (credentials and options are the builder's).
pub type Builder = Box<dyn Fn(&ProviderSpec) -> Result<Arc<dyn Provider>, String> + Send + Sync>;

/// Which provider settings of the live configuration a [`LiveProvider`] follows.
pub type Selector = fn(&Live) -> ProviderSpec;

pub struct LiveProvider {
    live: watch::Receiver<Arc<Live>>,
    select: Selector,
    build: Builder,
    /// `None` until the first call of a lazily built provider.
    current: Mutex<Option<Current>>,
}

/// The session's own provider settings.
pub fn session_spec(live: &Live) -> ProviderSpec {
    live.spec.provider.clone()
}

struct Current {
    spec: ProviderSpec,
    client: Arc<dyn Provider>,
}

impl LiveProvider {
    /// A provider for the settings `live` holds now and later; fails when the current ones
    /// cannot be built.
    pub fn new(live: watch::Receiver<Arc<Live>>, build: Builder) -> Result<Self, String> {
        let spec = session_spec(&live.borrow());
        let client = build(&spec)?;
        Ok(Self {
            live,
            select: session_spec,
            build,
            current: Mutex::new(Some(Current { spec, client })),
        })
    }

    /// A provider for the settings `select` picks from `live`, built at its first call: settings
    /// that cannot be built fail that call (classified like any provider failure), not the
    /// session.
    pub fn lazy(live: watch::Receiver<Arc<Live>>, select: Selector, build: Builder) -> Self {
        Self {
            live,
            select,
            build,
            current: Mutex::new(None),
        }
    }

    /// The client for the settings of this moment, rebuilt when they changed. Settings that
    /// cannot be built fail the call with a clear message; the previous client is not used
    /// behind the user's back.
    fn client(&self) -> Result<Arc<dyn Provider>, Box<ProviderError>> {
        let spec = (self.select)(&self.live.borrow());
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = current.as_ref()
            && c.spec == spec
        {
            return Ok(Arc::clone(&c.client));
        }
        let what = if current.is_some() {
            "the changed provider settings cannot be used"
        } else {
            "the provider settings cannot be used"
        };
        let client = (self.build)(&spec).map_err(|e| {
            Box::new(ProviderError::transport(
                spec.kind.as_str(),
                format!("{what}: {e}"),
                0,
            ))
        })?;
        if let Some(c) = current.as_ref() {
            tracing::info!(
                from_kind = c.spec.kind.as_str(),
                to_kind = spec.kind.as_str(),
                from_model = %c.spec.model,
                to_model = %spec.model,
                "provider settings changed; client rebuilt"
            );
        }
        *current = Some(Current {
            spec,
            client: Arc::clone(&client),
        });
        Ok(client)
    }

    fn kind(&self) -> ProviderKind {
        match self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            Some(c) => c.spec.kind,
            None => (self.select)(&self.live.borrow()).kind,
        }
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

    fn render(&self, request: &ChatRequest) -> Result<super::Rendered, Box<ProviderError>> {
        self.client()?.render(request)
    }
}
