//! What compaction keeps in sight of a corpus session: the ladder run at a model's window and
//! forced to a level, measured with the engine's probe ([`probe::retention`]) per category,
//! with the bytes the result weighs and what the compaction cost.
//!
//! Level 2 gets a careless summarizer ([`CarelessSummarizer`]): a summary with the nine
//! sections that names nothing concrete, so what stays in sight is what the engine itself
//! keeps (kept messages, ledger sections), not what a good model happened to repeat.

use std::collections::BTreeMap;
use std::time::Instant;

use async_trait::async_trait;
use cairn_crds::EffectivePolicy;
use cairn_engine::artifacts::Category;
use cairn_engine::ccr::{Key, MemoryStore, Store};
use cairn_engine::compact::probe::{self, Retention};
use cairn_engine::compact::summarize::{SECTIONS, SummaryRequest};
use cairn_engine::compact::{
    BudgetInputs, LadderContext, SessionState, SummarizeError, Summarizer, SummaryVerdict, Trigger,
    compact,
};
use cairn_engine::compact::{ledger, sections};
use cairn_engine::history::{self, Message};

/// The windows measured, in tokens.
pub const WINDOWS: [u64; 3] = [8_000, 32_000, 128_000];
/// The ladder levels measured.
pub const LEVELS: [u8; 3] = [1, 2, 3];

/// A summarizer that writes the nine sections and names no file, command, error or request:
/// the worst summary the level-2 gate still accepts.
pub struct CarelessSummarizer;

/// What each section says.
const CARELESS: &str = "The work went on as discussed; some things were changed and some checks were run. \
Details are in the earlier conversation.";

#[async_trait]
impl Summarizer for CarelessSummarizer {
    fn window_chars(&self) -> usize {
        400_000
    }

    async fn summarize(&self, request: &SummaryRequest) -> Result<String, SummarizeError> {
        let len = (request.transcript.len() / 40).clamp(2_100, 6_000);
        let mut s = String::new();
        for (n, section) in SECTIONS.iter().enumerate() {
            s.push_str(&format!("{}. {section}\n{CARELESS}\n", n + 1));
        }
        while s.len() < len {
            s.push_str("More of the same work happened; nothing else stood out.\n");
        }
        Ok(s)
    }
}

/// One compaction measured.
#[derive(Clone, Debug)]
pub struct Measure {
    /// The session's size before, in bytes.
    pub session: usize,
    /// The model's window, in tokens.
    pub window: u64,
    /// The level the ladder was forced to.
    pub level: u8,
    /// The highest level that ran (level 2 goes on to 3 when the summary leaves the history
    /// over the window's target; level 3 only runs when level 1 left it over).
    pub reached: Option<u8>,
    /// The window's target, in bytes.
    pub target: usize,
    pub retention: Retention,
    /// What the compacted history weighs.
    pub bytes_after: usize,
    /// Of that, what cairn's own sections and ledger lines in its stand-ins take: the bytes
    /// spent keeping artifacts in sight.
    pub sections_bytes: usize,
    /// The compaction's wall time.
    pub millis: f64,
    /// How level 2's summarizer call ended, when one ran.
    pub summary: Option<SummaryVerdict>,
}

impl Measure {
    /// `present / total` of `category` (1 when nothing was at stake).
    pub fn in_sight(&self, category: Category) -> f64 {
        share(
            self.retention.tally(category).present,
            category,
            &self.retention,
        )
    }

    /// `reachable / total` of `category`.
    pub fn reachable(&self, category: Category) -> f64 {
        share(
            self.retention.tally(category).reachable,
            category,
            &self.retention,
        )
    }
}

fn share(kept: usize, category: Category, r: &Retention) -> f64 {
    let total = r.tally(category).total;
    if total == 0 {
        1.0
    } else {
        kept as f64 / total as f64
    }
}

