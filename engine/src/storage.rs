//! The storage port: named objects under one session's prefix, the one interface the
//! journal, the session memory and the archive's durable tiers are written through. The
//! shell implements it for a local directory and for S3; an overlay that keeps writes in
//! memory (`cairn-agent context`) wraps any of them.

use async_trait::async_trait;

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The store could not be reached or refused the request.
    #[error("{0}")]
    Unavailable(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Named objects. Names are relative to the store's prefix (for S3 a key prefix, for a local
/// directory a path); a name with `/` in it lives in a subdirectory of a local store.
#[async_trait]
pub trait ObjectStore: Send + Sync {
    /// Stores `body` under `name`, replacing what was there; returns only once it is
    /// durable.
    async fn put(&self, name: &str, body: Vec<u8>) -> Result<(), ObjectError>;
    /// The object's bytes, or `None` when there is no such object.
    async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, ObjectError>;
    /// Names starting with `prefix`, in any order. A local store lists one directory: the
    /// part of `prefix` up to its last `/` names it.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, ObjectError>;
    /// Removes `name`; removing what is not there succeeds.
    async fn delete(&self, name: &str) -> Result<(), ObjectError>;
}
