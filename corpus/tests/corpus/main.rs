//! The corpus: recorded from real tools (a real API server for kubectl), the sessions
//! generated over it, and what compaction keeps in sight of them.

mod recording;
mod retention;
mod sessions;

pub use cairn_tests::harness::corpus::corpus;
