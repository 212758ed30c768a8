//! The storage port's backends: named objects in a local directory ([`DirObjects`]) and in S3
//! ([`S3Objects`]). The journal, the session memory and the archive's durable tier in S3 are
//! written through them. The port is the engine's (`cairn_engine::storage`, re-exported
//! here).

pub use cairn_engine::storage::*;

mod dir;
mod s3;

pub use dir::DirObjects;
pub use s3::S3Objects;
