//! The local tier: one file per entry in a directory that is its own index.
//!
//! There is no index file to corrupt or to keep in step with the entries: a file named after a
//! key is an entry, its length is its size and its modification time is its last access
//! (set explicitly on every hit, because `atime` is often disabled). Writes go to a temp file
//! that is renamed into place, so a reader — in this process or another one sharing the
//! directory — sees a whole entry or none. Entries are bounded by total bytes (least recently
//! used first) and by age; one entry may use at most a quarter of the store, so an insert can
//! never evict itself and leave a dangling marker.
//!
//! The originals of one pass are written as a batch, in one blocking task: every temp file is
//! written and flushed, then renamed into place, then the directory is flushed once, so
//! a crash leaves whole entries and stale temp files, never a torn entry under a key. Occupancy
//! is kept as a running tally (what this process wrote and removed); the directory is
//! re-listed only when the tally passes the bound or is older than [`RESCAN_INTERVAL`], which
//! also catches entries written by other processes and entries past their TTL.

use std::fs::{self, File, FileTimes, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;

use super::stats::{ArchiveCounters, ArchiveReport, StoreUsage};
use super::{ArchiveError, DEFAULT_IN_FLIGHT, Hashed, Key, Store};

/// Temp files start with this; no key does, so the sweep can never remove an entry.
const TEMP_PREFIX: &str = ".tmp-";
/// Where the only tier keeps a damaged entry: out of the entries (no key names a directory)
/// and out of reach of eviction and the temp sweep, for a person to inspect.
const QUARANTINE_DIR: &str = ".corrupt";
/// A temp file this old belongs to a writer that crashed (a live write takes milliseconds).
const STALE_TEMP_AGE: Duration = Duration::from_secs(10 * 60);
/// Age of the tally after which the next write or usage report re-lists the directory.
const RESCAN_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// Flushes of one batch issued at once, at most: concurrent flushes share the file system's
/// journal commits.
const MAX_FLUSH_THREADS: usize = 8;

/// Bounds of a local tier (from `AgentSession.spec.archive.localCacheSize` and `.ttl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalLimits {
    /// Total bytes of all entries.
    pub max_bytes: u64,
    /// Entries not accessed for this long are dropped.
    pub ttl: Duration,
}

/// `archive.localCacheSize` when the session sets none (as documented on the CRD).
pub const DEFAULT_CACHE_SIZE: &str = "256Mi";
/// `archive.ttl` when the session sets none (as documented on the CRD).
pub const DEFAULT_TTL: &str = "168h";

/// Where a session without S3 keeps its archive: `$XDG_DATA_HOME/cairn`, else
/// `~/.local/share/cairn`, else `./.cairn` (no home at all, e.g. a bare container).
pub fn default_root() -> PathBuf {
    let non_empty = |v: &str| {
        std::env::var_os(v)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    };
    if let Some(data) = non_empty("XDG_DATA_HOME") {
        return data.join("cairn");
    }
    if let Some(home) = non_empty("HOME") {
        return home.join(".local").join("share").join("cairn");
    }
    PathBuf::from(".cairn")
}

/// A cache size or TTL that does not parse (the CRD's CEL rules normally catch these first).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitsError {
    #[error("archive.localCacheSize {0:?} is not a quantity like 256Mi")]
    Size(String),
    #[error("archive.ttl {0:?} is not a duration like 168h, 30m or 1h30m")]
    Ttl(String),
}

impl LimitsError {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Size(_) => "invalid_cache_size",
            Self::Ttl(_) => "invalid_ttl",
        }
    }
}

impl LocalLimits {
    /// From `AgentSession.spec.archive.localCacheSize` and `.ttl`, defaults filled in.
    pub fn from_spec(size: Option<&str>, ttl: Option<&str>) -> Result<Self, LimitsError> {
        let size = size.unwrap_or(DEFAULT_CACHE_SIZE);
        let ttl = ttl.unwrap_or(DEFAULT_TTL);
        Ok(Self {
            max_bytes: parse_quantity(size).ok_or_else(|| LimitsError::Size(size.to_owned()))?,
            ttl: parse_duration(ttl).ok_or_else(|| LimitsError::Ttl(ttl.to_owned()))?,
        })
    }

