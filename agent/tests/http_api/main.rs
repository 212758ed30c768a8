//! The agent's HTTP API (`/v1/responses`, `/v1/chat/completions`, the session routes) on a
//! real socket, in process against cairn-sim, moto and nginx, and through official clients:
//! errors and limits, streaming, disconnects, the context inspector, images, client tools.

// Test helpers outside `#[test]` functions are test code too (STYLE: tests may unwrap).
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod client_tools;
mod context;
mod disconnect;
mod e2e;
mod errors;
mod images;
mod limits;
mod openai_sdk;
mod page;
mod provider_errors;
mod py_clients;
mod replay_props;
mod stream;
