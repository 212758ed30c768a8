//! Looking at a session without touching it: its storage behind an overlay that reads
//! through to the real objects and keeps every write in memory. A session opened on it
//! ([`crate::app::context_cmd`]: the journal, and the archive as a
//! [`crate::ccr::ObjectArchive`] over its durable tier) claims its journal epoch, rebuilds its
//! history and runs its cheap passes exactly as a starting agent does, yet nothing reaches
//! the real stores: an agent serving the same session is not fenced and its archive is not
//! written.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::storage::{ObjectError, ObjectStore};

/// Named objects: reads see this process's writes over the real store's objects.
pub struct PeekObjects {
    inner: Arc<dyn ObjectStore>,
    /// Written (`Some`) or deleted (`None`) here.
    local: Mutex<BTreeMap<String, Option<Vec<u8>>>>,
}

impl PeekObjects {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            local: Mutex::default(),
        }
    }

    fn local(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Option<Vec<u8>>>> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl ObjectStore for PeekObjects {
    async fn put(&self, name: &str, body: Vec<u8>) -> Result<(), ObjectError> {
        self.local().insert(name.to_owned(), Some(body));
        Ok(())
    }

    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, ObjectError> {
        if let Some(local) = self.local().get(name) {
            return Ok(local.clone());
        }
        self.inner.get(name).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, ObjectError> {
        let mut names = self.inner.list(prefix).await?;
        let local = self.local();
        names.retain(|n| !local.contains_key(n));
        names.extend(
            local
                .iter()
                .filter(|(n, body)| n.starts_with(prefix) && body.is_some())
                .map(|(n, _)| n.clone()),
        );
        Ok(names)
    }

    async fn delete(&self, name: &str) -> Result<(), ObjectError> {
        self.local().insert(name.to_owned(), None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::{Key, ObjectArchive, Store};
    use crate::storage::DirObjects;

    #[tokio::test]
    async fn writes_stay_in_the_overlay_and_reads_see_them_over_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let real: Arc<dyn ObjectStore> = Arc::new(DirObjects::open(dir.path()).unwrap());
        real.put("entries/1", b"one".to_vec()).await.unwrap();
        real.put("entries/2", b"two".to_vec()).await.unwrap();
        let peek = PeekObjects::new(Arc::clone(&real));
        peek.put("claims/9", b"mine".to_vec()).await.unwrap();
        peek.delete("entries/2").await.unwrap();
        peek.put("entries/1", b"ONE".to_vec()).await.unwrap();

        assert_eq!(peek.get("entries/1").await.unwrap(), Some(b"ONE".to_vec()));
        assert_eq!(peek.get("entries/2").await.unwrap(), None);
        assert_eq!(peek.get("claims/9").await.unwrap(), Some(b"mine".to_vec()));
        let mut names = peek.list("entries/").await.unwrap();
        names.sort();
        assert_eq!(names, ["entries/1"]);
        // The real store is as it was.
        assert_eq!(real.get("entries/1").await.unwrap(), Some(b"one".to_vec()));
        assert_eq!(real.get("entries/2").await.unwrap(), Some(b"two".to_vec()));
        assert!(real.list("claims/").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_archive_over_the_overlay_reads_the_real_originals_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let real: Arc<dyn ObjectStore> = Arc::new(DirObjects::open(dir.path()).unwrap());
        let kept = Key::of(b"archived by the agent");
        real.put(kept.as_str(), b"archived by the agent".to_vec())
            .await
            .unwrap();
        let archive = ObjectArchive::new(PeekObjects::new(Arc::clone(&real)));
        assert_eq!(
            archive.fetch(&kept).await.unwrap(),
            Some(b"archived by the agent".to_vec())
        );
        let new = archive.archive(b"archived while peeking").await.unwrap();
        assert!(archive.fetch(&new).await.unwrap().is_some());
        assert_eq!(real.get(new.as_str()).await.unwrap(), None);
    }
}
