//! The compaction ladder: verbatim budget, then level 1 trim, level 2 summary, level 3
//! emergency truncation, stopping as soon as the history fits. Three failed compactions in a
//! row open the session's circuit breaker: auto-compaction stops (manual compaction and
//! recovery still run) until a compaction succeeds.
//!
//! It is the one shrinking engine of the agent, driven by two kinds of trigger: a budget
//! before sending (the policy's ratio of the window, or pre-flight's tighter one), and after
//! a rejection a target the recovery ladder computed from what the server said
//! ([`LadderContext::target`]).

use cairn_crds::EffectivePolicy;
use cairn_crds::session::CompactionScore;

use crate::artifacts::Artifact;
use crate::ccr::Store;
use crate::history::{self, Message};

use super::ledger::Width;
use super::sections::{self, Room};
use super::state::{SKIP_LEVEL2_AFTER_NON_CONVERGING, SummaryVerdict};
use super::summarize::{self, SummaryOutcome};
use super::window::target_chars;
use super::{
    Budget, BudgetInputs, Pass, PassReport, SessionState, Summarizer, Trigger, emergency, ledger,
    probe, trim, verbatim,
};

/// Pre-flight compacts when a request would exceed this share of a known payload cap.
pub const PREFLIGHT_CAP_SHARE: f64 = 0.85;
/// The budget ratio of a pre-flight compaction.
pub const PREFLIGHT_BUDGET_RATIO: f64 = 0.40;
/// With no payload cap known, a history past this size is worth one warning per session.
pub const LARGE_HISTORY_WARN_BYTES: usize = 2_621_440;

/// What to do before sending a request of `request_bytes`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Preflight {
    Send,
    /// Compact with this budget ratio first ([`Trigger::PreFlight`]).
    Compact {
        budget_ratio: f64,
    },
    /// Send, and warn once: the history is large and no payload cap is known.
    WarnLargeHistory,
}

/// The pre-flight check: compacts hard before a request that would come close to a known
/// payload cap (configured or learned), warns once about a large history when none is known.
pub fn preflight(
    request_bytes: usize,
    configured_cap: Option<u64>,
    state: &mut SessionState,
) -> Preflight {
    match state.effective_payload_cap(configured_cap) {
        Some(cap) if request_bytes as f64 > cap as f64 * PREFLIGHT_CAP_SHARE => {
            Preflight::Compact {
                budget_ratio: PREFLIGHT_BUDGET_RATIO,
            }
        }
        Some(_) => Preflight::Send,
        None if request_bytes > LARGE_HISTORY_WARN_BYTES && !state.large_history_warned => {
            state.large_history_warned = true;
            Preflight::WarnLargeHistory
        }
        None => Preflight::Send,
    }
}

/// Everything a compaction needs besides the history and the session state.
pub struct LadderContext<'a> {
    pub policy: &'a EffectivePolicy,
    pub inputs: BudgetInputs,
    pub store: &'a dyn Store,
    /// `None`, or a disabled summarizer in the policy: level 2 is skipped.
    pub summarizer: Option<&'a dyn Summarizer>,
    pub trigger: Trigger,
    /// Overrides the policy's budget ratio (pre-flight compacts to 0.40).
    pub budget_ratio: Option<f64>,
    /// A target in bytes that overrides the budget's (recovery: the size the server's
    /// numbers call for). The ladder then runs even if the history fits its budget.
    pub target: Option<usize>,
}

/// Why a compaction did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotRun {
    /// Already within the target.
    NotNeeded,
    /// The circuit breaker is open.
    CircuitOpen,
}

/// The result of one compaction.
#[derive(Clone, Debug, PartialEq)]
pub struct CompactionOutcome {
    pub trigger: Trigger,
    /// The target in bytes the ladder aimed for.
    pub target: usize,
    pub bytes_before: usize,
    pub bytes_after: usize,
    /// The history fits the target.
    pub met: bool,
    /// Highest level that ran (1-3).
    pub level: Option<u8>,
    pub not_run: Option<NotRun>,
    pub reports: Vec<PassReport>,
    /// The circuit breaker opened with this compaction.
    pub breaker_opened: bool,
    /// How level 2's summarizer call ended, when one ran (a memory standing in for the
    /// summary is no summarizer call); `level2_skipped` when it backed off.
    pub summary: Option<SummaryVerdict>,
    pub level2_skipped: bool,
    /// What it kept in sight of what it replaced, when it changed the history
    /// ([`probe::score`]).
    pub quality: Option<CompactionScore>,
    /// The policy's `quality.minScore`, when the score stayed below it.
    pub below_min_score: Option<f64>,
}

