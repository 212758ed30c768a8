//! The chart's dashboard and alerts: the dashboard ConfigMap and the PrometheusRule render
//! only when enabled and carry the files under `charts/cairn/monitoring/` unchanged; the
//! rules pass `promtool check rules` and every alert's `promtool test rules` case; every
//! query of the dashboard and every alert expression parses (promtool checks them as
//! recording rules) and names only series the code exposes, with labels the code sets.
//!
//! The series the code exposes: the agent's are `agent/tests/data/metrics-series.txt`, which
//! the agent's tests hold to its registry and to the `/metrics` of a running agent; the
//! operator's and the gateway's are read from the registrations in their metrics modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use cairn_tests::harness::{promtool, repo_root, run_dir};
use cairn_tests::monitoring::{self, alerts, dashboard_queries};
use syn::visit::{self, Visit};

use super::render;

fn kind<'a>(docs: &'a [serde_yaml::Value], kind: &str) -> Vec<&'a serde_yaml::Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn dashboard_configmaps(docs: &[serde_yaml::Value]) -> Vec<&serde_yaml::Value> {
    kind(docs, "ConfigMap")
        .into_iter()
        .filter(|d| d["data"]["cairn.json"].is_string())
        .collect()
}

const ENABLED: [&str; 3] = [
    "metrics.dashboard.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "metrics.agentPodMonitor.enabled=true",
];

/// The rendered PrometheusRule's spec, as the YAML text of a rules file.
fn rendered_rules(values: &[&str]) -> String {
    let docs = render(values);
    let rules = kind(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1, "{values:?}");
    serde_yaml::to_string(&rules[0]["spec"]).expect("the spec serializes")
}

