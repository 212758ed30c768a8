//! The naming contract of a session's objects: what the operator creates, the agent holds
//! and reports on, and the gateway and `kubectl cairn` reach. One home, so the four agree.

/// Port of the agent's HTTP API (and its probes and `/metrics`).
pub const AGENT_PORT: u16 = 8080;
/// Key of the API bearer token in the session's token Secret.
pub const TOKEN_KEY: &str = "token";
/// Label naming the session an object belongs to.
pub const SESSION_LABEL: &str = "cairn.dev/session";
/// Label of the pods of a namespace that may reach every session's agent there (value
/// `"true"`; a session's own agent pod never counts, whatever its labels).
pub const CLIENT_LABEL: &str = "cairn.dev/client";
/// Name of the headless Service and the NetworkPolicy every session of a namespace shares
/// (and the `app.kubernetes.io/component` label value they carry).
pub const SESSIONS: &str = "cairn-sessions";

/// Name shared by the session's ServiceAccount, Role and RoleBinding, and its pod's hostname.
pub fn object_name(session: &str) -> String {
    format!("cairn-{session}")
}

/// Name of the Secret holding the session's API bearer token.
pub fn token_secret_name(session: &str) -> String {
    format!("cairn-{session}-api-token")
}

/// Name of the session's pod (the `-0` keeps the name pods of earlier versions had).
pub fn pod_name(session: &str) -> String {
    format!("{}-0", object_name(session))
}

/// Lease the agent holds while it writes the session's journal (the single-writer fence).
pub fn lease_name(session: &str) -> String {
    object_name(session)
}

/// In-cluster URL of the session's HTTP API: its pod's name under the namespace's shared
/// headless Service.
pub fn service_url(session: &str, namespace: &str) -> String {
    format!(
        "http://{}.{SESSIONS}.{namespace}.svc:{AGENT_PORT}",
        object_name(session)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_of_a_sessions_objects() {
        assert_eq!(object_name("s1"), "cairn-s1");
        assert_eq!(pod_name("s1"), "cairn-s1-0");
        assert_eq!(token_secret_name("s1"), "cairn-s1-api-token");
        assert_eq!(lease_name("s1"), "cairn-s1");
        assert_eq!(
            service_url("s1", "team-a"),
            "http://cairn-s1.cairn-sessions.team-a.svc:8080"
        );
    }
}
