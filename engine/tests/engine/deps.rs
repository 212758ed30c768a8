//! The engine stays pure as a Cargo fact: its normal dependency tree holds no HTTP client or
//! server, SDK, Kubernetes client, MCP, telemetry exporter or image codec, and tokio (if it
//! ever enters) without networking or the filesystem.

use std::process::Command;

/// Crates whose presence means I/O or a wire protocol reached the engine.
const FORBIDDEN: &[&str] = &[
    "reqwest",
    "hyper",
    "axum",
    "kube",
    "kube-client",
    "kube-runtime",
    "rmcp",
    "opentelemetry",
    "image",
];

/// The crate names (no versions) of `cargo tree -p cairn-engine -e normal`, with features.
fn normal_tree(edges: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "cairn-engine",
            "-e",
            edges,
            "--prefix",
            "none",
        ])
        .args(["--format", "{p} {f}", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Which of `lines` (`name vX.Y features`) name a forbidden crate or tokio with I/O features.
fn offenders(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|line| {
            let name = line.split_whitespace().next().unwrap_or("");
            let features = line.splitn(3, ' ').nth(2).unwrap_or("");
            FORBIDDEN.contains(&name)
                || name.starts_with("aws-")
                || name.starts_with("opentelemetry")
                || (name == "tokio"
                    && features
                        .split(',')
                        .any(|f| matches!(f, "net" | "fs" | "full" | "process")))
        })
        .cloned()
        .collect()
}

#[test]
fn the_normal_dependency_tree_holds_no_io_crate() {
    let tree = normal_tree("normal");
    assert!(
        tree.iter().any(|l| l.starts_with("cairn-engine ")),
        "cargo tree listed the engine: {tree:?}"
    );
    let bad = offenders(&tree);
    assert!(bad.is_empty(), "I/O crates in cairn-engine's tree: {bad:?}");
}

#[test]
fn the_check_names_what_it_forbids() {
    let lines: Vec<String> = [
        "serde v1.0.0 derive,std",
        "reqwest v0.12.0 json",
        "aws-sdk-s3 v1.0.0 ",
        "tokio v1.0.0 rt,time",
        "tokio v1.0.0 fs,rt",
        "kube v5.0.0 derive",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        offenders(&lines),
        [
            "reqwest v0.12.0 json",
            "aws-sdk-s3 v1.0.0 ",
            "tokio v1.0.0 fs,rt",
            "kube v5.0.0 derive"
        ]
    );
}