#[test]
fn the_dashboard_and_the_rules_render_only_when_enabled_and_carry_the_files() {
    let defaults = render(&[]);
    assert!(kind(&defaults, "PrometheusRule").is_empty());
    assert!(dashboard_configmaps(&defaults).is_empty());

    let docs = render(&ENABLED);
    let maps = dashboard_configmaps(&docs);
    assert_eq!(maps.len(), 1);
    assert_eq!(maps[0]["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: serde_json::Value =
        serde_json::from_str(maps[0]["data"]["cairn.json"].as_str().unwrap_or_default())
            .expect("the ConfigMap's dashboard is JSON");
    let file: serde_json::Value =
        serde_json::from_str(&monitoring::file("dashboard.json")).expect("dashboard.json");
    assert_eq!(shipped, file);

    let rule = kind(&docs, "PrometheusRule");
    assert_eq!(rule.len(), 1);
    assert_eq!(rule[0]["apiVersion"], "monitoring.coreos.com/v1");
    let file: serde_yaml::Value =
        serde_yaml::from_str(&monitoring::file("alerts.yaml")).expect("alerts.yaml");
    assert_eq!(rule[0]["spec"], file);

    // The agent's series carry the session: the PodMonitor copies its pod label.
    let monitor = kind(&docs, "PodMonitor");
    assert_eq!(
        monitor[0]["spec"]["podTargetLabels"],
        serde_yaml::Value::Sequence(vec!["cairn.dev/session".into()])
    );

    // Runbook links can point elsewhere; every alert keeps its anchor.
    let moved = rendered_rules(&[
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.runbooksUrl=https://wiki.example.com/cairn/runbooks/",
    ]);
    let urls: Vec<&str> = moved
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
        .collect();
    assert_eq!(urls.len(), alerts(&file).len());
    for url in urls {
        assert!(
            url.starts_with("https://wiki.example.com/cairn/runbooks#cairn"),
            "{url}"
        );
    }
}

/// The alerting rules of a rules file.
fn run(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool().expect("promtool"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// GitHub's anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn the_rendered_rules_pass_promtool_check_and_every_alert_its_unit_test() {
    let dir = run_dir("chart-rules").expect("a run directory");
    let rendered = rendered_rules(&ENABLED);
    std::fs::write(dir.join("alerts.yaml"), &rendered).expect("write");
    std::fs::write(
        dir.join("alerts_test.yaml"),
        monitoring::file("alerts_test.yaml"),
    )
    .expect("write");
    let checked = run(&dir, &["check", "rules", "alerts.yaml"]);
    let rules: serde_yaml::Value = serde_yaml::from_str(&rendered).expect("rules");
    let alerts = alerts(&rules);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{checked}"
    );
    run(&dir, &["test", "rules", "alerts_test.yaml"]);

    let tests: serde_yaml::Value =
        serde_yaml::from_str(&monitoring::file("alerts_test.yaml")).expect("alerts_test.yaml");
    let fired: BTreeSet<&str> = tests["tests"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_sequence().into_iter().flatten())
        .filter(|c| c["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty()))
        .filter_map(|c| c["alertname"].as_str())
        .collect();
    let runbooks = std::fs::read_to_string(repo_root().join("docs/runbooks.md")).expect("runbooks");
    let sections: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(anchor)
        .collect();
    for alert in &alerts {
        let name = alert["alert"].as_str().unwrap_or_default();
        assert!(fired.contains(name), "no test makes {name} fire");
        assert!(
            matches!(
                alert["labels"]["severity"].as_str(),
                Some("warning" | "critical")
            ),
            "{name}: severity"
        );
        for key in ["summary", "description"] {
            assert!(
                alert["annotations"][key]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: {key}"
            );
        }
        let url = alert["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        let section = url
            .strip_prefix("https://github.com/cairn-dev/cairn/blob/main/docs/runbooks.md#")
            .unwrap_or_else(|| panic!("{name}: runbook_url {url}"));
        assert_eq!(section, name.to_lowercase(), "{name}: runbook_url {url}");
        assert!(
            sections.contains(section),
            "{name}: docs/runbooks.md has no section #{section}"
        );
    }
}

/// A family the code exposes: its series names and its labels.
#[derive(Debug)]
struct Family {
    series: Vec<String>,
    labels: BTreeSet<String>,
}

/// The series of a family of `kind` named `name`.
fn series_of(name: &str, kind: &str) -> Vec<String> {
    match kind {
        "counter" => vec![format!("{name}_total")],
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|s| format!("{name}{s}"))
            .collect(),
        _ => vec![name.to_owned()],
    }
}

/// What a metrics module declares: its prefix, its label-set structs' fields, its `Metrics`
/// fields' types, and its `register(name, help, value)` calls.
#[derive(Default)]
struct Registrations {
    prefix: String,
    /// The string constants of the module (a prefix may be one).
    constants: BTreeMap<String, String>,
    label_sets: BTreeMap<String, BTreeSet<String>>,
    field_types: BTreeMap<String, Vec<String>>,
    /// Name and the field whose clone is registered.
    registered: Vec<(String, String)>,
}

fn lit_str(e: &syn::Expr) -> Option<String> {
    match e {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) => Some(s.value()),
        _ => None,
    }
}

/// The field or variable a registered value is cloned from: `m.x.clone()`, `x.clone()`.
fn cloned_name(e: &syn::Expr) -> Option<String> {
    let syn::Expr::MethodCall(call) = e else {
        return None;
    };
    match call.receiver.as_ref() {
        syn::Expr::Field(f) => match &f.member {
            syn::Member::Named(i) => Some(i.to_string()),
            syn::Member::Unnamed(_) => None,
        },
        syn::Expr::Path(p) => p.path.get_ident().map(ToString::to_string),
        _ => None,
    }
}

impl<'ast> Visit<'ast> for Registrations {
    fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
        let derives_label_set = s.attrs.iter().any(|a| match &a.meta {
            syn::Meta::List(list) => {
                list.path.is_ident("derive") && list.tokens.to_string().contains("EncodeLabelSet")
            }
            _ => false,
        });
        let fields = s
            .fields
            .iter()
            .filter_map(|f| f.ident.as_ref().map(|i| (i.to_string(), type_names(&f.ty))));
        if derives_label_set {
            self.label_sets
                .insert(s.ident.to_string(), fields.map(|(n, _)| n).collect());
        } else if s.ident == "Metrics" {
            self.field_types.extend(fields);
        }
        visit::visit_item_struct(self, s);
    }

    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = c.func.as_ref()
            && p.path
                .segments
                .last()
                .is_some_and(|s| s.ident == "with_prefix")
            && let Some(arg) = c.args.first()
        {
            self.prefix = match arg {
                syn::Expr::Path(p) => p.path.get_ident().map(|i| format!("const {i}")),
                other => lit_str(other),
            }
            .unwrap_or_default();
        }
        visit::visit_expr_call(self, c);
    }

    fn visit_item_const(&mut self, c: &'ast syn::ItemConst) {
        if let Some(value) = lit_str(&c.expr) {
            self.constants.insert(c.ident.to_string(), value);
        }
        visit::visit_item_const(self, c);
    }

    fn visit_expr_method_call(&mut self, c: &'ast syn::ExprMethodCall) {
        if c.method == "register"
            && c.args.len() == 3
            && let (Some(name), Some(field)) = (lit_str(&c.args[0]), cloned_name(&c.args[2]))
        {
            self.registered.push((name, field));
        }
        visit::visit_expr_method_call(self, c);
    }
}

/// The names in a type: `Family<ResultLabels, Counter>` → Family, ResultLabels, Counter.
fn type_names(ty: &syn::Type) -> Vec<String> {
    let syn::Type::Path(p) = ty else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for segment in &p.path.segments {
        names.push(segment.ident.to_string());
        if let syn::PathArguments::AngleBracketed(args) = &segment.arguments {
            for arg in &args.args {
                if let syn::GenericArgument::Type(t) = arg {
                    names.extend(type_names(t));
                }
            }
        }
    }
    names
}

fn registrations(module: &str) -> Registrations {
    let path = repo_root().join(module);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{module}: {e}"));
    let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{module}: {e}"));
    let mut r = Registrations::default();
    r.visit_file(&file);
    if let Some(name) = r.prefix.strip_prefix("const ") {
        r.prefix = r.constants.get(name).cloned().unwrap_or_default();
    }
    assert!(!r.prefix.is_empty(), "{module}: no Registry::with_prefix");
    r
}

/// The kind of the metric a `Family<Labels, Metric>` (or a bare metric) type holds, and the
/// fields of its label set.
fn family_type(
    ty: &[String],
    label_sets: &BTreeMap<String, BTreeSet<String>>,
) -> (String, BTreeSet<String>) {
    let kind = [
        "Histogram",
        "Counter",
        "Gauge",
        "FloatCounter",
        "FloatGauge",
    ]
    .into_iter()
    .find(|k| ty.iter().any(|n| n == k))
    .unwrap_or_else(|| panic!("the type {ty:?} is no counter, gauge or histogram"))
    .trim_start_matches("Float")
    .to_lowercase();
    let labels = ty
        .iter()
        .filter_map(|n| label_sets.get(n))
        .flatten()
        .cloned()
        .collect();
    (kind, labels)
}

/// The labels every scraped series also carries that the rules and the dashboard use: the
/// namespace (the Prometheus Operator's target label) and the session (the PodMonitor's
/// podTargetLabels, for agents); `le` of histogram buckets.
const TARGET_LABELS: [&str; 2] = ["namespace", "cairn_dev_session"];

/// Every family the code exposes, by series name.
fn exposed() -> BTreeMap<String, Family> {
    let mut out = BTreeMap::new();
    // The agent: the checked-in list, with the labels of its label sets.
    let agent = registrations("agent/src/metrics.rs");
    let field_of: BTreeMap<&str, &str> = agent
        .registered
        .iter()
        .map(|(n, f)| (n.as_str(), f.as_str()))
        .collect();
    let listed = std::fs::read_to_string(repo_root().join("agent/tests/data/metrics-series.txt"))
        .expect("metrics-series.txt");
    for line in listed
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, kind) = line.split_once(' ').expect("name type");
        let family = series.strip_suffix("_total").unwrap_or(series);
        let short = family
            .strip_prefix(&format!("{}_", agent.prefix))
            .expect("the agent's prefix");
        let labels = field_of
            .get(short)
            .and_then(|f| agent.field_types.get(*f))
            .map(|ty| family_type(ty, &agent.label_sets).1)
            .unwrap_or_default();
        add(&mut out, family, kind, labels, &TARGET_LABELS);
    }
    // The operator and the gateway: their registrations.
    for module in ["operator/src/metrics.rs", "gateway/src/metrics.rs"] {
        let r = registrations(module);
        assert!(!r.registered.is_empty(), "{module}: no registrations");
        for (name, field) in &r.registered {
            let ty = r
                .field_types
                .get(field)
                .unwrap_or_else(|| panic!("{module}: {field} is no field of Metrics"));
            let (kind, labels) = family_type(ty, &r.label_sets);
            add(
                &mut out,
                &format!("{}_{name}", r.prefix),
                &kind,
                labels,
                &[],
            );
        }
    }
    out
}

