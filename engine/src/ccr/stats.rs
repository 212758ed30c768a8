//! Counters of the archive and of content-aware compression, for `/metrics` and
//! `status.session.archive`. Lock-free on the hot path; a snapshot is plain data.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::meter::Meter;

/// Archive traffic of one session.
#[derive(Default, Debug)]
pub struct ArchiveCounters {
    puts: AtomicU64,
    dedupes: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    evictions: AtomicU64,
    failures: AtomicU64,
}

/// A point-in-time copy of [`ArchiveCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveSnapshot {
    /// New originals stored.
    pub puts: u64,
    /// Archives of content that was already stored.
    pub dedupes: u64,
    /// Fetches that found their key.
    pub hits: u64,
    /// Fetches of keys this session's archive does not hold.
    pub misses: u64,
    /// Bytes of new originals stored.
    pub bytes_in: u64,
    /// Bytes returned by fetches.
    pub bytes_out: u64,
    /// Local entries dropped to honour the byte bound.
    pub evictions: u64,
    /// Archives refused because the durable tier was unreachable.
    pub failures: u64,
}

impl ArchiveCounters {
    pub fn record_put(&self, bytes: usize) {
        self.puts.fetch_add(1, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn record_dedupe(&self) {
        self.dedupes.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_fetch(&self, found: Option<&[u8]>) {
        match found {
            Some(bytes) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.bytes_out
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn record_eviction(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn record_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> ArchiveSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ArchiveSnapshot {
            puts: get(&self.puts),
            dedupes: get(&self.dedupes),
            hits: get(&self.hits),
            misses: get(&self.misses),
            bytes_in: get(&self.bytes_in),
            bytes_out: get(&self.bytes_out),
            evictions: get(&self.evictions),
            failures: get(&self.failures),
        }
    }
}

impl ArchiveSnapshot {
    /// What `status.session.archive` reports: objects and bytes this session archived.
    pub fn session_stats(&self) -> cairn_crds::session::ArchiveStats {
        cairn_crds::session::ArchiveStats {
            objects: self.puts,
            bytes: self.bytes_in,
        }
    }
}

/// Occupancy of a store tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreUsage {
    pub entries: u64,
    pub bytes: u64,
    /// Time since the least recently used entry was last accessed.
    #[serde(with = "seconds")]
    pub oldest_age: Duration,
}

mod seconds {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }
}

/// Everything the archive reports about itself: traffic and local occupancy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveReport {
    pub counters: ArchiveSnapshot,
    pub local: StoreUsage,
}

/// Compression outcomes per strategy (`log`, `search`, `diff`, `json`, `code`, `prose`,
/// `ceiling` for results cut to `compression.maxResultBytes`, `none` when no strategy ran)
/// and the outcomes of the model's `recall` calls. Mirrored into the session's metrics when
/// built [`CompressionCounters::with_metrics`].
#[derive(Default)]
pub struct CompressionCounters {
    by_strategy: Mutex<BTreeMap<&'static str, StrategySnapshot>>,
    recall_found: AtomicU64,
    recall_missing: AtomicU64,
    metrics: Option<Arc<dyn Meter>>,
}

impl std::fmt::Debug for CompressionCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompressionCounters")
            .field("by_strategy", &self.snapshot())
            .finish_non_exhaustive()
    }
}

