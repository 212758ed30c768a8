//! Characters per token, calibrated per session from the provider's reported usage.
//!
//! Budgets are kept in characters (bytes of what is sent) because that is what cairn can
//! measure without a tokenizer; the context window is in tokens. The ratio starts at the
//! usual 4 and follows the provider's own count with an exponential moving average, clamped
//! so one odd reply (an image-heavy request, a cached prefix) cannot swing the budget.

/// Starting ratio before any usage has been reported.
pub const DEFAULT_CHARS_PER_TOKEN: f64 = 4.0;
/// Weight of the newest observation in the moving average.
pub const EMA_ALPHA: f64 = 0.3;
/// Bounds of the calibrated ratio. Small-vocabulary tokenizers on logs and code reach 1.6
/// bytes per token; CJK text with byte-level tokenizers goes lower still.
pub const MIN_CHARS_PER_TOKEN: f64 = 1.0;
pub const MAX_CHARS_PER_TOKEN: f64 = 8.0;
/// Observations from tiny requests are dominated by framing overhead and are ignored.
pub const MIN_SAMPLE_TOKENS: u64 = 256;

/// The calibrated ratio of one session.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CharsPerToken {
    value: f64,
    samples: u32,
}

impl Default for CharsPerToken {
    fn default() -> Self {
        Self {
            value: DEFAULT_CHARS_PER_TOKEN,
            samples: 0,
        }
    }
}

impl CharsPerToken {
    pub fn get(&self) -> f64 {
        self.value
    }

    pub fn samples(&self) -> u32 {
        self.samples
    }

    /// Folds in one request: `chars` sent, `input_tokens` the provider counted for it.
    pub fn observe(&mut self, chars: u64, input_tokens: u64) {
        if input_tokens < MIN_SAMPLE_TOKENS || chars == 0 {
            return;
        }
        let observed =
            (chars as f64 / input_tokens as f64).clamp(MIN_CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN);
        self.value = if self.samples == 0 {
            observed
        } else {
            EMA_ALPHA * observed + (1.0 - EMA_ALPHA) * self.value
        }
        .clamp(MIN_CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN);
        self.samples = self.samples.saturating_add(1);
    }

    /// Takes a server's own count of one request as the ratio: `chars` is the weight of the
    /// request the server counted `tokens` for. Unlike [`CharsPerToken::observe`] there is
    /// no averaging: an exact count of the session's own content beats any estimate, and a
    /// rejection is exactly when an optimistic estimate has to stop.
    pub fn set_counted(&mut self, chars: u64, tokens: u64) {
        if tokens == 0 || chars == 0 {
            return;
        }
        self.value = (chars as f64 / tokens as f64).clamp(MIN_CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN);
        self.samples = self.samples.saturating_add(1);
    }

    /// A ratio restored from the journal.
    pub fn restored(value: f64, samples: u32) -> Self {
        Self {
            value: if value.is_finite() {
                value.clamp(MIN_CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN)
            } else {
                DEFAULT_CHARS_PER_TOKEN
            },
            samples,
        }
    }

    /// Tokens that `chars` characters are expected to cost.
    pub fn tokens(&self, chars: usize) -> u64 {
        (chars as f64 / self.value).ceil() as u64
    }

    /// Characters that fit in `tokens` tokens.
    pub fn chars(&self, tokens: u64) -> usize {
        (tokens as f64 * self.value) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_four_and_follows_usage_clamped() {
        let mut c = CharsPerToken::default();
        assert_eq!(c.get(), 4.0);
        c.observe(30_000, 10_000);
        assert_eq!(c.get(), 3.0);
        c.observe(50_000, 10_000);
        assert!((c.get() - (0.3 * 5.0 + 0.7 * 3.0)).abs() < 1e-9);
        c.observe(1_000_000, 10_000);
        assert!(c.get() <= MAX_CHARS_PER_TOKEN);
        let before = c.get();
        c.observe(10, 5);
        assert_eq!(c.get(), before, "tiny samples are ignored");
    }
}
