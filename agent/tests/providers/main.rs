//! The provider clients: each wire format against cairn-sim (contract, decoders, faults,
//! server-side context management, prompt caching, reloads, the summarizer's own provider), no
//! secret in any output, real middleboxes (nginx, Squid, mitmproxy) and a real llama-server.

// Test helpers outside `#[test]` functions are test code too (STYLE: tests may unwrap).
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod context_management;
mod contract;
mod corpus_summaries;
mod decoders;
mod faults;
mod keep_alive;
mod middlebox_nginx;
mod network_path;
mod prompt_cache;
mod real_llama;
mod real_llama_tools;
mod reload;
mod secrets;
mod summarizer;
