//! The recorder: runs the [`script`](crate::script) on a copy of the fixture project and
//! keeps what the tools printed in a cache keyed by the fixtures, the script and the tools'
//! versions, so a second run reads one file.
//!
//! A tool that is missing or fails to print its version fails the recording: a corpus
//! without one of its parts would measure something else.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::script::{self, Edit, Setup, Step};
use crate::{Corpus, RecordedEdit, Run, SourceFile};

/// A recorded output is cut to this many bytes (on a character boundary).
pub const MAX_OUTPUT: usize = 64 * 1024;
/// A command that runs longer fails the recording.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(180);

/// Why a recording failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(
        "the corpus needs `{tool}` ({command}), which failed: {detail}; install it (CI has every tool)"
    )]
    MissingTool {
        tool: String,
        command: String,
        detail: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("setting up the fixture repository: `{command}` exited with {code}:\n{output}")]
    Setup {
        command: String,
        code: i32,
        output: String,
    },
    #[error("the edit of {path} does not apply: its old text does not occur exactly once")]
    Edit { path: String },
    #[error("`{command}` ran longer than {COMMAND_TIMEOUT:?}")]
    Timeout { command: String },
    #[error("starting the control plane for the kubectl recordings: {0}")]
    Cluster(String),
    #[error("the cached corpus {path} is unreadable: {detail}")]
    Cache { path: String, detail: String },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RecordError {
    let what = what.into();
    move |source| RecordError::Io { what, source }
}

/// A running API server for the kubectl commands; `guard` keeps it running until dropped.
pub struct Cluster {
    pub kubeconfig: PathBuf,
    pub guard: Box<dyn Send>,
}

/// The fixture project the corpus is recorded from.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/shop")
}

/// `$CAIRN_CACHE/corpus`, else `~/.cache/cairn/corpus` (where the test harness keeps its
/// binaries and runs).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("CAIRN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/cairn")))
        .unwrap_or_else(std::env::temp_dir)
        .join("corpus")
}