    /// The largest single entry: a quarter of the store.
    pub fn per_entry_cap(&self) -> u64 {
        self.max_bytes / 4
    }
}

/// A content-addressed directory of originals.
#[derive(Clone)]
pub struct LocalStore {
    inner: Arc<Inner>,
    /// Reads (and, within a batch, flushes) kept in flight at once.
    in_flight: usize,
}

struct Inner {
    dir: PathBuf,
    limits: LocalLimits,
    counters: Arc<ArchiveCounters>,
    /// Flush each entry before it is renamed into place (when this tier is the durable one).
    sync_writes: bool,
    temp_seq: AtomicU64,
    /// Occupancy as of the last scan, plus what this process wrote and removed since.
    tally: Mutex<Tally>,
}

/// The running count of the directory's entries.
#[derive(Clone, Copy, Debug)]
struct Tally {
    entries: u64,
    bytes: u64,
    /// Least recent access seen by the last scan (writes and reads only make entries newer).
    oldest: Option<SystemTime>,
    scanned_at: Instant,
}

impl Tally {
    fn add(&mut self, bytes: u64) {
        self.entries += 1;
        self.bytes += bytes;
    }

    fn remove(&mut self, bytes: u64) {
        self.entries = self.entries.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

/// What `put` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// A new entry was written.
    Stored,
    /// The entry was already there and intact; its recency was refreshed.
    Deduplicated,
}

impl LocalStore {
    /// Opens (creating if needed) the directory and sweeps temp files left by a crash.
    pub fn open(dir: impl Into<PathBuf>, limits: LocalLimits) -> Result<Self, ArchiveError> {
        Self::open_with_counters(dir, limits, Arc::new(ArchiveCounters::default()))
    }

    /// Opens the directory as a cache in front of a durable tier: entries are not flushed to
    /// disk one by one (the durable tier already holds them; a torn entry after a crash fails
    /// its key check and is fetched again).
    pub fn open_cache(dir: impl Into<PathBuf>, limits: LocalLimits) -> Result<Self, ArchiveError> {
        Self::open_inner(
            dir.into(),
            limits,
            Arc::new(ArchiveCounters::default()),
            false,
        )
    }

    /// As [`LocalStore::open`], counting into shared counters.
    pub fn open_with_counters(
        dir: impl Into<PathBuf>,
        limits: LocalLimits,
        counters: Arc<ArchiveCounters>,
    ) -> Result<Self, ArchiveError> {
        Self::open_inner(dir.into(), limits, counters, true)
    }

    fn open_inner(
        dir: PathBuf,
        limits: LocalLimits,
        counters: Arc<ArchiveCounters>,
        sync_writes: bool,
    ) -> Result<Self, ArchiveError> {
        fs::create_dir_all(&dir)?;
        let store = Self {
            inner: Arc::new(Inner {
                dir,
                limits,
                counters,
                sync_writes,
                temp_seq: AtomicU64::new(0),
                tally: Mutex::new(Tally {
                    entries: 0,
                    bytes: 0,
                    oldest: None,
                    scanned_at: Instant::now(),
                }),
            }),
            in_flight: DEFAULT_IN_FLIGHT,
        };
        store.inner.sweep_stale_temps(SystemTime::now())?;
        store.inner.evict(&[], SystemTime::now())?;
        Ok(store)
    }

