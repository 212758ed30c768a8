//! Object names and fencing tokens: entries `e<epoch>n<nonce>-s<seq>[-full].json`, claims
//! `claims/e<epoch>n<nonce>[-start].json`.

use serde::{Deserialize, Serialize};

/// An epoch claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Claim {
    pub epoch: u64,
    pub holder: String,
    /// `None` while the claimant is still reading the journal.
    pub start_seq: Option<u64>,
}

/// A writer's fencing token: its epoch, and a nonce that orders two claims of the same epoch
/// (two agents starting at the same moment both pick highest + 1).
///
/// The nonce is the claim's wall-clock time in milliseconds above 16 random bits
/// ([`Token::claimed`]): of two claims of one epoch the later one wins. A claim whose write
/// failed may still land afterwards (its request was held somewhere); it was never completed,
/// so readers ignore it, and being older it cannot fence the claimant that retried after it.
/// Journals of the first format carry 8 hex digits of a random nonce; they parse, and rank
/// below any claim of the same epoch made since.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token {
    pub epoch: u64,
    pub nonce: u64,
}

impl Token {
    /// A token of `epoch` claimed at `unix_millis` (wall-clock milliseconds since the Unix
    /// epoch), `random` breaking ties between claims of the same millisecond.
    pub fn claimed(epoch: u64, unix_millis: u64, random: u16) -> Self {
        Self {
            epoch,
            nonce: (unix_millis << 16) | u64::from(random),
        }
    }

    /// `e<epoch>n<nonce>`, the part of every object name that says whose it is.
    pub fn name(self) -> String {
        format!("e{:010}n{:016x}", self.epoch, self.nonce)
    }

    /// Reads [`Token::name`] back (also the 8-digit nonces of the first format).
    pub fn parse(s: &str) -> Option<Self> {
        let (e, n) = s.strip_prefix('e')?.split_once('n')?;
        if e.len() != 10 || !matches!(n.len(), 8 | 16) {
            return None;
        }
        Some(Self {
            epoch: e.parse().ok()?,
            nonce: u64::from_str_radix(n, 16).ok()?,
        })
    }
}

/// The name of entry `seq` of `token`; `full`: a checkpoint.
pub fn entry_name(token: Token, seq: u64, full: bool) -> String {
    format!(
        "{}-s{seq:012}{}.json",
        token.name(),
        if full { "-full" } else { "" }
    )
}

/// Reads [`entry_name`] back: the token, the seq and whether it is a checkpoint.
pub fn parse_entry_name(name: &str) -> Option<(Token, u64, bool)> {
    let rest = name.strip_suffix(".json")?;
    let (rest, full) = match rest.strip_suffix("-full") {
        Some(r) => (r, true),
        None => (rest, false),
    };
    let (t, s) = rest.split_once("-s")?;
    Some((Token::parse(t)?, s.parse().ok()?, full))
}

/// The claim as first written (no `start_seq`).
pub fn claim_name(token: Token) -> String {
    format!("claims/{}.json", token.name())
}

/// The completed claim: a second name, so that a late copy of the first write can never
/// overwrite the completion.
pub fn start_claim_name(token: Token) -> String {
    format!("claims/{}-start.json", token.name())
}

/// The token of a claim's name, as first written or completed.
pub fn parse_claim(name: &str) -> Option<Token> {
    let rest = name.strip_prefix("claims/")?.strip_suffix(".json")?;
    Token::parse(rest.strip_suffix("-start").unwrap_or(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let t = Token {
            epoch: 3,
            nonce: 0xdead_beef,
        };
        assert_eq!(
            parse_entry_name(&entry_name(t, 17, true)),
            Some((t, 17, true))
        );
        assert_eq!(
            parse_entry_name(&entry_name(t, 0, false)),
            Some((t, 0, false))
        );
        assert_eq!(parse_claim(&claim_name(t)), Some(t));
        assert_eq!(parse_claim(&start_claim_name(t)), Some(t));
        assert_eq!(parse_entry_name(&claim_name(t)), None);
        assert_eq!(parse_claim("claims/e1.json"), None);
    }

    #[test]
    fn first_format_names_parse_and_rank_below_later_claims() {
        let old = parse_claim("claims/e0000000002nffffffff.json").unwrap();
        assert_eq!(
            old,
            Token {
                epoch: 2,
                nonce: 0xffff_ffff
            }
        );
        // 2023-11-14, the earliest a claim of the second format could have been made.
        let since = 1_700_000_000_000;
        assert!(Token::claimed(2, since, 0) > old);
        assert!(Token::claimed(3, since, 0) > Token::claimed(2, since + 1, u16::MAX));
    }
}
