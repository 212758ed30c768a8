//! The session's side of the session memory ([`crate::memory`]): opening it, starting its
//! background updates after a turn, queueing what compactions remove, counting what the
//! updates spent.

use std::sync::Arc;

use crate::history::Message;
use crate::memory::SessionMemory;
use crate::metrics::OutcomeLabels;

use super::Session;

/// A background update; dropping it (the session goes away) stops the update, as a killed
/// process would: what is queued stays queued.
pub(super) struct UpdateTask(tokio::task::JoinHandle<()>);

impl Drop for UpdateTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Session {
    /// The memory, when the policy enables it and the ladder can use it (`engine: local`
    /// and the summarizer enabled; anything else is reported as not honoured).
    pub(super) fn memory_on(&self) -> Option<&Arc<SessionMemory>> {
        let p = &self.live.policy;
        let usable = p.memory.enabled
            && p.summarizer.enabled
            && p.engine == cairn_crds::policy::SummaryEngine::Local;
        self.memory.as_ref().filter(|_| usable)
    }

    /// The session memory (status, tests).
    pub fn memory(&self) -> Option<Arc<SessionMemory>> {
        self.memory_on().cloned()
    }

    /// `status.session.memory` as it stands now.
    pub fn memory_stats(&self) -> Option<cairn_crds::session::MemoryStats> {
        self.memory_on().map(|m| m.stats(&self.history, self.turns))
    }

    /// Opens the memory and its queue the first time the policy enables it.
    pub(super) async fn ensure_memory(&mut self) {
        if !self.live.policy.memory.enabled || self.memory.is_some() {
            return;
        }
        match SessionMemory::open(
            Arc::clone(self.journal.objects()),
            Arc::clone(&self.store),
            self.journal.epoch(),
            Arc::clone(&self.metrics),
        )
        .await
        {
            Ok(m) => self.memory = Some(Arc::new(m)),
            Err(e) => tracing::warn!("the session memory could not be opened: {e}"),
        }
    }

    /// Starts a background update when one is due. The turn never waits for it.
    pub(super) fn maybe_update_memory(&mut self) {
        if self.journal.fenced().is_some() {
            return;
        }
        let Some(memory) = self.memory_on().cloned() else {
            return;
        };
        let Some(snapshot) = memory.snapshot(
            &self.history,
            self.turns,
            &self.live.policy.memory,
            self.state.chars_per_token.get(),
        ) else {
            return;
        };
        if !memory.begin() {
            return;
        }
        let summarizer = self.summarizer(None);
        let task = tokio::spawn(memory.update(snapshot, summarizer));
        self.memory_task = Some(UpdateTask(task));
    }

    /// Counts what the background updates spent (as the summarizer's) and turns a failed
    /// update into a notice of the next turn.
    pub(super) fn absorb_memory_events(&mut self) {
        let Some(memory) = self.memory.clone() else {
            return;
        };
        if let Some((used, model)) = memory.take_usage() {
            self.charge_summarizer(&model, &used);
        }
        if let Some(e) = memory.take_unreported_error() {
            self.pending_notices
                .push(("memory", format!("the session memory was not updated: {e}")));
        }
    }

    /// Hands what a compaction removed from `before` to the memory's queue before the
    /// rewritten history is journaled. `false` when the queue could not be written: the
    /// caller then goes back to `before` (a lossy step runs only once its originals are
    /// safe, here for the memory as in the archive).
    pub(super) async fn queue_removed(&mut self, before: &[Message]) -> Result<(), String> {
        let Some(memory) = self.memory_on().cloned() else {
            return Ok(());
        };
        if *self.history == before {
            return Ok(());
        }
        match memory.enqueue_removed(before, &self.history).await {
            Ok(n) => {
                if n > 0 {
                    tracing::debug!(
                        messages = n,
                        "removed messages queued for the session memory"
                    );
                }
                Ok(())
            }
            Err(e) => {
                tracing::warn!(
                    "the session memory's queue could not be written; the compaction is undone: {e}"
                );
                self.metrics
                    .memory_updates
                    .get_or_create(&OutcomeLabels {
                        outcome: "queue_failed",
                    })
                    .inc();
                Err(e.to_string())
            }
        }
    }
}
