//! Generated artifacts are committed and must match what the code generates.

use cairn_tests::repo_root;

#[test]
fn committed_crds_match_the_types() {
    let committed = std::fs::read_to_string(repo_root().join("crds/generated/cairn-crds.yaml"))
        .expect("crds/generated/cairn-crds.yaml is committed");
    let generated = cairn_crds::crds_yaml().expect("CRDs serialize");
    assert!(
        committed == generated,
        "crds/generated/cairn-crds.yaml is stale: run `cargo run -p cairn-crds --bin crdgen`"
    );
}

#[test]
fn chart_crds_are_the_same_crds() {
    let chart = std::fs::read_to_string(repo_root().join("charts/cairn/templates/crds.yaml"))
        .expect("the chart's CRD template is committed");
    for crd in cairn_crds::crds() {
        let name = crd.metadata.name.expect("CRDs are named");
        assert!(
            chart.contains(&format!("name: {name}")),
            "{name} missing from the chart"
        );
    }
    assert!(chart.contains("helm.sh/resource-policy: keep"));
}