    /// Reads of one pass kept in flight at once (`archive.maxInFlight`; at least 1).
    pub fn with_in_flight(mut self, in_flight: usize) -> Self {
        self.in_flight = in_flight.max(1);
        self
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn limits(&self) -> LocalLimits {
        self.inner.limits
    }

    pub fn counters(&self) -> &Arc<ArchiveCounters> {
        &self.inner.counters
    }

    /// Stores `content` under `key` (which the caller has computed with [`Key::of`]).
    /// Content over the per-entry cap is refused with `Unavailable`.
    pub async fn put(&self, key: Key, content: Vec<u8>) -> Result<PutOutcome, ArchiveError> {
        let mut outcomes = self.put_many(vec![(key, content)]).await?;
        Ok(outcomes.pop().unwrap_or(PutOutcome::Deduplicated))
    }

    /// Stores a batch of entries of distinct keys in one blocking task; `Ok` only when every
    /// entry is in place (and, in durable mode, flushed along with the directory). Nothing
    /// is written when one entry is over the per-entry cap.
    pub async fn put_many(
        &self,
        entries: Vec<(Key, Vec<u8>)>,
    ) -> Result<Vec<PutOutcome>, ArchiveError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let inner = Arc::clone(&self.inner);
        let threads = self.in_flight.min(MAX_FLUSH_THREADS);
        blocking(move || inner.put_batch(&entries, threads)).await
    }

    /// The entry's bytes, verified against the key, refreshing its recency.
    pub async fn get(&self, key: Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.get(key, SystemTime::now())).await
    }

    /// [`LocalStore::get`] of several keys in one blocking task, answers in order.
    pub async fn get_many(&self, keys: Vec<Key>) -> Vec<Result<Option<Vec<u8>>, ArchiveError>> {
        let n = keys.len();
        let inner = Arc::clone(&self.inner);
        let task = tokio::task::spawn_blocking(move || {
            let now = SystemTime::now();
            keys.into_iter()
                .map(|k| inner.get(k, now))
                .collect::<Vec<_>>()
        });
        match task.await {
            Ok(found) => found,
            Err(e) => (0..n)
                .map(|_| {
                    Err(ArchiveError::Unavailable(format!(
                        "local archive task failed: {e}"
                    )))
                })
                .collect(),
        }
    }

    /// True when an intact entry exists (refreshing its recency).
    pub async fn contains(&self, key: Key) -> Result<bool, ArchiveError> {
        Ok(self.get(key).await?.is_some())
    }

    /// Entries, bytes and the age of the least recently used entry.
    pub async fn usage(&self) -> Result<StoreUsage, ArchiveError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.usage(SystemTime::now())).await
    }

    /// Counters and occupancy, for `/metrics` and `status.session.archive`.
    pub async fn report(&self) -> Result<ArchiveReport, ArchiveError> {
        Ok(ArchiveReport {
            counters: self.inner.counters.snapshot(),
            local: self.usage().await?,
        })
    }

    /// Drops expired entries, then least recently used ones until the byte bound holds.
    pub async fn evict(&self) -> Result<(), ArchiveError> {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.evict(&[], SystemTime::now())).await
    }
}

#[async_trait]
impl Store for LocalStore {
    async fn put_hashed(&self, original: Hashed<'_>) -> Result<(), ArchiveError> {
        self.put_batch(&[original]).await
    }

    /// One blocking task for the whole batch (see the module comment).
    async fn put_batch(&self, originals: &[Hashed<'_>]) -> Result<(), ArchiveError> {
        let entries: Vec<(Key, Vec<u8>)> = originals
            .iter()
            .map(|o| (o.key(), o.bytes().to_vec()))
            .collect();
        let outcomes = self.put_many(entries).await?;
        for (o, outcome) in originals.iter().zip(outcomes) {
            match outcome {
                PutOutcome::Stored => self.inner.counters.record_put(o.bytes().len()),
                PutOutcome::Deduplicated => self.inner.counters.record_dedupe(),
            }
        }
        Ok(())
    }

    async fn fetch(&self, key: &Key) -> Result<Option<Vec<u8>>, ArchiveError> {
        let found = self.get(*key).await?;
        self.inner.counters.record_fetch(found.as_deref());
        Ok(found)
    }

    async fn fetch_many(&self, keys: &[Key]) -> Vec<Result<Option<Vec<u8>>, ArchiveError>> {
        let found = self.get_many(keys.to_vec()).await;
        for f in found.iter().flatten() {
            self.inner.counters.record_fetch(f.as_deref());
        }
        found
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ArchiveError> + Send + 'static,
) -> Result<T, ArchiveError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ArchiveError::Unavailable(format!("local archive task failed: {e}")))?
}

