//! What a compaction kept, measured without an LLM: of the artifacts the history touched
//! before (files, commands, errors, requests; see [`crate::artifacts`]), how many the
//! compacted history still shows, and how many it can still reach through its archive
//! markers.
//!
//! An artifact is *present* when its text occurs verbatim in what the compacted history
//! sends for some message: content, reasoning or tool-call arguments (or is named by those
//! arguments once parsed, so a command given as an argv array or a path with JSON escapes
//! still counts). It is *reachable* when present, or when it occurs in an archived original
//! whose `<<ccr:KEY>>` marker the compacted history carries in that same sent text, following
//! markers inside fetched originals too, up to [`MAX_DEPTH`] fetches deep. Keys that only sit
//! in `meta.archived` do not count: the model never sees them. An archived segment (JSON
//! Lines, see [`super::archive::segment_text`]) is read as the messages it holds, so escaped
//! text and the markers it quotes are found as the model would recall them.
//!
//! Pure: the caller passes the archive as a lookup of bytes by key.
//!
//! Every compaction is scored the same way without reading the archive ([`Snapshot`],
//! [`score`]): what it puts at stake are the artifacts of the messages it replaces or
//! removes, and its score is the share of those still in sight. Reachability is not re-read
//! there: every replaced byte is archived before a marker names it, which the property tests
//! of [`retention`] check.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};

use aho_corasick::AhoCorasick;
use cairn_crds::session::CompactionScore;
use xxhash_rust::xxh3::Xxh3;

use crate::artifacts::{self, Artifact, Category};
use crate::ccr::{Key, extract_markers};
use crate::history::Message;

use super::archive::parse_segment;
use super::{PassReport, ledger};

/// Fetches followed from the compacted history down through archived originals.
pub const MAX_DEPTH: usize = 4;

/// Counts for one category.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Artifacts of the history before compaction.
    pub total: usize,
    /// Of those, shown verbatim by the compacted history.
    pub present: usize,
    /// Of those, present or recallable through the compacted history's markers.
    pub reachable: usize,
}

impl Tally {
    fn add(&mut self, present: bool, reachable: bool) {
        self.total += 1;
        self.present += usize::from(present);
        self.reachable += usize::from(present || reachable);
    }
}

/// Retention of one compaction, per category.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    pub files: Tally,
    pub commands: Tally,
    pub errors: Tally,
    pub requests: Tally,
    /// Artifacts neither present nor reachable, in order.
    pub lost: Vec<Artifact>,
}

impl Retention {
    /// The counts of `category`.
    pub fn tally(&self, category: Category) -> Tally {
        match category {
            Category::Files => self.files,
            Category::Commands => self.commands,
            Category::Errors => self.errors,
            Category::Requests => self.requests,
        }
    }

    fn tally_mut(&mut self, category: Category) -> &mut Tally {
        match category {
            Category::Files => &mut self.files,
            Category::Commands => &mut self.commands,
            Category::Errors => &mut self.errors,
            Category::Requests => &mut self.requests,
        }
    }

    /// Mean over the categories with something at stake of `present / total`; 1.0 when
    /// nothing was at stake.
    pub fn score(&self) -> f64 {
        self.mean(|t| t.present)
    }

    /// [`Retention::score`] for `reachable`: 1.0 when nothing was lost for good.
    pub fn reachable_share(&self) -> f64 {
        self.mean(|t| t.reachable)
    }

    fn mean(&self, kept: impl Fn(&Tally) -> usize) -> f64 {
        mean_share(Category::ALL.iter().map(|c| {
            let t = self.tally(*c);
            (kept(&t) as u64, t.total as u64)
        }))
    }
}

/// The mean of `kept / total` over the `(kept, total)` pairs with a total; 1.0 when none has.
fn mean_share(pairs: impl Iterator<Item = (u64, u64)>) -> f64 {
    let shares: Vec<f64> = pairs
        .filter(|(_, total)| *total > 0)
        .map(|(kept, total)| kept as f64 / total as f64)
        .collect();
    if shares.is_empty() {
        return 1.0;
    }
    shares.iter().sum::<f64>() / shares.len() as f64
}

