//! The rewind levels: a bounded stack of undo records. Each entry that compacted pushes its
//! record, each rewind pops the newest; a checkpoint carries the whole stack, so the levels
//! survive a restart and the collection of the entries they came from.

use super::entry::{StoredUndo, Undo};

/// Compactions a session can rewind, newest first. Pushing one more drops the oldest.
pub const REWIND_LEVELS: usize = 8;

/// One rewind level: the entry that compacted, how to undo it, and how the journal stores
/// that record.
#[derive(Clone, Debug, PartialEq)]
pub struct Level {
    pub seq: u64,
    pub undo: Undo,
    pub stored: StoredUndo,
}

impl StoredUndo {
    /// Holds the whole pre-compaction history (inline or as an archived segment) rather than
    /// a splice of its entry's history: it reads back without that entry.
    pub fn is_whole(&self) -> bool {
        self.keep == 0 && self.tail.is_none()
    }
}

/// [`Undo::pre`] stored whole, inline.
pub fn whole_undo(undo: &Undo) -> StoredUndo {
    StoredUndo {
        keep: 0,
        pre: undo.pre.clone(),
        archived: None,
        tail: None,
        post_len: undo.post_len,
    }
}

/// At most [`REWIND_LEVELS`] records, oldest first.
#[derive(Clone, Debug, PartialEq)]
pub struct UndoStack<T> {
    levels: Vec<T>,
}

impl<T> Default for UndoStack<T> {
    fn default() -> Self {
        Self { levels: Vec::new() }
    }
}

impl<T> UndoStack<T> {
    /// Adds the newest record; returns the oldest when the bound dropped it.
    pub fn push(&mut self, record: T) -> Option<T> {
        let dropped = (self.levels.len() >= REWIND_LEVELS).then(|| self.levels.remove(0));
        self.levels.push(record);
        dropped
    }

    /// Takes the newest record (a rewind).
    pub fn pop(&mut self) -> Option<T> {
        self.levels.pop()
    }

    pub fn top(&self) -> Option<&T> {
        self.levels.last()
    }

    pub fn top_mut(&mut self) -> Option<&mut T> {
        self.levels.last_mut()
    }

    pub fn len(&self) -> usize {
        self.levels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.levels.is_empty()
    }

    /// Oldest first.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.levels.iter()
    }

    /// Oldest first.
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, T> {
        self.levels.iter_mut()
    }

    /// The records below the newest, oldest first.
    pub fn below_top(&self) -> &[T] {
        let n = self.levels.len().saturating_sub(1);
        &self.levels[..n]
    }

    /// The records, oldest first.
    pub fn into_vec(self) -> Vec<T> {
        self.levels
    }

    /// Keeps only the `n` newest records.
    pub fn keep_newest(&mut self, n: usize) {
        let drop = self.levels.len().saturating_sub(n);
        self.levels.drain(..drop);
    }
}

impl<T> FromIterator<T> for UndoStack<T> {
    /// Pushes in order (oldest first), so the bound keeps the newest.
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut s = Self::default();
        for r in iter {
            s.push(r);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Message;

    #[test]
    fn the_stack_pops_newest_first_and_drops_the_oldest_at_the_bound() {
        let mut s: UndoStack<usize> = UndoStack::default();
        assert_eq!(s.pop(), None);
        for i in 0..REWIND_LEVELS {
            assert_eq!(s.push(i), None);
        }
        assert_eq!(s.len(), REWIND_LEVELS);
        // One more drops the oldest.
        assert_eq!(s.push(REWIND_LEVELS), Some(0));
        assert_eq!(s.len(), REWIND_LEVELS);
        assert_eq!(s.below_top().first(), Some(&1));
        let popped: Vec<usize> = std::iter::from_fn(|| s.pop()).collect();
        assert_eq!(popped, (1..=REWIND_LEVELS).rev().collect::<Vec<_>>());
        assert!(s.is_empty());
        let collected: UndoStack<usize> = (0..20).collect();
        assert_eq!(collected.len(), REWIND_LEVELS);
        assert_eq!(collected.top(), Some(&19));
        let mut k = collected.clone();
        k.keep_newest(2);
        assert_eq!(k.iter().copied().collect::<Vec<_>>(), vec![18, 19]);
    }

    #[test]
    fn a_whole_record_reads_back_without_its_entry() {
        let pre = vec![Message::user("a"), Message::user("b"), Message::user("c")];
        let undo = Undo { pre, post_len: 2 };
        let whole = whole_undo(&undo);
        assert!(whole.is_whole());
        // Whatever history it is read against, even none.
        assert_eq!(super::super::decode_undo(whole.clone(), &[]).unwrap(), undo);
        let other = vec![Message::user("x"), Message::user("y")];
        assert_eq!(super::super::decode_undo(whole, &other).unwrap(), undo);
    }
}