/// Totals of one strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StrategySnapshot {
    /// Inputs that came out smaller (original archived).
    pub compressed: u64,
    /// Inputs left byte-identical (below threshold, not smaller, mode, archive down).
    pub unchanged: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl CompressionCounters {
    /// Counters that also count in `metrics` (`cairn_agent_compression_total`,
    /// `cairn_agent_compression_bytes_total`, `cairn_agent_recall_keys_total`).
    pub fn with_metrics(metrics: Arc<dyn Meter>) -> Self {
        Self {
            metrics: Some(metrics),
            ..Self::default()
        }
    }

    pub fn record(&self, strategy: &'static str, bytes_in: usize, bytes_out: Option<usize>) {
        if let Some(m) = &self.metrics {
            m.compression(strategy, bytes_in, bytes_out);
        }
        let Ok(mut map) = self.by_strategy.lock() else {
            return;
        };
        let s = map.entry(strategy).or_default();
        s.bytes_in += bytes_in as u64;
        match bytes_out {
            Some(out) => {
                s.compressed += 1;
                s.bytes_out += out as u64;
            }
            None => {
                s.unchanged += 1;
                s.bytes_out += bytes_in as u64;
            }
        }
    }

    pub fn snapshot(&self) -> BTreeMap<&'static str, StrategySnapshot> {
        self.by_strategy
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
    }

    /// One `recall` call of the model: keys it found and keys the archive did not hold.
    pub fn record_recall(&self, found: usize, missing: usize) {
        self.recall_found.fetch_add(found as u64, Ordering::Relaxed);
        self.recall_missing
            .fetch_add(missing as u64, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.recall_keys(found, missing);
        }
    }

    /// What `status.session.compression` reports.
    pub fn session_stats(&self) -> cairn_crds::session::CompressionStats {
        let found = self.recall_found.load(Ordering::Relaxed);
        let missing = self.recall_missing.load(Ordering::Relaxed);
        cairn_crds::session::CompressionStats {
            strategies: self
                .snapshot()
                .into_iter()
                .map(|(k, s)| {
                    (
                        k.to_owned(),
                        cairn_crds::session::CompressionStrategyStats {
                            compressed: s.compressed,
                            unchanged: s.unchanged,
                            bytes_in: s.bytes_in,
                            bytes_out: s.bytes_out,
                        },
                    )
                })
                .collect(),
            recall_found: found,
            recall_missing: missing,
            recall_hit_rate: (found + missing > 0)
                .then(|| (found as f64 / (found + missing) as f64 * 1000.0).round() / 1000.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_counts_and_session_stats() {
        let c = ArchiveCounters::default();
        c.record_put(10);
        c.record_put(5);
        c.record_dedupe();
        c.record_fetch(Some(b"abc"));
        c.record_fetch(None);
        let s = c.snapshot();
        assert_eq!((s.puts, s.dedupes, s.hits, s.misses), (2, 1, 1, 1));
        assert_eq!((s.bytes_in, s.bytes_out), (15, 3));
        assert_eq!(s.session_stats().objects, 2);
        assert_eq!(s.session_stats().bytes, 15);
    }

    #[test]
    fn compression_counts_per_strategy() {
        let c = CompressionCounters::default();
        c.record("log", 100, Some(40));
        c.record("log", 50, None);
        let s = c.snapshot();
        let log = s.get("log").copied().unwrap_or_default();
        assert_eq!((log.compressed, log.unchanged), (1, 1));
        assert_eq!((log.bytes_in, log.bytes_out), (150, 90));
    }

    #[test]
    fn counters_reach_the_meter_and_the_status() {
        #[derive(Default)]
        struct Seen(Mutex<Vec<String>>);
        impl Meter for Seen {
            fn compression(&self, strategy: &'static str, bytes_in: usize, out: Option<usize>) {
                if let Ok(mut v) = self.0.lock() {
                    v.push(format!("{strategy} {bytes_in} {out:?}"));
                }
            }
            fn recall_keys(&self, found: usize, missing: usize) {
                if let Ok(mut v) = self.0.lock() {
                    v.push(format!("recall {found} {missing}"));
                }
            }
        }
        let seen = Arc::new(Seen::default());
        let c = CompressionCounters::with_metrics(Arc::clone(&seen) as Arc<dyn Meter>);
        c.record("log", 1000, Some(100));
        c.record_recall(3, 1);
        assert_eq!(
            *seen.0.lock().expect("lock"),
            ["log 1000 Some(100)", "recall 3 1"]
        );
        let s = c.session_stats();
        assert_eq!(s.strategies["log"].bytes_in, 1000);
        assert_eq!(s.recall_hit_rate, Some(0.75));
    }
}
