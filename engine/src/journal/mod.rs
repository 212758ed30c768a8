//! The session journal's format and its reading: an append-only log of history changes from
//! which a restarted agent rebuilds the exact history. The writer (claims, writes, read-back
//! and seal of failed writes, collection) is the shell's; it builds on what is here.
//!
//! Every entry is one object `e<epoch>n<nonce>-s<seq>[-full].json` under the session's
//! `journal/` prefix (S3: `<prefix>/<namespace>/<session>/journal/`, or a local directory).
//! An entry is a splice of the history of the entry it builds on (its `base`): "keep the first
//! `at` messages, then these, then the base's messages `tail[0]..tail[1]`". A turn that only
//! added messages writes only those; a compaction or a rewind writes only the messages it
//! changed. A checkpoint (`-full`) holds the whole history and builds on nothing. Replaying
//! the chain of bases from the newest valid entry back to a checkpoint gives the history byte
//! for byte, with its summaries and archive markers ([`rebuild`]). Journal objects are
//! named objects of the storage port ([`ObjectStore`], re-exported here).
//!
//! Each entry that compacted carries an undo record; rewinds undo them newest first, up to
//! [`REWIND_LEVELS`] deep ([`UndoStack`]). A checkpoint carries the newest as a splice of its
//! own history and the older ones whole ([`CarriedUndo`]).
//!
//! A writer holds a fencing token ([`Token`]): it claims `claims/e<epoch>n<nonce>.json`, then
//! completes the claim under a second name, `claims/e<epoch>n<nonce>-start.json`, with
//! `start_seq` = the next free sequence number ([`Claim`]). A reader ignores every entry of
//! token `t` whose seq is at or beyond the `start_seq` of a completed claim with a higher
//! token.

mod entry;
mod names;
mod rebuild;
mod splice;
mod undo;

pub use entry::*;
pub use names::*;
pub use rebuild::*;
pub use splice::*;
pub use undo::*;

pub use crate::storage::{ObjectError, ObjectStore};

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Nothing was written (a failed write was read back and is not there).
    #[error("journal store unavailable: {0}")]
    Unavailable(String),
    /// This write was sent and nothing confirms or denies that it landed.
    #[error(
        "the journal store did not confirm the write ({0}); whether it was persisted is unknown, and it is settled before anything else is written"
    )]
    Unknown(String),
    /// This write is in the journal; the claims check that makes it count did not complete.
    #[error(
        "the change is in the journal, but this agent could not confirm that it still owns the session ({0}); it counts unless another agent has taken the session over, and it is confirmed before anything else is written"
    )]
    Unconfirmed(String),
    /// An earlier write is still unsettled; nothing was written.
    #[error("an earlier journal write is not settled yet ({0}); nothing was written")]
    Unsettled(String),
    #[error(
        "this agent ({holder}, epoch {epoch}) no longer owns the session: {by} took it over with epoch {by_epoch}; it stops writing"
    )]
    Fenced {
        holder: String,
        epoch: u64,
        by: String,
        by_epoch: u64,
    },
    #[error("journal object {name} is corrupt: {reason}")]
    Corrupt { name: String, reason: String },
    #[error("journal I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("journal has no compaction to undo")]
    NothingToRewind,
}

impl JournalError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Unknown(_) => "unknown",
            Self::Unconfirmed(_) => "unconfirmed",
            Self::Unsettled(_) => "unsettled",
            Self::Fenced { .. } => "fenced",
            Self::Corrupt { .. } => "corrupt",
            Self::Io(_) => "io",
            Self::NothingToRewind => "nothing_to_rewind",
        }
    }

    /// The write this error answers may be in the journal.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, Self::Unknown(_) | Self::Unconfirmed(_))
    }
}

/// The store's own failures keep their text: what was unavailable, or the I/O error.
impl From<ObjectError> for JournalError {
    fn from(e: ObjectError) -> Self {
        match e {
            ObjectError::Unavailable(s) => Self::Unavailable(s),
            ObjectError::Io(e) => Self::Io(e),
        }
    }
}
