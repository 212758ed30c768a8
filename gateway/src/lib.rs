//! cairn-gateway: one authenticated endpoint for every session of the cluster.
//!
//! `/{namespace}/{session}/v1/...` is forwarded to the session's Service after the caller's
//! bearer is checked ([`auth`]); a session that sleeps for being idle is woken and the
//! request held until it is ready ([`server`]); platform code creates, lists, reads and
//! deletes AgentSessions through the lifecycle API, each call authorized for the caller by a
//! SubjectAccessReview ([`authz`]). Sessions are read from a reflector
//! ([`directory`]), so a request costs the API server nothing.

pub mod auth;
pub mod authz;
pub mod config;
pub mod directory;
pub mod error;
pub mod metrics;
pub mod proxy;
pub mod run;
pub mod server;
