//! Splices and diffs: how an entry's history is built from its base's, and the smallest
//! splice that turns one history into another.

use super::entry::{StoredUndo, Undo};
use crate::history::Message;

/// `base[..at] ++ messages ++ base[tail[0]..tail[1]]`.
pub fn splice(
    base: &[Message],
    at: usize,
    messages: &[Message],
    tail: Option<[usize; 2]>,
) -> Result<Vec<Message>, String> {
    if at > base.len() {
        return Err(format!(
            "keeps {at} messages of a {}-message history",
            base.len()
        ));
    }
    let tail = match tail {
        None => &[][..],
        Some([a, b]) if a <= b && b <= base.len() => &base[a..b],
        Some([a, b]) => {
            return Err(format!(
                "keeps messages {a}..{b} of a {}-message history",
                base.len()
            ));
        }
    };
    let mut out = Vec::with_capacity(at + messages.len() + tail.len());
    out.extend_from_slice(&base[..at]);
    out.extend_from_slice(messages);
    out.extend_from_slice(tail);
    Ok(out)
}

/// The splice that turns `old` into `new`: messages kept from the start, the range of `new`
/// to store, and the range of `old` kept at the end.
pub fn diff(
    old: &[Message],
    new: &[Message],
) -> (usize, std::ops::Range<usize>, Option<[usize; 2]>) {
    diff_from(old, new, 0)
}

/// [`diff`] when the first `synced` messages of both are known to be equal: the comparison
/// starts there (the writer checks the claim in debug builds).
pub fn diff_from(
    old: &[Message],
    new: &[Message],
    synced: usize,
) -> (usize, std::ops::Range<usize>, Option<[usize; 2]>) {
    let synced = synced.min(old.len()).min(new.len());
    let p = synced
        + old[synced..]
            .iter()
            .zip(&new[synced..])
            .take_while(|(a, b)| a == b)
            .count();
    let room = old.len().min(new.len()) - p;
    let s = old
        .iter()
        .rev()
        .zip(new.iter().rev())
        .take(room)
        .take_while(|(a, b)| a == b)
        .count();
    let tail = (s > 0).then(|| [old.len() - s, old.len()]);
    (p, p..new.len() - s, tail)
}

/// An [`Undo`] as an entry whose history is `post` stores it: a splice of `post`.
pub fn encode_undo(undo: &Undo, post: &[Message]) -> StoredUndo {
    let base = &post[..undo.post_len.min(post.len())];
    let (keep, range, tail) = diff(base, &undo.pre);
    StoredUndo {
        keep,
        pre: undo.pre[range].to_vec(),
        archived: None,
        tail,
        post_len: undo.post_len,
    }
}

/// Reads [`encode_undo`] back; an error says why the record does not fit `post`.
pub fn decode_undo(stored: StoredUndo, post: &[Message]) -> Result<Undo, String> {
    if stored.archived.is_some() {
        return Err("the replaced messages are archived, not inline".into());
    }
    let base = &post[..stored.post_len.min(post.len())];
    Ok(Undo {
        pre: splice(base, stored.keep, &stored.pre, stored.tail)?,
        post_len: stored.post_len,
    })
}

/// [`encode_undo`] for a checkpoint that carries the newest rewind level on: the archived
/// segment of `known` when it still reads back against `post` (it is whole, or the splice is
/// still the same one: the history up to `post_len` did not change), else the messages
/// inline.
pub fn carry_undo(undo: &Undo, post: &[Message], known: Option<&StoredUndo>) -> StoredUndo {
    let inline = encode_undo(undo, post);
    match known {
        Some(
            k @ StoredUndo {
                archived: Some(a), ..
            },
        ) if k.post_len == inline.post_len
            && ((k.keep == 0 && k.tail.is_none() && a.messages == undo.pre.len())
                || (k.keep == inline.keep
                    && k.tail == inline.tail
                    && a.messages == inline.pre.len())) =>
        {
            k.clone()
        }
        _ => inline,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(msgs: &[&str]) -> Vec<Message> {
        msgs.iter().map(|m| Message::user(*m)).collect()
    }

    #[test]
    fn a_diff_splices_back_into_the_new_history() {
        let cases: &[(&[&str], &[&str])] = &[
            (&[], &["a"]),
            (&["a", "b"], &["a", "b", "c"]),
            (&["a", "b", "c", "d"], &["s", "c", "d"]),
            (&["a", "b", "c", "d"], &["a", "s", "d"]),
            (&["a", "b"], &[]),
            (&["a", "a", "a"], &["a", "a"]),
            (&["x", "a"], &["a"]),
        ];
        for (old, new) in cases {
            let (old, new) = (users(old), users(new));
            let (at, range, tail) = diff(&old, &new);
            assert_eq!(
                splice(&old, at, &new[range], tail).unwrap(),
                new,
                "{old:?} -> {new:?}"
            );
        }
        // An undo keeps only what the compacted history does not already hold.
        let pre = users(&["a", "b", "c", "d", "e"]);
        let post = users(&["a", "summary", "d", "e", "new"]);
        let undo = Undo { pre, post_len: 4 };
        let stored = encode_undo(&undo, &post);
        assert_eq!(stored.pre, users(&["b", "c"]));
        assert_eq!(decode_undo(stored, &post).unwrap(), undo);
    }
}
