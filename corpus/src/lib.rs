//! A corpus of real tool output, the coding sessions generated over it, and what compaction
//! keeps in sight of them.
//!
//! - [`record`] runs real tools (cargo, pytest, go, npm, git, grep, kubectl against a real
//!   API server) on the fixture projects under `corpus/fixtures/shop` and caches what they
//!   printed, keyed by the fixtures and the tools' versions. The only module that does I/O.
//! - [`script`] is what the recorder runs, as plain data.
//! - [`session`] turns a [`Corpus`] into a coding session: a pure function of the corpus, a
//!   seed and a size.
//! - [`retention`] compacts those sessions at a window and a ladder level and measures, per
//!   category, what stays in sight and within recall.

use serde::{Deserialize, Serialize};

pub mod record;
pub mod retention;
pub mod script;
pub mod session;

/// What a recording holds: the fixtures' files and every tool run, in the order they ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Corpus {
    /// The cache key: a hash of the fixtures, the script and the tools' versions.
    pub key: String,
    /// Each tool's version line, as it printed it.
    pub tools: Vec<String>,
    /// The fixture files, by path relative to the project root, sorted.
    pub files: Vec<SourceFile>,
    pub runs: Vec<Run>,
    pub edits: Vec<RecordedEdit>,
}

/// A fixture file as an agent reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceFile {
    pub path: String,
    pub content: String,
}

/// One command the recorder ran from the project root with `bash -c`, stdout and stderr in
/// one stream as a terminal shows them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub topic: Topic,
    pub command: String,
    pub exit_code: i32,
    pub output: String,
}

/// An edit the recorder applied to a fixture file, and `git diff` of the file after it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedEdit {
    pub path: String,
    pub old: String,
    pub new: String,
    pub diff: String,
}

/// What part of the project a file, a command or a request is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topic {
    Rust,
    Python,
    Go,
    Node,
    Kube,
    Git,
}

impl Topic {
    pub const ALL: [Topic; 6] = [
        Topic::Rust,
        Topic::Python,
        Topic::Go,
        Topic::Node,
        Topic::Kube,
        Topic::Git,
    ];

    /// The topic of a fixture file, by its top directory.
    pub fn of_path(path: &str) -> Self {
        match path.split('/').next().unwrap_or_default() {
            "rust" => Self::Rust,
            "python" => Self::Python,
            "go" => Self::Go,
            "node" => Self::Node,
            "deploy" => Self::Kube,
            _ => Self::Git,
        }
    }
}

impl Corpus {
    /// The fixture files of `topic`.
    pub fn files_of(&self, topic: Topic) -> impl Iterator<Item = &SourceFile> {
        self.files
            .iter()
            .filter(move |f| Topic::of_path(&f.path) == topic)
    }

    /// The runs of `topic`.
    pub fn runs_of(&self, topic: Topic) -> impl Iterator<Item = &Run> {
        self.runs.iter().filter(move |r| r.topic == topic)
    }

    /// The edits of files of `topic`.
    pub fn edits_of(&self, topic: Topic) -> impl Iterator<Item = &RecordedEdit> {
        self.edits
            .iter()
            .filter(move |e| Topic::of_path(&e.path) == topic)
    }

    /// The run of exactly `command`.
    pub fn run(&self, command: &str) -> Option<&Run> {
        self.runs.iter().find(|r| r.command == command)
    }
}
