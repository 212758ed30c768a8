//! Real servers for the integration tests (each test binary uses a subset).
#![allow(dead_code)]

pub mod faults;
pub mod moto;
