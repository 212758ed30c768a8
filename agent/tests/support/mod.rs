//! The one support module of the agent's integration-test binaries (`tests/<area>/main.rs`
//! each declare it with `#[path = "../support/mod.rs"] mod support;`): fixtures for sessions,
//! the API and the real binary ([`agent`]), and real servers ([`moto`], and the S3 fault proxy
//! in [`faults`]).
// Each binary uses a subset.
#![allow(dead_code)]

pub mod agent;
pub mod faults;
pub mod moto;

/// `node_modules` of the reference MCP servers (`tests/harness/install-mcp-servers.sh`),
/// installed on first use.
pub fn mcp_node_modules() -> &'static std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/harness/install-mcp-servers.sh");
        let out = std::process::Command::new("bash")
            .arg(script)
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run install-mcp-servers.sh");
        assert!(out.status.success(), "install-mcp-servers.sh failed");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("node_modules="))
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| panic!("no node_modules= in {text}"))
    })
}

/// Runs the calling test again, alone, in a child process of this test binary, and returns
/// `true` in that child (where the test does its work) and `false` in the parent once the
/// child passed. For a test that changes what every thread of the process sees (environment
/// variables): the binary's other tests run on other threads of the same process.
/// `module` is the caller's `module_path!()`, `test` its function name.
pub fn in_own_process(module: &str, test: &str) -> bool {
    const CHILD: &str = "CAIRN_TEST_OWN_PROCESS";
    let name = test_name(module, test);
    if std::env::var(CHILD).is_ok_and(|v| v == name) {
        return true;
    }
    let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", &name, "--nocapture", "--test-threads", "1"])
        .env(CHILD, &name)
        .status()
        .expect("spawn the test binary");
    assert!(
        status.success(),
        "{name} failed in its own process: {status}"
    );
    false
}

/// The name libtest knows a test by (what `--exact` matches): its module path without the
/// crate, then the function.
pub fn test_name(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_owned(),
    }
}
