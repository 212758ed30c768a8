//! The chart's dashboard and alerts (`charts/cairn/monitoring/`) as the tests read them, and
//! the chart's monitors (PodMonitor, ServiceMonitors) translated into the scrape targets
//! Prometheus Operator would derive from them, for a Prometheus without the operator.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;

use crate::harness::helm;
use crate::harness::prometheus::ScrapeTarget;
use crate::repo_root;

/// A file of `charts/cairn/monitoring/`.
pub fn file(name: &str) -> String {
    let path = repo_root().join("charts/cairn/monitoring").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn dashboard() -> serde_json::Value {
    serde_json::from_str(&file("dashboard.json")).expect("dashboard.json")
}

pub fn rules() -> serde_yaml::Value {
    serde_yaml::from_str(&file("alerts.yaml")).expect("alerts.yaml")
}

/// The alerting rules of a rules file (recording rules left out).
pub fn alerts(rules: &serde_yaml::Value) -> Vec<serde_yaml::Value> {
    rules["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .filter(|r| r["alert"].is_string())
        .collect()
}

/// The dashboard's queries, each with what it is: every panel target (rows' panels too) and
/// the selector of every `label_values(...)` variable.
pub fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn panels<'a>(list: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            panels(&p["panels"], out);
        }
    }
    let mut all = Vec::new();
    panels(&dashboard["panels"], &mut all);
    let mut queries = Vec::new();
    for p in all {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(
                !expr.is_empty(),
                "panel {}: a target without expr",
                p["title"]
            );
            queries.push((format!("panel {}", p["title"]), expr.to_owned()));
        }
    }
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let query = v["query"]["query"].as_str().unwrap_or_default();
        let selector = query
            .strip_prefix("label_values(")
            .and_then(|q| q.rsplit_once(','))
            .map(|(selector, _)| selector)
            .unwrap_or_else(|| panic!("variable {}: {query}", v["name"]));
        queries.push((format!("variable {}", v["name"]), selector.to_owned()));
    }
    queries
}

/// A dashboard query with Grafana's variables given values: the rate interval, and the
/// session the per-session panels show.
pub fn with_variables(expr: &str, rate_interval: &str, namespace: &str, session: &str) -> String {
    expr.replace("$__rate_interval", rate_interval)
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
        .replace("$namespace", namespace)
        .replace("$session", session)
}

/// An alert's expression without its final threshold (`... > 0`): what the alert watches,
/// which has series whether or not the alert fires.
pub fn watched(expr: &str) -> String {
    let expr = expr.trim();
    match expr.rsplit_once('>') {
        Some((watched, threshold))
            if threshold.trim().parse::<f64>().is_ok() && !watched.ends_with('=') =>
        {
            watched.trim().to_string()
        }
        _ => expr.to_string(),
    }
}

/// The chart's monitors (PodMonitor, ServiceMonitors) as `helm template` renders them for
/// release `release` in `namespace` with `sets` and the monitors on: what a cluster with
/// Prometheus Operator would get. `dir` holds helm's own files.
pub fn chart_monitors(
    dir: &std::path::Path,
    release: &str,
    namespace: &str,
    sets: &[String],
) -> Vec<serde_yaml::Value> {
    let mut cmd = std::process::Command::new(helm().expect("helm installs"));
    cmd.env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .env("HELM_DATA_HOME", dir.join("helm/data"))
        .args(["template", release])
        .arg(repo_root().join("charts/cairn"))
        .args(["--namespace", namespace]);
    for s in sets.iter().map(String::as_str).chain([
        "metrics.serviceMonitor.enabled=true",
        "metrics.agentPodMonitor.enabled=true",
    ]) {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("helm runs");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).expect("rendered YAML parses"))
        .filter(|d| matches!(d["kind"].as_str(), Some("PodMonitor" | "ServiceMonitor")))
        .collect()
}