/// Retention of the compaction that turned `before` into `after`; `archived` returns an
/// original's bytes by key (or `None` when the archive does not hold it).
pub fn retention(
    before: &[Message],
    after: &[Message],
    archived: &dyn Fn(&Key) -> Option<Vec<u8>>,
) -> Retention {
    let stake: Vec<Artifact> = artifacts::of_history(before).into_iter().collect();
    let shown = Texts::of(after);
    let present = shown.find(&stake);
    // The archive is read only when something is not in plain sight.
    let recallable = if present.contains(&false) {
        recall(shown.markers(), archived).find(&stake)
    } else {
        present.clone()
    };
    let mut out = Retention::default();
    for ((a, p), r) in stake.into_iter().zip(present).zip(recallable) {
        out.tally_mut(a.category).add(p, p || r);
        if !(p || r) {
            out.lost.push(a);
        }
    }
    out
}

/// A history as a compaction found it: each message's fingerprint and artifacts, so that
/// once the history is compacted in place, [`Snapshot::at_stake`] knows what it put at stake.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    messages: Vec<(u64, Vec<Artifact>)>,
}

impl Snapshot {
    pub fn of(history: &[Message]) -> Self {
        Self {
            messages: history
                .iter()
                .map(|m| (fingerprint(m), stake_of(m)))
                .collect(),
        }
    }

    /// The artifacts of the messages `after` does not hold unchanged, distinct, in order.
    pub fn at_stake(&self, after: &[Message]) -> Vec<Artifact> {
        let kept: HashSet<u64> = after.iter().map(fingerprint).collect();
        let mut seen = HashSet::new();
        self.messages
            .iter()
            .filter(|(f, _)| !kept.contains(f))
            .flat_map(|(_, found)| found)
            .filter(|a| seen.insert(*a))
            .cloned()
            .collect()
    }
}

/// What replacing or cutting `m` puts at stake: what the original message held, that is its
/// own artifacts and, for a message an earlier pass cut in place, those its ledger recorded
/// before the cut ([`ledger::note_cut`]), so a stub counts what it replaced. A stand-in's
/// ledger is not its own: it is what the stand-in already replaced, scored then.
pub fn stake_of(m: &Message) -> Vec<Artifact> {
    let mut out = artifacts::of_message(m);
    if !m.meta.is_summary {
        for a in &m.meta.ledger {
            if !out.contains(a) {
                out.push(a.clone());
            }
        }
    }
    out
}

/// Which of `wanted` `messages` show, by index: the test [`score`] applies.
pub fn in_sight<'a>(
    wanted: &[Artifact],
    messages: impl IntoIterator<Item = &'a Message>,
) -> Vec<bool> {
    Texts::of(messages).find(wanted)
}

/// Scores the pass of `report`, which turned the history of `snapshot` into `after`, on the
/// report itself, when it changed the history: every pass that cuts is scored alike.
pub fn grade_pass(report: &mut PassReport, snapshot: &Snapshot, after: &[Message]) {
    if report.is_change() {
        let level = report.level().unwrap_or(0);
        report.quality = Some(score(&snapshot.at_stake(after), after, level));
    }
}

/// What a message sends, hashed: two messages with one fingerprint read the same.
fn fingerprint(m: &Message) -> u64 {
    let mut h = Xxh3::new();
    let mut part = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    part(m.role.as_str().as_bytes());
    part(m.content.as_bytes());
    part(m.reasoning.as_deref().unwrap_or_default().as_bytes());
    part(m.tool_call_id.as_deref().unwrap_or_default().as_bytes());
    for c in &m.tool_calls {
        part(c.id.as_bytes());
        part(c.name.as_bytes());
        part(c.arguments.as_bytes());
    }
    h.digest()
}

/// The score of a compaction that put `stake` at stake (see [`Snapshot::at_stake`]) and
/// left `after`; `level` is the highest ladder level that ran (0: none).
pub fn score(stake: &[Artifact], after: &[Message], level: u8) -> CompactionScore {
    let found = Texts::of(after).find(stake);
    let mut out = CompactionScore {
        level,
        ..CompactionScore::default()
    };
    for (a, in_sight) in stake.iter().zip(found) {
        let c = match a.category {
            Category::Files => &mut out.files,
            Category::Commands => &mut out.commands,
            Category::Errors => &mut out.errors,
            Category::Requests => &mut out.requests,
        };
        c.at_stake += 1;
        c.in_sight += u64::from(in_sight);
    }
    out.score = mean_share(
        out.categories()
            .into_iter()
            .map(|(_, c)| (c.in_sight, c.at_stake)),
    );
    out
}

/// Everything the archive gives back through `keys`, following markers inside the originals.
fn recall(keys: Vec<Key>, archived: &dyn Fn(&Key) -> Option<Vec<u8>>) -> Texts<'static> {
    let mut out = Texts::default();
    let mut seen: BTreeSet<Key> = BTreeSet::new();
    let mut level = keys;
    for _ in 0..MAX_DEPTH {
        let mut next = Vec::new();
        for key in level {
            if !seen.insert(key) {
                continue;
            }
            let Some(bytes) = archived(&key) else {
                continue;
            };
            let mut found = Texts::default();
            found.add_original(bytes);
            next.extend(found.markers());
            out.absorb(found);
        }
        if next.is_empty() {
            break;
        }
        level = next;
    }
    out
}