/// One entry as the directory listing shows it.
struct Entry {
    path: PathBuf,
    key: Key,
    bytes: u64,
    last_access: SystemTime,
}

impl Inner {
    fn path_of(&self, key: Key) -> PathBuf {
        self.dir.join(key.as_str())
    }

    fn put_batch(
        &self,
        entries: &[(Key, Vec<u8>)],
        flush_threads: usize,
    ) -> Result<Vec<PutOutcome>, ArchiveError> {
        let cap = self.limits.per_entry_cap();
        if let Some((_, over)) = entries.iter().find(|(_, c)| c.len() as u64 > cap) {
            return Err(ArchiveError::Unavailable(format!(
                "entry of {} bytes exceeds the local archive's per-entry cap of {cap} bytes",
                over.len()
            )));
        }
        let now = SystemTime::now();
        let mut outcomes = Vec::with_capacity(entries.len());
        let mut fresh: Vec<(Key, &[u8])> = Vec::with_capacity(entries.len());
        for (key, content) in entries {
            // Most keys of a batch are new: one failed lookup, no read.
            let present = match fs::symlink_metadata(self.path_of(*key)) {
                Ok(_) => true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                Err(e) => return Err(e.into()),
            };
            let existing = if present {
                self.get(*key, now)
            } else {
                Ok(None)
            };
            match existing {
                Ok(Some(_)) => outcomes.push(PutOutcome::Deduplicated),
                // Archiving the original again heals a damaged entry.
                Ok(None) | Err(ArchiveError::Corrupt(_)) => {
                    outcomes.push(PutOutcome::Stored);
                    fresh.push((*key, content));
                }
                Err(e) => return Err(e),
            }
        }
        if fresh.is_empty() {
            return Ok(outcomes);
        }
        let temps = self.write_temps(&fresh, flush_threads)?;
        let mut renamed = 0;
        let placed = temps.iter().zip(&fresh).try_for_each(|(temp, (key, _))| {
            fs::rename(temp, self.path_of(*key))?;
            renamed += 1;
            Ok::<_, io::Error>(())
        });
        if let Err(e) = placed {
            temps[renamed..].iter().for_each(|t| {
                let _ = fs::remove_file(t);
            });
            return Err(e.into());
        }
        if self.sync_writes {
            // The renames themselves are durable only once the directory is.
            File::open(&self.dir)?.sync_all()?;
            // Healed: the intact original is back, the damaged copy has served its purpose.
            if self.dir.join(QUARANTINE_DIR).exists() {
                for (key, _) in &fresh {
                    remove_if_present(&self.quarantined(*key))?;
                }
            }
        }
        let rescan = {
            let mut tally = self.tally();
            fresh.iter().for_each(|(_, c)| tally.add(c.len() as u64));
            tally.oldest.get_or_insert(now);
            tally.bytes > self.limits.max_bytes || tally.scanned_at.elapsed() >= RESCAN_INTERVAL
        };
        if rescan {
            let keep: Vec<Key> = fresh.iter().map(|(k, _)| *k).collect();
            self.evict(&keep, now)?;
        }
        Ok(outcomes)
    }

