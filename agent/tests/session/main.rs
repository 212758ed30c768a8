//! The session's turn against cairn-sim: compaction and convergence, headroom, pre-flight and
//! learned caps, deadlines and cancellation, steering, the memory, built-in, client-side and MCP
//! tools, compression of entering tool results.

#[path = "../support/mod.rs"]
mod support;

mod compress_entry;
mod converge;
mod deadlines;
mod headroom;
mod learned_cap;
mod mcp;
mod memory;
mod preflight;
mod steering;
mod tools;
mod turn_cancel;
