//! What the engine counts, as typed events: the shell's metrics registry implements
//! [`Meter`] and turns each event into its series (`cairn_agent_model_tokens_total`,
//! `cairn_agent_cost_usd_total`, `cairn_agent_compression_total`,
//! `cairn_agent_compression_bytes_total`, `cairn_agent_recall_keys_total`).

/// Receives the engine's countable events. Every method defaults to ignoring the event.
pub trait Meter: Send + Sync {
    /// `n` tokens of `kind` (input, output, cache_read, cache_write) billed on `model`.
    fn model_tokens(&self, model: &str, kind: &'static str, n: u64) {
        let _ = (model, kind, n);
    }

    /// A provider call of `client` (session, summarizer) on `model` cost `usd`.
    fn cost_usd(&self, client: &'static str, model: &str, usd: f64) {
        let _ = (client, model, usd);
    }

    /// One input of compression strategy `strategy`: `bytes_out` is `None` when it came out
    /// unchanged.
    fn compression(&self, strategy: &'static str, bytes_in: usize, bytes_out: Option<usize>) {
        let _ = (strategy, bytes_in, bytes_out);
    }

    /// One `recall` call of the model: keys found and keys the archive did not hold.
    fn recall_keys(&self, found: usize, missing: usize) {
        let _ = (found, missing);
    }
}

/// A meter that counts nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMeter;

impl Meter for NoMeter {}