    /// Writes each entry to its own temp file and, in durable mode, flushes them (several at
    /// once); returns the temp paths in order. On an error every temp file is removed.
    fn write_temps(
        &self,
        fresh: &[(Key, &[u8])],
        flush_threads: usize,
    ) -> Result<Vec<PathBuf>, ArchiveError> {
        let mut temps: Vec<PathBuf> = Vec::with_capacity(fresh.len());
        let mut files: Vec<File> = Vec::with_capacity(fresh.len());
        let cleanup = |temps: &[PathBuf]| {
            temps.iter().for_each(|t| {
                let _ = fs::remove_file(t);
            })
        };
        for (key, content) in fresh {
            let temp = self.dir.join(format!(
                "{TEMP_PREFIX}{key}-{}-{}",
                std::process::id(),
                self.temp_seq.fetch_add(1, Ordering::Relaxed)
            ));
            let written = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp)
                .and_then(|mut f| f.write_all(content).map(|()| f));
            match written {
                Ok(f) => {
                    temps.push(temp);
                    files.push(f);
                }
                Err(e) => {
                    let _ = fs::remove_file(&temp);
                    cleanup(&temps);
                    return Err(e.into());
                }
            }
        }
        if self.sync_writes
            && let Err(e) = flush_all(&files, flush_threads)
        {
            cleanup(&temps);
            return Err(e.into());
        }
        Ok(temps)
    }

    fn tally(&self) -> MutexGuard<'_, Tally> {
        // The tally is plain counts: a panic elsewhere cannot leave it inconsistent.
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, key: Key, now: SystemTime) -> Result<Option<Vec<u8>>, ArchiveError> {
        let path = self.path_of(key);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // The only tier's damaged entry stays reported until the original is
                // archived again.
                if self.sync_writes && self.quarantined(key).exists() {
                    return Err(ArchiveError::Corrupt(key));
                }
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let meta = file.metadata()?;
        if self.expired(last_access(&meta), now) {
            drop(file);
            remove_if_present(&path)?;
            self.tally().remove(meta.len());
            return Ok(None);
        }
        let mut content = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        file.read_to_end(&mut content)?;
        if Key::of(&content) != key {
            drop(file);
            if self.sync_writes {
                // This is the only copy: deleting it would turn "corrupt" into "never
                // archived" on the next read. It is moved aside, and reads keep saying why.
                let aside = self.quarantined(key);
                fs::create_dir_all(self.dir.join(QUARANTINE_DIR))?;
                fs::rename(&path, &aside)?;
                tracing::error!(key = %key, kept = %aside.display(), "archived original is corrupt; moved aside");
            } else {
                // A damaged cache entry must not shadow the intact copy of the durable tier.
                remove_if_present(&path)?;
            }
            self.tally().remove(meta.len());
            return Err(ArchiveError::Corrupt(key));
        }
        touch(&path, now)?;
        Ok(Some(content))
    }

    fn quarantined(&self, key: Key) -> PathBuf {
        self.dir.join(QUARANTINE_DIR).join(key.as_str())
    }

    fn expired(&self, last_access: SystemTime, now: SystemTime) -> bool {
        now.duration_since(last_access)
            .is_ok_and(|age| age > self.limits.ttl)
    }

    fn entries(&self) -> Result<Vec<Entry>, ArchiveError> {
        let mut out = Vec::new();
        for dirent in fs::read_dir(&self.dir)? {
            let dirent = dirent?;
            let name = dirent.file_name();
            let Some(key) = name.to_str().and_then(Key::parse) else {
                continue;
            };
            let meta = match dirent.metadata() {
                Ok(m) => m,
                // Removed by another process between listing and stat.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            };
            if !meta.is_file() {
                continue;
            }
            out.push(Entry {
                path: dirent.path(),
                key,
                bytes: meta.len(),
                last_access: last_access(&meta),
            });
        }
        Ok(out)
    }

    /// Re-lists the directory: drops expired entries, then least recently used ones until
    /// the byte bound holds (never one of `keep`), and resets the tally.
    fn evict(&self, keep: &[Key], now: SystemTime) -> Result<(), ArchiveError> {
        let mut entries = self.entries()?;
        let mut kept = Vec::with_capacity(entries.len());
        for entry in entries.drain(..) {
            if !keep.contains(&entry.key) && self.expired(entry.last_access, now) {
                remove_if_present(&entry.path)?;
            } else {
                kept.push(entry);
            }
        }
        let mut total: u64 = kept.iter().map(|e| e.bytes).sum();
        if total > self.limits.max_bytes {
            // Evicting down to 90% leaves room for the next writes without another scan each.
            let low_water = self.limits.max_bytes - self.limits.max_bytes / 10;
            kept.sort_by_key(|e| e.last_access);
            let mut survivors = Vec::with_capacity(kept.len());
            for entry in kept {
                if total <= low_water || keep.contains(&entry.key) {
                    survivors.push(entry);
                    continue;
                }
                remove_if_present(&entry.path)?;
                total = total.saturating_sub(entry.bytes);
                self.counters.record_eviction();
            }
            kept = survivors;
        }
        *self.tally() = Tally {
            entries: kept.len() as u64,
            bytes: total,
            oldest: kept.iter().map(|e| e.last_access).min(),
            scanned_at: Instant::now(),
        };
        Ok(())
    }

    /// From the tally; the directory is re-listed when the tally is older than
    /// [`RESCAN_INTERVAL`].
    fn usage(&self, now: SystemTime) -> Result<StoreUsage, ArchiveError> {
        if self.tally().scanned_at.elapsed() >= RESCAN_INTERVAL {
            self.evict(&[], now)?;
        }
        let tally = *self.tally();
        Ok(StoreUsage {
            entries: tally.entries,
            bytes: tally.bytes,
            oldest_age: tally
                .oldest
                .and_then(|t| now.duration_since(t).ok())
                .unwrap_or_default(),
        })
    }

    fn sweep_stale_temps(&self, now: SystemTime) -> Result<(), ArchiveError> {
        for dirent in fs::read_dir(&self.dir)? {
            let dirent = dirent?;
            let is_temp = dirent
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(TEMP_PREFIX));
            if !is_temp {
                continue;
            }
            let Ok(meta) = dirent.metadata() else {
                continue;
            };
            let stale = now
                .duration_since(meta.modified().unwrap_or(now))
                .is_ok_and(|age| age >= STALE_TEMP_AGE);
            if stale {
                remove_if_present(&dirent.path())?;
            }
        }
        Ok(())
    }
}