/// Compacts `before` as the ladder does for a model of `window` tokens (the default policy,
/// four characters a token, no payload cap), forced to `level`:
///
/// - 1: a manual compaction without a summarizer that stops after level 1 (trim);
/// - 2: a manual compaction with [`CarelessSummarizer`] (trim, summary, then level 3 if the
///   history is still over the window's target);
/// - 3: a manual compaction without a summarizer (trim, then level 3 if still over).
pub async fn measure(before: &[Message], window: u64, level: u8) -> Measure {
    measure_with(before, window, level, &CarelessSummarizer).await
}

/// [`measure`] with `summarizer` writing level 2 (a real model's, say).
pub async fn measure_with(
    before: &[Message],
    window: u64,
    level: u8,
    summarizer: &dyn Summarizer,
) -> Measure {
    let policy = EffectivePolicy::default();
    let store = MemoryStore::new();
    let mut state = SessionState::new();
    let inputs = BudgetInputs {
        context_window: window,
        payload_cap: None,
        reserve_bytes: 0,
    };
    let ctx = LadderContext {
        policy: &policy,
        inputs,
        store: &store,
        summarizer: (level == 2).then_some(summarizer),
        trigger: Trigger::Manual,
        budget_ratio: None,
        // Level 1 alone: a target nothing exceeds, so no level follows.
        target: (level == 1).then_some(usize::MAX),
    };
    let mut h = before.to_vec();
    let started = Instant::now();
    let out = compact(&mut h, &ctx, &mut state).await;
    let millis = started.elapsed().as_secs_f64() * 1e3;
    let mut archived: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
    for key in out.reports.iter().flat_map(|r| r.archived.iter()) {
        if let Ok(Some(bytes)) = store.fetch(key).await {
            archived.insert(*key, bytes);
        }
    }
    let retention = probe::retention(before, &h, &|k| archived.get(k).cloned());
    let target = if level == 1 {
        // What the window's target would have been, for the table.
        compact_target(window, &policy)
    } else {
        out.target
    };
    Measure {
        session: history::weight(before),
        window,
        level,
        reached: out.level,
        target,
        retention,
        bytes_after: history::weight(&h),
        sections_bytes: sections_bytes(&h),
        millis,
        summary: out.summary,
    }
}

/// The bytes of cairn's blocks and ledger sections in the stand-ins of `h`.
fn sections_bytes(h: &[Message]) -> usize {
    h.iter()
        .filter(|m| m.meta.is_summary)
        .map(|m| {
            let own = sections::summarizer_text(&m.content);
            m.content.len() - ledger::without_section(&own).len()
        })
        .sum()
}

/// The target the ladder aims for at `window` tokens.
fn compact_target(window: u64, policy: &EffectivePolicy) -> usize {
    use cairn_engine::compact::{Budget, window::target_chars};
    let state = SessionState::new();
    let inputs = BudgetInputs {
        context_window: window,
        payload_cap: None,
        reserve_bytes: 0,
    };
    target_chars(
        Budget::compute(&inputs, policy, &state),
        &inputs,
        policy,
        &state,
    )
}

/// The table's header (Markdown).
pub fn header() -> String {
    "| session | window | level (reached) | target | files | commands | errors | requests | reachable | bytes after | cairn's sections | ms |\n\
     |---|---|---|---|---|---|---|---|---|---|---|---|"
        .into()
}

/// One row of the table (Markdown): each category as `present/total`.
pub fn row(m: &Measure) -> String {
    let cell = |c: Category| {
        let t = m.retention.tally(c);
        format!("{}/{} ({:.2})", t.present, t.total, m.in_sight(c))
    };
    let reached = m.reached.map_or("–".to_owned(), |l| l.to_string());
    format!(
        "| {} KB | {}k | {} ({reached}) | {} KB | {} | {} | {} | {} | {:.2} | {} KB | {:.1} KB | {:.0} |",
        m.session / 1000,
        m.window / 1000,
        m.level,
        m.target / 1000,
        cell(Category::Files),
        cell(Category::Commands),
        cell(Category::Errors),
        cell(Category::Requests),
        m.retention.reachable_share(),
        m.bytes_after / 1000,
        m.sections_bytes as f64 / 1000.0,
        m.millis
    )
}
