//! The journal and the archive: properties, S3 (moto) with faults, a process killed mid-batch,
//! the archive check, AWS identities and the operator's scoped credentials.

// Test helpers outside `#[test]` functions are test code too (STYLE: tests may unwrap).
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod archive_check;
mod archive_kill;
mod aws_credentials;
mod ccr_props;
mod ccr_s3;
mod journal_faults;
mod journal_props;
mod scoped_credentials;