fn add(
    out: &mut BTreeMap<String, Family>,
    family: &str,
    kind: &str,
    mut labels: BTreeSet<String>,
    target: &[&str],
) {
    labels.extend(target.iter().map(|s| (*s).to_owned()));
    if kind == "histogram" {
        labels.insert("le".into());
    }
    let series = series_of(family, kind);
    for s in &series {
        out.insert(
            s.clone(),
            Family {
                series: series.clone(),
                labels: labels.clone(),
            },
        );
    }
}

/// What a PromQL expression names: metric names with the labels matched on each, and the
/// labels of its `by`, `without`, `on`, `ignoring` and `group_*` clauses.
#[derive(Debug, Default)]
struct Named {
    metrics: Vec<(String, Vec<String>)>,
    grouping: Vec<String>,
}

/// Words of PromQL that are not metric names when they stand alone.
const KEYWORDS: [&str; 13] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
];

fn named(expr: &str) -> Named {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Named::default();
    let mut i = 0;
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_ws = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        j
    };
    let read_ident = |j: usize| {
        let mut k = j;
        while k < chars.len() && ident_char(chars[k]) {
            k += 1;
        }
        (chars[j..k].iter().collect::<String>(), k)
    };
    // The end of a quoted string starting at `j`.
    let skip_string = |j: usize| {
        let quote = chars[j];
        let mut k = j + 1;
        while k < chars.len() && chars[k] != quote {
            k += if chars[k] == '\\' { 2 } else { 1 };
        }
        k + 1
    };
    // Label names of a `{...}` starting at `j`, and its end.
    let matchers = |j: usize| {
        let mut labels = Vec::new();
        let mut k = j + 1;
        while k < chars.len() && chars[k] != '}' {
            k = skip_ws(k);
            if k < chars.len() && ident_start(chars[k]) {
                let (label, next) = read_ident(k);
                labels.push(label);
                k = next;
            } else if k < chars.len() && (chars[k] == '"' || chars[k] == '\'') {
                k = skip_string(k);
            } else {
                k += 1;
            }
        }
        (labels, k + 1)
    };
    let mut last_metric: Option<usize> = None;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(i);
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '{' {
            let (labels, next) = matchers(i);
            match last_metric {
                Some(m) => out.metrics[m].1.extend(labels),
                None => out.grouping.extend(labels),
            }
            last_metric = None;
            i = next;
        } else if ident_start(c) && (i == 0 || !ident_char(chars[i - 1]) && chars[i - 1] != '.') {
            let (word, next) = read_ident(i);
            let after = skip_ws(next);
            let grouping = [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&word.as_str());
            if grouping && after < chars.len() && chars[after] == '(' {
                let mut k = after + 1;
                while k < chars.len() && chars[k] != ')' {
                    k = skip_ws(k);
                    if k < chars.len() && ident_start(chars[k]) {
                        let (label, n) = read_ident(k);
                        out.grouping.push(label);
                        k = n;
                    } else {
                        k += 1;
                    }
                }
                i = k + 1;
                last_metric = None;
                continue;
            }
            let is_call = after < chars.len() && chars[after] == '(';
            let is_aggregation = after < chars.len()
                && ["by", "without"]
                    .iter()
                    .any(|k| chars[after..].iter().collect::<String>().starts_with(k));
            if is_call || is_aggregation || KEYWORDS.contains(&word.as_str()) {
                last_metric = None;
            } else {
                out.metrics.push((word, Vec::new()));
                last_metric = Some(out.metrics.len() - 1);
            }
            i = next;
        } else {
            if !c.is_whitespace() {
                last_metric = None;
            }
            i += 1;
        }
    }
    out
}