/// A Kubernetes label name as a Prometheus label name (`cairn.dev/session` →
/// `cairn_dev_session`), as Prometheus Operator writes `podTargetLabels`.
pub fn label_name(k8s: &str) -> String {
    k8s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn matches(labels: &serde_json::Value, selector: &serde_yaml::Value) -> bool {
    selector["matchLabels"]
        .as_mapping()
        .into_iter()
        .flatten()
        .all(|(k, v)| k.as_str().is_some_and(|k| labels[k].as_str() == v.as_str()))
}

/// The namespaces a monitor selects pods or Services in: `namespaceSelector.matchNames`,
/// `any`, or (neither) the monitor's own.
fn in_namespaces(monitor: &serde_yaml::Value, ns: &str) -> bool {
    let sel = &monitor["spec"]["namespaceSelector"];
    if sel["any"].as_bool() == Some(true) {
        return true;
    }
    match sel["matchNames"].as_sequence() {
        Some(names) => names.iter().any(|n| n.as_str() == Some(ns)),
        None => monitor["metadata"]["namespace"].as_str() == Some(ns),
    }
}

/// The container port of `pod` named `name` (or numbered so): its container and number.
fn container_port(pod: &serde_json::Value, name: &serde_json::Value) -> Option<(String, u16)> {
    for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
        for p in c["ports"].as_array().into_iter().flatten() {
            if p["name"] == *name || p["containerPort"] == *name {
                let n = p["containerPort"].as_u64()?;
                return Some((c["name"].as_str()?.to_string(), u16::try_from(n).ok()?));
            }
        }
    }
    None
}

fn running(pod: &serde_json::Value) -> bool {
    pod["status"]["phase"] == "Running" && pod["status"]["podIP"].is_string()
}

fn ip_port(pod: &serde_json::Value, port: u16) -> Option<SocketAddr> {
    let ip: std::net::IpAddr = pod["status"]["podIP"].as_str()?.parse().ok()?;
    Some(SocketAddr::new(ip, port))
}

