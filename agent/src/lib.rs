//! The cairn agent: the loop that keeps one LLM session alive through full context windows
//! and proxy body-size limits, and never loses what it compacts.
//!
//! Pure logic (history, classification, compaction, recovery) is plain functions over plain
//! data; I/O (providers, the archive store, the journal, the Kubernetes API) sits behind
//! traits at the edges.

// The pure core lives in `cairn-engine`; its modules keep their paths here.
pub use cairn_engine::{
    breakdown, catalog, classify, compact, compress, cost, history, meter, overflow, recovery,
    replay, steering, tokens, why,
};

pub mod ccr;
pub mod images;
pub mod provider;

// The running agent: settings, journal, session loop, HTTP API, cluster integration.
pub mod allocator;
pub mod app;
pub mod aws;
pub mod cluster;
pub mod config;
pub mod events;
pub mod journal;
pub mod mcp;
pub mod memory;
pub mod metrics;
pub mod net;
pub mod peek;
pub mod report;
pub mod server;
pub mod session;
pub mod storage;
pub mod telemetry;
