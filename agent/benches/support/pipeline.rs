//! The no-LLM path of a turn on a history, as the engine and store benches run it.

use cairn_agent::ccr::Store;
use cairn_agent::compact::ladder::LadderContext;
use cairn_agent::compact::{
    BudgetInputs, SessionState, Trigger, budget, compact, dedup, microcompact, pairing,
};
use cairn_agent::history::{self, Message};
use cairn_crds::EffectivePolicy;

/// A window whose budget is a quarter of the history, so every level has work to do.
pub fn window_for(history: &[Message]) -> u64 {
    (history::weight(history) as f64 / 4.0 / 2.4) as u64 + 13_000
}

/// The turn's cheap passes plus the ladder without a summarizer (levels 1 and 3).
pub async fn pipeline(
    h: &mut Vec<Message>,
    policy: &EffectivePolicy,
    store: &dyn Store,
    window: u64,
) -> usize {
    let mut state = SessionState::new();
    pairing::repair_archived(h, store, Trigger::Turn).await;
    microcompact::microcompact(h, policy, None, store).await;
    dedup::dedup_reads(h, policy, store).await;
    let ctx = LadderContext {
        policy,
        inputs: BudgetInputs {
            context_window: window,
            payload_cap: None,
            reserve_bytes: 0,
        },
        store,
        summarizer: None,
        trigger: Trigger::Auto,
        budget_ratio: None,
        target: None,
    };
    let out = compact(h, &ctx, &mut state).await;
    // As a turn sends: the request's cuts are made in place and undone after the call.
    let (cuts, report) = budget::cut(h, state.tool_result_limits(policy), store).await;
    cuts.restore(h);
    out.bytes_after + report.bytes_after
}
