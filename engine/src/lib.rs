//! cairn's engine: the pure core of the agent loop that keeps one LLM session alive through
//! full context windows and proxy body-size limits, and never loses what it compacts.
//!
//! Everything here is a function of plain data: history, token estimates, the classification
//! of a provider's rejection, the compaction and recovery ladders, the compressors, archive
//! keys and markers, the journal's format and rebuild. I/O reaches the engine only through
//! traits it defines and the shell implements ([`provider::Provider`], [`ccr::Store`],
//! [`storage::ObjectStore`], [`meter::Meter`]); the crate depends on
//! no HTTP client, SDK, server, Kubernetes client, or tokio networking and filesystem.

pub mod artifacts;
pub mod breakdown;
pub mod catalog;
pub mod ccr;
pub mod classify;
pub mod compact;
pub mod compress;
pub mod cost;
pub mod history;
pub mod journal;
pub mod meter;
pub mod offer;
pub mod overflow;
pub mod provider;
pub mod recovery;
pub mod replay;
pub mod steering;
pub mod storage;
pub mod testing;
pub mod tokens;
pub mod turn;
pub mod utf8;
pub mod why;