/// The scrape targets Prometheus Operator derives from the chart's rendered monitors
/// (`rendered`: the documents of `helm template`) against the cluster's running pods and
/// Services (`kubectl get pods,services -A -o json` lists). Addresses are the pods' own
/// (inside the cluster); labels are the operator's: `job` (a ServiceMonitor's Service name,
/// a PodMonitor's `namespace/name`), `namespace`, `pod`, `container`, `endpoint`, `service`,
/// and each of a PodMonitor's `podTargetLabels`.
pub fn scrape_targets(
    rendered: &[serde_yaml::Value],
    pods: &serde_json::Value,
    services: &serde_json::Value,
) -> Vec<ScrapeTarget> {
    let pods: Vec<&serde_json::Value> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| running(p))
        .collect();
    let mut out = Vec::new();
    for m in rendered {
        let spec = &m["spec"];
        match m["kind"].as_str() {
            Some("PodMonitor") => {
                let job = format!(
                    "{}/{}",
                    m["metadata"]["namespace"].as_str().unwrap_or_default(),
                    m["metadata"]["name"].as_str().unwrap_or_default()
                );
                for pod in &pods {
                    let meta = &pod["metadata"];
                    let ns = meta["namespace"].as_str().unwrap_or_default();
                    if !in_namespaces(m, ns) || !matches(&meta["labels"], &spec["selector"]) {
                        continue;
                    }
                    for e in spec["podMetricsEndpoints"]
                        .as_sequence()
                        .into_iter()
                        .flatten()
                    {
                        let port = serde_json::json!(e["port"].as_str());
                        let Some((container, number)) = container_port(pod, &port) else {
                            continue;
                        };
                        let Some(addr) = ip_port(pod, number) else {
                            continue;
                        };
                        let mut labels = BTreeMap::from([
                            ("namespace".to_string(), ns.to_string()),
                            (
                                "pod".into(),
                                meta["name"].as_str().unwrap_or_default().into(),
                            ),
                            ("container".into(), container),
                            ("endpoint".into(), port.as_str().unwrap_or_default().into()),
                        ]);
                        for l in spec["podTargetLabels"].as_sequence().into_iter().flatten() {
                            let l = l.as_str().unwrap_or_default();
                            if let Some(v) = meta["labels"][l].as_str() {
                                labels.insert(label_name(l), v.to_string());
                            }
                        }
                        out.push(ScrapeTarget {
                            job: job.clone(),
                            addr,
                            path: e["path"].as_str().unwrap_or("/metrics").to_string(),
                            labels,
                        });
                    }
                }
            }
            Some("ServiceMonitor") => {
                for svc in services["items"].as_array().into_iter().flatten() {
                    let meta = &svc["metadata"];
                    let ns = meta["namespace"].as_str().unwrap_or_default();
                    if !in_namespaces(m, ns) || !matches(&meta["labels"], &spec["selector"]) {
                        continue;
                    }
                    let name = meta["name"].as_str().unwrap_or_default();
                    for e in spec["endpoints"].as_sequence().into_iter().flatten() {
                        let port_name = e["port"].as_str().unwrap_or_default();
                        let Some(port) = svc["spec"]["ports"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find(|p| p["name"] == port_name)
                        else {
                            continue;
                        };
                        let target_port = if port["targetPort"].is_null() {
                            port["port"].clone()
                        } else {
                            port["targetPort"].clone()
                        };
                        let selector = &svc["spec"]["selector"];
                        for pod in &pods {
                            let pmeta = &pod["metadata"];
                            let selected = selector.as_object().is_some_and(|sel| {
                                sel.iter().all(|(k, v)| pmeta["labels"][k] == *v)
                            });
                            if pmeta["namespace"] != ns || !selected {
                                continue;
                            }
                            let Some((container, number)) = container_port(pod, &target_port)
                            else {
                                continue;
                            };
                            let Some(addr) = ip_port(pod, number) else {
                                continue;
                            };
                            out.push(ScrapeTarget {
                                job: name.to_string(),
                                addr,
                                path: e["path"].as_str().unwrap_or("/metrics").to_string(),
                                labels: BTreeMap::from([
                                    ("namespace".to_string(), ns.to_string()),
                                    ("service".into(), name.into()),
                                    (
                                        "pod".into(),
                                        pmeta["name"].as_str().unwrap_or_default().into(),
                                    ),
                                    ("container".into(), container),
                                    ("endpoint".into(), port_name.into()),
                                ]),
                            });
                        }
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alerts_threshold_comes_off_and_nothing_else() {
        assert_eq!(watched("sum(x) > 0"), "sum(x)");
        assert_eq!(
            watched("sum(rate(a[5m])) / sum(rate(b[5m])) > 0.1"),
            "sum(rate(a[5m])) / sum(rate(b[5m]))"
        );
        assert_eq!(watched("sum(x{a!=\"b\"}) >= 1"), "sum(x{a!=\"b\"}) >= 1");
        assert_eq!(watched("up == 0"), "up == 0");
        assert_eq!(label_name("cairn.dev/session"), "cairn_dev_session");
    }

    #[test]
    fn monitors_become_the_targets_prometheus_operator_would_scrape() {
        let rendered: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(
            "kind: PodMonitor\nmetadata: {name: cairn-agents, namespace: sys}\nspec:\n  namespaceSelector: {matchNames: [a]}\n  selector: {matchLabels: {app: agent}}\n  podTargetLabels: [cairn.dev/session]\n  podMetricsEndpoints: [{port: http, path: /metrics}]\n---\nkind: ServiceMonitor\nmetadata: {name: cairn, namespace: sys}\nspec:\n  selector: {matchLabels: {app: op}}\n  endpoints: [{port: http, path: /metrics}]\n",
        )
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
        .collect();
        let pod = |ns: &str, name: &str, app: &str, ip: &str, port: u16| {
            serde_json::json!({
                "metadata": {"namespace": ns, "name": name, "labels": {"app": app, "cairn.dev/session": name}},
                "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": port}]}]},
                "status": {"phase": "Running", "podIP": ip},
            })
        };
        let pods = serde_json::json!({"items": [
            pod("a", "s1", "agent", "10.0.0.1", 8080),
            pod("b", "s2", "agent", "10.0.0.2", 8080),
            pod("sys", "op-1", "op", "10.0.0.3", 8081),
        ]});
        let services = serde_json::json!({"items": [{
            "metadata": {"namespace": "sys", "name": "cairn", "labels": {"app": "op"}},
            "spec": {"selector": {"app": "op"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
        }]});
        let t = scrape_targets(&rendered, &pods, &services);
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(t[0].job, "sys/cairn-agents");
        assert_eq!(t[0].addr.to_string(), "10.0.0.1:8080");
        assert_eq!(t[0].labels["cairn_dev_session"], "s1");
        assert_eq!(t[0].labels["namespace"], "a");
        assert_eq!(t[1].job, "cairn");
        assert_eq!(t[1].addr.to_string(), "10.0.0.3:8081");
        assert_eq!(t[1].labels["service"], "cairn");
    }
}