/// A Kubernetes quantity as the CRD allows it: digits and an optional `Ki`/`Mi`/`Gi`
/// (binary) or `K`/`M`/`G` (decimal) suffix.
fn parse_quantity(s: &str) -> Option<u64> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = s.get(..digits)?.parse().ok()?;
    let unit: u64 = match &s[digits..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(unit)
}

/// `168h`, `30m`, `1h30m`, `45s`.
fn parse_duration(s: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: u64 = rest.get(..digits)?.parse().ok()?;
        let unit = match rest.as_bytes().get(digits)? {
            b'h' => 3600,
            b'm' => 60,
            b's' => 1,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(unit)?)?;
        rest = &rest[digits + 1..];
    }
    Some(Duration::from_secs(total))
}

/// Flushes every file to disk, on up to `threads` threads at once.
fn flush_all(files: &[File], threads: usize) -> io::Result<()> {
    let threads = threads.clamp(1, files.len().max(1));
    if threads == 1 {
        return files.iter().try_for_each(File::sync_all);
    }
    let chunk = files.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let flushers: Vec<_> = files
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().try_for_each(File::sync_all)))
            .collect();
        flushers.into_iter().try_for_each(|f| {
            f.join()
                .unwrap_or_else(|_| Err(io::Error::other("flush thread panicked")))
        })
    })
}

fn last_access(meta: &fs::Metadata) -> SystemTime {
    meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)
}

