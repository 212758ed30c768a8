//! What a security reviewer checks first in a chart's RBAC, as a pure function of the
//! rendered manifests: no `impersonate`, `escalate` or `bind`, no wildcard verb or resource,
//! and no Secret read (`get`, `list`, `watch`) a ClusterRoleBinding makes cluster-wide —
//! except the grants of an explicit allow-list, each with its reason.

use serde_yaml::Value;

/// One grant the checker refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// `ClusterRole/<name>` or `Role/<namespace>/<name>`.
    pub role: String,
    pub verb: String,
    /// `<resource>` (core group) or `<resource>.<group>`.
    pub resource: String,
    pub why: &'static str,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} {} ({})",
            self.role, self.verb, self.resource, self.why
        )
    }
}

/// A grant accepted despite the rules, and why.
#[derive(Debug, Clone, Copy)]
pub struct Allowed {
    pub role: &'static str,
    pub verb: &'static str,
    pub resource: &'static str,
    pub reason: &'static str,
}

const DANGEROUS_VERBS: [(&str, &str); 3] = [
    (
        "impersonate",
        "impersonate: acts as any user or group it names",
    ),
    ("escalate", "escalate: grants itself more than it holds"),
    ("bind", "bind: binds roles it does not hold"),
];
const SECRET_READS: [&str; 3] = ["get", "list", "watch"];

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_str()
        .unwrap_or_default()
}

/// Every refused grant of the rendered manifests `docs`. Pure.
pub fn findings(docs: &[Value]) -> Vec<Finding> {
    // ClusterRoles a ClusterRoleBinding binds: their rules hold in every namespace.
    let cluster_bound: Vec<&str> = docs
        .iter()
        .filter(|d| str_of(d, &["kind"]) == "ClusterRoleBinding")
        .filter(|d| str_of(d, &["roleRef", "kind"]) == "ClusterRole")
        .map(|d| str_of(d, &["roleRef", "name"]))
        .collect();
    let mut out = Vec::new();
    for d in docs {
        let kind = str_of(d, &["kind"]);
        let name = str_of(d, &["metadata", "name"]);
        let role = match kind {
            "ClusterRole" => format!("ClusterRole/{name}"),
            "Role" => format!("Role/{}/{name}", str_of(d, &["metadata", "namespace"])),
            _ => continue,
        };
        let cluster_wide = kind == "ClusterRole" && cluster_bound.contains(&name);
        if d["aggregationRule"].is_mapping() {
            out.push(Finding {
                role: role.clone(),
                verb: "*".into(),
                resource: "*".into(),
                why: "an aggregated role holds whatever other roles add to it",
            });
        }
        for rule in d["rules"].as_sequence().into_iter().flatten() {
            let verbs = strings(&rule["verbs"]);
            let resources = strings(&rule["resources"]);
            let groups = strings(&rule["apiGroups"]);
            let urls = strings(&rule["nonResourceURLs"]);
            let named = !strings(&rule["resourceNames"]).is_empty();
            let qualified = |r: &str| -> Vec<String> {
                if groups.is_empty() {
                    return vec![r.to_string()];
                }
                groups
                    .iter()
                    .map(|g| {
                        if g.is_empty() {
                            r.to_string()
                        } else {
                            format!("{r}.{g}")
                        }
                    })
                    .collect()
            };
            let targets: Vec<String> = resources
                .iter()
                .flat_map(|r| qualified(r))
                .chain(urls.iter().cloned())
                .collect();
            for verb in &verbs {
                for target in &targets {
                    let mut push = |why| {
                        out.push(Finding {
                            role: role.clone(),
                            verb: verb.clone(),
                            resource: target.clone(),
                            why,
                        })
                    };
                    if verb == "*" {
                        push("a wildcard verb grants every verb, present and future");
                    }
                    if target == "*" || target.starts_with("*.") || target.ends_with("/*") {
                        push("a wildcard resource grants every resource, present and future");
                    }
                    if let Some((_, why)) = DANGEROUS_VERBS.iter().find(|(v, _)| v == verb) {
                        push(why);
                    }
                    let secrets = target == "secrets" || target == "*" || target.starts_with("*.");
                    if cluster_wide
                        && secrets
                        && (verb == "*" || SECRET_READS.contains(&verb.as_str()))
                    {
                        push(if named {
                            "reads Secrets in every namespace (by name)"
                        } else {
                            "reads every Secret of the cluster"
                        });
                    }
                }
            }
        }
    }
    out.dedup();
    out
}

