//! Per-object exponential backoff with jitter. kube-runtime retries with whatever delay
//! `error_policy` returns; without per-object state every failing session would retry at the
//! same fixed pace, and a shared outage would make them all retry in lockstep.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Failure counts per object, reset by the first success.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before the next attempt:
    /// `base * 2^(n-1)` capped at `max`, then scaled by a random factor in [0.5, 1.0) so
    /// retries of many objects spread out.
    pub fn next_delay(&self, key: &str) -> Duration {
        let n = {
            let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
            let n = failures.entry(key.to_string()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let exp = self
            .base
            .saturating_mul(1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX));
        let capped = exp.min(self.max);
        capped.mul_f64(0.5 + rand::random::<f64>() * 0.5)
    }

    /// Forgets the failures of `key` (after a success, or when the object is gone).
    pub fn reset(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    pub fn failures(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_with_jitter_and_caps() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let d1 = b.next_delay("a");
        assert!(d1 >= Duration::from_millis(500) && d1 < Duration::from_secs(1));
        let d2 = b.next_delay("a");
        assert!(d2 >= Duration::from_secs(1) && d2 < Duration::from_secs(2));
        let d3 = b.next_delay("a");
        assert!(d3 >= Duration::from_secs(2) && d3 < Duration::from_secs(4));
        for _ in 0..40 {
            let d = b.next_delay("a");
            assert!(d < Duration::from_secs(60), "{d:?} exceeds the cap");
        }
        assert!(b.next_delay("a") >= Duration::from_secs(30));
    }

    #[test]
    fn objects_are_independent_and_success_resets() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        for _ in 0..5 {
            b.next_delay("a");
        }
        assert_eq!(b.failures("a"), 5);
        assert!(b.next_delay("b") < Duration::from_secs(1));
        b.reset("a");
        assert_eq!(b.failures("a"), 0);
        assert!(b.next_delay("a") < Duration::from_secs(1));
    }
}
