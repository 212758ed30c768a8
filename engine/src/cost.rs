//! What a session's provider calls cost: each call's usage priced by the model price table
//! ([`crate::catalog::PriceTable`]) when it is counted, the session model's replies and the
//! summarizer's calls apart. Prices are applied per call, so a fleet that changes its price
//! table changes the price of later calls only.

use serde::{Deserialize, Serialize};

use crate::catalog::PriceTable;
use crate::meter::Meter;
use crate::provider::Usage;

/// Whose call a usage is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// The session model's replies.
    Session,
    /// The level-2 summarizer's calls.
    Summarizer,
}

impl Client {
    pub fn label(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Summarizer => "summarizer",
        }
    }
}

/// The cost so far, journaled with the session's state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Accounting {
    /// Cache-write tokens of the session model's and of the summarizer's calls (the other
    /// token counts are journaled beside this).
    #[serde(default)]
    pub cache_write_tokens: [u64; 2],
    /// USD of the session model's and of the summarizer's calls.
    #[serde(default)]
    pub usd: [f64; 2],
    /// The summarizer's model, once it was called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summarizer_model: Option<String>,
    /// Models called that the price table has no prices for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unpriced: Vec<String>,
}

impl Accounting {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Prices `used` of `model` and adds it to the client's cost and to
    /// `cairn_agent_cost_usd_total{client, model}` and
    /// `cairn_agent_model_tokens_total{model, kind}` (the models of one agent are its session
    /// model and its summarizer's: two series per kind at most). Returns the call's cost.
    pub fn charge(
        &mut self,
        client: Client,
        model: &str,
        used: &Usage,
        prices: &PriceTable,
        metrics: &dyn Meter,
    ) -> f64 {
        let i = client as usize;
        self.cache_write_tokens[i] += used.cache_write_tokens;
        if client == Client::Summarizer {
            self.summarizer_model = Some(model.to_owned());
        }
        for (kind, v) in used.by_kind() {
            if v > 0 {
                metrics.model_tokens(model, kind, v);
            }
        }
        let Some(p) = prices.prices(model) else {
            if *used != Usage::default() && !self.unpriced.iter().any(|m| m == model) {
                self.unpriced.push(model.to_owned());
            }
            return 0.0;
        };
        let cost = p.cost(used);
        self.usd[i] += cost;
        if cost > 0.0 {
            metrics.cost_usd(client.label(), model, cost);
        }
        cost
    }

    /// `status.session.costUSD`.
    pub fn status(&self) -> cairn_crds::session::CostStats {
        cairn_crds::session::CostStats {
            total: round(self.usd[0] + self.usd[1]),
            session: round(self.usd[0]),
            summarizer: round(self.usd[1]),
            unpriced: self.unpriced.clone(),
            ..Default::default()
        }
    }
}

/// To a millionth of a dollar, so the status does not churn on float noise.
fn round(usd: f64) -> f64 {
    (usd * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Sums per series, keyed like the shell's metrics.
    #[derive(Default)]
    struct Sums(Mutex<Vec<(String, f64)>>);

    impl Sums {
        fn add(&self, key: String, v: f64) {
            if let Ok(mut all) = self.0.lock() {
                match all.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, sum)) => *sum += v,
                    None => all.push((key, v)),
                }
            }
        }
        fn get(&self, key: &str) -> f64 {
            let all = self.0.lock().expect("lock");
            all.iter().find(|(k, _)| k == key).map_or(0.0, |(_, v)| *v)
        }
    }

    impl Meter for Sums {
        fn model_tokens(&self, model: &str, kind: &'static str, n: u64) {
            self.add(format!("tokens {model} {kind}"), n as f64);
        }
        fn cost_usd(&self, client: &'static str, model: &str, usd: f64) {
            self.add(format!("usd {client} {model}"), usd);
        }
    }

    #[test]
    fn calls_are_priced_per_client_and_unknown_models_are_named() {
        let metrics = Sums::default();
        let mut a = Accounting::default();
        let table = PriceTable::default();
        let used = Usage {
            input_tokens: 2_000,
            output_tokens: 100,
            cache_read_tokens: 1_000,
            cache_write_tokens: 500,
        };
        let c = a.charge(
            Client::Session,
            "claude-sonnet-4-5",
            &used,
            &table,
            &metrics,
        );
        // 500 uncached × 3 + 1000 read × 0.3 + 500 written × 3.75 + 100 out × 15, per million.
        let want = (1_500.0 + 300.0 + 1_875.0 + 1_500.0) / 1e6;
        assert!((c - want).abs() < 1e-12, "{c}");
        a.charge(
            Client::Summarizer,
            "claude-haiku-4-5",
            &used,
            &table,
            &metrics,
        );
        a.charge(Client::Summarizer, "local-llm", &used, &table, &metrics);
        let s = a.status();
        assert!((s.session - round(want)).abs() < 1e-12);
        assert!(s.summarizer > 0.0 && s.summarizer < s.session);
        assert_eq!(s.unpriced, vec!["local-llm".to_string()]);
        assert_eq!(a.cache_write_tokens, [500, 1_000]);
        assert_eq!(metrics.get("tokens claude-haiku-4-5 cache_write"), 500.0);
        assert!((metrics.get("usd session claude-sonnet-4-5") - want).abs() < 1e-12);
    }
}