/// The findings no entry of `allowed` accepts. Pure.
pub fn violations(docs: &[Value], allowed: &[Allowed]) -> Vec<Finding> {
    findings(docs)
        .into_iter()
        .filter(|f| {
            !allowed
                .iter()
                .any(|a| a.role == f.role && a.verb == f.verb && a.resource == f.resource)
        })
        .collect()
}

/// The allow-list entries no finding used (a grant removed from the chart leaves a stale
/// entry behind: it should go too). Pure.
pub fn unused<'a>(docs: &[Value], allowed: &'a [Allowed]) -> Vec<&'a Allowed> {
    let found = findings(docs);
    allowed
        .iter()
        .filter(|a| {
            !found
                .iter()
                .any(|f| a.role == f.role && a.verb == f.verb && a.resource == f.resource)
        })
        .collect()
}

/// Parses a multi-document YAML stream (as `helm template` prints it).
pub fn parse(yaml: &str) -> Result<Vec<Value>, serde_yaml::Error> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(yaml)
        .map(Value::deserialize)
        .filter(|d| !matches!(d, Ok(Value::Null)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHART: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: app}
rules:
  - apiGroups: [cairn.dev]
    resources: [agentsessions]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: app}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: app}
subjects: [{kind: ServiceAccount, name: app, namespace: sys}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: tokens, namespace: team-a}
rules:
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get, list]
"#;

    fn with_rule(rule: &str) -> Vec<Value> {
        let mut docs = parse(CHART).expect("fixture");
        let rule: Value = serde_yaml::from_str(rule).expect("rule");
        docs[0]["rules"]
            .as_sequence_mut()
            .expect("rules")
            .push(rule);
        docs
    }

    #[test]
    fn a_clean_chart_has_no_findings_and_namespaced_secret_reads_are_fine() {
        assert_eq!(findings(&parse(CHART).expect("fixture")), []);
    }

    #[test]
    fn each_forbidden_grant_is_found() {
        let cases = [
            (
                "{apiGroups: [''], resources: [users, groups], verbs: [impersonate]}",
                "impersonate",
                "users",
            ),
            (
                "{apiGroups: [rbac.authorization.k8s.io], resources: [roles], verbs: [escalate]}",
                "escalate",
                "roles.rbac.authorization.k8s.io",
            ),
            (
                "{apiGroups: [rbac.authorization.k8s.io], resources: [clusterroles], verbs: [bind]}",
                "bind",
                "clusterroles.rbac.authorization.k8s.io",
            ),
            (
                "{apiGroups: [cairn.dev], resources: [agentsessions], verbs: ['*']}",
                "*",
                "agentsessions.cairn.dev",
            ),
            (
                "{apiGroups: [cairn.dev], resources: ['*'], verbs: [get]}",
                "get",
                "*.cairn.dev",
            ),
            (
                "{apiGroups: [''], resources: [secrets], verbs: [get]}",
                "get",
                "secrets",
            ),
            (
                "{apiGroups: [''], resources: [secrets], verbs: [watch]}",
                "watch",
                "secrets",
            ),
        ];
        for (rule, verb, resource) in cases {
            let found = findings(&with_rule(rule));
            assert!(
                found.iter().any(|f| f.role == "ClusterRole/app"
                    && f.verb == verb
                    && f.resource == resource),
                "{rule}: {found:?}"
            );
        }
        // Writing Secrets is not reading them.
        assert_eq!(
            findings(&with_rule(
                "{apiGroups: [''], resources: [secrets], verbs: [create, patch]}"
            )),
            []
        );
    }

    #[test]
    fn a_cluster_role_bound_only_in_namespaces_is_not_cluster_wide() {
        let mut docs = with_rule("{apiGroups: [''], resources: [secrets], verbs: [get]}");
        docs.remove(1);
        assert_eq!(findings(&docs), []);
    }

    #[test]
    fn the_allow_list_accepts_exactly_its_grants() {
        let docs = with_rule("{apiGroups: [''], resources: [secrets], verbs: [get, list]}");
        let allowed = [Allowed {
            role: "ClusterRole/app",
            verb: "get",
            resource: "secrets",
            reason: "by name",
        }];
        let left = violations(&docs, &allowed);
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0].verb, "list");
        assert!(unused(&docs, &allowed).is_empty());
        assert_eq!(unused(&parse(CHART).expect("fixture"), &allowed).len(), 1);
    }
}
