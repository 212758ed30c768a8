//! The official Python clients (the OpenAI and Anthropic SDKs, LangChain) in the harness's
//! venv, installed by `tests/harness/install-py-clients.sh` when missing, and scripts run
//! with them. Test support: failures panic with the script's output.

use std::path::PathBuf;
use std::process::Command;

/// The venv's python.
pub fn python() -> PathBuf {
    let out = Command::new("bash")
        .arg(super::repo_root().join("tests/harness/install-py-clients.sh"))
        .output()
        .expect("install-py-clients.sh");
    assert!(
        out.status.success(),
        "installing the Python clients failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Runs `script` (`python -c`) with `env` added and returns its stdout; a failing script
/// panics with its stdout and stderr.
pub fn run<K: AsRef<str>, V: AsRef<str>>(script: &str, env: &[(K, V)]) -> String {
    let out = Command::new(python())
        .args(["-c", script])
        .envs(env.iter().map(|(k, v)| (k.as_ref(), v.as_ref())))
        .output()
        .expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The value of the script's `key=value` line.
pub fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= line in:\n{out}"))
}
