//! The reconciler's errors, each with a stable label (metrics, Event reasons) and a class that
//! decides how `error_policy` retries it.

use crate::purge::PurgeError;
use crate::scoped::ScopedError;
use crate::validate::ValidationError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Secret {namespace}/{name} not found")]
    SecretNotFound { namespace: String, name: String },
    #[error("Secret {namespace}/{name} has no key {key:?}")]
    SecretKeyMissing {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("purging the session archive failed: {0}")]
    Purge(#[from] PurgeError),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("encoding {0}")]
    Encode(#[from] serde_json::Error),
    #[error("scoped archive credentials: {0}")]
    Scoped(#[from] ScopedError),
}

/// How an error is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Only a change to the session fixes it.
    Invalid,
    /// Something else must change first (a Secret, a policy); retried slowly.
    Waiting,
    /// Probably passes by itself; retried with per-object exponential backoff.
    Transient,
}

impl Error {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Invalid(e) => e.label(),
            Self::Kube(_) => "KubeApi",
            Self::SecretNotFound { .. } => "SecretNotFound",
            Self::SecretKeyMissing { .. } => "SecretKeyMissing",
            Self::Purge(e) => e.label(),
            Self::Finalizer(e) => match e.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(inner)
                | kube::runtime::finalizer::Error::CleanupFailed(inner) => inner.label(),
                _ => "Finalizer",
            },
            Self::Encode(_) => "Encode",
            Self::Scoped(e) => e.label(),
        }
    }

    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Invalid(_) => ErrorClass::Invalid,
            Self::SecretNotFound { .. } | Self::SecretKeyMissing { .. } => ErrorClass::Waiting,
            Self::Finalizer(e) => match e.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(inner)
                | kube::runtime::finalizer::Error::CleanupFailed(inner) => inner.class(),
                _ => ErrorClass::Transient,
            },
            Self::Kube(_) | Self::Purge(_) | Self::Encode(_) | Self::Scoped(_) => {
                ErrorClass::Transient
            }
        }
    }
}
