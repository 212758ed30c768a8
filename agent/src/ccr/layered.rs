//! The store a session runs with: S3 for durability, a bounded local directory in front of it
//! for speed.
//!
//! `archive` writes through: it returns `Ok` only after S3 acknowledged the object, so a
//! marker is never emitted for bytes that exist only on this pod. The local copy is written
//! after that, best effort — losing it costs a round trip, never data. `fetch` reads the local
//! copy, else S3 (and fills the local copy). The local directory is per session, so neither
//! tier can answer with another session's bytes.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};

use super::local::{LocalLimits, LocalStore};
use super::s3::S3Store;
use super::stats::{ArchiveCounters, ArchiveReport, StoreUsage};
use super::{ArchiveError, Hashed, Key, Store};

#[derive(Clone)]
pub struct LayeredStore {
    local: LocalStore,
    remote: S3Store,
    counters: Arc<ArchiveCounters>,
}

impl LayeredStore {
    /// Opens the session's cache directory `<cache_root>/<namespace>/<session>` in front of
    /// `remote`.
    pub fn open(
        cache_root: &Path,
        limits: LocalLimits,
        remote: S3Store,
    ) -> Result<Self, ArchiveError> {
        let scope = remote.scope();
        let dir = cache_root.join(scope.namespace()).join(scope.session());
        Ok(Self::new(LocalStore::open_cache(dir, limits)?, remote))
    }

    /// Combines tiers the caller opened; the caller keeps the local directory per session.
    pub fn new(local: LocalStore, remote: S3Store) -> Self {
        Self {
            local,
            remote,
            counters: Arc::new(ArchiveCounters::default()),
        }
    }

    pub fn counters(&self) -> &Arc<ArchiveCounters> {
        &self.counters
    }

    pub fn local(&self) -> &LocalStore {
        &self.local
    }

    pub fn remote(&self) -> &S3Store {
        &self.remote
    }

    /// Occupancy of the local tier.
    pub async fn local_usage(&self) -> Result<StoreUsage, ArchiveError> {
        self.local.usage().await
    }

    /// Counters and local occupancy, for `/metrics` and `status.session.archive`.
    pub async fn report(&self) -> Result<ArchiveReport, ArchiveError> {
        Ok(ArchiveReport {
            counters: self.counters.snapshot(),
            local: self.local.usage().await?,
        })
    }

    async fn fill_local(&self, key: Key, content: &[u8]) {
        if content.len() as u64 > self.local.limits().per_entry_cap() {
            return;
        }
        if let Err(e) = self.local.put(key, content.to_vec()).await {
            tracing::warn!(%key, error = %e, label = e.label(), "ccr: local cache write failed");
        }
    }
}

#[async_trait]
impl Store for LayeredStore {
    async fn put_hashed(&self, original: Hashed<'_>) -> Result<(), ArchiveError> {
        let (key, content) = (original.key(), original.bytes());
        // Local entries are written only after S3 acknowledged them, so a local hit is durable.
        if matches!(self.local.get(key).await, Ok(Some(_))) {
            self.counters.record_dedupe();
            return Ok(());
        }
        if let Err(e) = self.remote.put(&key, content).await {
            self.counters.record_failure();
            tracing::warn!(%key, error = %e, "ccr: durable tier refused the original; nothing archived");
            return Err(e);
        }
        self.counters.record_put(content.len());
        self.fill_local(key, content).await;
        Ok(())
    }

    /// One local lookup task for the batch, the S3 writes of what the cache lacks
    /// concurrently (up to [`Store::in_flight`]), then one local write task for those.
    async fn put_batch(&self, originals: &[Hashed<'_>]) -> Result<(), ArchiveError> {
        if let [one] = originals {
            return self.put_hashed(*one).await;
        }
        let cached = self
            .local
            .get_many(originals.iter().map(|o| o.key()).collect())
            .await;
        let missing: Vec<Hashed<'_>> = originals
            .iter()
            .zip(cached)
            .filter_map(|(o, c)| match c {
                Ok(Some(_)) => {
                    self.counters.record_dedupe();
                    None
                }
                _ => Some(*o),
            })
            .collect();
        let mut writes = Vec::with_capacity(missing.len());
        for o in &missing {
            writes.push(async move {
                let (key, content) = (o.key(), o.bytes());
                match self.remote.put(&key, content).await {
                    Ok(()) => {
                        self.counters.record_put(content.len());
                        Ok(())
                    }
                    Err(e) => {
                        self.counters.record_failure();
                        tracing::warn!(%key, error = %e, "ccr: durable tier refused the original; nothing archived");
                        Err(e)
                    }
                }
            });
        }
        futures::stream::iter(writes)
            .buffer_unordered(self.in_flight())
            .try_collect::<()>()
            .await?;
        let cap = self.local.limits().per_entry_cap();
        let fill: Vec<(Key, Vec<u8>)> = missing
            .iter()
            .filter(|o| o.bytes().len() as u64 <= cap)
            .map(|o| (o.key(), o.bytes().to_vec()))
            .collect();
        if let Err(e) = self.local.put_many(fill).await {
            tracing::warn!(error = %e, label = e.label(), "ccr: local cache write failed");
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.remote.in_flight()
    }

    async fn fetch(&self, key: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        match self.local.get(*key).await {
            Ok(Some(bytes)) => {
                self.counters.record_fetch(Some(&bytes));
                return Ok(Some(bytes));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(%key, error = %e, label = e.label(), "ccr: local cache read failed; asking S3");
            }
        }
        let found = self.remote.get(key).await?;
        if let Some(bytes) = &found {
            self.fill_local(*key, bytes).await;
        }
        self.counters.record_fetch(found.as_deref());
        Ok(found)
    }
}