/// Runs the ladder on `history`.
pub async fn compact(
    history: &mut Vec<Message>,
    ctx: &LadderContext<'_>,
    state: &mut SessionState,
) -> CompactionOutcome {
    let ratio = ctx.budget_ratio.unwrap_or(ctx.policy.budget_ratio);
    let budget = Budget::with_ratio(&ctx.inputs, ratio, state);
    let target = ctx
        .target
        .unwrap_or_else(|| target_chars(budget, &ctx.inputs, ctx.policy, state).min(budget.chars));
    let before = history::weight(history);
    let mut out = CompactionOutcome {
        trigger: ctx.trigger,
        target,
        bytes_before: before,
        bytes_after: before,
        met: before <= target,
        level: None,
        not_run: None,
        reports: Vec::new(),
        breaker_opened: false,
        summary: None,
        level2_skipped: false,
        quality: None,
        below_min_score: None,
    };
    if ctx.trigger == Trigger::Auto && state.auto_compaction_disabled() {
        out.not_run = Some(NotRun::CircuitOpen);
        return out;
    }
    let manual = ctx.trigger == Trigger::Manual;
    if out.met && !manual {
        out.not_run = Some(NotRun::NotNeeded);
        return out;
    }
    let fits = |h: &[Message]| history::weight(h) <= target;
    let snapshot = probe::Snapshot::of(history);
    // What each pass put at stake, by report index: graded against the history the whole
    // compaction leaves.
    let mut stakes = PassStakes::default();

    let before = probe::Snapshot::of(history);
    out.reports
        .push(verbatim::enforce(history, budget, ctx.trigger, ctx.store).await);
    stakes.note(&out.reports, &before, history);

    if !fits(history) || manual {
        let before = probe::Snapshot::of(history);
        out.reports
            .push(trim::trim(history, ctx.policy, ctx.trigger, ctx.store).await);
        stakes.note(&out.reports, &before, history);
        out.level = Some(1);
    }

    let summarizer = ctx.summarizer.filter(|_| ctx.policy.summarizer.enabled);
    if (!fits(history) || manual)
        && let Some(s) = summarizer
    {
        if state.skip_level2 > 0 {
            state.skip_level2 -= 1;
            state.summaries.skipped += 1;
            out.level2_skipped = true;
        } else {
            let mut before = probe::Snapshot::of(history);
            let (report, outcome) =
                summarize::summarize(history, ctx.policy, ctx.trigger, s, ctx.store).await;
            // The session memory replaced what it covers; when that is not enough, level 2
            // summarises the rest as it would have without a memory.
            let (mut report, outcome) = if outcome == SummaryOutcome::Applied
                && report
                    .notes
                    .iter()
                    .any(|n| n == summarize::FROM_MEMORY_NOTE)
                && !fits(history)
            {
                out.level = Some(2);
                out.reports.push(report);
                stakes.note(&out.reports, &before, history);
                before = probe::Snapshot::of(history);
                let plain = WithoutMemory(s);
                summarize::summarize(history, ctx.policy, ctx.trigger, &plain, ctx.store).await
            } else {
                (report, outcome)
            };
            let from_memory = report
                .notes
                .iter()
                .any(|n| n == summarize::FROM_MEMORY_NOTE);
            out.summary = match &outcome {
                SummaryOutcome::Applied if from_memory => None,
                SummaryOutcome::Applied => Some(SummaryVerdict::Accepted),
                SummaryOutcome::NothingToSummarize => None,
                SummaryOutcome::Rejected(r) => Some(SummaryVerdict::Rejected(r.label())),
                SummaryOutcome::Failed(_) | SummaryOutcome::ArchiveFailed => {
                    Some(SummaryVerdict::Failed)
                }
            };
            if let Some(v) = out.summary {
                state.record_summary(v);
            }
            if outcome == SummaryOutcome::Applied {
                out.level = Some(2);
                if !fits(history) {
                    // The kept tail's largest results give way (archived, their error lines
                    // kept) before level 3 would truncate the summary and all before it.
                    let mut cut = history.clone();
                    let mut r = report.clone();
                    let room = Room::UnderTarget(Width::Wide);
                    sections::fill_newest(&mut cut, target, room, ctx.store, &mut r).await;
                    if fits(&cut) {
                        *history = cut;
                        report = r;
                    }
                }
                if !fits(history) {
                    state.skip_level2 = SKIP_LEVEL2_AFTER_NON_CONVERGING;
                    report
                        .notes
                        .push("summary did not bring the history under budget; level 2 is skipped for the next 2 compactions".into());
                }
            }
            out.reports.push(report);
            stakes.note(&out.reports, &before, history);
        }
    }

    if out.level == Some(2) && !fits(history) {
        // Level 3 runs next: the summary's sections are filled now, in the room a section
        // takes before level 3, so that level 3 keeps them (it never cuts cairn's own
        // stand-ins) or carries their entries into its notice.
        let room = Room::AtMost(ledger::before_level3(target));
        fill(history, target, room, ctx.store, &mut out.reports).await;
    }
    let mut before_level3 = None;
    let mut level3 = None;
    if !fits(history) {
        level3 = Some((out.reports.len(), probe::Snapshot::of(history)));
        // With a score to meet, level 3 may run again from here with a wider ledger section.
        before_level3 = ctx.policy.quality.min_score.map(|_| history.clone());
        let (report, _) =
            emergency::emergency(history, ctx.policy, target, ctx.trigger, ctx.store).await;
        out.reports.push(report);
        out.level = Some(3);
        state.level3_compactions += 1;
    }

    // With a score to meet, the sections may be filled again with the kept tail cut.
    let mut unfilled = None;
    if out.level == Some(2) {
        // What the summarized messages touched, in the room left under the target (level 3
        // writes its notice's section itself).
        unfilled = ctx
            .policy
            .quality
            .min_score
            .filter(|_| {
                !history
                    .iter()
                    .any(|m| m.content.contains(sections::BLOCK_OPEN))
            })
            .map(|_| history.clone());
        let room = Room::UnderTarget(Width::Normal);
        fill(history, target, room, ctx.store, &mut out.reports).await;
    }
    if out.reports.iter().any(PassReport::is_change) {
        let retry = match (before_level3, unfilled) {
            (Some(h), _) => Some(Retry::Level3(h)),
            (None, Some(h)) => Some(Retry::Sections(h)),
            (None, None) => None,
        };
        let score = grade(history, &snapshot, retry, target, ctx, &mut out).await;
        state.quality.record(score.clone());
        state.quality.below_min_score += u64::from(out.below_min_score.is_some());
        out.quality = Some(score);
    }
    // Level 3 may have run again while graded: what it put at stake is read at the end.
    if let Some((i, before)) = level3 {
        stakes.0.push((i, before.at_stake(history)));
    }
    stakes.grade(&mut out.reports, history);
    out.bytes_after = history::weight(history);
    out.met = out.bytes_after <= target;
    if ctx.trigger == Trigger::Recovery {
        // Recovery counts its own attempts; it neither opens nor closes the breaker.
        return out;
    }
    let was_open = state.auto_compaction_disabled();
    state.record_outcome(out.met);
    state.compactions += 1;
    out.breaker_opened = !was_open && state.auto_compaction_disabled();
    out
}