/// Sent text to search, and the artifacts named by tool-call arguments within it.
#[derive(Default)]
struct Texts<'a> {
    texts: Vec<Cow<'a, str>>,
    named: HashSet<String>,
}

impl<'a> Texts<'a> {
    fn of(messages: impl IntoIterator<Item = &'a Message>) -> Self {
        let mut out = Self::default();
        for m in messages {
            out.add_message(m);
        }
        out
    }

    fn add_message(&mut self, m: &'a Message) {
        self.texts.extend(m.sent_texts().map(Cow::Borrowed));
        self.name(artifacts::of_calls(&m.tool_calls));
        self.name_request(m);
    }

    /// A user message shows its own request, however long (a long request's artifact is its
    /// head and tail, which its content does not hold in one piece).
    fn name_request(&mut self, m: &Message) {
        if m.role == crate::history::Role::User {
            self.name(artifacts::of_message(m));
        }
    }

    fn add_owned_message(&mut self, m: Message) {
        self.name(artifacts::of_calls(&m.tool_calls));
        self.name_request(&m);
        self.texts.push(Cow::Owned(m.content));
        if let Some(r) = m.reasoning {
            self.texts.push(Cow::Owned(r));
        }
        for c in m.tool_calls {
            self.texts.push(Cow::Owned(c.arguments));
        }
    }

    /// An archived original: a segment's messages, or a single text (which may be a call's
    /// arguments). The raw text is searched as well.
    fn add_original(&mut self, bytes: Vec<u8>) {
        let text = match String::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        match parse_segment(&text) {
            Ok(msgs) if !msgs.is_empty() && text.starts_with('{') => {
                msgs.into_iter().for_each(|m| self.add_owned_message(m));
            }
            _ => self.name(artifacts::of_arguments(&text)),
        }
        self.texts.push(Cow::Owned(text));
    }

    fn name(&mut self, found: Vec<Artifact>) {
        self.named.extend(found.into_iter().map(|a| a.text));
    }

    fn absorb(&mut self, other: Texts<'_>) {
        self.texts
            .extend(other.texts.into_iter().map(|t| Cow::Owned(t.into_owned())));
        self.named.extend(other.named);
    }

    /// Which of `wanted` the texts hold, by index: named by a call, or found in one pass
    /// over the texts for all of them at once.
    fn find(&self, wanted: &[Artifact]) -> Vec<bool> {
        let mut found: Vec<bool> = wanted
            .iter()
            .map(|a| self.named.contains(&a.text))
            .collect();
        let mut left = found.iter().filter(|f| !**f).count();
        if left == 0 {
            return found;
        }
        // Each artifact's text, and the one-line form the ledger section shows a multi-line
        // one in; `of[p]` is the artifact pattern `p` stands for.
        let mut patterns: Vec<Cow<'_, str>> = Vec::with_capacity(wanted.len());
        let mut of: Vec<usize> = Vec::with_capacity(wanted.len());
        for (i, a) in wanted.iter().enumerate() {
            let one_line = ledger::one_line(&a.text);
            if matches!(one_line, Cow::Owned(_)) {
                patterns.push(one_line);
                of.push(i);
            }
            patterns.push(Cow::Borrowed(a.text.as_str()));
            of.push(i);
        }
        let Ok(matcher) = AhoCorasick::new(patterns.iter().map(|p| p.as_ref())) else {
            // An automaton too large to build: one search per pattern.
            for (p, i) in patterns.iter().zip(&of) {
                found[*i] = found[*i] || self.texts.iter().any(|t| t.contains(p.as_ref()));
            }
            return found;
        };
        for t in &self.texts {
            for m in matcher.find_overlapping_iter(t.as_ref()) {
                let f = &mut found[of[m.pattern().as_usize()]];
                if !*f {
                    *f = true;
                    left -= 1;
                    if left == 0 {
                        return found;
                    }
                }
            }
        }
        found
    }

    /// Markers in the texts, distinct, in order of first appearance.
    fn markers(&self) -> Vec<Key> {
        let mut seen = HashSet::new();
        self.texts
            .iter()
            .flat_map(|t| extract_markers(t))
            .filter(|k| seen.insert(*k))
            .collect()
    }
}
