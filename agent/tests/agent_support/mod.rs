//! `replay_props.rs` (on its way to cairn-engine's tests) still declares `mod agent_support;`:
//! the fixtures themselves are `support/agent.rs`, shared with every agent test binary.

#[allow(dead_code)]
#[path = "../support/agent.rs"]
mod agent;

pub use agent::*;
