//! The archive over the storage port: each original is the object named by its key.

use async_trait::async_trait;

use super::{ArchiveError, DEFAULT_IN_FLIGHT, Hashed, Key, Store};
use crate::storage::ObjectStore;

/// Originals as named objects: the object `<key>` holds the original's bytes verbatim. A
/// read is checked against its key, so a damaged or tampered object is an error, never an
/// answer.
#[derive(Clone)]
pub struct ObjectArchive<O> {
    objects: O,
    in_flight: usize,
}

impl<O: ObjectStore> ObjectArchive<O> {
    /// The archive in `objects`, whose names are relative to the session's `ccr/` prefix.
    pub fn new(objects: O) -> Self {
        Self {
            objects,
            in_flight: DEFAULT_IN_FLIGHT,
        }
    }

    /// Requests of one pass kept in flight at once (`archive.maxInFlight`; at least 1).
    pub fn with_in_flight(mut self, in_flight: usize) -> Self {
        self.in_flight = in_flight.max(1);
        self
    }

    pub fn objects(&self) -> &O {
        &self.objects
    }

    /// Stores `content` under `key` (the caller computed it with [`Key::of`]); returns once
    /// the store has acknowledged it.
    pub async fn put(&self, key: &Key, content: &[u8]) -> Result<(), ArchiveError> {
        Ok(self.objects.put(key.as_str(), content.to_vec()).await?)
    }

    /// The original of `key`, verified against the key; `None` when there is none.
    pub async fn get(&self, key: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        let Some(bytes) = self.objects.get(key.as_str()).await? else {
            return Ok(None);
        };
        if Key::of(&bytes) != *key {
            return Err(ArchiveError::Corrupt(*key));
        }
        Ok(Some(bytes))
    }
}

#[async_trait]
impl<O: ObjectStore> Store for ObjectArchive<O> {
    async fn put_hashed(&self, original: Hashed<'_>) -> Result<(), ArchiveError> {
        self.put(&original.key(), original.bytes()).await
    }

    async fn fetch(&self, key: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        self.get(key).await
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemObjects;

    #[tokio::test]
    async fn originals_are_objects_named_by_their_key_and_reads_are_checked() {
        let archive = ObjectArchive::new(MemObjects::default());
        let key = archive.archive(b"the original").await.unwrap();
        assert_eq!(archive.objects().names(), [key.as_str()]);
        assert_eq!(
            archive.fetch(&key).await.unwrap(),
            Some(b"the original".to_vec())
        );
        let other = Key::of(b"never stored");
        assert_eq!(archive.fetch(&other).await.unwrap(), None);
        archive
            .objects()
            .raw_put(key.as_str(), b"tampered".to_vec());
        assert_eq!(archive.fetch(&key).await.unwrap_err().label(), "corrupt");
    }
}