fn touch(path: &Path, now: SystemTime) -> io::Result<()> {
    let file = match OpenOptions::new().write(true).open(path) {
        Ok(f) => f,
        // Evicted by another process just after we read it: the read itself was whole.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    file.set_times(FileTimes::new().set_accessed(now).set_modified(now))
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ccr::Archivable;

    fn limits(max_bytes: u64) -> LocalLimits {
        LocalLimits {
            max_bytes,
            ttl: Duration::from_secs(3600),
        }
    }

    fn set_age(path: &Path, age: Duration) {
        let t = SystemTime::now() - age;
        let f = OpenOptions::new().write(true).open(path).expect("open");
        f.set_times(FileTimes::new().set_accessed(t).set_modified(t))
            .expect("set times");
    }

    #[test]
    fn limits_from_the_spec() {
        let d = LocalLimits::from_spec(None, None).expect("defaults");
        assert_eq!(d.max_bytes, 256 << 20);
        assert_eq!(d.ttl, Duration::from_secs(168 * 3600));
        let l = LocalLimits::from_spec(Some("1G"), Some("1h30m")).expect("parsed");
        assert_eq!(
            (l.max_bytes, l.ttl),
            (1_000_000_000, Duration::from_secs(5400))
        );
        assert_eq!(
            LocalLimits::from_spec(Some("12Xi"), None).map_err(|e| e.label()),
            Err("invalid_cache_size")
        );
        for bad in ["", "h", "10", "10d", "1h30"] {
            assert!(LocalLimits::from_spec(None, Some(bad)).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn round_trip_dedupe_and_second_instance() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = LocalStore::open(dir.path(), limits(1 << 20)).expect("open");
        let k = a.archive(b"\x00\xffbinary").await.expect("archive");
        assert_eq!(a.archive(b"\x00\xffbinary").await.expect("again"), k);
        let snap = a.counters().snapshot();
        assert_eq!((snap.puts, snap.dedupes), (1, 1));
        let b = LocalStore::open(dir.path(), limits(1 << 20)).expect("reopen");
        assert_eq!(
            b.fetch(&k).await.expect("fetch").as_deref(),
            Some(&b"\x00\xffbinary"[..])
        );
        let usage = b.usage().await.expect("usage");
        assert_eq!((usage.entries, usage.bytes), (1, 8));
    }

    #[tokio::test]
    async fn corrupt_cache_entry_is_reported_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = LocalStore::open_cache(dir.path(), limits(1 << 20)).expect("open");
        let k = s.archive(b"original").await.expect("archive");
        fs::write(dir.path().join(k.as_str()), b"tampered").expect("tamper");
        assert!(matches!(s.fetch(&k).await, Err(ArchiveError::Corrupt(c)) if c == k));
        // The durable tier behind the cache holds the intact copy: the damaged one goes.
        assert_eq!(s.fetch(&k).await.expect("second read"), None);
    }

    #[tokio::test]
    async fn corrupt_entry_of_the_only_tier_is_kept_aside_and_reported_every_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = LocalStore::open(dir.path(), limits(1 << 20)).expect("open");
        let k = s.archive(b"original").await.expect("archive");
        fs::write(dir.path().join(k.as_str()), b"tampered").expect("tamper");
        for read in 1..=3 {
            assert!(
                matches!(s.fetch(&k).await, Err(ArchiveError::Corrupt(c)) if c == k),
                "read {read} must report the corruption"
            );
        }
        // A store reopened on the directory still knows.
        let again = LocalStore::open(dir.path(), limits(1 << 20)).expect("reopen");
        assert!(matches!(
            again.fetch(&k).await,
            Err(ArchiveError::Corrupt(_))
        ));
        // The damaged bytes are kept for inspection, outside the entries.
        let kept = fs::read(dir.path().join(".corrupt").join(k.as_str())).expect("kept");
        assert_eq!(kept, b"tampered");
        assert_eq!(again.usage().await.expect("usage").entries, 0);
        // Archiving the original again heals the entry.
        assert_eq!(again.archive(b"original").await.expect("re-archive"), k);
        assert_eq!(
            again.fetch(&k).await.expect("healed").as_deref(),
            Some(&b"original"[..])
        );
    }

    #[tokio::test]
    async fn lru_evicts_least_recently_used_and_never_the_new_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = LocalStore::open(dir.path(), limits(1000)).expect("open");
        let a = s.archive(&[b'a'; 240]).await.expect("a");
        let b = s.archive(&[b'b'; 240]).await.expect("b");
        let c = s.archive(&[b'c'; 240]).await.expect("c");
        set_age(&dir.path().join(a.as_str()), Duration::from_secs(30));
        set_age(&dir.path().join(b.as_str()), Duration::from_secs(20));
        set_age(&dir.path().join(c.as_str()), Duration::from_secs(10));
        // Reading `a` makes it the most recent, so `b` goes first.
        assert!(s.contains(a).await.expect("a"));
        let d = s.archive(&[b'd'; 240]).await.expect("d");
        let e = s.archive(&[b'e'; 240]).await.expect("e");
        assert!(!s.contains(b).await.expect("b"));
        for k in [a, d, e] {
            assert!(s.contains(k).await.expect("kept"), "{k}");
        }
        assert!(s.usage().await.expect("usage").bytes <= 1000);
    }

    #[tokio::test]
    async fn a_batch_lands_whole_and_the_tally_matches_the_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = LocalStore::open(dir.path(), limits(1 << 20)).expect("open");
        let first = s.archive(b"already there").await.expect("first");
        let texts: Vec<Vec<u8>> = (0..50)
            .map(|i| format!("original {i} ").repeat(i + 1).into_bytes())
            .chain([b"already there".to_vec()])
            .collect();
        let originals: Vec<Hashed<'_>> = texts
            .iter()
            .map(|t| Archivable::check(t).expect("no marker").hash())
            .collect();
        s.put_batch(&originals).await.expect("batch");
        for (o, t) in originals.iter().zip(&texts) {
            assert_eq!(s.fetch(&o.key()).await.expect("fetch").as_ref(), Some(t));
        }
        let snap = s.counters().snapshot();
        assert_eq!((snap.puts, snap.dedupes), (51, 1));
        let names: Vec<String> = fs::read_dir(dir.path())
            .expect("list")
            .map(|d| d.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with(TEMP_PREFIX)),
            "{names:?}"
        );
        assert!(names.contains(&first.to_string()));
        let tally = s.usage().await.expect("usage");
        let scanned = LocalStore::open(dir.path(), limits(1 << 20))
            .expect("reopen")
            .usage()
            .await
            .expect("usage");
        assert_eq!(
            (tally.entries, tally.bytes),
            (scanned.entries, scanned.bytes)
        );
        assert_eq!(tally.entries, 51);
    }

    #[tokio::test]
    async fn a_batch_with_one_entry_over_the_cap_writes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = LocalStore::open(dir.path(), limits(1000)).expect("open");
        let small = [b'a'; 100];
        let big = [b'b'; 300];
        let batch = [
            Archivable::check(&small).expect("ok").hash(),
            Archivable::check(&big).expect("ok").hash(),
        ];
        assert!(matches!(
            s.put_batch(&batch).await,
            Err(ArchiveError::Unavailable(_))
        ));
        assert_eq!(fs::read_dir(dir.path()).expect("list").count(), 0);
    }

    #[tokio::test]
    async fn entry_over_a_quarter_of_the_store_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = LocalStore::open(dir.path(), limits(1000)).expect("open");
        assert!(s.archive(&[b'x'; 250]).await.is_ok());
        assert!(matches!(
            s.archive(&[b'y'; 251]).await,
            Err(ArchiveError::Unavailable(_))
        ));
        assert_eq!(s.usage().await.expect("usage").entries, 1);
    }

    #[tokio::test]
    async fn ttl_expires_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = LocalStore::open(
            dir.path(),
            LocalLimits {
                max_bytes: 1 << 20,
                ttl: Duration::from_secs(60),
            },
        )
        .expect("open");
        let old = s.archive(b"old").await.expect("old");
        let fresh = s.archive(b"fresh").await.expect("fresh");
        set_age(&dir.path().join(old.as_str()), Duration::from_secs(120));
        assert_eq!(s.fetch(&old).await.expect("old"), None);
        assert!(s.contains(fresh).await.expect("fresh"));
    }

    #[tokio::test]
    async fn stale_temp_files_are_swept_on_open_but_fresh_ones_stay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stale = dir.path().join(".tmp-0123456789abcdef-1-0");
        let fresh = dir.path().join(".tmp-0123456789abcdef-2-0");
        fs::write(&stale, b"half").expect("stale");
        fs::write(&fresh, b"half").expect("fresh");
        set_age(&stale, STALE_TEMP_AGE + Duration::from_secs(1));
        let s = LocalStore::open(dir.path(), limits(1 << 20)).expect("open");
        assert!(!stale.exists());
        assert!(
            fresh.exists(),
            "a concurrent writer's temp file is left alone"
        );
        assert_eq!(s.usage().await.expect("usage").entries, 0);
    }
}