/// Fills the sections of the newest level-2 stand-in, naming what it archives in the
/// summary's report.
async fn fill(
    history: &mut [Message],
    target: usize,
    room: Room,
    store: &dyn Store,
    reports: &mut [PassReport],
) {
    if let Some(r) = reports.iter_mut().rev().find(|r| r.pass == Pass::Summary) {
        sections::fill_newest(history, target, room, store, r).await;
    }
}

/// What a compaction below `quality.minScore` tries once more from.
enum Retry {
    /// Level 3 again, from the history it started from, with a wide ledger section.
    Level3(Vec<Message>),
    /// The summary's sections again, from the history before they were filled, the kept
    /// tail cut to make room.
    Sections(Vec<Message>),
}

/// The score of the compaction that turned `snapshot` into `history`. Below the policy's
/// `quality.minScore` it tries once more to keep more in sight (within `target`, see
/// [`Retry`]); the better of the two stays. One that stays below sets
/// `out.below_min_score`. Either way the compaction's last report says so.
async fn grade(
    history: &mut Vec<Message>,
    snapshot: &probe::Snapshot,
    retry: Option<Retry>,
    target: usize,
    ctx: &LadderContext<'_>,
    out: &mut CompactionOutcome,
) -> CompactionScore {
    let level = out.level.unwrap_or(0);
    let stake = snapshot.at_stake(history);
    let score = probe::score(&stake, history, level);
    let Some(min) = ctx.policy.quality.min_score.filter(|m| score.score < *m) else {
        return score;
    };
    let first = score.score;
    let (mut again, mut reports) = (Vec::new(), out.reports.clone());
    match retry {
        Some(Retry::Level3(mut h)) => {
            let (report, _) = emergency::emergency_with(
                &mut h,
                ctx.policy,
                target,
                ctx.trigger,
                ctx.store,
                Width::Wide,
            )
            .await;
            if let Some(r) = reports.iter_mut().rev().find(|r| r.pass == Pass::Emergency) {
                *r = report;
            }
            again = h;
        }
        Some(Retry::Sections(mut h)) => {
            let room = Room::UnderTarget(Width::Wide);
            fill(&mut h, target, room, ctx.store, &mut reports).await;
            again = h;
        }
        None => {}
    }
    let retried = probe::score(&snapshot.at_stake(&again), &again, level);
    let score =
        if !again.is_empty() && retried.score > score.score && history::weight(&again) <= target {
            *history = again;
            out.reports = reports;
            retried
        } else {
            score
        };
    let note = if score.score >= min {
        format!(
            "score {first:.2} was below quality.minScore {min}: more was kept in sight, score {:.2}",
            score.score
        )
    } else {
        out.below_min_score = Some(min);
        format!(
            "score {:.2} stays below quality.minScore {min} with the most the target leaves room for",
            score.score
        )
    };
    if let Some(r) = out.reports.iter_mut().rev().find(|r| r.is_change()) {
        r.notes.push(note);
    }
    score
}