/// The corpus for the fixtures and tools of this machine: read from `cache` when recorded
/// before, else recorded (with `kubectl` against the cluster `start_cluster` starts) and
/// cached.
pub fn load_or_record(
    cache: &Path,
    kubectl: &Path,
    start_cluster: impl FnOnce() -> Result<Cluster, String> + Send,
) -> Result<Corpus, RecordError> {
    let files = read_fixtures(&fixtures_dir())?;
    let mut tools = Vec::new();
    for (tool, command) in script::TOOLS {
        tools.push(version(tool, command)?);
    }
    let kubectl_version = format!("{} version --client", shell_quote(kubectl));
    tools.push(version("kubectl", &kubectl_version)?);
    let key = cache_key(&files, &tools);
    let path = cache.join(format!("corpus-{key}.json"));
    if let Ok(text) = fs::read_to_string(&path) {
        return serde_json::from_str(&text).map_err(|e| RecordError::Cache {
            path: path.display().to_string(),
            detail: e.to_string(),
        });
    }
    // One work directory per process: two test binaries may record at once.
    let work = cache
        .join("work")
        .join(format!("{key}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    let root = work.join("shop");
    copy_dir(&fixtures_dir(), &root)?;
    let recorder = Recorder {
        root: &root,
        work: &work,
    };
    let recorded = recorder.record(kubectl, start_cluster);
    let _ = fs::remove_dir_all(&work);
    let (runs, edits) = recorded?;
    let corpus = Corpus {
        key,
        tools,
        files,
        runs,
        edits,
    };
    let text = serde_json::to_string(&corpus).map_err(|e| RecordError::Cache {
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    // Written aside and renamed: a concurrent reader sees the whole file or none.
    let partial = cache.join(format!("corpus-{}.json.{}", corpus.key, std::process::id()));
    fs::write(&partial, text).map_err(io(format!("writing {}", partial.display())))?;
    fs::rename(&partial, &path).map_err(io(format!("renaming to {}", path.display())))?;
    Ok(corpus)
}

fn cache_key(files: &[SourceFile], tools: &[String]) -> String {
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    part(script::fingerprint().as_bytes());
    for f in files {
        part(f.path.as_bytes());
        part(f.content.as_bytes());
    }
    for t in tools {
        part(t.as_bytes());
    }
    hex::encode(&h.finalize()[..8])
}

/// Every file under `dir`, by path relative to it, sorted.
fn read_fixtures(dir: &Path) -> Result<Vec<SourceFile>, RecordError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).map_err(io(format!("reading {}", d.display())))? {
            let entry = entry.map_err(io(format!("reading {}", d.display())))?;
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let content = fs::read_to_string(&path)
                .map_err(io(format!("reading fixture {}", path.display())))?;
            let relative = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            out.push(SourceFile {
                path: relative,
                content,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), RecordError> {
    fs::create_dir_all(to).map_err(io(format!("creating {}", to.display())))?;
    for entry in fs::read_dir(from).map_err(io(format!("reading {}", from.display())))? {
        let entry = entry.map_err(io(format!("reading {}", from.display())))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if src.is_dir() {
            copy_dir(&src, &dst)?;
        } else {
            fs::copy(&src, &dst).map_err(io(format!("copying {}", src.display())))?;
        }
    }
    Ok(())
}

/// A tool's version line; a tool that cannot print one is missing.
fn version(tool: &str, command: &str) -> Result<String, RecordError> {
    let missing = |detail: String| RecordError::MissingTool {
        tool: tool.into(),
        command: command.into(),
        detail,
    };
    let out = Command::new("bash")
        .args(["-c", command])
        .output()
        .map_err(|e| missing(e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || text.is_empty() {
        return Err(missing(format!(
            "exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(format!(
        "{tool}: {}",
        text.lines().next().unwrap_or_default()
    ))
}

fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// Runs the script in `root` (a copy of the fixtures).
struct Recorder<'a> {
    root: &'a Path,
    work: &'a Path,
}

impl Recorder<'_> {
    fn record(
        &self,
        kubectl: &Path,
        start_cluster: impl FnOnce() -> Result<Cluster, String> + Send,
    ) -> Result<(Vec<Run>, Vec<RecordedEdit>), RecordError> {
        // The control plane starts while the local tools run.
        std::thread::scope(|s| {
            let cluster = s.spawn(start_cluster);
            let mut runs = Vec::new();
            let local = self.local(&mut runs);
            let cluster = cluster
                .join()
                .map_err(|_| RecordError::Cluster("the start panicked".into()))
                .and_then(|c| c.map_err(RecordError::Cluster));
            local?;
            let cluster = cluster?;
            let bin = self.work.join("bin");
            fs::create_dir_all(&bin).map_err(io("creating the kubectl directory"))?;
            let link = bin.join("kubectl");
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(kubectl, &link).map_err(io("linking kubectl"))?;
            let path = format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            );
            let kube_env = [
                ("PATH", path),
                ("KUBECONFIG", cluster.kubeconfig.display().to_string()),
            ];
            for step in script::KUBE {
                runs.push(self.run(step, &kube_env)?);
            }
            drop(cluster);
            let mut edits = Vec::new();
            for edit in script::EDITS {
                self.apply(edit)?;
                let (_, diff) = self.exec(&format!("git diff -- {}", edit.path), &[])?;
                edits.push(RecordedEdit {
                    path: edit.path.into(),
                    old: edit.old.into(),
                    new: edit.new.into(),
                    diff,
                });
            }
            for step in script::AFTER_EDITS {
                runs.push(self.run(step, &[])?);
            }
            Ok((runs, edits))
        })
    }

    fn local(&self, runs: &mut Vec<Run>) -> Result<(), RecordError> {
        for setup in script::REPOSITORY {
            match setup {
                Setup::Shell(command) => {
                    let (code, output) = self.exec(command, &[])?;
                    if code != 0 {
                        return Err(RecordError::Setup {
                            command: (*command).into(),
                            code,
                            output,
                        });
                    }
                }
                Setup::Edit(edit) => self.apply(edit)?,
            }
        }
        for step in script::LOCAL {
            runs.push(self.run(step, &[])?);
        }
        Ok(())
    }

    fn apply(&self, edit: &Edit) -> Result<(), RecordError> {
        let path = self.root.join(edit.path);
        let text = fs::read_to_string(&path).map_err(io(format!("reading {}", edit.path)))?;
        if text.matches(edit.old).count() != 1 {
            return Err(RecordError::Edit {
                path: edit.path.into(),
            });
        }
        fs::write(&path, text.replacen(edit.old, edit.new, 1))
            .map_err(io(format!("writing {}", edit.path)))
    }

    fn run(&self, step: &Step, env: &[(&str, String)]) -> Result<Run, RecordError> {
        let (exit_code, output) = self.exec(step.command, env)?;
        Ok(Run {
            topic: step.topic,
            command: step.command.into(),
            exit_code,
            output,
        })
    }

    /// `bash -c command` in the project root, stdout and stderr in one stream.
    fn exec(&self, command: &str, env: &[(&str, String)]) -> Result<(i32, String), RecordError> {
        let log = self.work.join("output");
        let file = fs::File::create(&log).map_err(io("creating the output file"))?;
        let err = file.try_clone().map_err(io("opening the output file"))?;
        let mut cmd = Command::new("bash");
        cmd.args(["-c", command])
            .current_dir(self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err));
        // The test's own cargo settings must not leak into the fixture's builds.
        for var in [
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "RUSTFLAGS",
            "RUSTDOCFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_MAKEFLAGS",
            "RUST_BACKTRACE",
            "RUST_LOG",
        ] {
            cmd.env_remove(var);
        }
        let npm_cache = self.work.join("npm-cache").display().to_string();
        let fixed = [
            ("CARGO_NET_OFFLINE", "true"),
            ("CARGO_TERM_COLOR", "never"),
            ("GOFLAGS", "-mod=mod"),
            ("GOTOOLCHAIN", "local"),
            ("GOPROXY", "off"),
            ("GONOSUMDB", "*"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
            ("npm_config_cache", npm_cache.as_str()),
            ("npm_config_update_notifier", "false"),
            ("npm_config_fund", "false"),
            ("npm_config_audit", "false"),
            ("NO_COLOR", "1"),
            ("TERM", "dumb"),
            ("GIT_AUTHOR_NAME", "Dana Reyes"),
            ("GIT_AUTHOR_EMAIL", "dana@shop.example.com"),
            ("GIT_AUTHOR_DATE", "2026-11-30T09:00:00Z"),
            ("GIT_COMMITTER_NAME", "Dana Reyes"),
            ("GIT_COMMITTER_EMAIL", "dana@shop.example.com"),
            ("GIT_COMMITTER_DATE", "2026-11-30T09:00:00Z"),
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ];
        cmd.envs(fixed);
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        let mut child = cmd.spawn().map_err(|e| RecordError::MissingTool {
            tool: "bash".into(),
            command: command.into(),
            detail: e.to_string(),
        })?;
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child
                .try_wait()
                .map_err(io(format!("waiting for {command}")))?
            {
                break status;
            }
            if started.elapsed() > COMMAND_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RecordError::Timeout {
                    command: command.into(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut bytes = Vec::new();
        fs::File::open(&log)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(io("reading the output file"))?;
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if text.len() > MAX_OUTPUT {
            let mut end = MAX_OUTPUT;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        Ok((status.code().unwrap_or(-1), text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_fails_with_its_name_and_what_ran() {
        let err =
            version("frobnicate", "frobnicate-not-installed --version").expect_err("no such tool");
        let text = err.to_string();
        assert!(matches!(err, RecordError::MissingTool { .. }), "{err:?}");
        assert!(
            text.contains("`frobnicate`") && text.contains("frobnicate-not-installed --version"),
            "{text}"
        );
        assert!(
            version("bash", "bash --version")
                .expect("bash runs the recorder")
                .starts_with("bash: GNU bash")
        );
    }
}
