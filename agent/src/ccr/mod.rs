//! The archive's tiers: a local directory, S3, and the two layered. The addressing scheme,
//! markers and the [`Store`] trait they implement are the engine's (`cairn_engine::ccr`,
//! re-exported here).

pub use cairn_engine::ccr::*;

pub mod layered;
pub mod local;
pub mod s3;
mod segment;

pub use layered::LayeredStore;
pub use local::{LimitsError, LocalLimits, LocalStore};
pub use s3::{S3Config, S3Store, S3Timeouts, SessionScope};