/// What each pass of a compaction put at stake, by the index of its report.
#[derive(Default)]
struct PassStakes(Vec<(usize, Vec<Artifact>)>);

impl PassStakes {
    /// The newest of `reports`, run on the history of `before`, left `after`.
    fn note(&mut self, reports: &[PassReport], before: &probe::Snapshot, after: &[Message]) {
        if let Some(i) = reports.len().checked_sub(1)
            && reports[i].is_change()
        {
            self.0.push((i, before.at_stake(after)));
        }
    }

    /// Scores each pass on its report: of what it put at stake, what `history`, the history
    /// the compaction left, still shows.
    fn grade(self, reports: &mut [PassReport], history: &[Message]) {
        for (i, stake) in self.0 {
            if let Some(r) = reports.get_mut(i)
                && r.is_change()
            {
                let level = r.level().unwrap_or(0);
                r.quality = Some(probe::score(&stake, history, level));
            }
        }
    }
}

/// A summarizer with its session memory hidden: level 2 proper.
struct WithoutMemory<'a>(&'a dyn Summarizer);

#[async_trait::async_trait]
impl Summarizer for WithoutMemory<'_> {
    fn window_chars(&self) -> usize {
        self.0.window_chars()
    }

    async fn summarize(
        &self,
        request: &summarize::SummaryRequest,
    ) -> Result<String, summarize::SummarizeError> {
        self.0.summarize(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preflight_compacts_near_a_known_cap_and_warns_once_without_one() {
        let mut st = SessionState::new();
        assert_eq!(
            preflight(800_000, Some(1_000_000), &mut st),
            Preflight::Send
        );
        assert_eq!(
            preflight(900_000, Some(1_000_000), &mut st),
            Preflight::Compact { budget_ratio: 0.40 }
        );
        st.learn_payload_cap(500_000);
        assert_eq!(
            preflight(450_000, None, &mut st),
            Preflight::Compact { budget_ratio: 0.40 }
        );
        let mut fresh = SessionState::new();
        assert_eq!(
            preflight(3_000_000, None, &mut fresh),
            Preflight::WarnLargeHistory
        );
        assert_eq!(preflight(3_000_000, None, &mut fresh), Preflight::Send);
    }
}
