//! The cairn operator: reconciles each AgentSession into a ServiceAccount, Role, RoleBinding,
//! Secret, StatefulSet, Service and NetworkPolicy, and keeps its status.
//!
//! The reconcile pipeline is dereference → validate → build → apply → status; `validate` and
//! `build` are pure functions of plain data.

pub mod crds;