#[test]
fn every_query_parses_and_names_only_series_and_labels_the_code_exposes() {
    let exposed = exposed();
    let dashboard: serde_json::Value =
        serde_json::from_str(&monitoring::file("dashboard.json")).expect("dashboard.json");
    let mut queries = dashboard_queries(&dashboard);
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&monitoring::file("alerts.yaml")).expect("alerts.yaml");
    for alert in alerts(&rules) {
        queries.push((
            format!("alert {}", alert["alert"].as_str().unwrap_or_default()),
            alert["expr"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    assert!(queries.len() > 40, "{queries:?}");

    // Every query parses: promtool checks them as recording rules.
    let group: Vec<serde_json::Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, q))| {
            serde_json::json!({"record": format!("cairn:query_{i}"), "expr": monitoring::with_variables(q, "5m", "team-a", "s1")})
        })
        .collect();
    let file = serde_json::json!({"groups": [{"name": "queries", "rules": group}]});
    let dir = run_dir("chart-queries").expect("a run directory");
    std::fs::write(
        dir.join("queries.yaml"),
        serde_yaml::to_string(&file).expect("yaml"),
    )
    .expect("write");
    let checked = run(&dir, &["check", "rules", "queries.yaml"]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );

    // ... and names only what the code exposes.
    let all_labels: BTreeSet<&String> = exposed.values().flat_map(|f| &f.labels).collect();
    let mut used = BTreeSet::new();
    for (place, query) in &queries {
        let named = named(query);
        assert!(!named.metrics.is_empty(), "{place}: no series in {query}");
        for (metric, labels) in &named.metrics {
            let family = exposed
                .get(metric)
                .unwrap_or_else(|| panic!("{place}: {metric} is no series the code exposes"));
            used.extend(family.series.iter().cloned());
            for l in labels {
                assert!(
                    family.labels.contains(l),
                    "{place}: {metric} has no label {l} (it has {:?})",
                    family.labels
                );
            }
        }
        for l in &named.grouping {
            assert!(
                all_labels.contains(l),
                "{place}: no series has the label {l}: {query}"
            );
        }
    }
    // The check itself sees what it must: the series the brief of the dashboard names.
    for series in [
        "cairn_operator_sessions",
        "cairn_agent_context_utilization",
        "cairn_agent_compactions_total",
        "cairn_agent_compaction_score_bucket",
        "cairn_agent_recoveries_total",
        "cairn_agent_learned_payload_cap_bytes",
        "cairn_agent_archive_bytes_total",
        "cairn_agent_archive_failures_total",
        "cairn_agent_provider_seconds_bucket",
        "cairn_agent_provider_errors_total",
        "cairn_agent_tokens_total",
        "cairn_agent_cost_usd_total",
        "cairn_gateway_wakeups_total",
        "cairn_operator_reconciles_total",
    ] {
        assert!(used.contains(series), "no query reads {series}");
    }
}

