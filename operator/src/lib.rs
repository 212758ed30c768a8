//! The cairn operator: reconciles each AgentSession into a ServiceAccount, Role, RoleBinding,
//! Secret and Pod, with the Service and NetworkPolicy its namespace's sessions share, and
//! keeps its status.
//!
//! The reconcile pipeline is [`dereference`] → [`validate`] → [`objects::build`] → [`apply`]
//! → [`status`]; `validate`, `build` and `status` are pure functions of plain data.

pub mod apply;
pub mod backoff;
pub mod cache;
pub mod client;
pub mod config;
pub mod controller;
pub mod crds;
pub mod dereference;
pub mod error;
pub use cairn_events as events;
pub mod http;
pub mod idle;
pub mod metrics;
pub mod migrate;
pub mod objects;
pub mod purge;
pub mod run;
pub mod scoped;
pub mod status;
pub mod validate;
pub mod watches;

pub use config::{Defaults, OperatorArgs};
pub use error::Error;
pub use objects::{BuildInputs, SessionObjects, build};
pub use validate::{Plan, ValidationError, validate};
