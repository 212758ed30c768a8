//! Shared helpers for cairn's workspace-level tests.

use std::path::PathBuf;

/// The repository root (tests use it to find the chart, examples and generated files).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub mod chart_roles;
pub mod demo;
pub mod harness;
pub mod monitoring;
