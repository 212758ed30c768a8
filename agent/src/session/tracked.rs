//! The session's history with a mark of how much of it the journal already holds, so a
//! journal write compares only what may have changed instead of every message of a 4 MB
//! history twice per turn.
//!
//! The mark is conservative by construction: every mutable access through `DerefMut`
//! clears it, and only the operations below that cannot touch the messages before their
//! own position keep it (`push`, `extend`, `truncate`). Two more keep it on the caller's
//! word, each at one call site that says why: a cheap pass that reports no change, and the
//! loan of the history to a provider request (its drop guard puts back exactly what it
//! took). Debug builds check the mark against the journal on every write.

use std::ops::{Deref, DerefMut};

use crate::history::Message;

/// A history and the length of its prefix known to equal what the journal holds.
#[derive(Debug, Default)]
pub(super) struct Tracked {
    messages: Vec<Message>,
    /// `messages[..synced]` equals the journal's history at the same positions.
    synced: usize,
}

impl Tracked {
    /// A history of unknown relation to the journal.
    pub(super) fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            synced: 0,
        }
    }

    /// How many leading messages are known to equal the journal's.
    pub(super) fn synced(&self) -> usize {
        self.synced.min(self.messages.len())
    }

    /// The journal now holds exactly this history.
    pub(super) fn mark_synced(&mut self) {
        self.synced = self.messages.len();
    }

    /// Replaces the whole history with the journal's own (it then holds exactly this).
    pub(super) fn follow(&mut self, journal: &[Message]) {
        self.messages = journal.to_vec();
        self.mark_synced();
    }

    /// Replaces the whole history.
    pub(super) fn replace(&mut self, messages: Vec<Message>) {
        self.messages = messages;
        self.synced = 0;
    }

    pub(super) fn push(&mut self, message: Message) {
        self.messages.push(message);
    }

    pub(super) fn extend(&mut self, messages: impl IntoIterator<Item = Message>) {
        self.messages.extend(messages);
    }

    pub(super) fn truncate(&mut self, len: usize) {
        self.messages.truncate(len);
        self.synced = self.synced.min(len);
    }

    /// Mutable access that keeps the mark: for a caller that lowers it through
    /// [`Tracked::changed`] when anything changed (a pass's report), or that restores every
    /// message it touches before anyone reads the history again (the request loan).
    pub(super) fn keeping_mark(&mut self) -> &mut Vec<Message> {
        &mut self.messages
    }

    /// Something at or after `from` may have changed.
    pub(super) fn changed(&mut self, from: usize) {
        self.synced = self.synced.min(from);
    }
}

impl Deref for Tracked {
    type Target = Vec<Message>;

    fn deref(&self) -> &Vec<Message> {
        &self.messages
    }
}

impl DerefMut for Tracked {
    /// Any other mutable access may change any message: the mark is cleared.
    fn deref_mut(&mut self) -> &mut Vec<Message> {
        self.synced = 0;
        &mut self.messages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(n: usize) -> Vec<Message> {
        (0..n).map(|i| Message::user(format!("m{i}"))).collect()
    }

    #[test]
    fn appends_keep_the_mark_and_other_mutations_clear_or_lower_it() {
        let mut h = Tracked::new(users(3));
        assert_eq!(h.synced(), 0, "a new history is not known to be journaled");
        h.mark_synced();
        h.push(Message::assistant("a"));
        h.extend(users(2));
        assert_eq!(h.synced(), 3);
        h.truncate(2);
        assert_eq!(h.synced(), 2);
        h.mark_synced();
        h.keeping_mark()[1].content.push('!');
        h.changed(1);
        assert_eq!(h.synced(), 1);
        h.mark_synced();
        h[0].content.push('!');
        assert_eq!(h.synced(), 0, "DerefMut clears the mark");
        h.mark_synced();
        h.replace(users(1));
        assert_eq!(h.synced(), 0);
    }
}