#[test]
fn the_query_scanner_finds_metrics_labels_and_rejects_unknown_names() {
    let n = named(
        r#"sum by (namespace, le) (rate(cairn_agent_x_bucket{a="1,}", b=~"x"}[5m])) / on (c) cairn_y"#,
    );
    assert_eq!(
        n.metrics,
        [
            (
                "cairn_agent_x_bucket".to_owned(),
                vec!["a".to_owned(), "b".to_owned()]
            ),
            ("cairn_y".to_owned(), vec![])
        ]
    );
    assert_eq!(n.grouping, ["namespace", "le", "c"]);
    let exposed = exposed();
    assert!(exposed.contains_key("cairn_operator_reconciles_total"));
    assert!(exposed.contains_key("cairn_operator_reconcile_duration_seconds_bucket"));
    assert!(exposed.contains_key("cairn_gateway_wakeups_total"));
    assert!(exposed.contains_key("cairn_agent_archive_failures_total"));
    assert!(!exposed.contains_key("cairn_operator_sessions_total"));
    assert!(!exposed.contains_key("cairn_agent_turns"));
    let recoveries = &exposed["cairn_agent_recoveries_total"].labels;
    for l in [
        "class",
        "attempt",
        "outcome",
        "namespace",
        "cairn_dev_session",
    ] {
        assert!(recoveries.contains(l), "{recoveries:?}");
    }
    assert!(!recoveries.contains("le"));
    assert!(
        exposed["cairn_operator_session_conditions"]
            .labels
            .contains("condition")
    );
}
