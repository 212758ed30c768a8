//! The real `cairn-agent` binary as a process: `serve` killed and restarted, shutdown, holder
//! identities, the `run`/`recall`/`context` commands, OTLP export.

#[path = "../support/mod.rs"]
mod support;

mod api_validity;
mod cli;
mod cli_context;
mod holder;
mod idle_clock;
mod otel;
mod serve;
mod shutdown;
